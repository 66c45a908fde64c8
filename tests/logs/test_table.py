"""CSV and JSON-lines tables: W&B exports, hand-written tables, --map."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapper.errors import InputError
from sapper.logs import parse_mapping, read_log


def test_wandb_history_export(examples: Path) -> None:
    log = read_log(examples / "wandb-history-lr-stuck.csv")
    assert log.format == "csv"
    steps = [r.step for r in log.records]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 1995
    by = {r.step: r for r in log.records}
    assert by[5].lr == pytest.approx(3e-8)
    assert by[5].grad_norm is not None and by[5].tokens_per_s is not None
    assert by[0].memory_peak_gib is not None and by[5].memory_peak_gib is None  # sparse
    # W&B logs eval on its own row at the same global step: merged
    assert by[500].eval_loss == pytest.approx(7.825) and by[500].loss is not None
    assert by[500].extra["_step"] == 100  # W&B's log-call counter is not the step
    assert log.notes == []


PANEL_COLUMNS = [
    "Step",
    *(f"{run} - train/loss{band}" for run in ("gpt-a", "gpt-b") for band in ("", "__MIN", "__MAX")),
]
PANEL = ",".join(PANEL_COLUMNS) + """
100,3.2,3.1,3.3,4.0,3.9,4.1
200,2.9,2.8,3.0,,,
300,2.7,2.6,2.8,3.5,3.4,3.6
"""


def test_wandb_panel_export_reads_the_first_run(tmp_path: Path) -> None:
    path = tmp_path / "panel.csv"
    path.write_text(PANEL)
    log = read_log(path)
    assert [(r.step, r.loss) for r in log.records] == [(100, 3.2), (200, 2.9), (300, 2.7)]
    assert all("train/loss__MIN" not in k for r in log.records for k in r.extra)
    assert any("2 runs" in n and "'gpt-b'" in n for n in log.notes)


def test_map_names_unknown_columns(tmp_path: Path) -> None:
    path = tmp_path / "metrics.tsv"
    path.write_text("it\tobjective\tgn\tmem_mb\n1\t5.0\t0.9\t2048\n2\t4.5\t0.8\t3072\n")
    mapping = parse_mapping(
        ["it=step", "objective=loss", "gn=grad_norm", "mem_mb=memory_peak_gib*0.0009765625"]
    )
    log = read_log(path, mapping=mapping)
    assert [(r.step, r.loss, r.grad_norm, r.memory_peak_gib) for r in log.records] == [
        (1, 5.0, 0.9, 2.0),
        (2, 4.5, 0.8, 3.0),
    ]


def test_map_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="not COLUMN=FIELD"):
        parse_mapping(["loss"])
    with pytest.raises(ValueError, match="not a step-record field"):
        parse_mapping(["x=lossy"])
    with pytest.raises(ValueError, match="not a number"):
        parse_mapping(["x=loss*two"])


def test_two_columns_for_one_field_keep_the_plainer(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("step,train/train_loss,train/loss\n1,,2.0\n2,1.5,1.9\n")
    log = read_log(path)
    assert [r.loss for r in log.records] == [2.0, 1.9]
    assert any("both mean loss" in n for n in log.notes)


def test_jsonl_table_with_bad_lines(tmp_path: Path) -> None:
    rows = [{"iteration": i, "train": {"loss": 3.0 - i / 10}, "lr": 1e-3} for i in range(1, 6)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(2, "iteration 3/ 10 | lm loss: 2.0 |")  # a text line in the middle
    lines.append('{"iteration": 6, "train": {"loss": 2.4')  # torn last line
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert log.format == "jsonl"
    assert [(r.step, r.loss) for r in log.records] == [
        (i, pytest.approx(3.0 - i / 10)) for i in range(1, 6)
    ]
    assert any("2 line(s) were not JSON objects" in n and "3, 7" in n for n in log.notes)


def test_csv_without_step_column_numbers_rows(tmp_path: Path) -> None:
    path = tmp_path / "losses.csv"
    path.write_text("loss,learning_rate\n2.0,1e-4\n1.5,1e-4\nnan,1e-4\n")
    log = read_log(path)
    assert [r.step for r in log.records] == [1, 2, 3]
    assert log.records[2].loss != log.records[2].loss  # NaN kept for the detectors
    assert any("no step column" in n for n in log.notes)


def test_non_numeric_cells_and_ragged_rows(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("step,loss,grad_norm\n1,2.0,0.5\n2,oops,0.4\n3,1.8,0.3,extra,cells\n4,1.7,0.2\n")
    log = read_log(path)
    assert [(r.step, r.loss) for r in log.records] == [(1, 2.0), (2, None), (4, 1.7)]
    assert any("'loss': 1 value(s) were not numbers" in n for n in log.notes)
    assert any("malformed rows" in n and "4" in n for n in log.notes)


def test_header_only_has_no_steps(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("step,loss\n")
    with pytest.raises(InputError, match="no training steps"):
        read_log(path, fmt="csv")
