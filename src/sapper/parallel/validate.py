"""Layout validation: every constraint a framework enforces, with the arithmetic shown.

Megatron-LM, DeepSpeed and torchtitan spread these checks over many files, and several
only fire at run time (a pipeline with fewer micro-batches than stages hangs). Here each
check is a small function of the plan returning :class:`LayoutIssue` objects whose
message carries the numbers, torchtitan-style: ``tp(2) * pp(1) * cp(1) * dp(8) = 16 !=
GPUs(64)``. The vectorizable predicates (``*_ok``) are shared with the planner, so a
layout the planner proposes always passes the checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapper.model.flops import padded_vocab
from sapper.parallel.cluster import Cluster
from sapper.parallel.layout import Layout, group_span, parse_rank_order, split_layers
from sapper.plan.schema import AttentionImpl, ModelSpec, Plan, PositionEncoding
from sapper.rules.model import Severity

__all__ = [
    "LayoutIssue",
    "bubble_fraction",
    "cp_supported",
    "heads_ok",
    "layers_ok",
    "micro_batches_ok",
    "seq_cp_ok",
    "tp_in_node_ok",
    "validate",
    "widths_ok",
    "zero_with_pp_ok",
]


@dataclass
class LayoutIssue:
    """One violated constraint; ``code`` names the P rule that reports it."""

    code: str
    severity: Severity
    message: str
    source: str | None = None
    value: float | None = None
    threshold: float | None = None
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


# ---- predicates shared with the planner (numpy-friendly) --------------------------------


def heads_ok(model: ModelSpec, tp: Any) -> Any:
    """Query heads split evenly, and KV heads either split evenly or are replicated an
    integral number of times (GQA: kv % tp == 0 or tp % kv == 0)."""
    tp = np.asarray(tp)
    kv = model.kv_heads
    return (model.num_heads % tp == 0) & ((kv % tp == 0) | (tp % kv == 0))


def widths_ok(model: ModelSpec, tp: Any) -> Any:
    """The MLP (and each expert's) inner width splits evenly over TP."""
    tp = np.asarray(tp)
    ok = model.ffn_size % tp == 0
    if model.moe_ffn_hidden_size:
        ok = ok & (model.moe_ffn_hidden_size % tp == 0)
    return ok


def layers_ok(layers: int, pp: Any, v: Any) -> Any:
    """Every (virtual) stage gets at least one layer, and interleaving needs a pipeline."""
    pp, v = np.asarray(pp), np.asarray(v)
    return (pp * v <= layers) & ((v == 1) | (pp > 1))


def micro_batches_ok(pp: Any, m: Any) -> Any:
    """At least as many micro-batches per step as pipeline stages."""
    return np.asarray(m) >= np.asarray(pp)


def seq_cp_ok(seq: int, cp: Any) -> Any:
    """Load-balanced causal context parallelism cuts the sequence into 2·CP chunks."""
    cp = np.asarray(cp)
    return (cp == 1) | (seq % (2 * cp) == 0)


def tp_in_node_ok(tp: Any, gpus_per_node: int) -> Any:
    """Each TP group stays inside one node (P103)."""
    return np.asarray(tp) <= gpus_per_node


def zero_with_pp_ok(pp: Any, zero: Any) -> Any:
    """ZeRO-2/3 is not combined with a pipeline (P111: DeepSpeed's pipeline engine
    supports stages 0-1 only)."""
    return (np.asarray(pp) == 1) | (np.asarray(zero) < 2)


def cp_supported(model: ModelSpec) -> bool:
    """Context parallelism needs a fused attention kernel and a position scheme its
    ring-attention kernels handle: not eager attention, not ALiBi."""
    return model.attention_impl != AttentionImpl.EAGER and (
        model.position_encoding != PositionEncoding.ALIBI
    )


def bubble_fraction(pp: int, m: int, v: int = 1) -> float:
    """Idle share of a step: (p-1)/(m+p-1) for 1F1B/GPipe; interleaving with v chunks
    per stage cuts the bubble time to (p-1)/(v·m) of the ideal time."""
    if pp <= 1:
        return 0.0
    if v > 1:
        rel = (pp - 1) / (v * m)
        return rel / (1 + rel)
    return (pp - 1) / (m + pp - 1)


# ---- checks ------------------------------------------------------------------------------

_Check = Callable[[Plan], Iterator[LayoutIssue]]
_CHECKS: list[_Check] = []


def _check(fn: _Check) -> _Check:
    _CHECKS.append(fn)
    return fn


def _degrees(plan: Plan) -> str:
    p = plan.parallel
    return f"tp({p.tp}) * pp({p.pp}) * cp({p.cp})"


@_check
def _world_size(plan: Plan) -> Iterator[LayoutIssue]:
    p, gpus = plan.parallel, plan.hardware.total_gpus
    mp = plan.model_parallel_size
    if gpus is None:
        return
    if p.dp == -1:
        if gpus % mp:
            yield LayoutIssue(
                "P102",
                Severity.ERROR,
                f"dp=-1 cannot be inferred: GPUs({gpus}) % ({_degrees(plan)} = {mp}) = "
                f"{gpus % mp}",
                source="parallel.dp",
                value=gpus,
                threshold=mp,
                fix=f"use a GPU count divisible by {mp}, or change tp/pp/cp",
            )
        return
    world = mp * p.dp
    if world != gpus:
        yield LayoutIssue(
            "P101",
            Severity.ERROR,
            f"{_degrees(plan)} * dp({p.dp}) = {world} != GPUs({gpus})",
            source="parallel.dp",
            value=world,
            threshold=gpus,
            fix=(
                f"set dp to {gpus // mp} (or -1 to infer it)"
                if gpus % mp == 0
                else f"GPUs({gpus}) is not a multiple of {_degrees(plan)} = {mp}"
            ),
        )


def _cluster(plan: Plan) -> Cluster | None:
    if plan.gpu is None or plan.hardware.total_gpus is None:
        return None
    return Cluster.from_plan(plan)


@_check
def _tp_beyond_node(plan: Plan) -> Iterator[LayoutIssue]:
    tp, gpn = plan.parallel.tp, plan.hardware.gpus_per_node
    if tp_in_node_ok(tp, gpn):
        return
    nodes = math.ceil(tp / gpn)
    msg = f"tp({tp}) > gpus_per_node({gpn}): each TP group spans {nodes} nodes"
    cluster = _cluster(plan)
    layout = Layout.from_plan(plan)
    if cluster is not None and layout is not None:
        span = group_span(layout, ("tp",), gpn)
        inside, across = cluster.gpu.nvlink_gbps, cluster.link_gbps(span)
        msg += (
            f"; its {4 + (2 if plan.parallel.checkpointing.granularity == 'full' else 0)} "
            f"collectives per layer drop from {inside:g} GB/s (NVLink) to {across:g} GB/s "
            f"(network, {span.per_node} NIC(s) per node) and pay the network's latency"
        )
    yield LayoutIssue(
        "P103",
        Severity.WARNING,
        msg,
        source="parallel.tp",
        value=tp,
        threshold=gpn,
        fix=f"keep tp ≤ {gpn} (one node) and split further with pp or cp across nodes",
    )


@_check
def _heads(plan: Plan) -> Iterator[LayoutIssue]:
    m, tp = plan.model, plan.parallel.tp
    if m is None or tp == 1:
        return
    a, kv = m.num_heads, m.kv_heads
    if a % tp:
        yield LayoutIssue(
            "P104",
            Severity.ERROR,
            f"num_heads({a}) % tp({tp}) = {a % tp}: attention heads cannot be split evenly",
            source="model.num_heads",
            value=a,
            threshold=tp,
            fix=f"use a tp that divides {a}: {_divisors_upto(a, 64)}",
        )
    elif not (kv % tp == 0 or tp % kv == 0):
        yield LayoutIssue(
            "P104",
            Severity.ERROR,
            f"num_kv_heads({kv}) vs tp({tp}): neither {kv} % {tp} == 0 nor {tp} % {kv} == 0, "
            "so KV heads can be neither split nor replicated evenly",
            source="model.num_kv_heads",
            value=kv,
            threshold=tp,
            fix=f"use a tp that divides or is a multiple of {kv}",
        )
    elif tp > kv:
        yield LayoutIssue(
            "P104",
            Severity.INFO,
            f"tp({tp}) > num_kv_heads({kv}): each KV head is replicated on {tp // kv} ranks "
            "(its K/V projection and cache are computed and stored that many times)",
            source="model.num_kv_heads",
            value=kv,
            threshold=tp,
            fix=f"tp ≤ {kv} avoids the replication",
        )


def _divisors_upto(n: int, limit: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, limit) + 1) if n % d == 0)


