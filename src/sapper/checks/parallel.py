"""Checklist item 6, the parallel layout (seed §4, §5.1): degrees, divisibility, pipeline,
communication groups, and the predicted cost of a step.

The arithmetic lives in :mod:`sapper.parallel` (``validate``, ``predict_step``,
``search``); this module holds the rules' documentation and turns their results into
findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapper.checks.engine import CheckOutput, not_evaluated, plan_check
from sapper.errors import InputError
from sapper.plan.schema import Plan
from sapper.rules.model import Finding, Rule, Severity

# sapper.parallel (numpy) is imported inside the checks: the rules below are imported
# whenever sapper lists its rules, which must not pay for the cost model.
if TYPE_CHECKING:
    from sapper.parallel.cost import StepCost
    from sapper.plan.load import LoadedPlan

__all__ = ["PARALLEL_RULES"]

_CHECK = "parallel"

WORLD_SIZE = Rule(
    code="P101",
    name="degrees-do-not-multiply-to-gpus",
    check=_CHECK,
    severity=Severity.ERROR,
    title="TP·PP·CP·DP does not equal the number of GPUs",
    why="""\
Every GPU gets exactly one coordinate in the TP x PP x CP x DP grid. When the product
differs from the world size the launcher either refuses to start or, worse, builds groups
over ranks that do not exist and hangs in the first collective.""",
    signs="""\
An assertion at start-up ("world size is not divisible by ..."), or a job that hangs in
its first all-reduce with every rank waiting.""",
    fix="""\
Make tp·pp·cp·dp equal the GPU count, or set dp to -1 so it is inferred.""",
    seed="§4.1, §5.1 item 6",
)

DP_NOT_INFERABLE = Rule(
    code="P102",
    name="dp-cannot-be-inferred",
    check=_CHECK,
    severity=Severity.ERROR,
    title="dp = -1 but the GPUs do not divide by tp·pp·cp",
    why="""\
An inferred DP degree is GPUs / (tp·pp·cp); when that is not a whole number some GPUs
would have no place in the grid.""",
    signs="""\
The framework refuses to start, or silently leaves GPUs idle.""",
    fix="""\
Use a GPU count divisible by tp·pp·cp, or change the model-parallel degrees.""",
    seed="§4.1",
)

TP_BEYOND_NODE = Rule(
    code="P103",
    name="tensor-parallel-beyond-a-node",
    check=_CHECK,
    severity=Severity.WARNING,
    title="Tensor parallelism spans more GPUs than one node has",
    why="""\
TP issues collectives inside every layer, forward and backward, on the critical path. In
one node they run over NVLink; beyond it they cross the network, which is several times
slower per GPU and adds its latency to every layer.""",
    signs="""\
Step time far above the estimate; GPU utilization low with long NCCL kernels between
matmuls in a profile; throughput that drops when adding nodes.""",
    fix="""\
Keep TP within one node (TP ≤ GPUs per node) and split further with pipeline or context
parallelism across nodes (seed §4.4: TP = GPUs per node, PP across nodes).""",
    seed="§4.2, §4.4",
)

HEADS_VS_TP = Rule(
    code="P104",
    name="attention-heads-vs-tp",
    check=_CHECK,
    severity=Severity.ERROR,
    title="Attention heads (or KV heads) do not split over TP",
    why="""\
Tensor parallelism gives each rank whole attention heads. Query heads must divide by TP;
with grouped-query attention the KV heads must either divide by TP or be replicated an
integral number of times (TP a multiple of the KV heads).""",
    signs="""\
An assertion when the model is built ("num_attention_heads must be divisible by
tensor_model_parallel_size"), or shapes that do not match at the first forward.""",
    fix="""\
Choose a TP that divides the number of heads (and divides or is a multiple of the KV
heads).""",
    seed="§4.2",
)

WIDTHS_VS_TP = Rule(
    code="P105",
    name="mlp-width-vs-tp",
    check=_CHECK,
    severity=Severity.ERROR,
    title="The MLP width or the experts do not split evenly",
    why="""\
Column-parallel layers split the MLP's inner width over TP ranks and expert parallelism
spreads whole experts over its ranks; an uneven split fails, or pads and wastes work.""",
    signs="""\
A shape or divisibility error when the model is built.""",
    fix="""\
Use a TP that divides the FFN width and an EP that divides the number of experts.""",
    seed="§4.2",
)

