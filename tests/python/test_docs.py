"""The command lines the documentation shows use flags the programs have.

Every `shardfeed ...`, `warm-cache ...`, `shardfeed-mock-s3 ...` and
`build/train_loop ...` line in README.md, docs/*.md and examples/README.md
(fenced blocks, with their `\\` continuations, and inline code) is read;
each `--flag` on it must be listed by that command's help (`shardfeed help`:
the options every command takes plus the command's own section;
`shardfeed load|doctor|tune --help`; `shardfeed-mock-s3 --help`; the
example's usage), and every flag a help lists must be one the program's
parser knows (it never answers "unknown option" for it).
"""
import re
import subprocess

import pytest

from conftest import REPO, tool, tool_env

DOCS = sorted([REPO / "README.md", REPO / "examples" / "README.md",
               *(REPO / "docs").glob("*.md")])
COMMANDS = ("ls", "get", "stat", "warm-cache", "cache", "pack", "inspect", "index", "load",
            "doctor", "tune", "version", "help")
PROGRAMS = ("shardfeed", "warm-cache", "shardfeed-mock-s3", "train_loop")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
PLACEHOLDERS = {"--option-name"}  # loader.md: "[every option above as --option-name]"


def _run(args, env=None):
    r = subprocess.run(args, capture_output=True, env=tool_env(env), timeout=60)
    return r.stdout.decode() + r.stderr.decode()


def _flags(text):
    return set(FLAG.findall(text))


def _doc_lines(path):
    """(line number, text) of each command line: fenced lines joined over
    trailing backslashes and over a usage's next lines of "[--option ...]",
    and inline code spans."""
    out, fenced, pending, start, last_fenced = [], False, "", 0, False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, pending, last_fenced = not fenced, "", False
        elif not fenced:
            out.extend((no, span) for span in re.findall(r"`([^`]+)`", line))
            last_fenced = False
        elif not pending and last_fenced and line.lstrip().startswith("["):
            out[-1] = (out[-1][0], out[-1][1] + " " + line)
        else:
            if not pending:
                start = no
            pending += line.rstrip("\\") + " "
            if not line.endswith("\\"):
                out.append((start, pending))
                pending, last_fenced = "", True
    return out


def _program_and_words(text):
    """The program a line runs and the words after it, or None."""
    words = text.split()
    for i, w in enumerate(words):
        name = w.rsplit("/", 1)[-1]
        if name in PROGRAMS and (i == 0 or words[i - 1] in ("$", "&&", "|", ";", "nice", "time")):
            return name, words[i + 1:]
    return None


def _command_of(program, words):
    if program != "shardfeed":
        return program
    for w in words:
        if w.startswith("#"):
            break
        if w in COMMANDS:
            return w
    return None


def _before_comment(words):
    kept = []
    for w in words:
        if w.startswith("#"):
            break
        kept.append(w)
    return " ".join(kept)


@pytest.fixture(scope="module")
def helps():
    cli = tool("SF_CLI_BIN", "shardfeed")
    general = _run([cli, "help"])
    # `shardfeed help`: "Options (all commands ...)" up to the first
    # per-command section ("ls:  -r, ...", "warm-cache, cache:").
    common_text = general.split("Options (all commands", 1)[1]
    section = re.compile(r"^([a-z-]+(?:, [a-z-]+)*):", re.M)
    first = section.search(common_text)
    common = _flags(common_text[:first.start()]) | {"--help"}
    own = {}
    marks = list(section.finditer(common_text))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(common_text)
        body = common_text[m.start():end].split("\n\n", 1)[0]
        for name in m.group(1).split(", "):
            own[name] = own.get(name, set()) | _flags(body)
    load = _flags(_run([cli, "load", "--help"]))
    h = {c: common | own.get(c, set()) for c in COMMANDS}
    h["load"] = common | load
    for cmd in ("doctor", "tune"):
        text = _run([cli, cmd, "--help"])
        # "Takes every option of `shardfeed load` but --digest and --autotune"
        but = re.search(r"every option of `shardfeed load`( but [^(.]*)?", text)
        assert but, f"`shardfeed {cmd} --help` no longer says which load options it takes"
        not_taken = _flags(but.group(1) or "")
        h[cmd] = common | ((load | _flags(text)) - not_taken)
    h["common"], h["load only"] = common, load - common
    h["shardfeed-mock-s3"] = _flags(_run([tool("SF_MOCK_S3_BIN", "shardfeed-mock-s3"),
                                          "--help"]))
    h["train_loop"] = _flags(_run([tool("SF_TRAIN_LOOP_BIN", "train_loop"), "--help"]))
    return h


