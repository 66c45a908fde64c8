"""TensorBoard runs written by torch's SummaryWriter, read back with tensorboard."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sapper.logs import LogSource, expand_paths, read_log

SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter


def _hf_style(logdir: Path, steps: range) -> None:
    """Tags as the HF Trainer's TensorBoardCallback writes them."""
    writer = SummaryWriter(str(logdir))
    for step in steps:
        writer.add_scalar("train/loss", 4.0 / math.sqrt(step), step)
        writer.add_scalar("train/grad_norm", math.nan if step == 30 else 0.8, step)
        writer.add_scalar("train/learning_rate", 1e-4, step)
        writer.add_scalar("train/epoch", step / 100, step)
        if step % 20 == 0:
            writer.add_scalar("eval/loss", 3.0 / math.sqrt(step), step)
            writer.add_scalar("eval/runtime", 12.5, step)
    writer.add_scalar("train/train_loss", 1.23, steps[-1])  # the run's average, once
    writer.add_text("notes", "<script>alert(1)</script>", 0)
    writer.close()


def test_hf_tags_map_to_fields(tmp_path: Path) -> None:
    _hf_style(tmp_path / "run", range(10, 101, 10))
    log = read_log(tmp_path / "run")
    assert log.format == "tensorboard"
    assert [r.step for r in log.records] == list(range(10, 101, 10))
    by = {r.step: r for r in log.records}
    assert by[40].loss == pytest.approx(4.0 / math.sqrt(40))
    assert math.isnan(by[30].grad_norm)
    assert by[20].eval_loss == pytest.approx(3.0 / math.sqrt(20), rel=1e-6)
    assert by[10].eval_loss is None
    assert by[10].lr == pytest.approx(1e-4)
    assert by[50].extra["train/epoch"] == pytest.approx(0.5)
    assert by[40].extra["eval/runtime"] == pytest.approx(12.5)
    # the once-logged average never replaces the curve
    assert by[100].loss == pytest.approx(0.4)
    assert by[10].time is not None


def test_megatron_tags_and_units(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path))
    for it in (10, 20, 30):
        writer.add_scalar("lm loss", 7.0 - it / 10, it)
        writer.add_scalar("lm loss vs samples", 7.0 - it / 10, it * 256)
        writer.add_scalar("grad-norm", 2.5, it)
        writer.add_scalar("learning-rate", 1.5e-4, it)
        writer.add_scalar("loss-scale", 65536.0 / it, it)
        writer.add_scalar("mem-allocated-bytes", 6 * 2**30, it)
        writer.add_scalar("iteration-time", 0.86, it)
    writer.add_scalar("lm loss validation", 6.5, 30)
    writer.close()
    log = read_log(tmp_path)
    assert [r.step for r in log.records] == [10, 20, 30]  # "vs samples" x-axes skipped
    last = log.records[-1]
    assert last.loss == pytest.approx(4.0)
    assert last.loss_scale == pytest.approx(65536.0 / 30)
    assert last.memory_allocated_gib == pytest.approx(6.0)
    assert last.step_time_s == pytest.approx(0.86)
    assert last.eval_loss == pytest.approx(6.5)


def test_poll_follows_a_growing_run(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path))
    for step in range(1, 6):
        writer.add_scalar("train/loss", 1.0 / step, step)
    writer.flush()
    source = LogSource(tmp_path)
    first = source.poll()
    assert [r.step for r in first] == [1, 2, 3, 4]  # the last step may still get tags
    for step in range(6, 9):
        writer.add_scalar("train/loss", 1.0 / step, step)
    writer.close()
    second = source.poll() + source.close()
    assert [r.step for r in second] == [5, 6, 7, 8]


def test_parent_folder_expands_to_one_entry_per_run(tmp_path: Path) -> None:
    _hf_style(tmp_path / "runs" / "May14_10-02-11_node1", range(10, 31, 10))
    _hf_style(tmp_path / "runs" / "May15_08-00-00_node1", range(10, 31, 10))
    expanded = expand_paths([tmp_path / "runs"])
    assert [(p.name, fmt) for p, fmt in expanded] == [
        ("May14_10-02-11_node1", "tensorboard"),
        ("May15_08-00-00_node1", "tensorboard"),
    ]
