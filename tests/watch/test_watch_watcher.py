"""The watch loop: idle stop, incremental detector state, stored findings, plan, filters,
and the actions run on findings (--exec, --findings-out)."""

from __future__ import annotations

import json
import sys
import time

import pytest
from watchkit import Recorder, first_nonfinite, megatron_lines, runlog_lines

from sapper.errors import InputError
from sapper.rules.model import Severity
from sapper.runtime.detector import Detector
from sapper.runtime.detectors.loss import LOSS_NONFINITE
from sapper.watch import ExecAction, FindingsFile, Watcher, open_follower, watch_detectors


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")


def test_stops_when_the_writer_is_gone_for_the_idle_timeout(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run))
    rec = Recorder()
    begin = time.monotonic()
    result = Watcher(open_follower(log), poll=0.1, idle_timeout=0.6, sinks=[rec]).run()
    elapsed = time.monotonic() - begin
    assert result.reason == "idle"
    assert 0.6 <= elapsed < 3.0
    assert result.records == len(fault_run) == len(rec.seen)
    nan = first_nonfinite(fault_run)
    assert ("R001", nan.step) in {(f.code, f.step) for f in result.findings}


def test_idle_timeout_also_ends_the_wait_for_a_log_that_never_comes(tmp_path):
    begin = time.monotonic()
    with pytest.raises(InputError, match="did not appear before the watch ended"):
        Watcher(open_follower(tmp_path / "never.log"), poll=0.1, idle_timeout=0.3).run()
    assert time.monotonic() - begin < 3
    (tmp_path / "out").mkdir()
    with pytest.raises(InputError, match="no log appeared in this folder"):
        Watcher(open_follower(tmp_path / "out"), poll=0.1, idle_timeout=0.3).run()
    with pytest.raises(InputError, match="no event file appeared"):
        Watcher(open_follower(tmp_path / "out", "tensorboard"), poll=0.1, idle_timeout=0.3).run()


def test_detector_state_carries_over_between_polls(tmp_path, fault_run):
    """Fed in many small pieces, the detectors find exactly what one pass finds."""
    log = tmp_path / "train.log"
    lines = megatron_lines(fault_run)
    log.write_text("")
    rec = Recorder()
    watcher = Watcher(open_follower(log), poll=0.05, idle_timeout=0, sinks=[rec])
    for i in range(0, len(lines), 7):
        with open(log, "a") as fh:
            fh.write("\n".join(lines[i : i + 7]) + "\n")
        watcher.tick()
    result = watcher.close()
    whole = Watcher(open_follower(log), idle_timeout=0)
    whole.tick()
    once = whole.close()
    assert [r.step for r in rec.seen] == [r.step for r in fault_run]
    assert {(f.code, f.step) for f in result.findings} == {(f.code, f.step) for f in once.findings}
    assert result.findings


def test_findings_stored_by_the_live_monitor_are_reported(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    stored = LOSS_NONFINITE.finding("loss is nan at step 3 (from the monitor)", step=3)
    lines = runlog_lines(fault_run[:5])
    lines.insert(4, json.dumps({"kind": "finding", **stored.to_json()}))
    _write(log, lines)
    watcher = Watcher(open_follower(log), idle_timeout=0)
    watcher.tick()
    result = watcher.close()
    assert [(f.code, f.step, f.message) for f in result.findings] == [
        ("R001", 3, "loss is nan at step 3 (from the monitor)")
    ]


def test_select_and_ignore(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run))

    def codes(select, ignore):
        watcher = Watcher(open_follower(log), idle_timeout=0, select=select, ignore=ignore)
        watcher.tick()
        return {f.code for f in watcher.close().findings}

    everything = codes([], [])
    loss = {c for c in everything if c.startswith("R00")}
    assert loss and loss != everything
    assert codes(["R00"], []) == loss
    assert codes([], ["R00"]) == everything - loss


def test_plan_from_the_run_log_meta_configures_the_detectors(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    lines = runlog_lines(fault_run[:3])
    meta = json.loads(lines[0])
    meta["plan"] = {"optimizer": {"lr": 3e-3}, "schedule": {"warmup_steps": 40}}
    lines[0] = json.dumps(meta)
    _write(log, lines)
    seen = []

    def factory(plan):
        seen.append(plan)
        return watch_detectors(plan)

    watcher = Watcher(open_follower(log), detectors=factory, idle_timeout=0)
    watcher.tick()
    watcher.close()
    assert seen[0] is not None and seen[0].schedule.warmup_steps == 40

    meta["plan"] = {"optimizer": {"lr": "fast"}}
    lines[0] = json.dumps(meta)
    _write(log, lines)
    watcher = Watcher(open_follower(log), idle_timeout=0)
    watcher.tick()
    assert any("plan stored in the run log is not valid" in n for n in watcher.close().notes)


def test_a_broken_detector_is_reported_and_the_others_go_on(tmp_path, fault_run):
    class Broken(Detector):
        def update(self, record):
            raise ZeroDivisionError("bug")

    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run))
    watcher = Watcher(
        open_follower(log), detectors=lambda p: [Broken(), *watch_detectors(p)], idle_timeout=0
    )
    watcher.tick()
    result = watcher.close()
    assert any("detector Broken failed" in n for n in result.notes)
    assert any(f.code == "R001" for f in result.findings)