VOCAB_PADDING = Rule(
    code="P106",
    name="vocabulary-padded-for-tp",
    check=_CHECK,
    severity=Severity.INFO,
    title="The vocabulary is padded to a multiple of 128 x TP",
    why="""\
Megatron pads the embedding and output head to a multiple of 128·TP rows so they split
evenly and run at tensor-core speed. The padded rows change the checkpoint's shape: a
tokenizer, converter or evaluation tool that expects the original size breaks.""",
    signs="""\
Shape mismatches when converting or loading checkpoints; logits with more entries than
the tokenizer has tokens.""",
    fix="""\
Pad the vocabulary yourself to the padded size so every tool agrees, or keep the
converter aware of the padding.""",
    seed="§4.2",
)

LAYERS_VS_PP = Rule(
    code="P107",
    name="layers-vs-pipeline-stages",
    check=_CHECK,
    severity=Severity.ERROR,
    title="Layers do not split over the pipeline (and virtual) stages",
    why="""\
Every pipeline stage (and every interleaved chunk) needs at least one layer; when the
layers do not divide evenly, the stage with the most layers sets the pace and the others
wait for it every micro-batch. Megatron's interleaved schedule refuses uneven splits.""",
    signs="""\
A start-up assertion ("number of layers should be divisible by ..."), or per-stage step
times that differ, with the fullest stage always busy.""",
    fix="""\
Choose PP (and virtual stages) dividing the layer count, or give the first and last
stages fewer layers explicitly (they also hold the embedding and the output head).""",
    seed="§4.1",
)

MICROBATCHES_VS_PP = Rule(
    code="P108",
    name="micro-batches-vs-pipeline",
    check=_CHECK,
    severity=Severity.ERROR,
    title="Too few micro-batches for the pipeline",
    why="""\
A pipeline of p stages idles while it fills and drains: with m micro-batches per step
the bubble is (p-1)/(m+p-1) of the step under 1F1B, (p-1)/(v·m) of the compute with v
interleaved chunks. With m < p the pipeline never fills and some schedules hang.""",
    signs="""\
Throughput far below the estimate that rises with gradient accumulation; a job that
hangs in its first step (torchtitan#775).""",
    fix="""\
Raise gradient accumulation (micro-batches per step) to several times PP, interleave
(virtual pipeline stages), or lower PP.""",
    seed="§4.1",
)

SP_WITHOUT_TP = Rule(
    code="P109",
    name="sequence-parallel-without-tp",
    check=_CHECK,
    severity=Severity.ERROR,
    title="Sequence parallelism without tensor parallelism (or TP overlap without it)",
    why="""\
Sequence parallelism splits the norms and dropout of a TP group along the sequence; with
TP = 1 there is no group to split over and frameworks reject the setting. TP
communication overlap pipelines the all-gathers and reduce-scatters that sequence
parallelism issues, so Megatron refuses it without them.""",
    signs="""\
A start-up assertion.""",
    fix="""\
Turn sequence parallelism off, or use TP > 1; with tp_comm_overlap, turn sequence
parallelism on.""",
    seed="§4.2",
)

SEQ_VS_CP = Rule(
    code="P110",
    name="sequence-vs-context-parallel",
    check=_CHECK,
    severity=Severity.ERROR,
    title="The sequence length does not divide by 2·CP",
    why="""\
Load-balanced causal context parallelism cuts each sequence into 2·CP chunks and gives
every rank one early and one late chunk; the length must divide evenly.""",
    signs="""\
A shape assertion in the attention's first forward.""",
    fix="""\
Use a sequence length divisible by 2·CP (pad or pack sequences to it).""",
    seed="§4.1",
)

ZERO_WITH_PP = Rule(
    code="P111",
    name="zero-2-3-with-pipeline",
    check=_CHECK,
    severity=Severity.WARNING,
    title="ZeRO-2/3 combined with pipeline parallelism",
    why="""\
DeepSpeed's pipeline engine supports ZeRO stages 0-1 only. Where sharded gradients are
combined with a pipeline anyway, the gradients cannot be accumulated over the
micro-batches: they are reduce-scattered on every micro-batch, multiplying the data-parallel
traffic by the number of micro-batches.""",
    signs="""\
DeepSpeed refuses to start ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
parallelism"); elsewhere, data-parallel communication that grows with gradient
accumulation.""",
    fix="""\
Use ZeRO-1 with pipeline parallelism (or a framework built for sharding with a pipeline,
such as FSDP with torchtitan's pipeline).""",
    seed="§3.3, §4.1",
)

