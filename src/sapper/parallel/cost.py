"""Time of one training step on one GPU, and where it goes (seed §4).

The model, per GPU and per micro-batch on the slowest pipeline stage:

* **compute**: matmuls as a roofline, the larger of executed FLOPs / (datasheet peak x
  sustained GEMM fraction) and the weight and weight-gradient bytes they stream / HBM
  bandwidth (few tokens per GPU make them memory-bound); plus the memory-bound
  element-wise work (norms, residual adds, activations, eager softmax) as bytes / (HBM
  bandwidth x its sustained fraction). Training = 3 forwards; full recomputation adds a
  forward, selective adds the attention core.
* **TP**: per layer, 2 all-reduces forward and 2 backward (+2 with full recomputation),
  or the same volume as all-gather + reduce-scatter with sequence parallelism. *Assumed
  not overlapped*: each sits between the matmuls that produce and consume it.
* **EP**: 2 all-to-alls forward and 2 backward per MoE layer, not overlapped.
* **CP**: ring attention passes K/V around the CP group in CP-1 point-to-point steps
  (1x forward, 2x backward); *assumed overlapped* with the attention core, only the
  excess is exposed.
* **PP**: one activation send forward and one gradient send backward per micro-batch and
  virtual chunk, at 1/TP of the activation (scatter/gather or sequence parallel), not
  overlapped; the pipeline runs at the pace of its slowest stage (the last one also
  runs the output head). Bubble: (p-1)/v micro-batch slots (1F1B: v = 1).
* **DP / ZeRO** per step over the data x context parallel group: ZeRO-0 all-reduces the
  gradients once; ZeRO-1 reduce-scatters gradients and all-gathers parameters once;
  ZeRO-2 reduce-scatters on every micro-batch (gradients are sharded, so accumulation
  cannot wait); ZeRO-3 also all-gathers parameters forward and backward on every
  micro-batch (~1.5x DP's traffic). With ``overlap_dp_comm`` (the default) they overlap
  one micro-batch's backward (gradients) or forward (parameters), taken as 2/3 and 1/3
  of its time: only the excess is exposed; without it they are exposed in full.
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
from sapper.parallel.cluster import Cluster
from sapper.parallel.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    P2P,
    REDUCE_SCATTER,
    collective_time,
)
from sapper.parallel.efficiency import HBM_FRACTION, PCIE_GBPS, gemm_fraction
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

#: Bytes per element of the CE softmax over the logits (computed in fp32).
_LOGIT_BYTES = 4
#: Element passes of the vocab-parallel cross entropy, forward and backward.
_CE_PASSES = 6


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
    overlap: np.ndarray
    bw_tp: np.ndarray
    bw_cp: np.ndarray
    bw_ep: np.ndarray
    bw_grad: np.ndarray
    bw_expert: np.ndarray
    bw_pp: np.ndarray
    l_max: np.ndarray  # most layers on a stage other than the last (all layers if pp = 1)
    l_last: np.ndarray  # layers on the last stage (which also runs the output head)

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
                "bw_tp": cluster.bus_gbps(pl.tp), "bw_cp": cluster.bus_gbps(pl.cp),
                "bw_ep": cluster.bus_gbps(pl.ep), "bw_grad": cluster.bus_gbps(pl.grad),
                "bw_expert": cluster.bus_gbps(pl.expert_grad), "bw_pp": cluster.bus_gbps(pl.pp),
                "l_max": max(stages[:-1]) if lay.pp > 1 else layers,
                "l_last": stages[-1],
            }
            for k, val in row.items():
                cols[k].append(val)
        return cls(**{k: np.asarray(v) for k, v in cols.items()})


def _padded_vocab(vocab: int, tp: np.ndarray) -> np.ndarray:
    unit = 128 * tp
    return -(-vocab // unit) * unit


def evaluate(w: Workload, cluster: Cluster, b: LayoutBatch) -> dict[str, np.ndarray]:
    """Cost every layout of ``b``: seconds per step by component (``BREAKDOWN``), the step
    time, throughput and FLOP rates, plus the intermediate figures reports quote."""
    f = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    tp, pp, cp, dp, ep = f(b.tp), f(b.pp), f(b.cp), f(b.dp), f(b.ep)
    micro, m, v = f(b.micro), f(b.ga), f(b.v)
    rc = f(b.rc)  # share of layers whose forward is recomputed in full
    sel = b.ckpt == 1
    flops_rate = cluster.peak_flops * gemm_fraction(cluster.gpu)
    hbm = cluster.gpu.hbm_gbps * 1e9 * HBM_FRACTION
    ab = w.act_bytes
    tokens = micro * w.seq_len / cp  # tokens per GPU per micro-batch

    # -- one layer, one micro-batch, forward + backward (+ recompute) --------------------
    gemm = tokens * w.gemm_flops / tp
    attn = tokens * w.attn_flops * w.attn_exec / tp
    exec_flops = 3 * (gemm + attn) + rc * (gemm + attn) + np.where(sel, attn, 0)
    t_attn = (3 * attn + rc * attn + np.where(sel, attn, 0)) / flops_rate
    rep = np.where(b.sp, w.elem_replicated / tp, w.elem_replicated)
    scores = tokens * w.elem_scores / tp
    elem_fwd = tokens * (rep + w.elem_split / tp) + scores
    elems = 3 * elem_fwd + rc * elem_fwd + np.where(sel, scores, 0)
    # Matmuls are a roofline: their FLOPs, or streaming the layer's weights (forward,
    # recompute, backward data-gradient) and accumulating its weight gradients
    # (read + write), whichever takes longer: few tokens per GPU make them memory-bound.
    w_local = w.layer_params / tp + w.expert_params / (tp * ep)
    w_bytes = w_local * (ab * (2 + rc) + 2 * w.grad_bytes)
    t_matmul = np.maximum(exec_flops / flops_rate, w_bytes / hbm)
    t_compute = t_matmul + elems * ab / hbm

    act = tokens * w.hidden * ab  # one activation tensor [tokens, h]
    n_tp = 4 + 2 * rc
    t_tp_one = np.where(
        b.sp,
        collective_time(ALL_GATHER, act, tp, b.bw_tp)
        + collective_time(REDUCE_SCATTER, act, tp, b.bw_tp),
        collective_time(ALL_REDUCE, act, tp, b.bw_tp),
    )
    t_tp = n_tp * t_tp_one

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

    # -- stages: balanced, the last stage also runs the output head ----------------------
    layers_max, layers_last = f(b.l_max), f(b.l_last)
    vpad = _padded_vocab(w.vocab, b.tp).astype(float)
    head = tokens * 2 * w.hidden * vpad / tp
    t_head = 3 * head / flops_rate + tokens * vpad / tp * _CE_PASSES * _LOGIT_BYTES / hbm
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

    p2p_bytes = act / tp
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

    t_ar = sync(ALL_REDUCE, psi_dense * gb, psi_expert * gb)
    t_rs = sync(REDUCE_SCATTER, psi_dense * gb, psi_expert * gb)
    t_ag = sync(ALL_GATHER, psi_dense * pb, psi_expert * pb)
    w_bwd = np.where(b.overlap, t_mb * 2 / 3, 0.0)
    w_fwd = np.where(b.overlap, t_mb / 3, 0.0)
    exp = lambda t, window: np.maximum(0.0, t - window)  # noqa: E731
    zero = b.zero
    dp_exposed = np.select(
        [zero == 0, zero == 1, zero == 2],
        [
            exp(t_ar, w_bwd),
            exp(t_rs, w_bwd) + exp(t_ag, w_fwd),
            m * exp(t_rs, w_bwd) + exp(t_ag, w_fwd),
        ],
        default=m * (exp(t_ag, w_fwd) + exp(t_ag + t_rs, w_bwd)),
    )
    dp_volume = np.select(
        [zero == 0, zero == 1, zero == 2],
        [2 * psi_dense * gb, psi_dense * (gb + pb), m * psi_dense * gb + psi_dense * pb],
        default=m * psi_dense * (2 * pb + gb),
    )

    psi = psi_dense + psi_expert
    owned = np.where(zero >= 1, psi / n_grad, psi)
    t_opt = np.where(
        b.offload,
        owned * (gb + pb) / (PCIE_GBPS * 1e9),
        owned * w.optimizer_bytes / hbm,
    )

    steady = m * slot
    step = steady + bubble + dp_exposed + t_opt
    global_batch = micro * m * dp
    step_tokens = global_batch * w.seq_len
    world = tp * pp * cp * dp
    model_flops = w.model_flops_per_token() * step_tokens
    redo = rc * w.recompute_flops_per_token("full") + np.where(
        sel, w.recompute_flops_per_token("selective"), 0.0
    )
    hw_flops = model_flops + redo * step_tokens
    out = {
        "compute": m * mb_compute,
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
    }
    out["mfu"] = out["model_tflops"] * 1e12 / cluster.peak_flops
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
            for k in ("microbatch_time", "dp_bytes", "tp_bytes_per_layer", "params_per_gpu")
        },
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