@_check
def _widths(plan: Plan) -> Iterator[LayoutIssue]:
    m, tp = plan.model, plan.parallel.tp
    if m is None:
        return
    for name, width in (
        ("ffn_hidden_size", m.ffn_size),
        ("moe_ffn_hidden_size", m.moe_ffn_hidden_size),
    ):
        if width and tp > 1 and width % tp:
            yield LayoutIssue(
                "P105",
                Severity.ERROR,
                f"{name}({width}) % tp({tp}) = {width % tp}: the MLP cannot be split evenly",
                source=f"model.{name}",
                value=width,
                threshold=tp,
                fix=f"use a tp that divides {width}",
            )
    if m.is_moe and plan.parallel.ep > 1 and m.num_experts % plan.parallel.ep:
        ep = plan.parallel.ep
        yield LayoutIssue(
            "P105",
            Severity.ERROR,
            f"num_experts({m.num_experts}) % ep({ep}) = {m.num_experts % ep}: experts cannot "
            "be spread evenly over the expert-parallel group",
            source="parallel.ep",
            value=m.num_experts,
            threshold=ep,
            fix=f"use an ep that divides {m.num_experts}",
        )


@_check
def _vocab(plan: Plan) -> Iterator[LayoutIssue]:
    m, tp = plan.model, plan.parallel.tp
    if m is None:
        return
    padded = padded_vocab(m.vocab_size, tp)
    if padded == m.vocab_size:
        return
    extra = padded - m.vocab_size
    yield LayoutIssue(
        "P106",
        Severity.INFO,
        f"vocab_size({m.vocab_size}) is padded to {padded} = 128 * tp({tp}) * "
        f"{padded // (128 * tp)} (+{extra} rows, {100 * extra / m.vocab_size:.2f}% more "
        "embedding and output-head work); checkpoints and tokenizer must agree on the size",
        source="model.vocab_size",
        value=m.vocab_size,
        threshold=padded,
        fix=f"pad the vocabulary to {padded} yourself so every tool sees the same size",
    )