RANK_ORDER = Rule(
    code="P112",
    name="rank-order-splits-tp-groups",
    check=_CHECK,
    severity=Severity.WARNING,
    title="The rank order puts TP groups across nodes",
    why="""\
Which ranks form a TP group is decided by the rank order: with TP fastest-varying, a TP
group of up to GPUs-per-node ranks is one node. Another order, or a TP that does not
divide the GPUs per node, scatters TP groups over nodes and every layer's collectives go
over the network, although the degrees look right (seed §5.1 item 6: communication groups
initialized correctly).""",
    signs="""\
A step several times slower than an identical layout elsewhere; NCCL all-reduces inside
each layer running at network speed in a profile.""",
    fix="""\
Put tp first in the rank order (Megatron's tp-cp-ep-dp-pp) and use a TP that divides the
GPUs per node.""",
    seed="§4.4, §5.1 item 6",
)

EP_VS_DP = Rule(
    code="P113",
    name="expert-parallel-vs-dp",
    check=_CHECK,
    severity=Severity.ERROR,
    title="Expert parallelism does not fit inside data parallelism",
    why="""\
Expert parallelism is carved out of the data-parallel ranks: each EP group holds different
experts and the remaining DP ranks replicate them. EP must divide DP, and a dense model
has no experts to spread.""",
    signs="""\
A start-up assertion when the process groups are built.""",
    fix="""\
Use an EP that divides DP (and the number of experts); EP = 1 for dense models.""",
    seed="§4.1",
)

CP_UNSUPPORTED = Rule(
    code="P117",
    name="context-parallel-unsupported",
    check=_CHECK,
    severity=Severity.ERROR,
    title="Context parallelism with an attention kernel or position scheme it cannot split",
    why="""\
Context parallelism (ring attention) splits each sequence across ranks and passes key/value
blocks around the ring, computing attention block by block with a fused (flash-style)
kernel that carries the softmax statistics between blocks. Eager attention materializes
the whole s×s score matrix on one rank, and ALiBi's position bias is not supported by the
context-parallel fused kernels (Megatron-Core/Transformer Engine), so the job refuses to
start or computes attention over the local chunk only.""",
    signs="""\
An assertion when the attention module is built; or, where nothing checks, a loss worse
than the same run without CP.""",
    fix="""\
Use CP = 1 for such models (split the batch with DP, the weights with TP/PP), or switch to
flash/SDPA attention with RoPE or learned positions.""",
    seed="§4.1",
)

COMM_BOUND = Rule(
    code="P114",
    name="communication-bound-layout",
    check=_CHECK,
    severity=Severity.WARNING,
    title="The layout spends much of the step waiting on communication",
    why="""\
Each parallelism has a price in communication (seed §4.3): TP all-reduces inside every
layer, pipeline sends, data-parallel gradient reductions, ZeRO's gathers. Placed on the
wrong link or not overlapped, they leave the GPUs idle: more GPUs, and a slower job
("multi-GPU is slower than one GPU").""",
    signs="""\
Tokens/s far below the estimate; MFU under 30%; throughput that does not grow with GPUs;
long NCCL kernels with idle compute in a profile.""",
    fix="""\
Put TP inside the node, DP and PP across nodes (seed §4.4); overlap gradient reduction
with the backward; prefer ZeRO-1 to ZeRO-3 when memory allows; `sapper plan` lists the
layouts predicted fastest.""",
    seed="§4.3, §4.4",
)

FASTER_LAYOUT = Rule(
    code="P115",
    name="faster-layout-available",
    check=_CHECK,
    severity=Severity.INFO,
    title="A layout predicted markedly faster fits the same GPUs",
    why="""\
The same model on the same GPUs can differ by tens of percent in throughput depending
on TP, PP, DP, ZeRO stage, recomputation and micro-batch size; days of a large run are
lost to a layout nobody compared.""",
    signs="""\
MFU well below published runs of similar size.""",
    fix="""\
Compare with `sapper plan`, which ranks every valid layout that fits and explains each.""",
    seed="§4.4",
)

