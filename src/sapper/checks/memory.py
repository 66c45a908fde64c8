"""Checklist item 5, memory (seed §3, §5.1): the estimate of where every byte goes.

The numbers come from :func:`sapper.memory.estimate` (the analytic model) and
:func:`sapper.memory.verdict.verdict`; a plan without a model, micro batch or sequence
length gets no memory findings (nothing is guessed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapper.checks.engine import CheckOutput, not_evaluated, plan_check
from sapper.plan.schema import Plan
from sapper.rules.model import Rule, Severity

# The memory model is imported inside the checks: the rules below are imported whenever
# sapper lists its rules, which must not pay for the estimator.
if TYPE_CHECKING:
    from sapper.memory.verdict import MemoryVerdict
    from sapper.plan.hardware import GpuSpec

STATES_EXCEED = Rule(
    code="M001",
    name="model-states-exceed-gpu",
    check="memory",
    severity=Severity.ERROR,
    title="Model states alone exceed the GPU's memory",
    why="""\
Parameters, gradients and optimizer states are resident for the whole run: with Adam
and mixed precision they take 16 bytes per parameter (fp32 master, m and v, 16-bit
weights and gradients), so a 7B model needs 112 GB before a single activation. No batch
size or checkpointing setting can make that fit.""",
    signs="""\
CUDA out of memory while building the optimizer or at the first optimizer step, even
with micro batch 1; torch.cuda.memory_summary() shows the memory held by parameters and
optimizer state.""",
    fix="""\
Shard the states: ZeRO stage 1 (optimizer states, ≈4× less), stage 2 (+ gradients,
≈8×), stage 3 (+ parameters, ≈N×), or split the model with tensor/pipeline parallelism;
offload optimizer states to CPU as a last resort.""",
    seed="§3.1, §3.3",
)

DOES_NOT_FIT = Rule(
    code="M002",
    name="does-not-fit",
    check="memory",
    severity=Severity.ERROR,
    title="The estimated peak memory exceeds the GPU",
    why="""\
The peak of a step is the sum of what coexists at its worst moment: the model states,
the activations of every micro-batch in flight, and the temporaries (fp32 logits and
cross-entropy, optimizer-step buffers, communication buckets). When it exceeds the GPU
the run dies with OOM, or the batch gets shrunk until the job crawls.""",
    signs="""\
CUDA out of memory at the end of the first forward or the start of backward (activations
and logits), or at the first optimizer step (states and their temporaries).""",
    fix="""\
Find the dominant part first (seed §3.1). Then, in this order (§3.4): activation
checkpointing, a higher ZeRO stage, offload, tensor/pipeline parallelism; or a smaller
micro batch with more gradient accumulation. `sapper memory` lists what each would
give.""",
    seed="§3.1, §3.4, §5.1",
)

LOW_HEADROOM = Rule(
    code="M003",
    name="little-memory-headroom",
    check="memory",
    severity=Severity.WARNING,
    title="The estimated peak leaves less than 10% of the GPU free",
    why="""\
Memory use is not flat: allocator fragmentation grows, longer or padded batches arrive,
evaluation and checkpoint saving allocate on top. A run that starts within a few percent
of the limit tends to OOM hours later.""",
    signs="""\
Reserved memory creeping toward the limit over the first hundreds of steps; an OOM at an
evaluation, a checkpoint save, or the longest batch.""",
    fix="""\
Leave at least 10% headroom: checkpoint one more group of blocks, lower the micro batch
(raise gradient accumulation to keep the global batch), or shard one ZeRO stage further.""",
    seed="§5.2",
)

HOST_MEMORY = Rule(
    code="M004",
    name="offload-exceeds-host-memory",
    check="memory",
    severity=Severity.ERROR,
    title="Offload needs more CPU memory than a node has",
    why="""\
Offloaded optimizer states (fp32 master, moments and gradients, 16 bytes/param) and
offloaded parameters live in the host's RAM, for every GPU of the node together. When
that exceeds the node's memory the process is killed by the OS, or swaps to a crawl.""",
    signs="""\
The job is OOM-killed (exit 137, dmesg shows the kernel's OOM killer) while ZeRO
initializes; or steps take minutes while the host swaps.""",
    fix="""\
Offload to NVMe (ZeRO-Infinity), shard over more nodes, or keep more on the GPUs with a
higher ZeRO stage instead of offload.""",
    seed="§3.4",
)

