"""``sapper watch`` on the command line: exit codes, output formats, stdin, Ctrl-C."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner
from watchkit import HERE, first_nonfinite, megatron_lines, runlog_lines

from sapper.cli.app import _register_commands, app

_register_commands()
FAST = ["--poll", "0.05", "--idle-timeout", "0.4"]
CLI = [sys.executable, "-c", "from sapper.cli.app import main; main()"]


def _invoke(*args, **kwargs):
    return CliRunner().invoke(app, ["watch", *args], **kwargs)


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")


def test_fault_run_exits_1_with_one_line_per_finding(tmp_path, fault_run):
    log = tmp_path / "train.log"
    _write(log, megatron_lines(fault_run))
    res = _invoke(str(log), "--format", "plain", *FAST)
    assert res.exit_code == 1, res.output
    nan = first_nonfinite(fault_run)
    assert f"step {nan.step}: R001 error: loss is nan" in res.output
    assert "— fix: Stop and restore the last good checkpoint" in res.output
    assert f"reading {log} as a megatron log" in res.output
    assert "watch ended (the log stopped growing)" in res.output
    assert "last values at step 60: loss nan" in res.output


def test_healthy_run_exits_0(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run[:40]))
    res = _invoke(str(log), "--format", "plain", *FAST)
    assert res.exit_code == 0, res.output
    assert "0 error(s), 0 warning(s)" in res.output


def test_json_lines_output(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run))
    res = _invoke(str(log), "--format", "json", *FAST)
    objs = [json.loads(line) for line in res.output.splitlines()]
    assert objs[-1]["kind"] == "summary" and objs[-1]["records"] == len(fault_run)
    assert objs[-1]["reason"] == "idle" and objs[-1]["errors"] >= 1
    assert {"R001", "R002"} <= {o["code"] for o in objs if o["kind"] == "finding"}


def test_stdin_ends_the_watch_when_the_pipe_closes(fault_run):
    text = "\n".join(megatron_lines(fault_run)) + "\n"
    res = _invoke("-", "--format", "plain", "--poll", "0.05", input=text)
    assert res.exit_code == 1, res.output
    assert "watch ended (the input ended)" in res.output and "R001" in res.output


def test_findings_out_and_exec_from_the_command_line(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run))
    out, paged = tmp_path / "findings.jsonl", tmp_path / "paged.jsonl"
    res = _invoke(str(log), "--format", "plain", *FAST, "--findings-out", str(out),
                  "--exec", f"cat >> {paged}; echo >> {paged}", "--exec-on", "warning",
                  "--exec-existing")
    assert res.exit_code == 1, res.output
    written = [json.loads(line) for line in out.read_text().splitlines()]
    sent = [json.loads(line) for line in paged.read_text().splitlines() if line.strip()]
    # Only warnings and errors run the command; an info finding (a step-time outlier when
    # the machine is busy while the fault run is made) is written but not sent.
    paged_codes = [d["code"] for d in written if d["severity"] in ("warning", "error")]
    assert paged_codes == [d["code"] for d in sent]
    assert {"R001", "R002"} <= {d["code"] for d in sent}


def test_strict_and_select(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run))
    assert _invoke(str(log), "--format", "plain", *FAST, "--select", "R002").exit_code == 0
    res = _invoke(str(log), "--format", "plain", *FAST, "--select", "R002", "--strict")
    assert res.exit_code == 1 and "R001" not in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--poll", "0"], "--poll: must be positive"),
        (["--format", "fancy"], "--format: unknown value"),
        (["--exec-on", "fatal"], "--exec-on: unknown value"),
        (["--log-format", "parquet"], "--log-format: unknown log format"),
        (["--exec", "true", "--exec-timeout", "-1"], "--exec-timeout: must be positive"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path, args, message):
    res = _invoke(str(tmp_path / "x.log"), *args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


def test_unreadable_input_exits_2(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00\x01\x02" * 100)
    res = _invoke(str(path), *FAST)
    assert res.exit_code == 2 and "binary data, not a training log" in res.output
    notes = tmp_path / "notes.txt"
    notes.write_text("not a log\n")
    res = _invoke(str(notes), *FAST)
    assert res.exit_code == 2 and "not a log sapper can read" in res.output
    res = _invoke(str(tmp_path / "never.log"), "--format", "plain", *FAST)
    assert res.exit_code == 2 and "never.log: did not appear before the watch ended" in res.output
    res = _invoke("-", *FAST, input="")
    assert res.exit_code == 2 and "no log line arrived" in res.output


@pytest.mark.slow
def test_real_pipe_and_ctrl_c(tmp_path, fault_run):
    """``writer | sapper watch -`` in real processes; then Ctrl-C on a watch of a file."""
    src = tmp_path / "lines.log"
    _write(src, megatron_lines(fault_run))
    writer = subprocess.Popen([sys.executable, str(HERE / "writer.py"), str(src), "-",
                               "--rate", "400"], stdout=subprocess.PIPE)
    watch = subprocess.run([*CLI, "watch", "-", "--format", "plain", "--poll", "0.1"],
                           stdin=writer.stdout, capture_output=True, text=True, timeout=60)
    writer.wait(10)
    assert watch.returncode == 1, watch.stderr
    assert "R001 error" in watch.stdout and "watch ended (the input ended)" in watch.stdout

    log = tmp_path / "run.jsonl"
    _write(log, runlog_lines(fault_run))
    proc = subprocess.Popen([*CLI, "watch", str(log), "--format", "plain", "--poll", "0.1",
                             "--idle-timeout", "0"], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 30
    while b"R001" not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            seen += os.read(proc.stdout.fileno(), 1 << 16)
    assert b"R001" in seen
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 1  # the findings decide, not the interruption
    assert "watch ended (interrupted)" in rest