def test_bad_poll_and_idle_values_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="--poll"):
        Watcher(open_follower(tmp_path / "x.log"), poll=0)
    with pytest.raises(InputError, match="--idle-timeout"):
        Watcher(open_follower(tmp_path / "x.log"), idle_timeout=-1)


# ---- actions --------------------------------------------------------------------------
def _run_with(tmp_path, fault_run, *sinks):
    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run))
    watcher = Watcher(open_follower(log), idle_timeout=0, sinks=list(sinks))
    for sink in sinks:
        sink.start(watcher)
    watcher.tick()
    return watcher.close()


def test_exec_receives_each_error_as_json_on_stdin(tmp_path, fault_run, monkeypatch):
    script = tmp_path / "page.py"
    script.write_text(
        "import json, os, sys\n"
        "f = json.load(sys.stdin)\n"
        "out = os.path.join(os.environ['OUT'], f['code'] + '-' + str(f['step']) + '.json')\n"
        "json.dump({'finding': f, 'env': os.environ['SAPPER_CODE']}, open(out, 'w'))\n"
    )
    out = tmp_path / "paged"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    action = ExecAction(f"{sys.executable} {script}", Severity.ERROR, timeout=30)
    result = _run_with(tmp_path, fault_run, action)
    errors = [f for f in result.findings if f.severity == Severity.ERROR]
    assert errors and len(action.runs) == len(errors)
    assert all(run.returncode == 0 and not run.error for run in action.runs)
    for f in errors:
        paged = json.loads((out / f"{f.code}-{f.step}.json").read_text())
        assert paged["finding"]["message"] == f.message and paged["env"] == f.code
        assert paged["finding"]["fix"] and paged["finding"]["severity"] == "error"


def test_exec_on_warning_includes_warnings(tmp_path, fault_run):
    action = ExecAction("cat > /dev/null", Severity.WARNING, timeout=30)
    result = _run_with(tmp_path, fault_run, action)
    counted = [f for f in result.findings if f.severity in (Severity.WARNING, Severity.ERROR)]
    assert len(action.runs) == len(counted) > result.count(Severity.ERROR)


def test_exec_failures_and_hangs_are_notes_not_errors(tmp_path, fault_run):
    failing = ExecAction("echo 'no pager configured' >&2; exit 3", timeout=30)
    result = _run_with(tmp_path, fault_run, failing)
    assert failing.runs and all(r.returncode == 3 for r in failing.runs)
    assert any("failed: exit status 3 (no pager configured)" in n for n in result.notes)

    begin = time.monotonic()
    hanging = ExecAction("sleep 30", timeout=0.3)
    result = _run_with(tmp_path, fault_run, hanging)
    assert time.monotonic() - begin < 10
    assert hanging.runs and all("timed out after 0.3 s" in r.error for r in hanging.runs)
    assert any("timed out" in n for n in result.notes)


def test_exec_arguments_are_checked():
    with pytest.raises(InputError, match="--exec"):
        ExecAction("  ")
    with pytest.raises(InputError, match="--exec-timeout"):
        ExecAction("true", timeout=0)


def test_findings_file_gets_one_json_line_per_finding(tmp_path, fault_run):
    out = tmp_path / "findings" / "watch.jsonl"
    out.parent.mkdir()
    out.write_text('{"kind": "finding", "code": "R999"}\n')  # appended to, never replaced
    result = _run_with(tmp_path, fault_run, FindingsFile(out))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["code"] == "R999"
    assert [(d["code"], d["step"]) for d in lines[1:]] == [
        (f.code, f.step) for f in result.findings
    ]
    assert all(d["kind"] == "finding" for d in lines)


def test_findings_file_that_cannot_be_opened_is_an_input_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    sink = FindingsFile(blocker / "sub" / "findings.jsonl")
    with pytest.raises(InputError, match="--findings-out"):
        sink.start(Watcher(open_follower(tmp_path / "x.log")))


def test_detectors_are_told_the_framework_the_log_shows(tmp_path):
    """A Megatron fp16 log whose unscaled norm (200) is a fifth of a loss scale of 1024,
    with a flat loss: read as an unknown framework that is R032's signature; as the
    Megatron log it is, GradScaler rules do not apply."""
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
    line = (fixture / "megatron-345m-fp16-2000it.log").read_text().splitlines()[0]
    lines = []
    for i in range(40):
        it = 3000 + 10 * i
        text = line.replace("     100/", f"{it:8d}/").replace("3.700", "200.0")
        lines.append(text.replace("9.654853E+00", "3.000000E+00").replace("262144.0", "1024.0"))
    log = tmp_path / "train.log"
    _write(log, lines)
    seen = []

    def factory(plan):
        seen.extend(watch_detectors(plan))
        return seen

    watcher = Watcher(open_follower(log), detectors=factory, idle_timeout=0)
    watcher.tick()
    result = watcher.close()
    assert result.records == 40
    assert {d.framework for d in seen} == {"megatron"}
    assert "R032" not in {f.code for f in result.findings}
