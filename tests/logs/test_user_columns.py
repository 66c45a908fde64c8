"""The column names people give memory and throughput in their own loops' tables are
read as those fields (``mem_bytes``, ``gpu_mem_gb``, ``max_memory_allocated``,
``memory/allocated``, ``tokens_per_sec``, ``throughput``, ``samples/s``), with a note of
the mappings that convert or guess; a GPU memory column named without its unit whose
values cannot be GiB is read in bytes (or MiB); a numeric column no field reads is
listed with the field it may be. A leak logged under such names is found offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapper.logs import read_log
from sapper.logs.fields import nearest_field, resolve
from sapper.pipeline.logs import analyze_logs


@pytest.mark.parametrize(
    ("name", "field"),
    [("mem_bytes", "memory_allocated_gib"), ("gpu_mem_gb", "memory_allocated_gib"),
     ("max_memory_allocated", "memory_peak_gib"), ("memory/allocated", "memory_allocated_gib"),
     ("tokens_per_sec", "tokens_per_s"), ("throughput", "tokens_per_s"),
     ("samples/s", "samples_per_s"), ("data_wait_ms", "data_time_s"),
     ("iter_time", "step_time_s")],
)
def test_names_people_use_are_read_as_their_field(name: str, field: str) -> None:
    fm = resolve(name)
    assert fm is not None and fm.field == field


def test_a_table_in_user_columns_says_how_it_was_read(tmp_path: Path) -> None:
    path = tmp_path / "run.csv"
    rows = ["step,loss,mem_bytes,max_memory_allocated,throughput,gpu_util,loss_ema"]
    for s in range(40):
        rows.append(f"{s},{3 - s / 100},{2**30 * (10 + s / 10)},{2**30 * 20},"
                    f"{1000 + s},{90},{3 - s / 120}")
    path.write_text("\n".join(rows) + "\n")
    log = read_log(path)
    first = log.records[0]
    assert first.memory_allocated_gib == pytest.approx(10.0)
    assert first.memory_peak_gib == pytest.approx(20.0)  # bytes, read from the values
    assert first.tokens_per_s == pytest.approx(1000.0)
    (read,) = [n for n in log.notes if n.startswith("columns read as:")]
    assert "mem_bytes → memory_allocated_gib (bytes → GiB)" in read
    assert "max_memory_allocated → memory_peak_gib (bytes → GiB)" in read
    assert "throughput → tokens_per_s" in read
    (unread,) = [n for n in log.notes if n.startswith("numeric columns no field reads")]
    assert "'loss_ema' (may be loss)" in unread
    assert first.extra["gpu_util"] == 90


def test_a_memory_column_in_mib_is_read_as_mib(tmp_path: Path) -> None:
    path = tmp_path / "run.csv"
    path.write_text("step,loss,gpu_memory\n" + "".join(
        f"{s},{3 - s / 100},{30000 + s}\n" for s in range(5)))
    log = read_log(path)
    assert log.records[0].memory_allocated_gib == pytest.approx(30000 / 1024)


def test_no_near_field_for_a_trackers_counter_or_an_eval_metric() -> None:
    assert nearest_field("_runtime") is None
    assert nearest_field("eval/samples_per_second") is None
    assert nearest_field("loss_ema") == "loss"


def test_a_leak_in_user_columns_is_found_offline(tmp_path: Path) -> None:
    path = tmp_path / "run.csv"
    rows = ["step,train_loss,mem_bytes,tokens_per_sec"]
    for s in range(120):
        grown = 0.0 if s < 40 else (s - 40) * 0.05
        rows.append(f"{s},{3 - s / 1000},{2**30 * (12 + grown)},{5000}")
    path.write_text("\n".join(rows) + "\n")
    (analysis,) = analyze_logs([read_log(path)], None, [], [])
    assert "R051" in {f.code for f in analysis.findings}
