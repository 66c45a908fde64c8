"""Time of one training step on one GPU, and where it goes (seed §4).

The model, per GPU and per micro-batch on the slowest pipeline stage:

* **compute**: each of the layer's weight GEMMs (:attr:`Workload.gemms`) forward, data
  gradient and weight gradient, at the efficiency of its own ``M x N x K`` shape after
  the TP split (:func:`sapper.parallel.efficiency.gemm_time`: the GPU's measured MAMF as
  the asymptote, tile and wave quantization, the operand-streaming roofline, the
  prologue/epilogue each output tile pays, a fixed launch cost; weight gradients
  accumulate into the gradient buffer, read and written); the attention core at the
  flash kernels' published rate for the local sequence length (causal half executed,
  backward 2.5 forwards) or, eager, as batched GEMMs; the memory-bound element-wise work
  (norms, residual adds, activations, eager softmax) as bytes / (HBM bandwidth x its
  sustained fraction) plus a launch cost per kernel; the output layer's GEMMs and the
  loss's fp32 passes over the logits on the last stage. Training = forward + backward;
  full recomputation adds a forward, selective the attention core.
* **TP**: per layer, 2 all-reduces forward and 2 backward (+2 with full recomputation),
  or the same volume as all-gather + reduce-scatter with sequence parallelism. Exposed
  in full, unless ``tp_comm_overlap`` (with sequence parallelism) pipelines them with
  the GEMMs they feed or drain: then each pass exposes what its GEMMs cannot cover, and
  at least 1/TP of it (the first all-gather chunk, the last reduce-scatter chunk).
* **EP**: 2 all-to-alls forward and 2 backward per MoE layer, not overlapped.
* **CP**: ring attention passes K/V around the CP group in CP-1 point-to-point steps
  (1x forward, 2x backward); *assumed overlapped* with the attention core, only the
  excess is exposed.
* **PP**: one activation send forward and one gradient send backward per micro-batch and
  virtual chunk, at 1/TP of the activation (Megatron's scatter/gather or sequence
  parallelism; the whole activation with ``pipeline_scatter_gather`` off), not
  overlapped; the pipeline runs at the pace of its slowest stage (the last one also
  runs the output head). Bubble: (p-1)/v micro-batch slots (1F1B: v = 1).
* **DP / ZeRO** per step over the data x context parallel group: ZeRO-0 all-reduces the
  gradients once; ZeRO-1 reduce-scatters gradients and all-gathers parameters once;
  ZeRO-2 reduce-scatters on every micro-batch (gradients are sharded, so accumulation
  cannot wait); ZeRO-3 also all-gathers parameters forward and backward on every
  micro-batch (~1.5x DP's traffic). With ``overlap_dp_comm`` gradient reductions overlap
  one micro-batch's backward (the last one: DDP and Megatron reduce there), taken as 2/3
  of its time; with ``overlap_param_gather`` parameter gathers overlap one forward (1/3);
  only the excess is exposed; without a switch its collectives are exposed in full.
* Overlapped collectives are not free: while hidden they occupy the SMs NCCL or the
  userbuffers kernels run on (:data:`~sapper.parallel.efficiency.COMM_SMS`), and the
  compute they hide behind slows by that share. What is hidden is reported per kind
  (``*_hidden``, :meth:`StepCost.assumptions`).
* **optimizer**: a memory-bound pass over the parameters this GPU updates.

All functions take numpy arrays of layouts (:class:`LayoutBatch`) so the planner costs
thousands of layouts in one pass; :func:`predict_step` wraps one plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapper.errors import InputError
from sapper.model.flops import padded_vocab
from sapper.parallel.cluster import Cluster
from sapper.parallel.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    P2P,
    REDUCE_SCATTER,
    bus_factor,
    collective_time,
)
from sapper.parallel.efficiency import (
    COMM_SMS,
    FLASH_BACKWARD_FACTOR,
    HBM_FRACTION,
    KERNEL_OVERHEAD_S,
    PCIE_GBPS,
    attention_fraction,
    best_published_mfu,
    gemm_time,
)
from sapper.parallel.layout import CHECKPOINTING, Layout, placement, split_layers
from sapper.parallel.workload import Workload
from sapper.plan.schema import Plan

__all__ = ["BREAKDOWN", "LayoutBatch", "StepCost", "cost_of", "evaluate", "predict_step"]

#: Components of a step, in the order reports show them; they add up to the step time.
BREAKDOWN: tuple[str, ...] = (
    "compute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_p2p",
    "bubble",
    "dp_comm",
    "optimizer",
)



@dataclass
class LayoutBatch:
    """Many layouts as parallel arrays, with each group's sustained bus bandwidth."""

    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    zero: np.ndarray
    ckpt: np.ndarray  # 0 none, 1 selective, 2 full
    rc: np.ndarray  # share of layers fully recomputed (1/every_k with full, else 0)
    micro: np.ndarray
    ga: np.ndarray
    v: np.ndarray
    sp: np.ndarray
    offload: np.ndarray
    overlap: np.ndarray  # gradient reduction overlaps the backward
    overlap_ag: np.ndarray  # ZeRO parameter all-gathers overlap compute
    overlap_tp: np.ndarray  # TP all-gather / reduce-scatter pipelined with the GEMMs
    pp_split: np.ndarray  # pipeline sends carry 1/TP of the activation
    bw_tp: np.ndarray
    bw_cp: np.ndarray
    bw_ep: np.ndarray
    bw_grad: np.ndarray
    bw_expert: np.ndarray
    bw_pp: np.ndarray
    l_max: np.ndarray  # most layers on a stage other than the last (all layers if pp = 1)
    l_last: np.ndarray  # layers on the last stage (which also runs the output head)
    #: Explicit layer counts of the first and last stages (0: an even split).
    first: np.ndarray | None = None
    last: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def from_layouts(
        cls, layouts: Sequence[Layout], cluster: Cluster, layers: int
    ) -> LayoutBatch:
        cols: dict[str, list[Any]] = {k: [] for k in cls.__dataclass_fields__}
        for lay in layouts:
            pl = placement(lay, cluster.gpus_per_node)
            stages = split_layers(
                layers, lay.pp, lay.first_stage_layers, lay.last_stage_layers
            ) or split_layers(layers, lay.pp)
            assert stages is not None
            row = {
                "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "ep": lay.ep,
                "zero": lay.zero, "ckpt": CHECKPOINTING.index(lay.checkpointing),
                "rc": 1.0 / lay.checkpoint_every if lay.checkpointing == "full" else 0.0,
                "micro": lay.micro_batch, "ga": lay.grad_accum, "v": lay.virtual_stages,
                "sp": lay.sequence_parallel, "offload": lay.offload_optimizer,
                "overlap": lay.overlap_dp_comm,
                "overlap_ag": lay.overlap_param_gather,
                "overlap_tp": lay.tp_comm_overlap,
                "pp_split": lay.pipeline_scatter_gather,
                "bw_tp": cluster.bus_gbps(pl.tp), "bw_cp": cluster.bus_gbps(pl.cp),
                "bw_ep": cluster.bus_gbps(pl.ep), "bw_grad": cluster.bus_gbps(pl.grad),
                "bw_expert": cluster.bus_gbps(pl.expert_grad), "bw_pp": cluster.bus_gbps(pl.pp),
                "l_max": max(stages[:-1]) if lay.pp > 1 else layers,
                "l_last": stages[-1],
                "first": lay.first_stage_layers or 0,
                "last": lay.last_stage_layers or 0,
            }
            for k, val in row.items():
                cols[k].append(val)
        return cls(**{k: np.asarray(v) for k, v in cols.items()})