ZERO3_UNNEEDED = Rule(
    code="M005",
    name="zero3-when-stage2-fits",
    check="memory",
    severity=Severity.INFO,
    title="ZeRO stage 3 while stage 2 would fit",
    why="""\
Stage 3 all-gathers every parameter in forward and again in backward and reduce-scatters
gradients: about 1.5× the traffic of plain data parallelism. It pays off only when the
parameters themselves do not fit; otherwise it slows every step.""",
    signs="""\
Step time well above the compute estimate, GPUs idle while waiting on all-gathers.""",
    fix="""\
Use ZeRO stage 2 (shards optimizer states and gradients), and measure its communication
cost at small scale first.""",
    seed="§3.3",
)

OFFLOAD_UNNEEDED = Rule(
    code="M006",
    name="offload-when-it-fits",
    check="memory",
    severity=Severity.WARNING,
    title="Offload is on although the job fits on the GPUs without it",
    why="""\
Offload moves optimizer states (and with ZeRO-3, parameters) over PCIe every step, so the
optimizer runs at host speed; it is the last resort after checkpointing and ZeRO, for
speed-insensitive, memory-starved jobs.""",
    signs="""\
Low GPU utilization during the optimizer step; step time dominated by host-device
copies.""",
    fix="""\
Turn offload off (DeepSpeed offload_optimizer/offload_param device "none").""",
    seed="§3.4",
)


def _gib(n: int) -> float:
    from sapper.memory.units import GIB

    return round(n / GIB, 2)


def _verdict(plan: Plan) -> MemoryVerdict | None:
    from sapper.memory.verdict import verdict
    from sapper.model import MissingInput

    try:
        return verdict(plan)
    except MissingInput:
        return None


#: Unresolved fields that leave the full-training estimate an upper bound, not a verdict:
#: which weights train (an adapter run), gradients freed as soon as the optimizer steps
#: them in backward (torchtune's optimizer_in_bwd), optimizer states the driver pages out
#: to the host (bitsandbytes' paged optimizers).
_BOUND_ONLY = ("model.trainable_parameters", "optimizer.in_backward", "optimizer.paged")


def _estimate_inputs_missing(plan: Plan) -> list[str]:
    """Plan fields the estimate needs and the plan lacks."""
    b = plan.batch
    needed = (("model", plan.model), ("batch.micro_batch_size", b.micro_batch_size),
              ("batch.seq_len", b.seq_len))
    missing = [name for name, value in needed if value is None]
    # A LoRA/QLoRA run (Axolotl's adapter) trains a part of the model the Plan cannot
    # describe: the full-training estimate is only an upper bound, not a verdict.
    return missing + [u for u in plan.unresolved if u in _BOUND_ONLY]


def _sharded_over_dp(plan: Plan) -> bool:
    par = plan.parallel
    return par.zero_stage > 0 or par.optimizer_partitioned


def _as_bf16(plan: Plan) -> Plan | None:
    """The plan in bf16 when it does not state its dtype (the fp32 default is the larger
    estimate, so a problem seen only in fp32 is not yet a problem), else None."""
    if "dtype" in plan.precision.model_fields_set:
        return None
    return plan.model_copy(
        update={"precision": plan.precision.model_copy(update={"dtype": "bf16"})}
    )


def _trouble(v: MemoryVerdict) -> bool:
    est, gpu = v.estimate, v.estimate.gpu_bytes or 0
    low = est.headroom_bytes is not None and est.headroom_bytes < 0.10 * gpu
    return v.states_exceed_gpu or est.fits is False or low


def _largest_gpu() -> GpuSpec:
    from sapper.plan.hardware import GPUS

    return max(GPUS, key=lambda g: g.memory_gib)