def test_documented_flags_are_in_the_help(helps):
    missing = []
    for path in DOCS:
        for no, text in _doc_lines(path):
            found = _program_and_words(text)
            if not found:
                continue
            program, words = found
            cmd = _command_of(program, words)
            if cmd is None:
                continue
            # "[every `shardfeed load` option but --digest, --autotune]"
            said = re.sub(r" but --[a-z-]+(?:(?:,| and) --[a-z-]+)*", "", _before_comment(words))
            for flag in sorted(_flags(said) - PLACEHOLDERS):
                if flag not in helps[cmd]:
                    missing.append(f"{path.relative_to(REPO)}:{no}: {program} {cmd}: {flag}")
    assert not missing, "documented flags the help does not list:\n" + "\n".join(missing)


@pytest.mark.parametrize("cmd", ["ls", "get", "stat", "warm-cache", "cache", "pack", "inspect",
                                 "index", "load", "doctor", "tune"])
def test_flags_the_help_lists_are_parsed(helps, cmd, tmp_path):
    cli = tool("SF_CLI_BIN", "shardfeed")
    env = {"XDG_CACHE_HOME": str(tmp_path), "HOME": str(tmp_path)}
    # One table each: the common flags are tried on ls alone, the load
    # table's on load alone (doctor and tune read the same tables).
    flags = helps[cmd] - {"--help"} - (helps["common"] if cmd != "ls" else set())
    if cmd in ("doctor", "tune"):
        flags -= helps["load only"]
    unknown = []
    for flag in sorted(flags):
        # No operand: every command stops at usage or at its first option
        # error before it touches a store; an unknown flag says so.
        out = _run([cli, cmd, flag] if cmd != "cache" else [cli, cmd, "stats", flag], env)
        if "unknown option" in out:
            unknown.append(f"{cmd} {flag}: {out.strip()}")
    assert not unknown, "\n".join(unknown)


def _table_names(path, heading, column):
    """The backticked names in one column of the first table under heading."""
    text = path.read_text().split(heading, 1)[1]
    names = []
    body = text.split("|---", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    for row in body:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        # "`epoch_policy` (`pad`/`drop`/`uneven`)": the values are no names
        names += re.findall(r"`([a-z_0-9-]+)`", re.sub(r"\([^)]*\)", "", cells[column]))
    assert names, f"no table under {heading!r} in {path.name}"
    return names


def test_every_loader_option_is_a_load_flag(helps):
    """docs/loader.md, Options: each option is `--name-with-dashes` in
    `shardfeed load --help` (a boolean that defaults to true: its --no- form)."""
    missing = []
    for name in _table_names(REPO / "docs" / "loader.md", "\n## Options\n", 0):
        if name == "sources":  # JSON only: the CLI takes URLs as operands
            continue
        flag = "--" + name.replace("_", "-")
        if flag not in helps["load"] and "--no-" + flag[2:] not in helps["load"]:
            missing.append(flag)
    assert not missing, "loader options `shardfeed load --help` does not list: " + " ".join(missing)


def test_every_s3_option_flag_is_common(helps):
    """docs/configuration.md's S3 table: its CLI flags are the options every
    command takes."""
    flags = {cell for cell in _table_names(REPO / "docs" / "configuration.md", "## S3 client", 1)
             if cell.startswith("--")}  # "-v, -vv" is --verbose
    missing = sorted(f for f in flags if f not in helps["ls"])
    assert flags and not missing, f"S3 flags `shardfeed help` does not list: {missing}"
