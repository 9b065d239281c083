"""The results file the bench helpers write and summarise: JSON lines, one
object per measured run, each with its "run" (which tool or setting) and its
"round"; and the tools' output each object comes from."""

import json
import statistics


def last_json_line(path):
    """The object on the last line of the file path that starts with "{" (a
    tool's JSON line after what it logged); None when the file cannot be read
    or has no such line, or that line is not JSON."""
    try:
        with open(path) as f:
            lines = [line for line in f if line.lstrip().startswith("{")]
        return json.loads(lines[-1])
    except (OSError, ValueError, IndexError):
        return None


class RunResults:
    """The objects of a results file, grouped by their "run"."""

    def __init__(self, path):
        self.runs = {}
        with open(path) as f:
            for line in f:
                d = json.loads(line)
                self.runs.setdefault(d["run"], []).append(d)

    def _values(self, run, key):
        return [d[key] for d in self.runs.get(run, []) if d.get(key) is not None]

    def median(self, run, key):
        """The median of key over run's objects that have it; None when none has."""
        v = self._values(run, key)
        return statistics.median(v) if v else None

    def span(self, run, key, fmt):
        """"min-max" of key over run's objects, each printed with fmt; "" when none has it."""
        v = self._values(run, key)
        return (fmt % min(v) + "-" + fmt % max(v)) if v else ""

    def paired(self, num, den, key):
        """The ratio num/den of key in each round that has both runs: (median, min, max),
        or None."""
        by_round = {d["round"]: d.get(key) for d in self.runs.get(den, [])}
        v = sorted(d[key] / by_round[d["round"]] for d in self.runs.get(num, [])
                   if d.get(key) is not None and by_round.get(d["round"]))
        return (statistics.median(v), v[0], v[-1]) if v else None
