"""A gradient norm that sits at the loss scale times a plausible norm from a run's first
logged step, under a GradScaler's power-of-two scale, is R032 within a few steps (a run
that applies scaled gradients may die before 20 logged steps); the columnar twin gives
the same findings as the streaming detector; a run whose norms are unscaled, a log that
starts mid-run, and a norm that was unscaled before it grew keep the 20-step rule."""

from __future__ import annotations

import json
from pathlib import Path

from sapper.logs import read_log
from sapper.logs.columnar import ColumnarLog, read_columnar
from sapper.pipeline.logs import analyze_logs


def _runlog(path: Path, rows: list[dict]) -> Path:
    meta = {"kind": "meta", "version": 1, "source": "sapper.Monitor", "framework": "torch"}
    lines = [json.dumps(meta)] + [json.dumps({"kind": "step", **r}) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _findings(path: Path, columnar: bool) -> list[tuple[str, int | None]]:
    log = read_columnar(path, "sapper", min_bytes=0) if columnar else read_log(path)
    assert isinstance(log, ColumnarLog) == columnar
    (analysis,) = analyze_logs([log], None, [], [])
    return sorted((f.code, f.step) for f in analysis.findings if f.code == "R032")


def _scaled_rows(steps: int, scale: float = 65536.0, norm: float = 1.5) -> list[dict]:
    """A run applying scaled gradients: the loss climbs from the first step (then it
    dies: the log ends)."""
    return [{"step": s, "loss": 5.5 + 0.2 * s, "grad_norm": scale * norm * (1 + 0.1 * s),
             "loss_scale": scale} for s in range(steps)]


def test_scaled_norms_from_the_first_step_fire_within_a_few_steps(tmp_path: Path) -> None:
    path = _runlog(tmp_path / "run.jsonl", _scaled_rows(5))
    streamed = _findings(path, columnar=False)
    assert streamed and streamed[0][1] <= 3
    assert _findings(path, columnar=True) == streamed


def test_unscaled_norms_and_a_non_grad_scaler_scale_do_not(tmp_path: Path) -> None:
    unscaled = [{"step": s, "loss": 5.0, "grad_norm": 1.2, "loss_scale": 65536.0}
                for s in range(30)]
    path = _runlog(tmp_path / "unscaled.jsonl", unscaled)
    assert _findings(path, columnar=False) == _findings(path, columnar=True) == []
    # a scale that is no power of two is no GradScaler's: the 20-step rule holds
    odd = _runlog(tmp_path / "odd.jsonl", _scaled_rows(5, scale=50000.0))
    assert _findings(odd, columnar=False) == _findings(odd, columnar=True) == []


def test_a_log_from_mid_run_or_after_unscaled_norms_keeps_the_long_rule(tmp_path: Path) -> None:
    late = [{**r, "step": r["step"] + 5000} for r in _scaled_rows(5)]
    path = _runlog(tmp_path / "late.jsonl", late)
    assert _findings(path, columnar=False) == _findings(path, columnar=True) == []
    before = [{"step": s, "loss": 5.0, "grad_norm": 1.0, "loss_scale": 65536.0}
              for s in range(3)]
    after = [{**r, "step": r["step"] + 3} for r in _scaled_rows(5)]
    path = _runlog(tmp_path / "grew.jsonl", before + after)
    assert _findings(path, columnar=False) == _findings(path, columnar=True) == []