@_check
def _layers(plan: Plan) -> Iterator[LayoutIssue]:
    m, p = plan.model, plan.parallel
    pp, v = p.pp, p.virtual_pipeline_stages
    if v > 1 and pp == 1:
        yield LayoutIssue(
            "P107",
            Severity.ERROR,
            f"virtual_pipeline_stages({v}) with pp(1): interleaving needs a pipeline",
            source="parallel.virtual_pipeline_stages",
            value=v,
            fix="set virtual_pipeline_stages to 1, or use pp > 1",
        )
        return
    if p.pipeline_schedule == "interleaved" and v == 1 and pp > 1:
        yield LayoutIssue(
            "P107",
            Severity.WARNING,
            "pipeline_schedule is interleaved but virtual_pipeline_stages is 1: this runs as "
            "plain 1F1B",
            source="parallel.virtual_pipeline_stages",
            value=v,
            fix="set virtual_pipeline_stages ≥ 2 (layers per stage must divide by it)",
        )
    if m is None or pp == 1:
        return
    L, chunks = m.num_layers, pp * v
    first, last = p.first_stage_layers, p.last_stage_layers
    if first is not None or last is not None:
        yield from _explicit_split(L, pp, v, first, last)
        return
    if chunks > L:
        yield LayoutIssue(
            "P107",
            Severity.ERROR,
            f"pp({pp}) * virtual_pipeline_stages({v}) = {chunks} > num_layers({L}): some "
            "stages would hold no layer",
            source="parallel.pp",
            value=chunks,
            threshold=L,
            fix=f"keep pp * v ≤ {L}",
        )
    elif L % chunks:
        most, avg = math.ceil(L / chunks), L / chunks
        what = f"pp({pp})" if v == 1 else f"(pp({pp}) * v({v}) = {chunks})"
        yield LayoutIssue(
            "P107",
            Severity.WARNING,
            f"num_layers({L}) % {what} = {L % chunks}: chunks hold {most} or {most - 1} "
            f"layers; the pipeline runs at the pace of the fullest ({most} vs {avg:.2f} on "
            f"average, {100 * (most / avg - 1):.0f}% slower)"
            + ("; Megatron's interleaved schedule requires an even split" if v > 1 else ""),
            source="model.num_layers",
            value=L,
            threshold=chunks,
            fix="choose pp (and v) dividing the layer count, or give the first and last "
            "stages fewer layers explicitly (they also hold the embedding and the head)",
        )