def _fits_without_gpu(plan: Plan) -> CheckOutput:
    """No GPU named: an estimate above the largest GPU sapper knows fails on any GPU;
    anything else depends on the GPU and stays unknown."""
    from sapper.memory.estimate import estimate
    from sapper.memory.units import GIB, fmt_bytes
    from sapper.model import MissingInput

    try:
        est = estimate(plan)
        bf16 = _as_bf16(plan)
        if bf16 is not None:
            est = min(est, estimate(bf16), key=lambda e: e.peak_bytes)
    except MissingInput:
        return
    largest = _largest_gpu()
    cap = int(largest.memory_gib * GIB)
    upper_bound_only = plan.dp_degree is None and _sharded_over_dp(plan)
    if est.peak_bytes > cap and not upper_bound_only:
        yield DOES_NOT_FIT.finding(
            f"estimated peak {fmt_bytes(est.peak_bytes)} per GPU (stage {est.peak_stage}, "
            f"{est.peak_phase}) exceeds every GPU sapper knows (largest: {largest.name}, "
            f"{fmt_bytes(cap)})",
            fix="shard the model states (ZeRO, TP/PP) or checkpoint activations; "
            "`sapper memory` lists what each would give",
            value=_gib(est.peak_bytes),
            threshold=_gib(cap),
            breakdown_gib={k: _gib(b) for k, b in est.breakdown.items()},
        )
        return
    yield not_evaluated(
        f"whether the estimated peak of {fmt_bytes(est.peak_bytes)} per GPU fits the GPU",
        "hardware.gpu",
        *(["hardware.num_gpus"] if upper_bound_only else []),
    )


@plan_check(STATES_EXCEED, DOES_NOT_FIT, LOW_HEADROOM)
def check_fits(plan: Plan) -> CheckOutput:
    from sapper.memory.units import fmt_bytes
    from sapper.parallel import validate

    missing = _estimate_inputs_missing(plan)
    if missing:
        if plan.gpu is None:
            missing.append("hardware.gpu")
        yield not_evaluated("the memory per GPU against the GPU's memory", *missing)
        return
    broken = [x for x in validate(plan) if x.severity == Severity.ERROR]
    if broken:
        # One truth: a layout that cannot start has no memory verdict (`sapper memory`
        # stops on the same errors).
        yield not_evaluated(
            "the memory per GPU: the layout has errors (" + ", ".join(x.code for x in broken)
            + ", see the parallel item)",
            "parallel",
        )
        return
    if plan.gpu is None:
        yield from _fits_without_gpu(plan)
        return
    v = _verdict(plan)
    if v is None:
        return
    est = v.estimate
    gpu = est.gpu_bytes or 0
    if plan.dp_degree is None and _sharded_over_dp(plan) and est.fits is not True:
        # Nothing sharded is an upper bound: it may fit once the DP degree is known.
        yield not_evaluated(
            f"whether ZeRO sharding brings the peak ({fmt_bytes(est.peak_bytes)} unsharded) "
            "under the GPU's memory",
            "hardware.num_gpus",
        )
        return
    bf16 = _as_bf16(plan)
    if _trouble(v) and bf16 is not None and (other := _verdict(bf16)) and not _trouble(other):
        yield not_evaluated(
            f"the memory per GPU: {fmt_bytes(est.peak_bytes)} in fp32, "
            f"{fmt_bytes(other.estimate.peak_bytes)} in bf16",
            "precision.dtype",
        )
        return
    if v.states_exceed_gpu:
        yield STATES_EXCEED.finding(
            f"parameters, gradients and optimizer states take {fmt_bytes(v.states_bytes)} "
            f"per GPU; the {plan.gpu.name} has {fmt_bytes(gpu)}",
            value=_gib(v.states_bytes),
            threshold=_gib(gpu),
            num_params=est.num_params,
            zero_stage=plan.parallel.zero_stage,
        )
    elif est.fits is False:
        first = v.remedies[0] if v.remedies else None
        hint = ""
        if first is not None:
            hint = f"; first remedy: {first.name} → {fmt_bytes(first.peak_bytes)}"
        yield DOES_NOT_FIT.finding(
            f"estimated peak {fmt_bytes(est.peak_bytes)} per GPU (stage {est.peak_stage}, "
            f"{est.peak_phase}) > {fmt_bytes(gpu)} on {plan.gpu.name}; dominant part: "
            f"{v.dominant_part} ({v.dominant} {fmt_bytes(est.breakdown[v.dominant])})"
            + hint,
            fix=(
                f"{first.name} (peak {fmt_bytes(first.peak_bytes)}); see `sapper memory`"
                if first
                else DOES_NOT_FIT.fix.split("\n\n")[0]
            ),
            value=_gib(est.peak_bytes),
            threshold=_gib(gpu),
            dominant=v.dominant,
            breakdown_gib={k: _gib(b) for k, b in est.breakdown.items()},
        )
    elif est.headroom_bytes is not None and est.headroom_bytes < 0.10 * gpu:
        yield LOW_HEADROOM.finding(
            f"estimated peak {fmt_bytes(est.peak_bytes)} of {fmt_bytes(gpu)} leaves "
            f"{fmt_bytes(est.headroom_bytes)} ({100 * est.headroom_bytes / gpu:.1f}%) free",
            value=_gib(est.peak_bytes),
            threshold=_gib(int(0.9 * gpu)),
            headroom_gib=_gib(est.headroom_bytes),
        )


