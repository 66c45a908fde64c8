"""``search``: every valid layout for a model and cluster, ranked by predicted throughput.

The space is every TP, PP, CP, DP (and EP for MoE) whose product is the GPU count, every
ZeRO stage, activation checkpointing, micro-batch size (the global batch stays fixed:
micro x GA x DP) and number of virtual pipeline stages, pruned by the same predicates
:mod:`sapper.parallel.validate` enforces. The cost model runs once over all of them as
numpy arrays. Memory is checked lazily with :func:`sapper.memory.estimate`, walking the
ranking from the fastest layout down until ``top`` layouts fit; the memory model's
monotonicity (more ZeRO sharding, more recomputation and a smaller micro-batch never use
more memory) lets one failed check rule out every layout it dominates.

Where PP does not divide the layers, the first and last stages' layer counts are
searched too (:func:`stage_splits`). The plan's own layout is always a candidate, costed
by the same model: when it fits and nothing proposed is faster, it is the answer.

Fixed choices, stated: sequence parallelism whenever TP > 1 (it only removes work and
memory), the plan's rank order (Megatron's by default), no stage fuller than the even
split's fullest, the interleaved schedule only where Megatron allows it (every stage's
layers and the micro-batches divisible by v and PP), selective recomputation only for
eager attention (flash kernels already recompute the attention core), no offload.
Nothing ``sapper check`` would flag is proposed: TP stays inside a node (P103), ZeRO-2/3
is not combined with a pipeline (P111), CP needs a fused kernel and RoPE or learned
positions (P117), and the peak keeps 10% of the GPU free (M003).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapper.errors import InputError
from sapper.parallel.candidate import Candidate, layout_at
from sapper.parallel.cluster import Cluster
from sapper.parallel.cost import LayoutBatch, cost_of, evaluate, predict_step
from sapper.parallel.layout import Layout, parse_rank_order, placement
from sapper.parallel.validate import (
    cp_supported,
    heads_ok,
    seq_cp_ok,
    tp_in_node_ok,
    validate,
    widths_ok,
    zero_with_pp_ok,
)
from sapper.parallel.workload import Workload
from sapper.plan.schema import AttentionImpl, Plan
from sapper.rules.model import Severity

__all__ = ["Candidate", "MemoryCheck", "SearchResult", "enumerate_layouts", "search"]

#: A memory check: plan -> (fits, peak GiB), optionally followed by the pipeline stage of
#: the peak and the activation GiB at the peak (they sharpen the pruning). The default
#: is :func:`sapper.memory.estimate`.
MemoryCheck = Callable[[Plan], tuple[Any, ...]]

_GIB = 1024**3
#: Peak memory above this share of the GPU is flagged by ``sapper check`` (M003), so the
#: memory walk counts it as not fitting: the planner never proposes it, and the
#: dominance pruning works on the same bound.
_HEADROOM_SHARE = 0.90


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def default_memory_check(plan: Plan) -> tuple[bool, float, int | None, float]:
    """Fit by the memory model: (fits, peak GiB, the stage of the peak, the activations
    GiB at the peak); a plan it rejects as impossible does not fit. Only the stages that
    can hold the peak are evaluated (the same peak, at a cost that does not grow with PP)."""
    from sapper.memory import MemoryOptions, estimate

    try:
        est = estimate(plan, MemoryOptions(worst_only=True))
    except InputError:
        return False, math.inf, None, 0.0
    acts = est.breakdown.get("activations", 0) / _GIB
    return bool(est.fits), est.peak_bytes / _GIB, est.peak_stage, acts


@dataclass
class SearchResult:
    """The ranked layouts and how the search went."""

    top: list[Candidate]
    #: The plan's own layout when it is complete and valid (for comparison).
    current: Candidate | None
    gpus: int
    enumerated: int
    memory_checks: int
    memory_rejected: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    #: Seconds spent enumerating, costing, checking memory (ranking walk) and explaining.
    timings: dict[str, float] = field(default_factory=dict)
    #: The plan's own layout fits and no layout the search proposes is predicted faster.
    current_is_best: bool = False

    @property
    def best(self) -> Candidate | None:
        return self.top[0] if self.top else None

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "enumerated": self.enumerated,
            "memory_checks": self.memory_checks,
            "memory_rejected": self.memory_rejected,
            "elapsed_s": self.elapsed_s,
            "timings_s": self.timings,
            "top": [c.to_json() for c in self.top],
            "current": self.current.to_json() if self.current else None,
            "current_is_best": self.current_is_best,
            "notes": self.notes,
        }


# ---- enumeration -----------------------------------------------------------------------


def _space_inputs(plan: Plan) -> tuple[Workload, Cluster, int, str]:
    work = Workload.from_plan(plan)
    cluster = Cluster.from_plan(plan)
    global_batch = plan.global_batch
    if global_batch is None:
        raise InputError(
            "the planner keeps the global batch fixed and the plan does not give it",
            field="batch.global_batch_size",
            expected="sequences per step (or micro batch, GA and a known DP)",
        )
    order = plan.parallel.rank_order
    if parse_rank_order(order) is None:
        raise InputError(
            "invalid rank order",
            field="parallel.rank_order",
            value=order,
            expected="tp, cp, dp and pp once each, e.g. tp-cp-ep-dp-pp",
        )
    return work, cluster, global_batch, order


def stage_splits(layers: int, pp: int) -> list[tuple[int, int, int, int, list[int]]]:
    """The layer splits the planner tries for ``pp`` stages: (first stage's layers, last
    stage's layers, most layers on a stage other than the last, layers on the last
    stage, the virtual stage counts ≥ 2 every stage divides into), 0 meaning the count
    is not given (an even split).

    The even split always; where PP does not divide the layers, also every explicit
    first/last count (Megatron's ``--decoder-first/last-pipeline-num-layers``; the
    stages between hold equal shares) that leaves no stage fuller than the even split's
    fullest, ⌈L/PP⌉: typically lighter first and last stages, which also hold the
    embedding and the head. A fuller stage only slows the pipeline."""
    if pp == 1:
        return [(0, 0, layers, layers, [])]
    base, extra = divmod(layers, pp)
    even_chunks = [v for v in _divisors(base)[1:] if layers % (pp * v) == 0] if not extra else []
    out = [(0, 0, base + (1 if extra else 0), base, even_chunks)]
    if not extra:
        return out
    c = base + 1
    mids = [0] if pp == 2 else range(max(1, -(-(layers - 2 * c) // (pp - 2))), c + 1)
    for mid in mids:
        rest = layers - (pp - 2) * mid
        for f in range(max(1, rest - c), min(c, rest - 1) + 1):
            last = rest - f
            stages = (f, last) if pp == 2 else (f, mid, last)
            chunks = _divisors(math.gcd(*stages))[1:]
            out.append((f, last, max(stages[:-1]), last, chunks))
    return out


def enumerate_layouts(plan: Plan) -> tuple[LayoutBatch, Workload, Cluster]:
    """Every valid layout of the plan's model on its cluster, as a :class:`LayoutBatch`."""
    work, cluster, gbatch, order = _space_inputs(plan)
    model = plan.model
    assert model is not None
    n, layers, seq = cluster.gpus, work.layers, work.seq_len
    # TP beyond one node is flagged by P103, so the planner never proposes it.
    tps = [
        t for t in _divisors(n)
        if heads_ok(model, t) and widths_ok(model, t) and tp_in_node_ok(t, cluster.gpus_per_node)
    ]
    cp_ok = cp_supported(model)
    rows: list[tuple[int, ...]] = []
    for tp in tps:
        for pp in _divisors(n // tp):
            if pp > layers:
                continue
            splits = stage_splits(layers, pp)
            for cp in _divisors(n // (tp * pp)):
                if not seq_cp_ok(seq, cp) or (cp > 1 and not cp_ok):
                    continue
                dp = n // (tp * pp * cp)
                if gbatch % dp:
                    continue
                eps = [1]
                if model.is_moe:
                    eps = _divisors(math.gcd(dp, model.num_experts))
                per_replica = gbatch // dp
                for micro in _divisors(per_replica):
                    m = per_replica // micro
                    if pp > 1 and m < pp:
                        continue
                    for first, last, l_max, l_last, chunks in splits:
                        vs = [1]
                        if pp > 1 and m % pp == 0:
                            vs += chunks
                        for ep in eps:
                            for v in vs:
                                rows.append((tp, pp, cp, dp, ep, micro, m, v,
                                             first, last, l_max, l_last))
    if not rows:
        raise InputError(
            "no valid layout: no TP/PP/CP/DP split of the GPUs fits the model and batch",
            field="hardware.num_gpus",
            value=n,
            expected="a GPU count whose divisors split the heads, layers and global batch",
        )
    base = np.array(rows, dtype=np.int64)
    ckpts = [0, 2] if model.attention_impl != AttentionImpl.EAGER else [0, 1, 2]
    combos = np.array([(z, c) for z in range(4) for c in ckpts], dtype=np.int64)
    k = len(combos)
    grid = np.repeat(base, k, axis=0)
    zc = np.tile(combos, (len(base), 1))
    # ZeRO-2/3 with a pipeline is flagged by P111: not proposed either.
    keep = zero_with_pp_ok(grid[:, 1], zc[:, 0])
    grid, zc = grid[keep], zc[keep]
    tp, pp, cp, dp, ep = (grid[:, i] for i in range(5))
    micro, m, v = grid[:, 5], grid[:, 6], grid[:, 7]

    bw: dict[tuple[int, ...], tuple[float, ...]] = {}
    for key in {tuple(r[:5]) for r in rows}:
        lay = Layout(tp=key[0], pp=key[1], cp=key[2], dp=key[3], ep=key[4], rank_order=order)
        pl = placement(lay, cluster.gpus_per_node)
        bw[key] = tuple(
            cluster.bus_gbps(s) for s in (pl.tp, pl.cp, pl.ep, pl.grad, pl.expert_grad, pl.pp)
        )
    bws = np.array([bw[tuple(r[:5])] for r in rows], dtype=float)
    bws = np.repeat(bws, k, axis=0)[keep]
    first, last, l_max, l_last = (grid[:, i] for i in range(8, 12))
    batch = LayoutBatch(
        tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, zero=zc[:, 0], ckpt=zc[:, 1],
        rc=(zc[:, 1] == 2).astype(float), micro=micro, ga=m, v=v, sp=tp > 1,
        offload=np.zeros(len(grid), dtype=bool),
        overlap=np.full(len(grid), plan.parallel.overlap_dp_comm),
        overlap_ag=np.full(len(grid), plan.parallel.overlap_param_gather),
        overlap_tp=np.full(len(grid), plan.parallel.tp_comm_overlap),
        pp_split=np.full(len(grid), plan.parallel.pipeline_scatter_gather),
        bw_tp=bws[:, 0], bw_cp=bws[:, 1], bw_ep=bws[:, 2], bw_grad=bws[:, 3],
        bw_expert=bws[:, 4], bw_pp=bws[:, 5], l_max=l_max, l_last=l_last,
        first=first, last=last,
    )
    return batch, work, cluster


# ---- lazy memory walk ------------------------------------------------------------------


class _MemoryWalk:
    """The search's :class:`~sapper.parallel.candidate.MemoryProbe`: memory checks with
    dominance pruning. Within one TP/PP/CP/DP/EP split, the memory model never uses less
    memory for a lower ZeRO stage, less recomputation, a larger micro-batch (the global
    batch is fixed, and the pipeline holds at least PP of them),
    or interleaving instead of 1F1B (the first stage holds at least as many micro-batches
    in flight); so one failed check rules out every layout it dominates. When the peak
    was on the first stage, fewer virtual stages (v ≥ 2) are dominated too: the first
    stage holds min(((v+1)·p - 1)/v, m) micro-batches in flight, more for smaller v."""

    def __init__(
        self, plan: Plan, b: LayoutBatch, order: str, check: MemoryCheck, floor: np.ndarray
    ) -> None:
        self.plan, self.b, self.order, self.check = plan, b, order, check
        self.floor = floor
        gpu = plan.gpu
        self.capacity = gpu.memory_gib * _GIB * _HEADROOM_SHARE if gpu else math.inf
        self.fails: dict[tuple[int, ...], list[tuple[int, int, int, int, bool]]] = {}
        self.calls = 0
        self.rejected = 0
        self.known: dict[int, tuple[bool, float | None]] = {}
        self.probed: set[tuple[tuple[int, ...], int]] = set()
        #: (split, recompute level) -> activation GiB of its leanest member, when that
        #: member's peak is on the first stage (the stage every leaner member shares).
        self.lean_acts: dict[tuple[tuple[int, ...], int], float] = {}

    def _key(self, i: int) -> tuple[int, ...]:
        b = self.b
        first = int(b.first[i]) if b.first is not None else 0
        last = int(b.last[i]) if b.last is not None else 0
        return (int(b.tp[i]), int(b.pp[i]), int(b.cp[i]), int(b.dp[i]), int(b.ep[i]),
                first, last)

    def _dominated(self, key: tuple[int, ...], v: int, z: int, c: int, mb: int) -> bool:
        return any(
            fz >= z and fc >= c and fmb <= mb
            and (fv in (1, v) or (first and 2 <= v <= fv))
            for fv, fz, fc, fmb, first in self.fails.get(key, ())
        )

    def _check(self, lay: Layout) -> tuple[bool, float, bool, float | None]:
        """(fits, peak GiB, whether the peak is on the first stage, activation GiB)."""
        self.calls += 1
        out = self.check(lay.apply(self.plan))
        first = len(out) > 2 and out[2] == 0
        acts = float(out[3]) if len(out) > 3 else None
        fits = bool(out[0]) and float(out[1]) * _GIB <= self.capacity
        return fits, float(out[1]), first, acts

    def fits(self, i: int) -> tuple[bool, float | None]:
        """Does layout ``i`` fit (and its peak GiB, or a floor on it, when known)? The
        first time a split is asked about a recomputation level, its leanest member at
        that level (1F1B, ZeRO-3, micro-batch 1) is checked first: if even that does not
        fit, the whole level is ruled out with one memory estimate."""
        if i in self.known:
            return self.known[i]
        b, key = self.b, self._key(i)
        v, z, c, mb = int(b.v[i]), int(b.zero[i]), int(b.ckpt[i]), int(b.micro[i])
        verdict: tuple[bool, float | None]
        lean = self.lean_acts.get((key, c))
        floor = self.floor[i] + (lean * _GIB if lean is not None else 0.0)
        if floor > self.capacity:
            verdict = (False, float(floor) / _GIB)
        elif self._dominated(key, v, z, c, mb):
            verdict = (False, None)
        else:
            lay = layout_at(b, i, self.order)
            verdict = (True, None)
            if (key, c) not in self.probed and (v, z, mb) != (1, 3, 1):
                self.probed.add((key, c))
                leanest = lay.with_(zero=3, micro_batch=1, virtual_stages=1, schedule="1f1b",
                                    grad_accum=lay.grad_accum * lay.micro_batch)
                ok, gib, first, acts = self._check(leanest)
                if not ok:
                    self.fails.setdefault(key, []).append((1, 3, c, 1, first))
                    verdict = (False, None)
                elif first and acts is not None:
                    # every member of this level holds at least these activations on the
                    # first stage, next to its weights (and persistent gradients)
                    self.lean_acts[(key, c)] = acts
                    if self.floor[i] + acts * _GIB > self.capacity:
                        verdict = (False, float(self.floor[i]) / _GIB + acts)
            if verdict[0]:
                ok, gib, first, _ = self._check(lay)
                verdict = (ok, gib)
                if not ok:
                    self.fails.setdefault(key, []).append((v, z, c, mb, first))
        if not verdict[0]:
            self.rejected += 1
        self.known[i] = verdict
        return verdict


def _state_floor(
    plan: Plan, work: Workload, b: LayoutBatch, result: dict[str, np.ndarray]
) -> np.ndarray:
    """Bytes a GPU holds throughout the step: its stage's weights unless ZeRO-3 shards
    them, and, where gradients persist across micro-batches (accumulation, a pipeline,
    a sharded optimizer), their full buffer unless ZeRO-2/3 shards it. Layouts whose
    floor exceeds the GPU skip the estimator. With explicit (lighter) first and last
    stages, the stage counted is a middle one: its layers without the embedding."""
    p = plan.precision
    weight = 4 if p.dtype in ("fp32", "tf32") or p.autocast else 2
    psi = result["params_per_gpu"]
    if b.first is not None:
        tp, ep = np.asarray(b.tp, dtype=float), np.asarray(b.ep, dtype=float)
        middle = np.asarray(b.l_max) * (work.layer_params / tp + work.expert_params / (tp * ep))
        psi = np.where((np.asarray(b.first) > 0) | (np.asarray(b.last) > 0),
                       np.minimum(psi, middle), psi)
    z = np.asarray(b.zero)
    persistent = (np.asarray(b.ga) > 1) | (np.asarray(b.pp) > 1) | (z >= 1)
    grads = np.where((z < 2) & persistent, work.grad_bytes, 0)
    return psi * (np.where(z < 3, weight, 0) + grads)


# ---- search ------------------------------------------------------------------------------


def search(
    plan: Plan,
    top: int = 5,
    *,
    memory: MemoryCheck | None = default_memory_check,
    explain: bool | int = True,
) -> SearchResult:
    """Rank every valid layout of ``plan``'s model on its cluster by predicted throughput
    and return the ``top`` fastest that fit in memory (``memory=None`` skips the memory
    check), one per TP/PP/CP/EP split (its ZeRO, recomputation and micro-batch variants
    are compared in the reasons), each with the reasons it wins
    (:mod:`sapper.parallel.explain`): all of them with ``explain=True``, the first N with
    an integer (the comparisons spend memory estimates)."""
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        timings[name] = now - clock[0]
        clock[0] = now

    timings: dict[str, float] = {}
    start = clock[0]
    batch, work, cluster = enumerate_layouts(plan)
    lap("enumerate")
    order = plan.parallel.rank_order
    result = evaluate(work, cluster, batch)
    ranking = _rank(result, batch)
    lap("cost")
    walk = (
        _MemoryWalk(plan, batch, order, memory, _state_floor(plan, work, batch, result))
        if memory
        else None
    )
    chosen: list[int] = []
    splits: set[tuple[int, ...]] = set()
    for i in ranking:
        i = int(i)
        split = (int(batch.tp[i]), int(batch.pp[i]), int(batch.cp[i]), int(batch.ep[i]))
        if split in splits or (walk is not None and not walk.fits(i)[0]):
            continue
        if not _passes_checks(plan, batch, i, order):
            continue
        chosen.append(i)
        splits.add(split)
        if len(chosen) >= top:
            break
    lap("memory")
    cands = []
    for i in chosen:
        lay = layout_at(batch, i, order)
        fits, gib = walk.known[i] if walk else (None, None)
        # _passes_checks kept only layouts without layout warnings; the explanations
        # add their notes (an MFU above published runs) to cand.warnings.
        cands.append(Candidate(lay, cost_of(result, i, lay), fits, gib))
    current = _current(plan, memory)
    current_best = _current_is_best(current, cands)
    notes: list[str] = []
    if current_best and not cands:
        notes.append(
            "your layout is the best sapper finds: no other layout that passes sapper's "
            "checks fits in memory"
        )
    elif current_best:
        notes.append(
            "your layout is the best sapper finds: none of the layouts above is predicted "
            "faster"
        )
    elif not cands:
        notes.append("no layout fits in memory: add GPUs, or a GPU with more memory")
    n_explain = len(cands) if explain is True else int(explain)
    if n_explain and cands:
        from sapper.parallel.explain import explain_candidates

        explain_candidates(
            cands[:n_explain], current, result, batch, ranking, walk, cluster, order,
            work=work,
        )
    lap("explain")
    return SearchResult(
        top=cands,
        current=current,
        gpus=cluster.gpus,
        enumerated=len(batch),
        memory_checks=walk.calls if walk else 0,
        memory_rejected=walk.rejected if walk else 0,
        elapsed_s=time.perf_counter() - start,
        notes=notes,
        timings=timings,
        current_is_best=current_best,
    )


def _current_is_best(current: Candidate | None, cands: list[Candidate]) -> bool:
    """The plan's own layout fits (or memory is not checked) and no proposal is
    predicted faster: it is a candidate scored by the same cost model, so it wins."""
    if current is None or current.fits is False:
        return False
    if not cands:
        return current.fits is True
    return current.cost.step_time_s < cands[0].cost.step_time_s


def _passes_checks(plan: Plan, b: LayoutBatch, i: int, order: str) -> bool:
    """A layout the planner may recommend: no layout error or warning from the checks
    ``sapper check`` runs (TP across nodes, ZeRO-2/3 with a pipeline, rank order ...);
    the memory walk already asks for the headroom M003 wants. One truth: a proposal
    never fails its own check."""
    lay = layout_at(b, i, order)
    return not any(x.severity != Severity.INFO for x in validate(lay.apply(plan)))


def _rank(result: dict[str, np.ndarray], b: LayoutBatch) -> np.ndarray:
    """Fastest first. Layouts within 0.1% of each other count as tied and are ordered
    simplest first: fewest model-parallel splits (TP·PP·CP), then least traffic per GPU,
    then the lower ZeRO stage and less recomputation."""
    t = result["step_time"]
    bucket = np.round(np.log(t / t.min()) / np.log1p(1e-3))
    volume = result["dp_bytes"] + result["tp_bytes_per_layer"]
    splits = b.tp * b.pp * b.cp
    return np.lexsort((b.ckpt, b.zero, volume, splits, bucket))


def _current(plan: Plan, memory: MemoryCheck | None) -> Candidate | None:
    """The plan's own layout, costed, when it is complete and has no layout error."""
    lay = Layout.from_plan(plan)
    if lay is None or plan.batch.micro_batch_size is None:
        return None
    if any(x.severity == Severity.ERROR for x in validate(plan)):
        return None
    try:
        cost = predict_step(plan)
    except InputError:
        return None
    fits, gib = memory(plan)[:2] if memory else (None, None)
    return Candidate(lay, cost, fits, gib)