STEP_PREDICTION = Rule(
    code="P116",
    name="predicted-step-cost",
    check=_CHECK,
    severity=Severity.INFO,
    title="Predicted step time, throughput and where the time goes",
    why="""\
A throughput expectation set before launch makes a slow run visible in its first
minutes (seed §5.2, throughput against expectation) instead of after a day.""",
    signs="""\
Measured tokens/s far below this prediction points at communication or the data
pipeline.""",
    fix="""\
Compare the first steps' tokens/s with this prediction; investigate a gap above ~20%.""",
    seed="§5.2",
)

PARALLEL_RULES: tuple[Rule, ...] = (
    WORLD_SIZE,
    DP_NOT_INFERABLE,
    TP_BEYOND_NODE,
    HEADS_VS_TP,
    WIDTHS_VS_TP,
    VOCAB_PADDING,
    LAYERS_VS_PP,
    MICROBATCHES_VS_PP,
    SP_WITHOUT_TP,
    SEQ_VS_CP,
    ZERO_WITH_PP,
    RANK_ORDER,
    EP_VS_DP,
    CP_UNSUPPORTED,
)
_BY_CODE = {r.code: r for r in PARALLEL_RULES}

#: Exposed communication above this share of the step is reported (P114).
COMM_SHARE_WARN = 0.25
#: A layout at least this many times faster is reported (P115).
FASTER_FACTOR = 1.2

_COMM = {"tp_comm": "TP", "cp_comm": "CP", "ep_comm": "EP", "pp_p2p": "PP p2p", "dp_comm": "DP"}


@plan_check(*PARALLEL_RULES)
def layout_constraints(plan: Plan) -> CheckOutput:
    from sapper.parallel import validate

    missing = [f for f, v in (("model", plan.model), ("hardware.num_gpus",
               plan.hardware.total_gpus)) if v is None]
    if missing:
        yield not_evaluated(
            "the layout against the model (heads, layers, widths) and the cluster (world "
            "size, TP inside a node)",
            *missing,
        )
    for issue in validate(plan):
        rule = _BY_CODE[issue.code]
        yield rule.finding(
            issue.message,
            severity=issue.severity,
            fix=issue.fix,
            value=issue.value,
            threshold=issue.threshold,
            source=issue.source,
            **issue.data,
        )


def _predict(plan: Plan) -> StepCost | None:
    """The plan's predicted step, when it is complete and its layout has no error."""
    from sapper.parallel import Layout, predict_step, validate

    needed = (plan.model, plan.gpu, plan.hardware.total_gpus, plan.batch.seq_len,
              plan.batch.micro_batch_size)
    if any(x is None for x in needed) or Layout.from_plan(plan) is None:
        return None
    if any(i.severity == Severity.ERROR for i in validate(plan)):
        return None
    try:
        return predict_step(plan)
    except InputError:
        return None


def _shares(cost: StepCost) -> str:
    from sapper.parallel.explain import LABELS

    return ", ".join(
        f"{LABELS[k]} {100 * v:.0f}%" for k, v in cost.shares().items() if v >= 0.005
    )


