"""What the cost model knows it does not know: its calibration error and its coverage.

The step cost model is checked against published runs (:mod:`sapper.parallel.published`).
Two things follow from that check, and every speed claim sapper prints honours both:

* **A band.** The spread of ln(predicted / published) over the calibration rows says how
  far one prediction can be off beyond the model's common bias. A claim that layout A is
  r times faster than B compares two predictions, each off by its own error, so it holds
  only to ±√2 · spread (:func:`ratio_band`); a prediction against a measured run (the
  planner's layout against a published one) to the rows' root-mean-square error
  (:func:`prediction_band`). A ratio inside its band is reported as no reliable
  difference; outside, with the band.
* **A region.** The calibration covers some GPUs, ZeRO stages, recomputation modes,
  degrees and sequence lengths and no others (:class:`Region`, derived from the rows
  themselves, never written by hand). A prediction for a layout outside it (ZeRO-3, a MoE,
  TP across nodes, an uncalibrated GPU) has no evidence behind it: sapper says so instead
  of printing a speed-up (:func:`outside`).

A predicted MFU above the best that any published run reached on that GPU is a claim no
run has shown; :func:`mfu_note` says so next to it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sapper.parallel.cluster import Cluster
from sapper.parallel.efficiency import best_published_mfu
from sapper.parallel.layout import Layout, placement
from sapper.parallel.workload import Workload

__all__ = [
    "CalibrationRow",
    "Region",
    "calibration",
    "claim",
    "mfu_note",
    "outside",
    "prediction_band",
    "ratio_band",
    "region",
    "spread",
]


@dataclass(frozen=True)
class CalibrationRow:
    """One published run against the model: TFLOP/s per GPU in the source's convention."""

    name: str
    gpu: str
    convention: str
    published: float
    predicted: float

    @property
    def error(self) -> float:
        """predicted / published - 1."""
        return self.predicted / self.published - 1.0


@functools.lru_cache(maxsize=1)
def calibration() -> tuple[CalibrationRow, ...]:
    """Every published run predicted by the current model (computed once per process)."""
    from sapper.parallel.cost import predict_step
    from sapper.parallel.published import PUBLISHED_RUNS

    rows = []
    for run in PUBLISHED_RUNS:
        plan = run.to_plan()
        cost = predict_step(plan)
        pred = (
            cost.hardware_tflops_per_gpu
            if run.convention == "hardware"
            else cost.model_tflops_per_gpu
        )
        gpu = plan.gpu.name if plan.gpu else "?"
        rows.append(CalibrationRow(run.name, gpu, run.convention, run.tflops, pred))
    return tuple(rows)


def _log_errors() -> np.ndarray:
    return np.log([r.predicted / r.published for r in calibration()])


def spread() -> float:
    """Standard deviation of ln(predicted / published) over the calibration rows."""
    e = _log_errors()
    return float(np.std(e, ddof=1)) if len(e) > 1 else 0.0


def prediction_band() -> float:
    """Relative band of one prediction against a measurement: the root mean square of
    ln(predicted / published) over the calibration rows (bias included)."""
    e = _log_errors()
    return math.expm1(float(np.sqrt(np.mean(e**2)))) if len(e) else 0.0


def ratio_band() -> float:
    """Relative band of a ratio of two predictions: √2 x :func:`spread` (two errors, taken
    as independent), as a fraction (0.14 = ±14%)."""
    return math.expm1(math.sqrt(2.0) * spread())


@dataclass(frozen=True)
class Region:
    """What the calibration rows cover, as facts about their layouts and workloads."""

    gpus: frozenset[str]
    zero: frozenset[int]
    checkpointing: frozenset[str]
    implementations: frozenset[str]
    attention: frozenset[str]
    max_tp: int
    max_pp: int
    max_cp: int
    seq: tuple[int, int]
    params: tuple[float, float]
    moe: bool
    offload: bool
    tp_across_nodes: bool


@functools.lru_cache(maxsize=1)
def region() -> Region:
    """The region the calibration rows span (derived from them)."""
    from sapper.parallel.published import PUBLISHED_RUNS

    gpus, zero, ckpt, impl, attn = set(), set(), set(), set(), set()
    tps, pps, cps, seqs, params = [], [], [], [], []
    moe = offload = across = False
    for run in PUBLISHED_RUNS:
        plan = run.to_plan()
        lay = Layout.from_plan(plan)
        assert lay is not None and plan.model is not None and plan.gpu is not None
        work = Workload.from_plan(plan)
        gpus.add(plan.gpu.name)
        zero.add(lay.zero)
        ckpt.add(lay.checkpointing)
        impl.add(work.implementation)
        attn.add(work.attention)
        tps.append(lay.tp)
        pps.append(lay.pp)
        cps.append(lay.cp)
        seqs.append(work.seq_len)
        params.append(work.params)
        moe |= work.experts > 1
        offload |= lay.offload_optimizer
        across |= not placement(lay, plan.hardware.gpus_per_node).tp.intra_node
    return Region(
        gpus=frozenset(gpus), zero=frozenset(zero), checkpointing=frozenset(ckpt),
        implementations=frozenset(impl), attention=frozenset(attn), max_tp=max(tps),
        max_pp=max(pps), max_cp=max(cps), seq=(min(seqs), max(seqs)),
        params=(min(params), max(params)), moe=moe, offload=offload, tp_across_nodes=across,
    )


