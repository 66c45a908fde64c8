"""Why a layout wins: seed §4.4's rules with the predicted numbers behind them.

§4.4 says: put the cheapest communication on the slowest links (TP inside the NVLink
domain, PP and DP across nodes). For each ranked layout this module states where each
group landed and what it costs (share of the step, the link's bus bandwidth), then
compares it with the best layout that decides one dimension differently (another TP,
PP, CP, ZeRO stage, recomputation, micro-batch or interleaving): how much slower it is and
which components make the difference, or that it would be faster but does not fit.

Every speed ratio is stated with the band the calibration supports, and not at all for a
layout the calibration does not cover (:mod:`sapper.parallel.confidence`); an MFU above
the best published on the GPU is flagged.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sapper.parallel.candidate import Candidate, MemoryProbe, layout_at
from sapper.parallel.cluster import Cluster
from sapper.parallel.confidence import claim, mfu_note, outside
from sapper.parallel.cost import BREAKDOWN, LayoutBatch, StepCost
from sapper.parallel.layout import Layout, placement
from sapper.parallel.workload import Workload

__all__ = ["LABELS", "compare", "explain_candidates", "placement_lines"]

LABELS = {
    "compute": "compute",
    "tp_comm": "TP comm",
    "cp_comm": "CP comm",
    "ep_comm": "EP all-to-all",
    "pp_p2p": "PP p2p",
    "bubble": "bubble",
    "dp_comm": "DP/ZeRO comm",
    "optimizer": "optimizer",
}

#: Dimensions compared, with how to name a layout's value of each.
_DIMS: dict[str, tuple[str, str]] = {
    "tp": ("tp", "TP{}"),
    "pp": ("pp", "PP{}"),
    "cp": ("cp", "CP{}"),
    "zero": ("zero", "ZeRO-{}"),
    "ckpt": ("checkpointing", "{} recompute"),
    "micro": ("micro_batch", "micro-batch {}"),
    "v": ("virtual_stages", "{} virtual stages"),
}
def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _hidden(cost: StepCost, key: str) -> str:
    """``, N% more hidden behind compute`` when the model assumes an overlap."""
    hid = cost.hidden.get(key, 0.0) / cost.step_time_s
    return f", {_pct(hid)} more hidden behind compute" if hid >= 0.0005 else ""


def placement_lines(layout: Layout, cost: StepCost, cluster: Cluster) -> list[str]:
    """Where TP, PP, CP and DP landed and what each costs (seed §4.4 made quantitative),
    and which of their collectives the model assumes hidden behind compute."""
    pl = placement(layout, cluster.gpus_per_node)
    share = cost.shares()
    where = lambda span: "inside one node" if span.intra_node else f"across {span.nodes} nodes"  # noqa: E731
    out = []
    if layout.tp > 1:
        how = " (pipelined with the GEMMs: tp_comm_overlap)" if layout.tp_comm_overlap else ""
        out.append(
            f"TP{layout.tp} {where(pl.tp)} ({cluster.bus_gbps(pl.tp):.0f} GB/s bus): "
            f"its per-layer collectives take {_pct(share['tp_comm'])} of the step{how}"
            + _hidden(cost, "tp")
        )
    else:
        out.append("no TP: no per-layer collectives")
    if layout.pp > 1:
        m, p, v = layout.grad_accum, layout.pp, layout.virtual_stages
        formula = f"(p-1)/(m+p-1) = {p - 1}/{m + p - 1}" if v == 1 else (
            f"(p-1)/(v·m) = {p - 1}/{v * m}"
        )
        out.append(
            f"PP{p} {where(pl.pp)} ({cluster.bus_gbps(pl.pp):.0f} GB/s): p2p "
            f"{_pct(share['pp_p2p'])} (not overlapped), bubble {_pct(share['bubble'])} "
            f"({formula})"
        )
    if layout.cp > 1:
        out.append(
            f"CP{layout.cp} {where(pl.cp)}: ring attention exposes {_pct(share['cp_comm'])}"
            + _hidden(cost, "cp")
        )
    if layout.dp * layout.cp > 1:
        overlaps = [
            name
            for name, on in (
                ("gradient reduction", layout.overlap_dp_comm),
                ("parameter all-gather", layout.overlap_param_gather and layout.zero >= 1),
            )
            if on
        ]
        how = f" ({' and '.join(overlaps)} overlapped)" if overlaps else " (not overlapped)"
        gb = cost.details.get("dp_bytes", 0) / 1e9
        out.append(
            f"DP{layout.dp} {where(pl.grad)} ({cluster.bus_gbps(pl.grad):.0f} GB/s), "
            f"ZeRO-{layout.zero}: {gb:.3g} GB through each GPU's link per step, "
            f"{_pct(share['dp_comm'])} exposed{how}" + _hidden(cost, "dp")
        )
    if layout.checkpointing != "none":
        out.append(f"{layout.checkpointing} recomputation: compute {_pct(share['compute'])}")
    return out


def compare(
    winner: StepCost,
    other: StepCost,
    reasons: list[str] | None = None,
    stated: list[str] | None = None,
) -> str:
    """``other`` against ``winner``: the speed ratio, stated with the calibration's band
    (or not at all outside the calibrated region: ``reasons`` says why, less those in
    ``stated``), and the two components that move most."""
    ratio = other.step_time_s / winner.step_time_s
    diffs = {
        k: (other.breakdown[k] - winner.breakdown[k]) / winner.step_time_s for k in BREAKDOWN
    }
    top = sorted(diffs, key=lambda k: -abs(diffs[k]))[:2]
    parts = [f"{LABELS[k]} {'+' if diffs[k] >= 0 else '−'}{_pct(abs(diffs[k]))}" for k in top
             if abs(diffs[k]) >= 0.001]
    text, _ = claim(ratio, reasons or (), stated=stated or ())
    if abs(ratio - 1) < 0.005:
        return text
    return text + (f" ({', '.join(parts)} of this step)" if parts else "")


def _value(layout: Layout, dim: str) -> str:
    attr, fmt = _DIMS[dim]
    val = getattr(layout, attr)
    return fmt.format(val)


def explain_candidates(
    cands: list[Candidate],
    current: Candidate | None,
    result: dict[str, np.ndarray],
    batch: LayoutBatch,
    ranking: np.ndarray,
    walk: MemoryProbe | None,
    cluster: Cluster,
    order: str,
    budget: int = 3,
    work: Workload | None = None,
) -> None:
    """Fill ``why`` for each candidate (mutates them, adding a warning when the predicted
    MFU is above the best published); ``budget`` caps the memory estimates spent per
    compared dimension. With ``work``, speed claims involving a layout outside the
    calibrated region are withheld, saying why."""
    ranked = {dim: np.asarray(getattr(batch, dim))[ranking] for dim in _DIMS}
    region = (lambda lay: outside(lay, work, cluster)) if work is not None else (
        lambda lay: []
    )
    for cand in cands:
        lay = cand.layout
        lines = [_headline(cand, cluster), *placement_lines(lay, cand.cost, cluster)]
        mine_out = region(lay)
        for dim, (attr, _) in _DIMS.items():
            mine = getattr(lay, attr)
            if dim == "ckpt":
                mine = ("none", "selective", "full").index(lay.checkpointing)
            others = ranking[ranked[dim] != mine]
            line = _alternative(
                cand, dim, others, result, batch, walk, order, budget, mine_out, region
            )
            if line:
                lines.append(line)
        if current is not None and current.layout != lay:
            reasons = mine_out + region(current.layout)
            lines.append(
                f"your layout ({current.layout.describe()}) is "
                f"{compare(cand.cost, current.cost, reasons, mine_out)}"
            )
        if mine_out:
            lines.insert(
                1,
                "outside the calibrated region: " + "; ".join(mine_out)
                + " (no published run checks the model there; its comparisons below "
                "are not supported claims)",
            )
        note = mfu_note(cand.cost.mfu, cluster.gpu.name)
        if note and note not in cand.warnings:
            cand.warnings.append(note)
        cand.why = lines


def _headline(cand: Candidate, cluster: Cluster) -> str:
    c = cand.cost
    mem = f", {cand.memory_gib:.0f} GiB of {cluster.gpu.memory_gib:g}" if cand.memory_gib else ""
    return (
        f"{c.model_tflops_per_gpu:.0f} TFLOP/s per GPU ({100 * c.mfu:.0f}% MFU), "
        f"{c.step_time_s:.2f} s per step{mem}"
    )


def _alternative(
    cand: Candidate,
    dim: str,
    others: np.ndarray,
    result: dict[str, np.ndarray],
    batch: LayoutBatch,
    walk: MemoryProbe | None,
    order: str,
    budget: int,
    mine_out: list[str] | None = None,
    region: Callable[[Layout], list[str]] | None = None,
) -> str | None:
    """The best layout deciding ``dim`` differently, and the faster ones that do not fit."""
    from sapper.parallel.cost import cost_of

    blocked: tuple[Layout, float | None] | None = None
    calls0 = walk.calls if walk else 0
    for j in others:
        j = int(j)
        ok, gib = walk.fits(j) if walk is not None else (True, None)
        if ok:
            alt = layout_at(batch, j, order)
            reasons = (mine_out or []) + (region(alt) if region is not None else [])
            text = (
                f"best with {_alt_name(alt, dim)} ({alt.describe()}): "
                f"{compare(cand.cost, cost_of(result, j, alt), reasons, mine_out)}"
            )
            if blocked is not None:
                need = f" ≥ {blocked[1]:.0f} GiB" if blocked[1] is not None else " more memory"
                text += (
                    f"; faster {_alt_name(blocked[0], dim)} layouts need{need} "
                    "(no fit with 10% headroom)"
                )
            return text
        if blocked is None and result["step_time"][j] < cand.cost.step_time_s:
            blocked = (layout_at(batch, j, order), gib)
        if walk is not None and walk.calls - calls0 >= budget:
            break
    if blocked is not None:
        need = f"≥ {blocked[1]:.0f} GiB" if blocked[1] is not None else "more memory"
        return (
            f"{_alt_name(blocked[0], dim)} would be faster but needs {need} "
            "(no fit with 10% headroom)"
        )
    return None


def _alt_name(alt: Layout, dim: str) -> str:
    if dim == "ckpt":
        return f"{'no' if alt.checkpointing == 'none' else alt.checkpointing} recompute"
    return _value(alt, dim)
