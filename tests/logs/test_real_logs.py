"""``sapper analyze`` on real public training logs, against what their authors reported.

Each file under ``tests/fixtures/logs/`` is an excerpt of a real run (sources in
``tests/fixtures/SOURCES.md``); ``EXPECTED.yaml`` says, from the source's own account,
which kinds of finding a correct analysis must report near which step (``must_fire``)
and which would be false alarms there (``must_not``). The kinds are sapper-independent;
``KIND_CODES`` below says which rule codes report each kind, so a rule may be renamed or
split without touching the ground truth.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.logs.detect import FORMATS

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
EXPECTED = LOGS / "EXPECTED.yaml"

#: Which sapper rule codes report each kind of finding. ``restart`` is not a rule: the
#: analysis reports it as more than one attempt of the run (see ``_attempts``).
KIND_CODES: dict[str, frozenset[str]] = {
    "spike": frozenset({"R002"}),
    "grad_surge": frozenset({"R013"}),
    "nan": frozenset({"R001", "R010", "R020", "X001"}),
    "overflow": frozenset({"R030", "R031"}),
    "counter": frozenset({"R031"}),
    "lr_schedule": frozenset({"R040", "R041", "R042", "R082"}),
    "eval_overfit": frozenset({"R110"}),
    "throughput": frozenset({"R060", "R061", "R063"}),
    "gradscaler_misuse": frozenset({"R032", "R033"}),
    "grad_norm_tiny": frozenset({"R012"}),
    "loss_stuck": frozenset({"R003"}),
    "restart": frozenset(),
}
#: Entries sapper does not get right yet, with what is missing. They run as strict
#: xfails: once a change makes one pass, pytest reports it (XPASS) and its line here
#: must go, so this table always says exactly what is still open.
OPEN: dict[str, str] = {
}
#: A must_fire step matches a finding this many logging intervals either side, unless
#: the entry gives its own ``window``; never closer than ``MIN_WINDOW`` steps.
INTERVALS = 3
MIN_WINDOW = 10

runner = CliRunner()
_register_commands()


@dataclass(frozen=True)
class Expect:
    """One kind of finding at one step (``None``: anywhere in the log)."""

    kind: str
    step: int | None = None
    window: int | None = None


@dataclass(frozen=True)
class Entry:
    file: str
    format: str
    source: str
    what_happened: str
    must_fire: tuple[Expect, ...] = ()
    must_not: tuple[str, ...] = ()


def _entries() -> list[Entry]:
    raw = yaml.safe_load(EXPECTED.read_text(encoding="utf-8"))
    entries = []
    for item in raw:
        fire = tuple(
            Expect(e["class"], e.get("step"), e.get("window")) for e in item.get("must_fire") or []
        )
        entries.append(
            Entry(
                file=item["file"],
                format=item["format"],
                source=item["source"],
                what_happened=item["what_happened"],
                must_fire=fire,
                must_not=tuple(item.get("must_not") or ()),
            )
        )
    return entries


ENTRIES = _entries()


def _attempts(log: dict[str, Any], findings: list[dict[str, Any]]) -> list[int | None]:
    """The first step of every attempt the analysis reports (``None`` where it gives no
    step): the log summary's ``attempts`` (a count or a list of attempts), else the
    attempt numbers findings carry in ``data["attempt"]``."""
    attempts = log.get("attempts")
    if isinstance(attempts, list):
        firsts = []
        for a in attempts:
            firsts.append(a.get("first_step") if isinstance(a, dict) else None)
        return firsts
    if isinstance(attempts, int):
        return [None] * attempts
    numbers = {f.get("data", {}).get("attempt") for f in findings}
    numbers.discard(None)
    return [None] * max(numbers, default=1)


def _analyze(entry: Entry) -> dict[str, Any]:
    res = runner.invoke(app, ["analyze", "--format", "json", str(LOGS / entry.file)])
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"{entry.file}: sapper raised {res.exception!r}\n{res.output}"
    )
    assert res.exit_code in (0, 1), f"{entry.file}: exit {res.exit_code}\n{res.output}"
    return json.loads(res.stdout)


def _window(expect: Expect, interval: int | None) -> int:
    if expect.window is not None:
        return expect.window
    return max(MIN_WINDOW, INTERVALS * (interval or 1))


def _fired(expect: Expect, findings: list[dict[str, Any]], log: dict[str, Any]) -> bool:
    if expect.kind == "restart":
        firsts = _attempts(log, findings)
        if len(firsts) < 2:
            return False
        later = firsts[1:]
        if expect.step is None or any(s is None for s in later):
            return True
        return any(abs(s - expect.step) <= _window(expect, log.get("interval")) for s in later)
    codes = KIND_CODES[expect.kind]
    near = _window(expect, log.get("interval"))
    for f in findings:
        if f["code"] not in codes:
            continue
        if expect.step is None or (
            f.get("step") is not None and abs(f["step"] - expect.step) <= near
        ):
            return True
    return False


def _false_alarms(kind: str, findings: list[dict[str, Any]], log: dict[str, Any]) -> list[str]:
    """Warnings and errors of a kind the log's ground truth rules out. An info is no
    alarm: it is how sapper says "a dip that recovered" or "an episode began"."""
    if kind == "restart":
        n = len(_attempts(log, findings))
        return [f"{n} attempts"] if n > 1 else []
    return [
        f"{f['code']}@{f.get('step')}: {f.get('message', '')}"
        for f in findings
        if f["code"] in KIND_CODES[kind] and f["severity"] != "info"
    ]


def test_expected_is_well_formed() -> None:
    """Every entry names a fixture that exists, a format sapper knows and known kinds;
    every fixture is described; no file is over the excerpt size limit."""
    described = {e.file for e in ENTRIES}
    on_disk = {
        str(p.relative_to(LOGS)) for p in LOGS.rglob("*") if p.is_file() and p.name != EXPECTED.name
    }
    assert described == on_disk
    for e in ENTRIES:
        assert e.format in FORMATS, e.file
        assert e.source and e.what_happened, e.file
        kinds = {x.kind for x in e.must_fire} | set(e.must_not)
        assert kinds <= KIND_CODES.keys(), (e.file, kinds - KIND_CODES.keys())
        assert not {x.kind for x in e.must_fire} & set(e.must_not), e.file
        assert (LOGS / e.file).stat().st_size <= 200 * 1024, e.file
    assert set(OPEN) <= described


def _cases() -> list[Any]:
    cases = []
    for e in ENTRIES:
        marks = []
        if e.file in OPEN:
            marks.append(pytest.mark.xfail(reason=OPEN[e.file], strict=True))
        if e.format == "wandb" and importlib.util.find_spec("wandb") is None:
            marks.append(pytest.mark.skip(reason="reading .wandb files needs sapper[wandb]"))
        cases.append(pytest.param(e, id=e.file, marks=marks))
    return cases


@pytest.mark.parametrize("entry", _cases())
def test_real_log(entry: Entry) -> None:
    payload = _analyze(entry)
    assert payload["summary"].get("unreadable") in (None, []), payload["summary"]["unreadable"]
    (log,) = payload["summary"]["logs"]
    assert log["format"] == entry.format, f"{entry.file}: read as {log['format']}"
    assert log["records"] >= 1
    findings = payload["findings"]
    missing = [f"{x.kind}@{x.step}" for x in entry.must_fire if not _fired(x, findings, log)]
    alarms = [a for kind in entry.must_not for a in _false_alarms(kind, findings, log)]
    found = sorted({(f["code"], f.get("step")) for f in findings}, key=str)
    assert not missing and not alarms, (
        f"{entry.file}: {entry.what_happened.strip()}\n"
        f"  missing: {missing}\n  false alarms: {alarms}\n  found: {found}"
    )