def _layer_gemms(
    w: Workload, cluster: Cluster, tokens: np.ndarray, tp: np.ndarray, ep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of one layer's weight GEMMs per micro-batch: (forward, backward = data
    gradients + weight gradients), each GEMM at the efficiency of its own shape."""
    gpu, peak = cluster.gpu, cluster.peak_flops
    ab = float(w.act_bytes)
    # weight gradients accumulate into the gradient buffer: read + write it
    wgrad_out = 2.0 * w.grad_bytes
    fwd = np.zeros_like(tokens)
    bwd = np.zeros_like(tokens)
    for g in w.gemms:
        n = g.n / tp if g.split == "n" else np.full_like(tp, float(g.n))
        k = g.k / tp if g.split == "k" else np.full_like(tp, float(g.k))
        if g.expert:
            local = np.maximum(w.experts / ep, 1.0)
            m = tokens * w.top_k / local
            batch = local
        else:
            m, batch = tokens, 1.0
        # (a GEMM only some blocks run, such as a MoE model's leading dense MLPs, counts
        # at its share of the mean layer)
        fwd = fwd + g.share * gemm_time(
            gpu, peak, m, n, k, batch=batch, in_bytes=ab, out_bytes=ab
        )
        bwd = bwd + g.share * (gemm_time(
            gpu, peak, m, k, n, batch=batch, in_bytes=ab, out_bytes=ab
        ) + gemm_time(gpu, peak, n, k, m, batch=batch, in_bytes=ab, out_bytes=wgrad_out))
    return fwd, bwd


def _attention(
    w: Workload, cluster: Cluster, micro: np.ndarray, tp: np.ndarray, cp: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of one layer's attention core per micro-batch: (forward, backward).

    Flash kernels: the executed causal half of the square at the attention fraction for
    the local query length, the backward at 2.5 forwards (it recomputes the scores).
    Eager: the batched Q·Kᵀ and P·V GEMMs (and their four backward GEMMs) through the GEMM
    formula, over the whole square."""
    gpu, peak = cluster.gpu, cluster.peak_flops
    s = float(w.seq_len)
    s_q = s / cp
    heads = w.heads / tp
    if w.attn_exec < 1.0:
        flops = micro * s_q * w.attn_flops * w.attn_exec / tp
        rate = peak * attention_fraction(gpu, s_q)
        fwd = flops / rate + KERNEL_OVERHEAD_S
        return fwd, FLASH_BACKWARD_FACTOR * (fwd - KERNEL_OVERHEAD_S) + KERNEL_OVERHEAD_S
    d, b = float(w.head_dim), micro * heads
    t = lambda m, n, k: gemm_time(gpu, peak, m, n, k, batch=b,  # noqa: E731
                                  in_bytes=w.act_bytes, out_bytes=w.act_bytes)
    fwd = t(s_q, s, d) + t(s_q, d, s)
    bwd = t(s_q, s, d) + t(s, d, s_q) + t(s_q, d, s) + t(s, d, s_q)
    return fwd, bwd


