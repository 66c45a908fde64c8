"""Per-layer gradient norms (``extra["grad_norm_layers"]``, as the live monitor writes
them and the log readers fill them): dead layers (R021) and an exploding layer (R013)."""

from __future__ import annotations

import random

from sapper.runtime import DetectorSet, StepRecord
from sapper.runtime.detectors import GradNormDetector, NumericsDetector, default_detectors

LAYERS = [f"transformer.h.{i}" for i in range(6)]


def _stream(n: int = 60, seed: int = 0, edit=None) -> list[StepRecord]:
    """Healthy per-layer norms (0.2-0.6, the embedding-side first block 3× larger) with a
    global norm that is their root sum of squares."""
    rng = random.Random(seed)
    out = []
    for s in range(n):
        layers = {
            name: (3.0 if i == 0 else 1.0) * rng.uniform(0.2, 0.6)
            for i, name in enumerate(LAYERS)
        }
        if edit is not None:
            edit(s, layers)
        total = sum(v * v for v in layers.values()) ** 0.5
        out.append(StepRecord(step=s, grad_norm=total, extra={"grad_norm_layers": layers}))
    return out


def _findings(records: list[StepRecord]):
    return DetectorSet(default_detectors()).run(records)


def test_healthy_layers_are_quiet() -> None:
    codes = {f.code for f in _findings(_stream())}
    assert not codes & {"R013", "R021"}


def test_a_layer_at_exactly_zero_is_dead() -> None:
    def cut(s: int, layers: dict) -> None:
        if s >= 20:
            layers["transformer.h.4"] = 0.0

    (dead,) = [f for f in _findings(_stream(edit=cut)) if f.code == "R021"]
    assert dead.step == 24 and dead.data["layers"] == ["transformer.h.4"]
    assert "exactly 0" in dead.message


def test_a_layer_far_below_the_others_is_dead_and_a_short_dip_is_not() -> None:
    def starve(s: int, layers: dict) -> None:
        if s >= 10:
            layers["transformer.h.2"] = 1e-6

    found = [f for f in _findings(_stream(edit=starve)) if f.code == "R021"]
    assert [f.data["layers"] for f in found] == [["transformer.h.2"]]

    def blip(s: int, layers: dict) -> None:
        if s in (10, 11, 12, 30):
            layers["transformer.h.2"] = 0.0

    assert "R021" not in {f.code for f in _findings(_stream(edit=blip))}


def test_an_exploding_layer_is_named_while_the_global_norm_barely_moves() -> None:
    def explode(s: int, layers: dict) -> None:
        if s == 40:
            layers["transformer.h.5"] = 40.0  # ≈100× its own median, ≈100× the others

    records = _stream(edit=explode)
    for r in records:  # a global norm that stays flat (clipped, or another group)
        r.grad_norm = 1.5
    surge = [f for f in DetectorSet([GradNormDetector()]).run(records) if f.code == "R013"]
    assert len(surge) == 1 and surge[0].step == 40
    assert surge[0].data["layer"] == "transformer.h.5"


def test_a_small_layer_growing_but_still_below_the_others_is_not_exploding() -> None:
    def grow(s: int, layers: dict) -> None:
        layers["transformer.h.3"] = 1e-3 if s < 30 else 5e-2  # 50× its past, ≪ the others

    found = DetectorSet([GradNormDetector()]).run(_stream(edit=grow))
    assert "R013" not in {f.code for f in found}


def test_unevaluated_without_layer_norms() -> None:
    det = NumericsDetector()
    DetectorSet([det]).run([StepRecord(step=s, grad_norm=0.5) for s in range(10)])
    assert [line.split(" ")[0] for line in det.unevaluated()] == ["R020", "R021", "R022"]
    det = NumericsDetector()
    DetectorSet([det]).run(_stream(10))
    assert [line.split(" ")[0] for line in det.unevaluated()] == ["R020", "R022"]
