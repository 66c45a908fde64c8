"""A writer process replays a real fault run while ``sapper watch`` follows the log.

Each test starts the watcher before the log exists, starts a writer process that
appends the run's records at speed, and measures the latency between the moment the
faulty record reached the file (the writer's clock, right after its flush) and the
moment the watcher emitted the finding. It must be at most one poll interval, plus a
scheduling allowance for a loaded CI machine. The findings must also be the ones
``sapper analyze`` reports on the finished log: live and offline share one code path.
"""

from __future__ import annotations

import json
from pathlib import Path

from watchkit import (
    SPIKE_STEP,
    Recorder,
    Running,
    first_nonfinite,
    megatron_lines,
    runlog_lines,
    start_tb_writer,
    start_writer,
)

from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.watch import Watcher, open_follower, watch_detectors

POLL = 0.5
#: Allowance for thread and process scheduling on a busy 2-core machine.
SLACK = 0.35


def _watch(path: Path | str, **kwargs: object) -> tuple[Recorder, Running]:
    rec = Recorder()
    watcher = Watcher(open_follower(path), poll=POLL, idle_timeout=0, sinks=[rec], **kwargs)
    return rec, Running(watcher)


def _latency(rec: Recorder, run: Running, code: str, step: int, written: float) -> float:
    fired = run.wait_for(lambda: rec.first(code, step) is not None, timeout=10)
    got = [(e.finding.code, e.finding.step) for e in rec.emitted]
    assert fired, f"{code} at step {step} never fired; got {got}"
    emitted = rec.first(code, step)
    assert emitted is not None
    return emitted.at - written


def _offline(path: Path) -> set[tuple[str, int | None]]:
    analysis = analyze_log(read_log(path), watch_detectors(None))
    return {(f.code, f.step) for f in analysis.findings}


def test_runlog_nan_and_spike_fire_within_one_poll(tmp_path, fault_run):
    src = tmp_path / "lines.jsonl"
    src.write_text("\n".join(runlog_lines(fault_run)) + "\n")
    nan = first_nonfinite(fault_run)
    spike_line, nan_line = SPIKE_STEP, nan.step  # line 0 is the meta line
    log = tmp_path / "run.jsonl"
    rec, run = _watch(log)
    stamps = tmp_path / "stamps.json"
    writer = start_writer(src, log, "--rate", "500", "--mark", str(spike_line), str(nan_line),
                          "--stamps", str(stamps))
    assert writer.wait(30) == 0
    written = {int(k): v for k, v in json.loads(stamps.read_text()).items()}
    nan_latency = _latency(rec, run, "R001", nan.step, written[nan_line])
    spike_latency = _latency(rec, run, "R002", SPIKE_STEP, written[spike_line])
    result = run.stop()
    print(f"run log: spike latency {spike_latency:.3f} s, NaN latency {nan_latency:.3f} s")
    assert nan_latency <= POLL + SLACK
    assert spike_latency <= POLL + SLACK
    assert result.records == len(fault_run)
    assert {(f.code, f.step) for f in result.findings} == _offline(log)


def test_megatron_nan_fires_within_one_poll(tmp_path, fault_run):
    lines = megatron_lines(fault_run)
    src = tmp_path / "lines.log"
    src.write_text("\n".join(lines) + "\n")
    nan = first_nonfinite(fault_run)
    nan_line = next(i for i, line in enumerate(lines) if f"iteration {nan.step:8d}/" in line)
    log = tmp_path / "train.log"
    rec, run = _watch(log)
    stamps = tmp_path / "stamps.json"
    writer = start_writer(src, log, "--rate", "500", "--mark", str(nan_line),
                          "--stamps", str(stamps))
    assert writer.wait(30) == 0
    written = json.loads(stamps.read_text())[str(nan_line)]
    latency = _latency(rec, run, "R001", nan.step, written)
    result = run.stop()
    print(f"megatron: NaN latency {latency:.3f} s")
    assert latency <= POLL + SLACK
    assert result.format == "megatron"
    assert result.records == len(fault_run)
    assert {(f.code, f.step) for f in result.findings} == _offline(log)


def test_last_record_before_the_job_dies_still_fires_within_one_poll(tmp_path, fault_run):
    """Megatron lines are merged per step, so the newest step waits for the next one;
    when the writer goes quiet after the NaN line, the watcher must not wait for it."""
    nan = first_nonfinite(fault_run)
    lines = megatron_lines([r for r in fault_run if r.step <= nan.step])
    src = tmp_path / "lines.log"
    src.write_text("\n".join(lines) + "\n")
    log = tmp_path / "train.log"
    rec, run = _watch(log)
    stamps = tmp_path / "stamps.json"
    writer = start_writer(src, log, "--rate", "500", "--mark", str(len(lines) - 1),
                          "--stamps", str(stamps), "--linger", "0")
    assert writer.wait(30) == 0
    written = json.loads(stamps.read_text())[str(len(lines) - 1)]
    latency = _latency(rec, run, "R001", nan.step, written)
    run.stop()
    print(f"megatron, NaN as the last line: latency {latency:.3f} s")
    assert latency <= POLL + SLACK


def test_tensorboard_run_written_by_summarywriter(tmp_path, fault_run):
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(json.dumps(r.to_json()) for r in fault_run) + "\n")
    nan = first_nonfinite(fault_run)
    logdir = tmp_path / "runs" / "exp1"
    rec, run = _watch(logdir)
    stamps = tmp_path / "stamps.json"
    writer = start_tb_writer(records, logdir, "--rate", "200", "--mark", str(nan.step),
                             "--stamps", str(stamps))
    assert writer.wait(60) == 0
    written = json.loads(stamps.read_text())[str(nan.step)]
    latency = _latency(rec, run, "R001", nan.step, written)
    result = run.stop()
    print(f"tensorboard: NaN latency {latency:.3f} s")
    assert latency <= POLL + SLACK
    assert result.format == "tensorboard"
    assert result.records == len(fault_run)
    assert [r.step for r in rec.seen] == [r.step for r in fault_run]
    assert {(f.code, f.step) for f in result.findings} == _offline(logdir)