@plan_check(COMM_BOUND, STEP_PREDICTION)
def predicted_cost(plan: Plan) -> CheckOutput:
    from sapper.parallel.cluster import Cluster
    from sapper.parallel.confidence import mfu_note, outside, prediction_band
    from sapper.parallel.cost import BREAKDOWN
    from sapper.parallel.workload import Workload

    cost = _predict(plan)
    if cost is None:
        return
    work, cluster = Workload.from_plan(plan), Cluster.from_plan(plan)
    out = outside(cost.layout, work, cluster)
    trust = (
        f"outside the calibrated region ({'; '.join(out)})"
        if out
        else f"the calibration's published runs are predicted to ±{100 * prediction_band():.0f}%"
    )
    hidden = cost.assumptions()
    note = mfu_note(cost.mfu, cluster.gpu.name)
    yield STEP_PREDICTION.finding(
        f"predicted {cost.step_time_s:.3g} s per step, {cost.tokens_per_s:,.0f} tokens/s, "
        f"{cost.model_tflops_per_gpu:.0f} TFLOP/s per GPU ({100 * cost.mfu:.0f}% MFU): "
        + _shares(cost)
        + (f"; assumed: {'; '.join(hidden)}" if hidden else "")
        + f"; {trust}"
        + (f"; {note}" if note else ""),
        value=round(cost.tokens_per_s, 1),
        step_time_s=cost.step_time_s,
        model_tflops_per_gpu=cost.model_tflops_per_gpu,
        hardware_tflops_per_gpu=cost.hardware_tflops_per_gpu,
        mfu=cost.mfu,
        breakdown_s={k: cost.breakdown[k] for k in BREAKDOWN},
        hidden_s=cost.hidden,
        outside_calibration=out,
    )
    shares = cost.shares()
    comm = {k: shares[k] for k in _COMM}
    total = sum(comm.values())
    if total > COMM_SHARE_WARN:
        worst = max(comm, key=lambda k: comm[k])
        detail = ", ".join(f"{_COMM[k]} {100 * v:.0f}%" for k, v in comm.items() if v >= 0.01)
        yield COMM_BOUND.finding(
            f"exposed communication is {100 * total:.0f}% of the predicted step ({detail}); "
            f"{_COMM[worst]} dominates",
            value=round(total, 4),
            threshold=COMM_SHARE_WARN,
            fix=_comm_fix(worst),
        )


def _comm_fix(kind: str) -> str:
    return {
        "tp_comm": "lower TP or keep it inside one node (TP ≤ GPUs per node); scale with PP/DP",
        "cp_comm": "lower CP, or keep the CP group inside a node",
        "ep_comm": "keep the EP group inside a node, or lower EP",
        "pp_p2p": "use fewer pipeline stages or fewer virtual stages",
        "dp_comm": "overlap gradient reduction with the backward, use ZeRO-1 rather than "
        "ZeRO-2/3, or raise gradient accumulation",
    }[kind]


@plan_check(FASTER_LAYOUT)
def faster_layout(plan: Plan) -> CheckOutput:
    from sapper.parallel import search
    from sapper.parallel.cluster import Cluster
    from sapper.parallel.confidence import claim, outside
    from sapper.parallel.workload import Workload

    cost = _predict(plan)
    if cost is None or plan.global_batch is None:
        return
    try:
        result = search(plan, top=1, explain=False)
    except InputError:
        return
    best = result.best
    if best is None:
        return
    ratio = cost.step_time_s / best.cost.step_time_s
    if ratio < FASTER_FACTOR:
        return
    work, cluster = Workload.from_plan(plan), Cluster.from_plan(plan)
    reasons = outside(best.layout, work, cluster) + outside(cost.layout, work, cluster)
    text, supported = claim(1 / ratio, reasons)
    if not supported and not reasons:
        return  # inside the calibration's error: nothing worth reporting
    rates = (
        f"{best.cost.model_tflops_per_gpu:.0f} vs {cost.model_tflops_per_gpu:.0f} TFLOP/s "
        "per GPU"
    )
    if supported:
        message = (
            f"{best.layout.describe()} is predicted {text} ({rates}) and fits "
            f"({best.memory_gib:.0f} GiB)"
        )
    else:
        message = (
            f"{best.layout.describe()} fits ({best.memory_gib:.0f} GiB) and is {ratio:.2f}x "
            f"faster by the model ({rates}), but outside the calibrated region "
            f"({'; '.join(dict.fromkeys(reasons))}): not a supported claim"
        )
    yield FASTER_LAYOUT.finding(
        message,
        fix="run `sapper plan` with the same inputs to see the ranked layouts and why",
        value=round(ratio, 3),
        threshold=FASTER_FACTOR,
        layout=best.layout.describe(),
        supported=supported,
    )


def layout_errors(loaded: LoadedPlan) -> list[Finding]:
    """The errors ``sapper check`` reports for the layout and the batch arithmetic.
    ``sapper memory`` and ``sapper plan`` stop on them first, so ``--tp 3`` with 32 heads
    is the same P104 error in every command, never "FITS"."""
    from sapper.checks.consistency import global_batch_indivisible, global_batch_mismatch

    found = [f for f in loaded.findings if f.severity == Severity.ERROR]
    for check in (layout_constraints, global_batch_mismatch, global_batch_indivisible):
        found.extend(
            f for f in check(loaded.plan)
            if isinstance(f, Finding) and f.severity == Severity.ERROR
        )
    return found