def _kernel_times(
    w: Workload, cluster: Cluster, micro: np.ndarray, tp: np.ndarray, cp: np.ndarray,
    ep: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """Per micro-batch: one layer's weight GEMMs (forward, backward), its attention core
    (forward, backward) and the output layer's GEMMs (forward, backward). They depend on
    (micro-batch, TP, CP, EP) only, of which a search has a few hundred distinct
    combinations among its many thousand layouts: computed once per combination."""
    cols = [np.asarray(x, dtype=np.int64) for x in (micro, tp, cp, ep)]
    key = cols[0]
    for c in cols[1:]:
        key = key * (1 << 15) + c  # degrees and micro-batches are far below 2^15
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    um, ut, uc, ue = (np.asarray(x, dtype=float)[first] for x in (micro, tp, cp, ep))
    gpu, peak, ab = cluster.gpu, cluster.peak_flops, w.act_bytes
    tokens = um * w.seq_len / uc
    g_fwd, g_bwd = _layer_gemms(w, cluster, tokens, ut, ue)
    a_fwd, a_bwd = _attention(w, cluster, um, ut, uc)
    vpad = padded_vocab(w.vocab, ut.astype(np.int64)).astype(float)
    h_fwd = gemm_time(gpu, peak, tokens, vpad / ut, w.hidden, in_bytes=ab, out_bytes=ab)
    h_bwd = gemm_time(gpu, peak, tokens, w.hidden, vpad / ut, in_bytes=ab, out_bytes=ab) + (
        gemm_time(gpu, peak, vpad / ut, w.hidden, tokens, in_bytes=ab,
                  out_bytes=2.0 * w.grad_bytes)
    )
    return tuple(
        np.broadcast_to(np.asarray(x, dtype=float), um.shape)[inverse]
        for x in (g_fwd, g_bwd, a_fwd, a_bwd, h_fwd, h_bwd)
    )


def _overlap(comm: np.ndarray, window: np.ndarray, chunks: Any = 1.0) -> np.ndarray:
    """Exposed seconds of ``comm`` overlapped with ``window`` seconds of compute: what
    does not fit in the window, and at least one of ``chunks`` pipelined pieces (the first
    all-gather chunk or the last reduce-scatter chunk has nothing to hide behind)."""
    return np.maximum(np.maximum(comm - window, 0.0), comm / np.asarray(chunks, dtype=float))


def evaluate(w: Workload, cluster: Cluster, b: LayoutBatch) -> dict[str, np.ndarray]:
    """Cost every layout of ``b``: seconds per step by component (``BREAKDOWN``), the step
    time, throughput and FLOP rates, the seconds of communication assumed hidden behind
    compute (``*_hidden``), plus the intermediate figures reports quote."""
    f = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    tp, pp, cp, dp, ep = f(b.tp), f(b.pp), f(b.cp), f(b.dp), f(b.ep)
    micro, m, v = f(b.micro), f(b.ga), f(b.v)
    rc = f(b.rc)  # share of layers whose forward is recomputed in full
    sel = b.ckpt == 1
    gpu = cluster.gpu
    hbm = gpu.hbm_gbps * 1e9 * HBM_FRACTION
    sm_share = min(1.0, COMM_SMS / max(gpu.sms, 1))
    ab = w.act_bytes
    tokens = micro * w.seq_len / cp  # tokens per GPU per micro-batch

    # -- one layer, one micro-batch, forward + backward (+ recompute) --------------------
    g_fwd, g_bwd, a_fwd, a_bwd, h_fwd, h_bwd = _kernel_times(w, cluster, micro, tp, cp, ep)
    t_attn = a_fwd * (1 + rc + np.where(sel, 1.0, 0.0)) + a_bwd
    rep = np.where(b.sp, w.elem_replicated / tp, w.elem_replicated)
    scores = tokens * w.elem_scores / tp
    elem_fwd = tokens * (rep + w.elem_split / tp) + scores
    elems = 3 * elem_fwd + rc * elem_fwd + np.where(sel, scores, 0)
    kernels = w.elem_kernels * (3 + rc)
    t_elem = elems * ab / hbm + kernels * KERNEL_OVERHEAD_S
    t_gemm = g_fwd * (1 + rc) + g_bwd
    t_compute = t_gemm + t_attn + t_elem

    act = tokens * w.hidden * ab  # one activation tensor [tokens, h]
    n_tp = 4 + 2 * rc
    t_tp_one = np.where(
        b.sp,
        collective_time(ALL_GATHER, act, tp, b.bw_tp)
        + collective_time(REDUCE_SCATTER, act, tp, b.bw_tp),
        collective_time(ALL_REDUCE, act, tp, b.bw_tp),
    )
    # TP overlap (sequence parallel only): the forward's (and recompute's) all-gathers and
    # reduce-scatters hide behind the forward GEMMs, the backward's behind the backward's
    tp_fwd, tp_bwd = (2 + 2 * rc) * t_tp_one, 2 * t_tp_one
    tpo = b.overlap_tp & b.sp & (tp > 1)
    t_tp = np.where(
        tpo,
        _overlap(tp_fwd, g_fwd * (1 + rc), tp) + _overlap(tp_bwd, g_bwd, tp),
        n_tp * t_tp_one,
    )
    tp_hidden = n_tp * t_tp_one - t_tp

    if w.experts > 1:
        a2a = act * w.top_k / np.where(b.sp, tp, 1)
        t_ep = n_tp * collective_time(ALL_TO_ALL, a2a, ep, b.bw_ep)
    else:
        t_ep = np.zeros_like(tp)

    kv_bytes = micro * w.seq_len * 2 * w.kv_heads * w.head_dim * ab / np.minimum(
        tp, w.kv_heads
    )
    t_cp_raw = (3 + rc) * collective_time(ALL_GATHER, kv_bytes, cp, b.bw_cp, calls=cp - 1)
    t_cp = np.maximum(0.0, t_cp_raw - t_attn)
    cp_hidden = t_cp_raw - t_cp
    # overlapped collectives occupy SMs the compute they hide behind would have used
    t_compute = t_compute + sm_share * (tp_hidden + cp_hidden)

    # -- stages: balanced, the last stage also runs the output head ----------------------
    layers_max, layers_last = f(b.l_max), f(b.l_last)
    vpad = padded_vocab(w.vocab, b.tp).astype(float)
    t_head = h_fwd + h_bwd + tokens * vpad / tp * w.ce_bytes / hbm
    t_head_tp = collective_time(ALL_REDUCE, act, tp, b.bw_tp)
    per_layer = t_compute + t_tp + t_ep + t_cp
    mid = layers_max * per_layer
    last = layers_last * per_layer + t_head + t_head_tp
    slow_last = last >= mid
    n_layers = np.where(slow_last, layers_last, layers_max)
    t_mb = np.maximum(mid, last)
    head_share = np.where(slow_last, 1.0, 0.0)
    mb_compute = n_layers * t_compute + head_share * t_head
    mb_tp = n_layers * t_tp + head_share * t_head_tp
    mb_ep, mb_cp = n_layers * t_ep, n_layers * t_cp

    p2p_bytes = act / np.where(b.sp | b.pp_split, tp, 1.0)
    t_p2p = np.where(pp > 1, collective_time(P2P, p2p_bytes, 2, b.bw_pp), 0.0)
    mb_p2p = 2 * v * t_p2p
    slot = t_mb + mb_p2p
    bubble = (pp - 1) / v * slot

    # -- data parallel / ZeRO ---------------------------------------------------------
    emb_stage = np.where(pp > 1, max(w.embed_params, w.head_params),
                         w.embed_params + w.head_params)
    psi_dense = (layers_max * w.layer_params + emb_stage) / tp
    psi_expert = layers_max * w.expert_params / (tp * ep)
    n_grad = dp * cp
    n_exp = dp * cp / ep
    gb, pb = w.grad_bytes, ab

    def sync(kind: str, nbytes_dense: np.ndarray, nbytes_exp: np.ndarray) -> np.ndarray:
        return collective_time(kind, nbytes_dense, n_grad, b.bw_grad) + np.where(
            nbytes_exp > 0, collective_time(kind, nbytes_exp, n_exp, b.bw_expert), 0.0
        )

    def wire(kind: str, nbytes_dense: np.ndarray, nbytes_exp: np.ndarray) -> np.ndarray:
        """Bytes through each GPU's link (the bus factor applied; 0 for one rank)."""
        return bus_factor(kind, n_grad) * nbytes_dense + np.where(
            nbytes_exp > 0, bus_factor(kind, n_exp) * nbytes_exp, 0.0
        )

    grads = (psi_dense * gb, psi_expert * gb)
    params = (psi_dense * pb, psi_expert * pb)
    t_ar, t_rs, t_ag = sync(ALL_REDUCE, *grads), sync(REDUCE_SCATTER, *grads), sync(
        ALL_GATHER, *params
    )
    # windows: gradients overlap one micro-batch's backward (Megatron and DDP reduce on
    # the last one), parameter gathers its forward (ZeRO-1/2: the next step's first)
    w_bwd = t_mb * 2 / 3
    w_fwd = t_mb / 3
    og, oa = b.overlap.astype(bool), b.overlap_ag.astype(bool)
    exp = lambda t, on, window: np.where(on, np.maximum(0.0, t - window), t)  # noqa: E731
    zero = b.zero
    z3_bwd = np.where(oa, t_ag, 0.0) + np.where(og, t_rs, 0.0)
    z3_exposed = (
        exp(t_ag, oa, w_fwd)
        + np.where(oa, 0.0, t_ag) + np.where(og, 0.0, t_rs)
        + np.maximum(0.0, z3_bwd - np.where(og | oa, w_bwd, 0.0))
    )
    dp_exposed = np.select(
        [zero == 0, zero == 1, zero == 2],
        [
            exp(t_ar, og, w_bwd),
            exp(t_rs, og, w_bwd) + exp(t_ag, oa, w_fwd),
            m * exp(t_rs, og, w_bwd) + exp(t_ag, oa, w_fwd),
        ],
        default=m * z3_exposed,
    )
    dp_total = np.select(
        [zero == 0, zero == 1, zero == 2],
        [t_ar, t_rs + t_ag, m * t_rs + t_ag],
        default=m * (2 * t_ag + t_rs),
    )
    dp_hidden = dp_total - dp_exposed
    dp_volume = np.select(
        [zero == 0, zero == 1, zero == 2],
        [
            wire(ALL_REDUCE, *grads),
            wire(REDUCE_SCATTER, *grads) + wire(ALL_GATHER, *params),
            m * wire(REDUCE_SCATTER, *grads) + wire(ALL_GATHER, *params),
        ],
        default=m * (2 * wire(ALL_GATHER, *params) + wire(REDUCE_SCATTER, *grads)),
    )

    psi = psi_dense + psi_expert
    owned = np.where(zero >= 1, psi / n_grad, psi)
    t_opt = np.where(
        b.offload,
        owned * (gb + pb) / (PCIE_GBPS * 1e9),
        owned * w.optimizer_bytes / hbm,
    )

    steady = m * slot
    step = steady + bubble + dp_exposed + t_opt + sm_share * dp_hidden
    global_batch = micro * m * dp
    step_tokens = global_batch * w.seq_len
    world = tp * pp * cp * dp
    model_flops = w.model_flops_per_token() * step_tokens
    redo = rc * w.recompute_flops_per_token("full") + np.where(
        sel, w.recompute_flops_per_token("selective"), 0.0
    )
    hw_flops = model_flops + redo * step_tokens
    out = {
        "compute": m * mb_compute + sm_share * dp_hidden,
        "tp_comm": m * mb_tp,
        "cp_comm": m * mb_cp,
        "ep_comm": m * mb_ep,
        "pp_p2p": m * mb_p2p,
        "bubble": bubble,
        "dp_comm": dp_exposed,
        "optimizer": t_opt,
        "step_time": step,
        "tokens_per_s": step_tokens / step,
        "model_tflops": model_flops / (step * world) / 1e12,
        "hardware_tflops": hw_flops / (step * world) / 1e12,
        "bubble_fraction": bubble / step,
        "microbatch_time": t_mb,
        "dp_bytes": dp_volume,
        "tp_bytes_per_layer": n_tp * act,
        "params_per_gpu": psi,
        "global_batch": global_batch,
        "tp_hidden": m * n_layers * tp_hidden,
        "cp_hidden": m * n_layers * cp_hidden,
        "dp_hidden": dp_hidden,
        "gemm_share": m * n_layers * t_gemm / step,
        "attention_share": m * n_layers * t_attn / step,
    }
    out["mfu"] = out["model_tflops"] * 1e12 / cluster.peak_flops
    best = best_published_mfu(gpu)
    out["above_best_mfu"] = (out["mfu"] > best[0]).astype(float) if best else 0.0 * step
    return out


@dataclass
class StepCost:
    """Predicted cost of one optimizer step on one GPU."""

    layout: Layout
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    #: Seconds per step by component (``BREAKDOWN``); they add up to ``step_time_s``.
    breakdown: dict[str, float]
    #: Further figures: per-micro-batch time, DP bytes per step, TP bytes per layer ...
    details: dict[str, float] = field(default_factory=dict)
    #: Seconds per step of communication the model assumes hidden behind compute, by kind
    #: (``tp``, ``cp``, ``dp``); what is not hidden is in ``breakdown``.
    hidden: dict[str, float] = field(default_factory=dict)

    def assumptions(self) -> list[str]:
        """Which collectives the breakdown assumes hidden behind compute, and how much."""
        lay, out = self.layout, []
        for key, what in (
            ("tp", "TP all-gathers/reduce-scatters pipelined with the GEMMs (tp_comm_overlap)"),
            ("cp", "CP ring K/V exchange behind the attention kernels"),
            ("dp", "DP gradient reduction behind the last micro-batch's backward "
                   "(overlap_dp_comm) and ZeRO parameter all-gathers behind a forward "
                   "(overlap_param_gather)"),
        ):
            sec = self.hidden.get(key, 0.0)
            if sec > 0:
                out.append(f"{what}: {sec:.3g} s per step hidden")
        if lay.pp > 1:
            out.append("pipeline sends and receives: not overlapped")
        if lay.tp > 1 and not lay.tp_comm_overlap:
            out.append("TP collectives: not overlapped (tp_comm_overlap off)")
        return out

    def shares(self) -> dict[str, float]:
        """Each component as a fraction of the step."""
        return {k: v / self.step_time_s for k, v in self.breakdown.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.layout.describe(),
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction,
            "breakdown_s": self.breakdown,
            "hidden_s": self.hidden,
            "assumptions": self.assumptions(),
            "details": self.details,
        }


def cost_of(result: dict[str, np.ndarray], i: int, layout: Layout) -> StepCost:
    """Row ``i`` of an :func:`evaluate` result as a :class:`StepCost`."""
    g = lambda k: float(result[k][i])  # noqa: E731
    return StepCost(
        layout=layout,
        step_time_s=g("step_time"),
        tokens_per_s=g("tokens_per_s"),
        model_tflops_per_gpu=g("model_tflops"),
        hardware_tflops_per_gpu=g("hardware_tflops"),
        mfu=g("mfu"),
        bubble_fraction=g("bubble_fraction"),
        breakdown={k: g(k) for k in BREAKDOWN},
        details={
            k: g(k)
            for k in (
                "microbatch_time", "dp_bytes", "tp_bytes_per_layer", "params_per_gpu",
                "gemm_share", "attention_share", "above_best_mfu",
            )
        },
        hidden={k: g(f"{k}_hidden") for k in ("tp", "cp", "dp")},
    )


def predict_step(plan: Plan, layout: Layout | None = None) -> StepCost:
    """Predict one step of ``plan`` (or of ``layout`` on the plan's model and cluster).

    Needs the model, sequence length, GPU model and a layout whose DP degree is known;
    raises :class:`~sapper.errors.InputError` naming the missing field otherwise.
    """
    work = Workload.from_plan(plan)
    cluster = Cluster.from_plan(plan)
    if layout is None:
        layout = Layout.from_plan(plan)
        if layout is None:
            raise InputError(
                "the data-parallel degree cannot be inferred",
                field="parallel.dp",
                expected="GPUs divisible by tp·pp·cp, or an explicit dp",
            )
    result = evaluate(work, cluster, LayoutBatch.from_layouts([layout], cluster, work.layers))
    return cost_of(result, 0, layout)

