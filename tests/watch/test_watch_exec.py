"""``--exec`` survives any finding content and fires only for what is new.

"Already in the log" (docs/watch.md): the findings that fire while the watch reads the
part of the log that was there when it started (to its end), and the findings a sapper
run log stored there. A resumed job whose log still holds the previous attempt's NaN is
not cancelled for it unless ``--exec-existing`` asks. The commands here are real
subprocesses (a Python script that records what it received).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from watchkit import runlog_lines

from sapper.rules.model import Finding, Severity
from sapper.watch import ExecAction, Watcher, open_follower
from sapper.watch.follow import StreamFollower

#: Saves the finding read from stdin and the SAPPER_* variables, one file per call.
PAGER = """\
import json, os, sys, uuid
finding = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith("SAPPER_")}
out = os.path.join(os.environ["PAGED"], uuid.uuid4().hex + ".json")
json.dump({"finding": finding, "env": env}, open(out, "w"))
"""


def _pager(tmp_path: Path, monkeypatch) -> tuple[str, Path]:
    script = tmp_path / "pager.py"
    script.write_text(PAGER)
    paged = tmp_path / "paged"
    paged.mkdir()
    monkeypatch.setenv("PAGED", str(paged))
    return f"{sys.executable} {script}", paged


def _received(paged: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(paged.iterdir())]


def _stored(step: int, message: str) -> str:
    """A finding as the live monitor stores it in a sapper run log."""
    finding = Finding(code="R002", severity=Severity.ERROR, check="loss", title="NaN loss",
                      message=message, fix="lower the LR", step=step)
    return json.dumps({"kind": "finding", **finding.to_json()})


def _append(path: Path, lines: list[str]) -> None:
    with path.open("a") as fh:
        fh.write("\n".join(lines) + "\n")


def test_findings_before_the_start_do_not_run_exec(tmp_path, fault_run, monkeypatch):
    """The previous attempt's NaN is in the log; the watch starts; only the finding the
    job writes afterwards runs the command."""
    command, paged = _pager(tmp_path, monkeypatch)
    log = tmp_path / "run.jsonl"
    _append(log, runlog_lines(fault_run))
    action = ExecAction(command, Severity.ERROR, timeout=30)
    watcher = Watcher(open_follower(log), idle_timeout=0, sinks=[action])
    action.start(watcher)
    watcher.tick()  # reads everything that was there: the old NaN fires, no command
    old = [f for f in watcher.findings if f.severity == Severity.ERROR]
    assert old and not watcher.catching_up
    last = max(r.step for r in fault_run)
    _append(log, [_stored(last + 5, "new NaN after the resume")])
    watcher.tick()
    result = watcher.close()
    received = _received(paged)
    assert [r["finding"]["step"] for r in received] == [last + 5]
    assert action.skipped_existing == len(old)
    assert any(f"did not run for {len(old)} finding(s) already in the log" in n
               for n in result.notes), result.notes


def test_exec_existing_runs_them_too(tmp_path, fault_run, monkeypatch):
    command, paged = _pager(tmp_path, monkeypatch)
    log = tmp_path / "run.jsonl"
    _append(log, [*runlog_lines(fault_run), _stored(10**6, "stored before the start")])
    action = ExecAction(command, Severity.ERROR, timeout=30, existing=True)
    watcher = Watcher(open_follower(log), idle_timeout=0, sinks=[action])
    action.start(watcher)
    watcher.tick()
    result = watcher.close()
    errors = [f for f in result.findings if f.severity == Severity.ERROR]
    assert len(_received(paged)) == len(errors) >= 2 and action.skipped_existing == 0


def test_a_nul_and_escapes_in_a_finding_reach_the_command_intact(tmp_path, fault_run,
                                                                monkeypatch):
    """A NUL in the message once killed the worker (environment values cannot hold
    one): the finding goes whole as JSON on stdin, the variables escaped."""
    command, paged = _pager(tmp_path, monkeypatch)
    log = tmp_path / "run.jsonl"
    _append(log, runlog_lines(fault_run[:5]))
    action = ExecAction(command, Severity.ERROR, timeout=30)
    watcher = Watcher(open_follower(log), idle_timeout=0, sinks=[action])
    action.start(watcher)
    watcher.tick()
    hostile = "loss\x00 is nan \x1b[2J\u202e [bold red]x[/] " + "y" * 10_000
    _append(log, [_stored(1000, hostile), _stored(1001, "the next one still runs")])
    watcher.tick()
    result = watcher.close()
    received = _received(paged)
    by_step = {r["finding"]["step"]: r for r in received}
    assert set(by_step) == {1000, 1001}, result.notes
    assert by_step[1000]["finding"]["message"] == hostile
    env = by_step[1000]["env"]["SAPPER_MESSAGE"]
    assert "\x00" not in env and "\x1b" not in env and "\u202e" not in env
    assert env.startswith("loss\\x00 is nan \\x1b[2J\\u202e [bold red]x[/] ")
    assert len(env) < 2100 and not any("failed" in n for n in result.notes)


def test_a_pipe_holds_nothing_from_before(tmp_path, fault_run, monkeypatch):
    """``sapper watch -``: everything on the pipe is written after the watch started."""
    command, paged = _pager(tmp_path, monkeypatch)
    stream = io.BytesIO(("\n".join(runlog_lines(fault_run)) + "\n").encode())
    action = ExecAction(command, Severity.ERROR, timeout=30)
    watcher = Watcher(StreamFollower(stream), idle_timeout=0, poll=0.01, sinks=[action])
    result = watcher.run()
    errors = [f for f in result.findings if f.severity == Severity.ERROR]
    assert errors and len(_received(paged)) == len(errors)


def test_an_old_megatron_log_ending_in_nan(tmp_path, fault_run, monkeypatch):
    """Megatron's reader holds the last step until a later one shows it complete; a
    crashed run's last line is its NaN, and the file is hours old: that NaN is still
    in the log before the start, and does not run the command."""
    import os

    from watchkit import first_nonfinite, megatron_lines

    command, paged = _pager(tmp_path, monkeypatch)
    nan_at = first_nonfinite(fault_run).step
    records = [r for r in fault_run if r.step <= nan_at]
    log = tmp_path / "train.log"
    _append(log, megatron_lines(records))
    os.utime(log, (1.0e9, 1.0e9))  # written long ago
    action = ExecAction(command, Severity.ERROR, timeout=30)
    watcher = Watcher(open_follower(log), idle_timeout=0, sinks=[action])
    action.start(watcher)
    watcher.tick()
    assert any(f.step == nan_at for f in watcher.findings), watcher.findings
    watcher.close()
    assert _received(paged) == [] and action.skipped_existing >= 1

