"""What the hostile-log tests share: mutations of real log lines, and the invariant.

The invariant, for every log however damaged: ``sapper analyze`` and ``sapper report``
exit 0, 1 or 2 (never 3, an unexpected exception), print no traceback and no "bug in
sapper" note (a detector that raised), keep their output bounded, and finish within
``CASE_LIMIT_S`` (enforced with SIGALRM, so a hang fails the test instead of blocking
the suite). The commands run in-process through typer's CliRunner, which maps errors
exactly as the installed ``sapper`` does.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from pathlib import Path

import typer.testing
from hypothesis import settings
from tests.fuzz import stable_settings, time_limit
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

ROOT = Path(__file__).parent.parent.parent
LOGS = ROOT / "examples" / "logs"
#: Wall-clock limit of one case (seconds): generous for a loaded CI machine.
CASE_LIMIT_S = 20
#: The most output one command may print for a log of a few hundred lines.
MAX_OUTPUT = 200_000

runner = CliRunner()
_register_commands()
#: The click command, built once: typer builds it anew on each ``invoke`` (half the
#: time of a short ``sapper analyze`` run).
_COMMAND = typer.testing._get_command(app)
#: Mutated records or lines per format, across the run (checked by the suite's last test).
MUTATED: Counter[str] = Counter()
#: Exit codes of ``sapper analyze`` per format.
EXITS: defaultdict[str, Counter[int]] = defaultdict(Counter)


def fast_settings(examples: int) -> settings:
    """The log suites' cases come from a seeded random.Random: drawn, never shrunk."""
    return stable_settings(examples, shrink=False)


def run_cli(*args: str) -> int:
    """Run one sapper command in-process and check the invariant; return its exit code."""
    build = typer.testing._get_command
    typer.testing._get_command = lambda _app: _COMMAND
    try:
        with time_limit(CASE_LIMIT_S):
            res = runner.invoke(app, list(args))
    finally:
        typer.testing._get_command = build
    exc = res.exception
    if exc is not None and not isinstance(exc, SystemExit):
        raise AssertionError(f"sapper {' '.join(args[:1])} raised {exc!r}") from exc
    out = res.output
    assert res.exit_code in (0, 1, 2), (res.exit_code, out[-2000:])
    assert "Traceback" not in out, out[-2000:]
    assert "bug in sapper" not in out, out[-2000:]
    assert len(out) < MAX_OUTPUT, len(out)
    return res.exit_code


def analyze_and_report(path: Path, fmt: str, *extra: str) -> tuple[int, int]:
    """Both commands on one log; the report goes next to it. Exit codes are counted per
    format in :data:`EXITS`."""
    code = run_cli("analyze", str(path), *extra)
    report = run_cli("report", str(path), "-o", str(path.parent / "report.html"), *extra)
    EXITS[fmt][code] += 1
    return code, report


# ---- mutations -------------------------------------------------------------------------
#: What a hostile or damaged log puts where a number belongs.
HOSTILE_VALUES: tuple[str, ...] = (
    "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e-400",
    "9" * 400, "9" * 5000, "1" + "0" * 30, "-1", "-0", "0", "1.5", "2e9", "3.4e38",
    '"abc"', '"nan"', '"inf"', '""', "{}", "[1,2]", "[]", "true", "false", "null",
    '{"a": [1, {"b": 2}]}', "[" * 150 + "]" * 150, "[" * 5000 + "]" * 5000, "0x1F",
    "1_000", "١٢٣", '"\\u0000"', '"\\ud800"',
)
#: Characters a damaged or hostile line may gain.
HOSTILE_CHARS: tuple[str, ...] = (
    "\r", "\x00", "\x1b[31m", "\x1b]0;pwned\x07", "\u202e", "\u2066", "\u2069", "\x85",
    "\x9b", "\x7f", "\t", ",", "|", ":", '"', "{", "}", "[", "]", "\\", "\ufeff", "\ufffd",
    "[bold red]", "[/]", "<script>alert(1)</script>", "\u2028", "é", "\U0001f525",
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def mutate_line(rng: random.Random, line: str, *, json_like: bool) -> str:
    """One line changed the way damage or a hostile writer changes it."""
    kind = rng.randrange(10)
    if kind <= 2:  # a number swapped for a hostile value
        spots = list(_NUMBER.finditer(line))
        if spots:
            m = rng.choice(spots)
            return line[: m.start()] + rng.choice(HOSTILE_VALUES) + line[m.end() :]
        kind = 3
    if kind == 3:  # characters inserted
        pos = rng.randrange(len(line) + 1)
        return line[:pos] + rng.choice(HOSTILE_CHARS) * rng.choice((1, 1, 3)) + line[pos:]
    if kind == 4:  # cut short
        return line[: rng.randrange(len(line) + 1)]
    if kind == 5:  # characters replaced at random
        chars = list(line)
        for _ in range(rng.randrange(1, 4)):
            if chars:
                chars[rng.randrange(len(chars))] = chr(rng.choice((0, 13, 27, 34, 44, 124))
                                                       if rng.random() < 0.5
                                                       else rng.randrange(32, 0x3000))
        return "".join(chars)
    if kind == 6:  # a NUL block, as a crashed node leaves it
        return "\x00" * rng.choice((16, 4096)) + line
    if kind == 7 and json_like:  # a key renamed to something hostile
        keys = list(re.finditer(r'"([^"\\]{1,40})"\s*:', line))
        if keys:
            m = rng.choice(keys)
            return line[: m.start(1)] + rng.choice(HOSTILE_CHARS) + m.group(1) + line[m.end(1) :]
    if kind == 8:  # a huge step number
        spots = list(_NUMBER.finditer(line))
        if spots:
            m = spots[0] if rng.random() < 0.7 else rng.choice(spots)
            big = rng.choice(("1" + "0" * 30, "9" * 5000, "-5", "18446744073709551616"))
            return line[: m.start()] + big + line[m.end() :]
    return line + rng.choice(HOSTILE_CHARS)  # a stray character at the end


def mutate_lines(
    rng: random.Random, lines: list[str], fmt: str, *, keep: int = 1, json_like: bool = False
) -> list[str]:
    """Every line after the first ``keep`` mutated (the header stays readable so the
    readers get past detection most of the time), counted in :data:`MUTATED`."""
    out = list(lines[:keep])
    for line in lines[keep:]:
        out.append(mutate_line(rng, line, json_like=json_like))
        if rng.random() < 0.05:
            out.append(out[-1])  # a line repeated (a restart logs steps again)
    MUTATED[fmt] += len(lines) - keep
    return out


def window(rng: random.Random, lines: list[str], size: int) -> list[str]:
    """``size`` consecutive lines of a real log (fewer if it is shorter)."""
    if len(lines) <= size:
        return list(lines)
    start = rng.randrange(len(lines) - size + 1)
    return lines[start : start + size]
