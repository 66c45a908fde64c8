"""Metric names as loggers spell them, mapped to record fields with their units."""

from __future__ import annotations

import pytest

from sapper.logs.fields import canonical


@pytest.mark.parametrize(
    ("name", "field", "factor"),
    [
        ("train/loss", "loss", 1.0),
        ("Training/Loss", "loss", 1.0),
        ("lm loss", "loss", 1.0),
        ("loss_metrics/global_avg_loss", "loss", 1.0),
        ("eval/loss", "eval_loss", 1.0),
        ("val/lm loss", "eval_loss", 1.0),
        ("lm loss validation", "eval_loss", 1.0),
        ("grad-norm", "grad_norm", 1.0),
        ("train/grad_norm", "grad_norm", 1.0),
        ("learning-rate", "lr", 1.0),
        ("lr-AdamW", "lr", 1.0),
        ("lr-AdamW/pg1", "lr", 1.0),
        ("loss-scale", "loss_scale", 1.0),
        ("number of skipped iterations", "skipped_total", 1.0),
        ("mem-allocated-bytes", "memory_allocated_gib", 1 / 2**30),
        ("memory/max_reserved(GiB)", "memory_reserved_gib", 1.0),
        ("peak_memory_mb", "memory_peak_gib", 1 / 1024),
        ("elapsed time per iteration (ms)", "step_time_s", 1e-3),
        ("perf/tokens_per_sec", "tokens_per_s", 1.0),
        ("throughput(tps)", "tokens_per_s", 1.0),
        ("train_samples_per_second", "samples_per_s", 1.0),
        ("mfu(%)", "mfu", 0.01),
    ],
)
def test_known_names(name: str, field: str, factor: float) -> None:
    fm = canonical(name)
    assert fm is not None and fm.field == field and fm.factor == pytest.approx(factor)


@pytest.mark.parametrize("name", ["eval/accuracy", "lr-AdamW/pg2", "foo/bar", "val/grad_norm"])
def test_unknown_or_eval_only_names(name: str) -> None:
    assert canonical(name) is None
