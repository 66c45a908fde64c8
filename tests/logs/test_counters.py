"""Count columns read as flags, per-record counts or running totals, from their values."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sapper.logs import MegatronParser, TableParser, read_log
from sapper.logs.analysis import analyze_log
from sapper.runtime.detectors.scaler import ScalerDetector


def _csv(tmp_path: Path, rows: list[tuple[int, int]], column: str = "skipped") -> Path:
    path = tmp_path / "m.csv"
    body = "".join(f"{s},{2.0 - s / 1000:.4f},65536,{k}\n" for s, k in rows)
    path.write_text(f"step,loss,loss_scale,{column}\n" + body)
    return path


def test_a_running_total_is_differentiated_and_named(tmp_path: Path) -> None:
    # one overflow at step 5 early on, then a healthy fp16 run: the total stays at 1
    rows = [(s, 0 if s < 5 else 1) for s in range(1, 301)]
    log = read_log(_csv(tmp_path, rows))
    assert [r.step for r in log.records if r.skipped] == [5]
    assert {r.skipped_total for r in log.records[10:]} == {1}
    assert any("'skipped' never decreases: read as a running total" in n for n in log.notes)
    analysis = analyze_log(log, [ScalerDetector()])
    assert [f for f in analysis.findings if f.code == "R031"] == []


def test_a_count_that_falls_is_per_record(tmp_path: Path) -> None:
    rows = [(s, 1 if s in (50, 120) else 0) for s in range(1, 201)]
    log = read_log(_csv(tmp_path, rows))
    assert [r.step for r in log.records if r.skipped] == [50, 120]
    assert any("fell from 1 to 0 at step 51" in n for n in log.notes)


def test_two_skips_in_a_row_are_told_by_the_falling_loss_scale(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    rows = [(s, 65536.0, 0) for s in range(1, 50)]
    rows += [(50, 32768.0, 1), (51, 16384.0, 1)] + [(s, 16384.0, 0) for s in range(52, 80)]
    path.write_text("step,loss_scale,skipped\n" + "".join(f"{s},{c},{k}\n" for s, c, k in rows))
    log = read_log(path)
    assert [r.step for r in log.records if r.skipped] == [50, 51]


def test_boolean_cells_and_flag_names_are_flags(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [{"step": s, "loss": 2.0, "skipped": s >= 3} for s in range(1, 8)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [r.skipped for r in read_log(path).records] == [False, False] + [True] * 5
    rows2 = [(s, 1 if s >= 3 else 0) for s in range(1, 8)]
    log = read_log(_csv(tmp_path, rows2, column="overflow"))
    assert [r.skipped for r in log.records] == [False, False] + [True] * 5


def test_a_total_resets_with_its_attempt(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    totals = [(1, 0), (2, 1), (3, 2), (4, 3), (3, 0), (4, 1), (5, 1)]  # restart at 3
    path.write_text("\n".join(json.dumps({"step": s, "skipped": k}) for s, k in totals) + "\n")
    log = read_log(path)
    assert len(log.attempts) == 2
    news = [r.extra.get("skipped_in_interval") for r in log.records]
    assert news == [0, 1, 1, 1, 0, 1, 0]
    assert [r.skipped_total for r in log.records] == [0, 1, 2, 3, 0, 1, 1]


def _line(step: int, skipped: int, nan: int = 0, loss: str | None = "2.0E+00") -> str:
    lm = f"lm loss: {loss} | " if loss else ""
    return (
        f" iteration {step:8d}/    1000 | {lm}loss scale: 1024.0 | "
        f"number of skipped iterations: {skipped:3d} | number of nan iterations: {nan:3d} |"
    )


def test_megatron_counts_are_per_interval() -> None:
    parser = MegatronParser()
    lines = [_line(10, 0), _line(20, 3), _line(30, 3), _line(40, 0), _line(50, 1)]
    records = parser.feed(lines) + parser.finish()
    assert [r.extra["skipped_in_interval"] for r in records] == [0, 3, 3, 0, 1]
    assert [r.skipped_total for r in records] == [0, 3, 6, 6, 7]
    assert not any("running total" in n for n in parser.notes)


def test_megatron_fork_printing_running_totals() -> None:
    parser = MegatronParser()
    lines = [_line(10, 0), _line(20, 4), _line(30, 15), _line(40, 15), _line(50, 16)]
    records = parser.feed(lines) + parser.finish()
    assert [r.extra["skipped_in_interval"] for r in records] == [0, 4, 11, 0, 1]
    assert any("reached 15 at step 30" in n for n in parser.notes)


def test_megatron_nan_iterations_make_a_missing_loss_nan() -> None:
    parser = MegatronParser()
    records = parser.feed([_line(10, 0), _line(20, 0, nan=2, loss=None), _line(30, 0)])
    records += parser.finish()
    assert records[1].loss != records[1].loss  # NaN
    assert records[2].loss == 2.0


def test_counters_read_the_same_in_chunks(tmp_path: Path) -> None:
    lines = ["step,skipped"] + [f"{s},{s // 40}" for s in range(1, 200)]
    whole = TableParser("csv")
    expected = whole.feed(lines) + whole.finish()
    chunked = TableParser("csv")
    got = []
    for i in range(0, len(lines), 7):
        got += chunked.feed(lines[i : i + 7])
        got += chunked.merger.settle() if i % 21 == 0 else []
    got += chunked.finish()
    assert [r.to_json() for r in got] == [r.to_json() for r in expected]
    assert sum(bool(r.skipped) for r in got) == 4


def test_a_tokens_column_that_counts_the_run_so_far(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    rows = "".join(f"{s},{2.0},{s * 4096}\n" for s in range(10, 501, 10))
    path.write_text("step,loss,tokens\n" + rows)
    log = read_log(path)
    assert {r.tokens for r in log.records[2:]} == {4096}
    assert log.records[5].extra["tokens_total"] == 60 * 4096
    assert any("'tokens' grows with the step" in n for n in log.notes)


def test_a_batch_size_ramp_is_not_a_total(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    sizes = [32, 64, 96, 128, *[160] * 20]  # the ramp: below one sample per step so far
    rows = "".join(f"{100 * (i + 1)},{2.0},{b}\n" for i, b in enumerate(sizes))
    path.write_text("step,loss,global_batch_size\n" + rows)
    log = read_log(path)
    assert [r.samples for r in log.records[:5]] == [32, 64, 96, 128, 160]
    assert not any("consumed so far" in n for n in log.notes)


def _ds_line(step: int, loss: str | None, skipped: int = 0, tail: str = "") -> str:
    """A Megatron-DeepSpeed line: the counters read 0 under DeepSpeed."""
    lm = f"lm loss: {loss} | " if loss else ""
    return (
        f" iteration {step:8d}/  250000 | learning rate: 2.999E-04 | global batch size: 8 | "
        f"{lm}loss scale: 1.0 | grad norm: 0.5 | number of skipped iterations: {skipped:3d} | "
        f"number of nan iterations:   0 |{tail}"
    )


def test_a_line_without_its_loss_is_a_nan_loss_unless_all_was_skipped() -> None:
    parser = MegatronParser()
    lines = [_ds_line(1, "2.0E+00"), _ds_line(2, None), _ds_line(3, None, skipped=1),
             _ds_line(4, "1.9E+00")]
    records = parser.feed(lines) + parser.finish()
    losses = [r.loss for r in records]
    assert losses[0] == 2.0 and losses[1] != losses[1] and losses[2] is None
    assert any("step 2: the iteration line has no loss" in n for n in parser.notes)
    assert all("_no_loss" not in r.extra for r in records)


def test_a_line_cut_before_its_loss_or_in_another_format_is_not_nan() -> None:
    parser = MegatronParser()
    wrapped = " iteration   42780/ 115311 | consumed samples:    71455664 | elapsed time per"
    old_format = " iteration      400/    3000 | lm loss 6.758929E+00 | loss scale 64.0 |"
    cut_after = " iteration     3385/    8000 | global batch size:    64 | loss scale: 1.0 | gr"
    records = parser.feed([wrapped, old_format, cut_after]) + parser.finish()
    assert [r.loss for r in records[:2]] == [None, 6.758929]  # the colon-less early format
    assert records[1].loss_scale == 64.0
    assert records[2].loss != records[2].loss  # it got past where the loss is printed


def test_a_late_validation_record_is_not_a_nan_loss() -> None:
    parser = MegatronParser()
    got = parser.feed([_ds_line(10, "2.0E+00")]) + parser.merger.settle()
    got += parser.feed([" validation loss at iteration 10 | lm loss value: 2.1E+00 |",
                        _ds_line(20, "1.9E+00")]) + parser.finish()
    assert [(r.step, r.loss, r.eval_loss) for r in got] == [
        (10, 2.0, None), (10, None, 2.1), (20, 1.9, None)
    ]


def test_a_nan_count_makes_a_missing_loss_nan_next_to_other_losses() -> None:
    parser = MegatronParser()
    line = (" iteration       20/    1000 | z loss: 1.0E-03 | loss scale: 1.0 | "
            "number of skipped iterations:   0 | number of nan iterations:   1 |")
    records = parser.feed([_line(10, 0), line, _line(30, 0)]) + parser.finish()
    assert math.isnan(records[1].loss) and records[1].extra["z_loss"] == 1.0e-3