def _explicit_split(
    L: int, pp: int, v: int, first: int | None, last: int | None
) -> Iterator[LayoutIssue]:
    stages = split_layers(L, pp, first, last)
    given = f"first_stage_layers({first}), last_stage_layers({last})"
    if stages is None:
        fixed = sum(x for x in (first, last) if x is not None)
        rest = pp - sum(x is not None for x in (first, last))
        yield LayoutIssue(
            "P107",
            Severity.ERROR,
            f"{given}: the other {L} - {fixed} = {L - fixed} layers do not split evenly "
            f"over the remaining {rest} stages",
            source="parallel.first_stage_layers",
            value=L - fixed,
            threshold=rest,
            fix="choose first/last stage layer counts that leave a multiple of the other "
            "stages",
        )
        return
    uneven = sorted({n for n in stages if n % v})
    if v > 1 and uneven:
        yield LayoutIssue(
            "P107",
            Severity.WARNING,
            f"stages of {', '.join(map(str, uneven))} layers do not split into "
            f"v({v}) equal chunks; Megatron's interleaved schedule requires it",
            source="parallel.virtual_pipeline_stages",
            value=v,
            fix="use a number of virtual stages dividing every stage's layer count",
        )


@_check
def _micro_batches(plan: Plan) -> Iterator[LayoutIssue]:
    p = plan.parallel
    m = plan.grad_accum
    if p.pp == 1 or m is None:
        return
    pp, v = p.pp, p.virtual_pipeline_stages
    if m < pp:
        frac = bubble_fraction(pp, m)
        yield LayoutIssue(
            "P108",
            Severity.ERROR,
            f"micro-batches per step({m}) < pp({pp}): the pipeline never fills; bubble "
            f"(p-1)/(m+p-1) = {pp - 1}/{m + pp - 1} = {100 * frac:.0f}% of the step, and "
            "some schedules hang",
            source="batch.gradient_accumulation_steps",
            value=m,
            threshold=pp,
            fix=f"raise gradient accumulation to ≥ {4 * pp} (bubble ≤ "
            f"{100 * bubble_fraction(pp, 4 * pp):.0f}%) or lower pp",
        )
        return
    if v > 1 and m % pp:
        yield LayoutIssue(
            "P108",
            Severity.WARNING,
            f"micro-batches per step({m}) % pp({pp}) = {m % pp}: Megatron's interleaved "
            "schedule requires a multiple of pp",
            source="batch.gradient_accumulation_steps",
            value=m,
            threshold=pp,
            fix=f"use a multiple of {pp} micro-batches per step",
        )
    frac = bubble_fraction(pp, m, v)
    if frac > 0.25:
        formula = (
            f"(p-1)/(m+p-1) = {pp - 1}/{m + pp - 1}"
            if v == 1
            else f"(p-1)/(v·m) = {pp - 1}/{v * m} of compute"
        )
        need = math.ceil(9 * (pp - 1) / v)  # bubble ≤ 10%
        yield LayoutIssue(
            "P108",
            Severity.WARNING,
            f"pipeline bubble {formula}: {100 * frac:.0f}% of the step idle with "
            f"{m} micro-batches over {pp} stages",
            source="batch.gradient_accumulation_steps",
            value=round(frac, 4),
            threshold=0.25,
            fix=f"≥ {need} micro-batches per step bring it to ≤ 10%"
            + ("" if v > 1 else "; or interleave (virtual_pipeline_stages)"),
        )


@_check
def _sequence_parallel(plan: Plan) -> Iterator[LayoutIssue]:
    p = plan.parallel
    if p.sequence_parallel and p.tp == 1:
        yield LayoutIssue(
            "P109",
            Severity.ERROR,
            "sequence_parallel with tp(1): sequence parallelism splits norms and dropout "
            "over the TP group, so it needs tp > 1",
            source="parallel.sequence_parallel",
            fix="turn sequence_parallel off, or use tp > 1",
        )
    if p.tp_comm_overlap and p.tp > 1 and not p.sequence_parallel:
        yield LayoutIssue(
            "P109",
            Severity.ERROR,
            f"tp_comm_overlap without sequence_parallel at tp({p.tp}): the overlap pipelines "
            "the all-gather and reduce-scatter that sequence parallelism issues (Megatron "
            "refuses it otherwise)",
            source="parallel.tp_comm_overlap",
            fix="turn sequence_parallel on, or tp_comm_overlap off",
        )


@_check
def _context_parallel(plan: Plan) -> Iterator[LayoutIssue]:
    cp, s = plan.parallel.cp, plan.batch.seq_len
    if cp == 1 or s is None:
        return
    if s % (2 * cp):
        yield LayoutIssue(
            "P110",
            Severity.ERROR,
            f"seq_len({s}) % (2 * cp({cp})) = {s % (2 * cp)}: load-balanced causal context "
            f"parallelism cuts each sequence into {2 * cp} equal chunks",
            source="batch.seq_len",
            value=s,
            threshold=2 * cp,
            fix=f"use a sequence length divisible by {2 * cp}",
        )