@plan_check(HOST_MEMORY)
def check_host_memory(plan: Plan) -> CheckOutput:
    from sapper.memory.estimate import MemoryOptions, estimate_shape, gpu_bytes_of
    from sapper.memory.inputs import shape_from_plan
    from sapper.memory.units import GIB, fmt_bytes
    from sapper.model import MissingInput

    host = plan.hardware.host_memory_gib
    par = plan.parallel
    if host is None:
        if par.offload_optimizer != "none" or par.offload_params != "none":
            yield not_evaluated(
                "whether offloaded states fit the nodes' CPU memory", "hardware.host_memory_gib"
            )
        return
    try:
        sh = shape_from_plan(plan)
    except MissingInput:
        return
    est = estimate_shape(sh, gpu_bytes_of(plan), plan.hardware.gpus_per_node, MemoryOptions())
    need = est.host_bytes_per_node
    if need > host * GIB:
        yield HOST_MEMORY.finding(
            f"offload needs {fmt_bytes(need)} of CPU memory per node "
            f"({plan.hardware.gpus_per_node} GPUs); the node has {host:g} GiB",
            value=_gib(need),
            threshold=host,
        )


@plan_check(ZERO3_UNNEEDED, OFFLOAD_UNNEEDED)
def check_sharding_choice(plan: Plan) -> CheckOutput:
    from sapper.memory.estimate import MemoryOptions, estimate_shape, gpu_bytes_of
    from sapper.memory.inputs import shape_from_plan
    from sapper.memory.units import fmt_bytes
    from sapper.model import MissingInput

    par = plan.parallel
    if plan.gpu is None or (par.zero_stage < 3 and par.offload_optimizer == "none"
                            and par.offload_params == "none"):
        return
    try:
        sh = shape_from_plan(plan)
    except MissingInput:
        return
    gpu = gpu_bytes_of(plan)
    gpn, opts = plan.hardware.gpus_per_node, MemoryOptions()
    if par.offload_optimizer != "none" or par.offload_params != "none":
        plain = estimate_shape(
            sh.replace(offload_optimizer="none", offload_params="none"), gpu, gpn, opts
        )
        if plain.fits and plain.headroom_bytes is not None and gpu:
            if plain.headroom_bytes >= 0.10 * gpu:
                yield OFFLOAD_UNNEEDED.finding(
                    f"without offload the estimated peak is {fmt_bytes(plain.peak_bytes)} "
                    f"of {fmt_bytes(gpu)}",
                    value=_gib(plain.peak_bytes),
                    threshold=_gib(gpu),
                )
                return
    if par.zero_stage == 3 and sh.dp * sh.cp > 1:
        two = estimate_shape(sh.replace(zero=2), gpu, gpn, opts)
        if two.fits and gpu and two.headroom_bytes is not None:
            if two.headroom_bytes >= 0.10 * gpu:
                yield ZERO3_UNNEEDED.finding(
                    f"with ZeRO stage 2 the estimated peak is {fmt_bytes(two.peak_bytes)} "
                    f"of {fmt_bytes(gpu)}",
                    value=_gib(two.peak_bytes),
                    threshold=_gib(gpu),
                )
