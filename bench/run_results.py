"""The results file the bench helpers write and summarise: JSON lines, one
object per measured run, each with its "run" (which tool or setting) and its
"round"."""

import json
import statistics


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