@_check
def _cp_kernel(plan: Plan) -> Iterator[LayoutIssue]:
    m, cp = plan.model, plan.parallel.cp
    if m is None or cp == 1 or cp_supported(m):
        return
    what = "eager attention" if m.attention_impl == AttentionImpl.EAGER else "ALiBi positions"
    yield LayoutIssue(
        "P117",
        Severity.ERROR,
        f"cp({cp}) with {what}: ring attention needs a fused kernel and RoPE or learned "
        "positions",
        source="parallel.cp",
        value=cp,
        threshold=1,
        fix="use cp 1 (split the batch with DP instead)",
    )


@_check
def _zero_with_pp(plan: Plan) -> Iterator[LayoutIssue]:
    p = plan.parallel
    if not zero_with_pp_ok(p.pp, p.zero_stage):
        m = plan.grad_accum
        extra = (
            f"; it would also reduce-scatter gradients on each of the {m} micro-batches"
            if m and m > 1
            else ""
        )
        # DeepSpeed's PipelineEngine asserts zero_optimization_stage() < 2 at start-up.
        deepspeed = plan.framework == "deepspeed"
        yield LayoutIssue(
            "P111",
            Severity.ERROR if deepspeed else Severity.WARNING,
            f"zero_stage({p.zero_stage}) with pp({p.pp}): DeepSpeed's pipeline engine "
            f"supports ZeRO stages 0-1 only"
            + (" and refuses to start" if deepspeed else "") + extra,
            source="parallel.zero_stage",
            value=p.zero_stage,
            threshold=1,
            fix="use ZeRO-1 with pipeline parallelism (or a framework that shards with PP, "
            "such as torchtitan's FSDP + PP)",
        )


@_check
def _rank_order(plan: Plan) -> Iterator[LayoutIssue]:
    p = plan.parallel
    order = parse_rank_order(p.rank_order)
    if order is None:
        yield LayoutIssue(
            "P112",
            Severity.ERROR,
            f"rank_order {p.rank_order!r} must name tp, cp, dp and pp once each (ep optional)",
            source="parallel.rank_order",
            fix="use Megatron's order tp-cp-ep-dp-pp",
        )
        return
    layout, gpn = Layout.from_plan(plan), plan.hardware.gpus_per_node
    if layout is None or p.tp == 1 or p.tp > gpn:
        return
    span = group_span(layout, ("tp",), gpn)
    if span.intra_node:
        return
    msg = (
        f"rank_order {p.rank_order!r} with gpus_per_node({gpn}) puts each TP group of "
        f"{p.tp} on {span.nodes} nodes ({span.per_node} rank(s) per node)"
    )
    cluster = _cluster(plan)
    if cluster is not None:
        msg += (
            f": TP collectives run at {cluster.link_gbps(span):g} GB/s instead of "
            f"{cluster.gpu.nvlink_gbps:g} GB/s NVLink"
        )
    yield LayoutIssue(
        "P112",
        Severity.WARNING,
        msg,
        source="parallel.rank_order",
        value=span.nodes,
        threshold=1,
        fix="put tp first (fastest-varying) in the rank order and use a tp that divides "
        f"{gpn}, as Megatron's tp-cp-ep-dp-pp does",
    )


@_check
def _expert_parallel(plan: Plan) -> Iterator[LayoutIssue]:
    p, m = plan.parallel, plan.model
    if p.ep == 1:
        return
    if m is not None and not m.is_moe:
        yield LayoutIssue(
            "P113",
            Severity.ERROR,
            f"ep({p.ep}) with a dense model (num_experts 1): there are no experts to spread",
            source="parallel.ep",
            value=p.ep,
            fix="set ep to 1 for dense models",
        )
        return
    dp = plan.dp_degree
    if dp is not None and dp % p.ep:
        yield LayoutIssue(
            "P113",
            Severity.ERROR,
            f"dp({dp}) % ep({p.ep}) = {dp % p.ep}: expert parallelism is carved out of the "
            "data-parallel ranks, so ep must divide dp",
            source="parallel.ep",
            value=p.ep,
            threshold=dp,
            fix=f"use an ep that divides {dp}: {_divisors_upto(dp, 256)}",
        )


def validate(plan: Plan) -> list[LayoutIssue]:
    """Every layout constraint the plan violates (errors, warnings and notes)."""
    issues: list[LayoutIssue] = []
    for check in _CHECKS:
        issues.extend(check(plan))
    return issues
