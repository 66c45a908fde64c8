"""What the watch shows: sparklines, the five metrics, the live screen, the plain lines."""

from __future__ import annotations

import io
import math

from rich.console import Console
from watchkit import first_nonfinite, runlog_lines

from sapper.runtime.records import StepRecord
from sapper.watch import LiveView, MetricBoard, PlainView, Watcher, make_view, open_follower
from sapper.watch.live import JsonView, render_screen
from sapper.watch.metrics import BARS, NONFINITE_BAR, sparkline


def test_sparkline_scales_keeps_the_worst_value_and_marks_nan():
    assert sparkline([]) == ""
    assert sparkline([1.0, 2.0, 3.0, 4.0], width=4) == BARS[0] + BARS[2] + BARS[5] + BARS[-1]
    assert set(sparkline([2.0] * 5)) == {BARS[len(BARS) // 2]}
    spiky = [1.0] * 99 + [50.0]
    assert sparkline(spiky, width=10)[-1] == BARS[-1]  # one spike in a cell of ten still shows
    line = sparkline([1.0, 2.0, math.nan, 1.5], width=4)
    assert line[2] == NONFINITE_BAR and len(line) == 4
    assert len(sparkline(range(1000), width=32)) == 32


def test_metric_board_reads_the_five_metrics():
    board = MetricBoard()
    board.update([
        StepRecord(step=1, loss=2.0, grad_norm=0.5, lr=1e-4, memory_allocated_gib=10.0,
                   memory_peak_gib=30.0, memory_limit_gib=80.0, tokens=4096, step_time_s=0.5),
        StepRecord(step=2, loss=1.9, samples=8, step_time_s=0.5),
    ])
    texts = {m.label: m.text() for m in board.metrics}
    assert texts["loss"] == "1.9" and texts["grad norm"] == "0.5"
    assert texts["memory"] == "30 / 80 GiB"
    assert texts["throughput"] == "16 samples/s"  # the latest: samples / step time
    assert board.last_step == 2 and board.records == 2
    empty = MetricBoard()
    empty.update([StepRecord(step=5, loss=3.0)])
    assert "memory N/A" in empty.summary() and "throughput N/A" in empty.summary()


def _watch_log(tmp_path, records, *sinks):
    log = tmp_path / "run.jsonl"
    log.write_text("\n".join(runlog_lines(records)) + "\n")
    watcher = Watcher(open_follower(log), idle_timeout=0, sinks=list(sinks))
    for sink in sinks:
        sink.start(watcher)
    watcher.tick()
    return watcher


def test_live_screen_shows_metrics_sparklines_and_findings(tmp_path, fault_run):
    view = LiveView(Console(file=io.StringIO(), width=160))
    watcher = _watch_log(tmp_path, fault_run, view)
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render_screen(watcher, view.board, view.findings, list(view.notes)))
    text = console.export_text()
    for label in ("loss", "grad norm", "learning rate", "memory", "throughput"):
        assert label in text
    assert NONFINITE_BAR in text  # the NaN tail of the loss
    assert f"step {fault_run[-1].step:,}" in text and "sapper log" in text
    nan = first_nonfinite(fault_run)
    assert "R001 error" in text and f"loss is nan at step {nan.step}" in text
    assert "Stop and restore the last good checkpoint" in text  # the fix
    watcher.close()


def test_live_view_on_a_terminal_ends_with_the_summary(tmp_path, fault_run):
    out = io.StringIO()
    view = LiveView(Console(file=out, force_terminal=True, width=140))
    watcher = _watch_log(tmp_path, fault_run, view)
    watcher.close()
    text = out.getvalue()
    assert "watch ended" in text and "error(s)" in text and "R001" in text


def test_plain_view_prints_status_lines_when_asked(tmp_path, fault_run):
    out = io.StringIO()
    view = PlainView(out, status_every=1e-9)
    watcher = _watch_log(tmp_path, fault_run[:20], view)
    watcher.tick()
    watcher.close()
    text = out.getvalue()
    assert "step 20: loss " in text and "learning rate 0.003" in text
    assert "watch ended" in text


def test_make_view_picks_plain_lines_when_not_a_terminal():
    assert isinstance(make_view("auto", io.StringIO()), PlainView)
    assert isinstance(make_view("json", io.StringIO()), JsonView)
    assert isinstance(make_view("live", io.StringIO()), LiveView)


def test_live_view_prints_every_finding_at_the_end_when_the_screen_showed_some(tmp_path):
    from sapper.runtime.detectors.loss import LOSS_SPIKE
    from sapper.watch import WatchResult

    out = io.StringIO()
    view = LiveView(Console(file=out, force_terminal=True, width=140))
    for step in range(10, 90, 10):
        view.finding(LOSS_SPIKE.finding(f"loss spike at step {step}", step=step))
    view.end(WatchResult(path="x", format="megatron", records=90, first_step=1, last_step=90,
                         findings=view.findings, reason="idle"))
    text = out.getvalue()
    assert "all 8 findings:" in text and "loss spike at step 10" in text
    assert "0 error(s), 8 warning(s)" in text