def _names(values: Sequence[object]) -> str:
    return ", ".join(str(v) for v in sorted(values, key=str))


def outside(layout: Layout, work: Workload, cluster: Cluster) -> list[str]:
    """Why a prediction for ``layout`` lies outside what the calibration covers (empty
    when it lies inside)."""
    reg = region()
    out: list[str] = []
    if cluster.gpu.name not in reg.gpus:
        out.append(f"no published run on {cluster.gpu.name} (calibrated: {_names(reg.gpus)})")
    if layout.zero not in reg.zero:
        out.append(f"ZeRO-{layout.zero} (calibrated: ZeRO-{_names(reg.zero)})")
    if layout.checkpointing not in reg.checkpointing:
        out.append(
            f"{layout.checkpointing} recomputation (calibrated: {_names(reg.checkpointing)})"
        )
    if work.implementation not in reg.implementations:
        out.append(
            f"{work.implementation} kernels (calibrated: {_names(reg.implementations)})"
        )
    if work.attention not in reg.attention:
        out.append(f"{work.attention} attention (calibrated: {_names(reg.attention)})")
    if work.experts > 1 and not reg.moe:
        out.append("a mixture of experts (no MoE run in the calibration)")
    if layout.offload_optimizer and not reg.offload:
        out.append("optimizer offload (no offloaded run in the calibration)")
    if layout.tp > reg.max_tp:
        out.append(f"TP{layout.tp} (calibrated: TP ≤ {reg.max_tp})")
    elif not reg.tp_across_nodes and layout.tp > 1 and not placement(
        layout, cluster.gpus_per_node
    ).tp.intra_node:
        out.append("TP across nodes (calibrated: TP inside a node)")
    if layout.pp > reg.max_pp:
        out.append(f"PP{layout.pp} (calibrated: PP ≤ {reg.max_pp})")
    if layout.cp > reg.max_cp:
        out.append(f"CP{layout.cp} (calibrated: CP ≤ {reg.max_cp})")
    lo, hi = reg.seq
    if not lo <= work.seq_len <= hi:
        out.append(f"sequence {work.seq_len} (calibrated: {lo}-{hi} tokens)")
    plo, phi = reg.params
    if not plo / 2 <= work.params <= 2 * phi:
        out.append(
            f"{work.params / 1e9:.1f}B parameters (calibrated: {plo / 1e9:.1f}B-"
            f"{phi / 1e9:.0f}B)"
        )
    return out


def claim(
    ratio: float,
    reasons: Sequence[str] = (),
    band: float | None = None,
    stated: Sequence[str] = (),
) -> tuple[str, bool]:
    """How to state that one layout's step takes ``ratio`` times another's (``ratio`` > 1:
    slower), given why either lies outside the calibration (``reasons``; those in
    ``stated`` were already said nearby and are not repeated). Returns the words and
    whether a difference is claimed at all."""
    if abs(ratio - 1) < 0.005:
        return "as fast (within 0.5%)", False
    if reasons:
        new = [r for r in dict.fromkeys(reasons) if r not in stated]
        where = f" ({'; '.join(new)})" if new else ""
        return (
            f"{_speed(ratio)} by the model, not a supported claim: outside the calibrated "
            f"region{where}",
            False,
        )
    b = ratio_band() if band is None else band
    lo, hi = ratio / (1 + b), ratio * (1 + b)
    if lo <= 1.0 <= hi:
        return (
            f"{_speed(ratio)}, within the calibrated ±{100 * b:.0f}%: no reliable difference",
            False,
        )
    if ratio >= 1:
        return f"{ratio:.2f}× slower (±{100 * b:.0f}%: {lo:.2f}-{hi:.2f}×)", True
    return (
        f"{1 / ratio:.2f}× faster (±{100 * b:.0f}%: {1 / hi:.2f}-{1 / lo:.2f}×)",
        True,
    )


def _speed(ratio: float) -> str:
    return f"{ratio:.2f}× slower" if ratio >= 1 else f"{1 / ratio:.2f}× faster"


def mfu_note(mfu: float, gpu: str) -> str | None:
    """A warning when ``mfu`` exceeds the best MFU published on ``gpu``; None otherwise."""
    best = best_published_mfu(gpu)
    if best is None or mfu <= best[0]:
        return None
    return (
        f"predicted {100 * mfu:.0f}% MFU is above the best published on {gpu} "
        f"({100 * best[0]:.0f}%: {best[1]}): no run has shown it; read it as an upper "
        "bound"
    )
