"""Checklist item 1, precision (seed §2.1, §2.2): dtype vs hardware, loss scaling."""

from __future__ import annotations

import math

from sapper.checks.engine import CheckOutput, not_evaluated, plan_check
from sapper.model.derived import plan_architecture
from sapper.model.params import total_params
from sapper.plan.schema import Plan
from sapper.rules.model import Rule, Severity

FP16_MAX = 65504.0
#: fp16's smallest normal number (2^-14): below it a value keeps fewer mantissa bits.
FP16_MIN_NORMAL = 2.0**-14
#: fp16's smallest subnormal (2^-24): below half of it a value rounds to zero.
FP16_MIN_SUBNORMAL = 2.0**-24
#: Global gradient norms of healthy pre-training (seed §2.3), and of the spikes that
#: clipping exists for (seed §2.3: "often 5-10" means the LR is too high).
HEALTHY_NORMS = (0.1, 1.0)
SPIKE_NORM = 10.0

BF16_UNSUPPORTED = Rule(
    code="N101",
    name="dtype-unsupported-by-gpu",
    check="precision",
    severity=Severity.ERROR,
    title="The compute dtype is not supported by the GPU",
    why="""\
bf16 (and fp8) need tensor-core support that older GPUs (V100 and earlier) lack. The
framework either refuses, or silently emulates the dtype at a fraction of the speed.""",
    signs="""\
A crash at the first matmul, or a step time many times slower than expected.""",
    fix="""\
Use fp16 with dynamic loss scaling on GPUs without bf16, or move to an A100/H100-class GPU.""",
    seed="§2.1",
)

FP16_NO_SCALING = Rule(
    code="N102",
    name="fp16-without-loss-scaling",
    check="precision",
    severity=Severity.ERROR,
    title="fp16 training without loss scaling",
    why="""\
fp16's smallest subnormal is about 6e-8; gradients below it round to zero. Without a loss
scale, small gradients underflow, whole layers stop learning, and nothing raises an error.""",
    signs="""\
Loss plateaus early; many gradient elements are exactly zero; some layers' gradient norm
reads 0.""",
    fix="""\
Enable dynamic loss scaling (torch.amp.GradScaler, or DeepSpeed "loss_scale": 0), or train
in bf16 where the GPU supports it.""",
    seed="§2.1, §2.2",
)

FP16_STATIC_SCALE = Rule(
    code="N103",
    name="fp16-static-loss-scale",
    check="precision",
    severity=Severity.WARNING,
    title="fp16 with a static loss scale",
    why="""\
Gradient magnitudes drift during training: large early, small late. A fixed scale that
fits the start overflows (Inf, skipped or poisoned steps) or, later, no longer lifts small
gradients above fp16's underflow threshold. A scale ≤ 1 does not scale at all; a huge one
overflows at once. The finding shows the arithmetic: a true gradient element above
65504 / scale overflows, one below 2^-25 / scale rounds to zero, and for a model of N
parameters the RMS element of a gradient at a healthy global norm (0.1-1) is
norm / √N, which the scale must lift into fp16's normal range (≥ 2^-14).""",
    signs="""\
Inf/NaN gradients in the first steps (scale too big), or gradients that drift to zero late
in training (scale too small).""",
    fix="""\
Use dynamic loss scaling: grow the scale after N clean steps, halve it and skip the step on
overflow (torch.amp.GradScaler; DeepSpeed "loss_scale": 0).""",
    seed="§2.2",
)

SCALER_PARAMS = Rule(
    code="N104",
    name="dynamic-scaler-parameters",
    check="precision",
    severity=Severity.WARNING,
    title="Dynamic loss-scaler parameters outside sane ranges",
    why="""\
A dynamic scaler recovers from overflow by backing off and grows back after a clean
interval. An initial scale far above 2^24 spends the first steps skipping updates; a
growth interval of a handful of steps makes the scale oscillate and skip many steps; a very
long one leaves it too low after a backoff; a min scale above 1 can pin the scale where
every step overflows.""",
    signs="""\
Many skipped steps in a row at the start; the loss scale oscillating by 2× every few steps;
'Current loss scale already at minimum' errors.""",
    fix="""\
Start at 2^16 (GradScaler's default), grow every 1000-2000 clean steps, allow min scale 1.""",
    seed="§2.2",
)

BF16_WITH_SCALING = Rule(
    code="N105",
    name="loss-scaling-with-bf16",
    check="precision",
    severity=Severity.INFO,
    title="Loss scaling with bf16 (pointless)",
    why="""\
bf16 has fp32's exponent range, so gradients do not underflow the way fp16's do; a loss
scale only adds an unscale pass and, statically, a risk of overflow.""",
    signs="""\
Nothing visible: it costs time and adds a failure mode.""",
    fix="""\
Turn loss scaling off for bf16 (no GradScaler; DeepSpeed bf16 needs none).""",
    seed="§2.1",
)

LOW_PRECISION_MASTER = Rule(
    code="N106",
    name="master-weights-not-fp32",
    check="precision",
    severity=Severity.WARNING,
    title="Master weights or optimizer states not in fp32",
    why="""\
Updates of size lr·grad are often below the spacing of fp16/bf16 numbers near a weight's
value (bf16 has 7 mantissa bits), so they round away: training stalls although gradients
are fine. Low-precision Adam moments lose the small second moments that set the step
size.""",
    signs="""\
Loss decreases more slowly than an fp32 run of the same model and then plateaus;
weights barely change between checkpoints.""",
    fix="""\
Keep fp32 master weights and fp32 optimizer states (the standard mixed-precision recipe,
16 bytes/param with Adam), or use a deliberately designed 8-bit optimizer.""",
    seed="§2.1",
)

FP16_LARGE_HIDDEN = Rule(
    code="N107",
    name="fp16-activation-headroom",
    check="precision",
    severity=Severity.WARNING,
    title="fp16 for a large model: activations approach 65504",
    why="""\
fp16's largest value is 65504. In wide, deep models, attention logits, residual-stream
activations and outlier features grow with width and depth; one value past 65504 becomes
Inf and NaN a few layers later.""",
    signs="""\
NaN loss after hundreds of good steps; loss-scale collapses; Inf in a few layers' outputs.""",
    fix="""\
Train in bf16 on GPUs that support it; otherwise keep fp32 softmax/LayerNorm, scale
attention logits, and watch activation maxima in the first steps (`sapper smoke`).""",
    seed="§2.1",
)


@plan_check(BF16_UNSUPPORTED)
def dtype_vs_gpu(plan: Plan) -> CheckOutput:
    gpu = plan.gpu
    dtype = plan.precision.dtype
    if "dtype" not in plan.precision.model_fields_set:
        yield not_evaluated("the compute dtype: fp32, bf16 or fp16", "precision.dtype")
        return
    if gpu is None:
        if dtype in ("bf16", "fp8"):
            yield not_evaluated(f"whether the GPU has {dtype} tensor cores", "hardware.gpu")
        return
    if dtype == "bf16" and not gpu.bf16:
        yield BF16_UNSUPPORTED.finding(
            f"bf16 requested on {gpu.name}, which has no bf16 tensor cores",
            fix="use fp16 with dynamic loss scaling on this GPU, or a bf16-capable GPU",
            source="precision.dtype",
        )
    if dtype == "fp8" and not gpu.fp8:
        yield BF16_UNSUPPORTED.finding(
            f"fp8 requested on {gpu.name}, which has no fp8 tensor cores (H100/H200/L40S do)",
            fix="use bf16 (or fp16 with dynamic loss scaling) on this GPU",
            source="precision.dtype",
        )


@plan_check(FP16_NO_SCALING, FP16_STATIC_SCALE)
def fp16_loss_scaling(plan: Plan) -> CheckOutput:
    if plan.precision.dtype != "fp16":
        return
    ls = plan.precision.loss_scaling
    if "mode" not in ls.model_fields_set:
        yield not_evaluated(
            "fp16 loss scaling (none, static or dynamic): nothing says which framework "
            "scales the loss",
            "precision.loss_scaling.mode",
        )
        return
    if ls.mode == "none":
        yield FP16_NO_SCALING.finding(
            "fp16 compute with loss scaling off: gradients below ~6e-8 underflow to zero",
            source="precision.loss_scaling.mode",
        )
    elif ls.mode == "static":
        scale = ls.static_scale
        numbers = static_scale_range(plan, scale) if scale is not None and scale > 0 else {}
        if scale is None or scale <= 1:
            yield FP16_STATIC_SCALE.finding(
                f"static loss scale {scale} ≤ 1 does not scale fp16 gradients at all"
                + (f" ({_range_text(numbers)})" if numbers else ""),
                severity=Severity.ERROR,
                value=scale,
                threshold=1.0,
                source="precision.loss_scaling.static_scale",
                **numbers,
            )
        elif scale > 2.0**24:
            yield FP16_STATIC_SCALE.finding(
                f"static loss scale {scale:g} (2^{_log2(scale)})"
                " is huge: scaled gradients overflow fp16 (max 65504) from the first steps"
                f" ({_range_text(numbers)})",
                severity=Severity.ERROR,
                value=scale,
                threshold=2.0**24,
                source="precision.loss_scaling.static_scale",
                **numbers,
            )
        else:
            yield FP16_STATIC_SCALE.finding(
                f"static loss scale {scale:g}: {_range_text(numbers)}; gradient magnitudes "
                "drift, a fixed scale either overflows early or underflows late",
                value=scale,
                source="precision.loss_scaling.static_scale",
                **numbers,
            )


def static_scale_range(plan: Plan, scale: float) -> dict[str, float]:
    """The gradient range a static loss scale leaves fp16, as numbers: the smallest true
    gradient element that overflows (65504 / scale), the largest that rounds to zero
    (2^-24 / 2 / scale), and, with the model's size N known, the RMS element of a gradient
    at the healthy global norms 0.1-1 (norm / √N) and where it lands once scaled."""
    out: dict[str, float] = {
        "overflow_above": FP16_MAX / scale,
        "zero_below": FP16_MIN_SUBNORMAL / 2 / scale,
    }
    arch = plan_architecture(plan)
    if arch is not None:
        n = total_params(arch)
        low, high = (norm / math.sqrt(n) for norm in HEALTHY_NORMS)
        out |= {"parameters": n, "rms_element_low": low, "rms_element_high": high,
                "scaled_rms_low": low * scale}
    return out


def _range_text(numbers: dict[str, float]) -> str:
    """The arithmetic of :func:`static_scale_range` in words."""
    if not numbers:
        return "no scaling range to compute"
    over, zero = numbers["overflow_above"], numbers["zero_below"]
    text = (f"a true gradient element above {over:.2g} overflows fp16 (65504 / scale) and "
            f"one below {zero:.2g} rounds to 0")
    if over <= SPIKE_NORM:
        text += (f"; a gradient spike of global norm {SPIKE_NORM:g} can hold an element that "
                 "large, and a static scale never backs off")
    if "parameters" in numbers:
        low, scaled = numbers["rms_element_low"], numbers["scaled_rms_low"]
        text += (f"; at global norm {HEALTHY_NORMS[0]:g} over {numbers['parameters']:,.0f} "
                 f"parameters the RMS element is {low:.2g}, {scaled:.2g} once scaled")
        if scaled < FP16_MIN_NORMAL:
            text += (f", below fp16's normal range ({FP16_MIN_NORMAL:.2g}): typical gradients "
                     "lose precision and the smaller ones vanish")
    return text


def _log2(x: float) -> str:
    return f"{math.log2(x):.0f}"


@plan_check(SCALER_PARAMS)
def dynamic_scaler_parameters(plan: Plan) -> CheckOutput:
    ls = plan.precision.loss_scaling
    if plan.precision.dtype != "fp16" or ls.mode != "dynamic":
        return
    src = "precision.loss_scaling"
    if ls.initial_scale > 2.0**24:
        yield SCALER_PARAMS.finding(
            f"initial scale 2^{_log2(ls.initial_scale)} > 2^24: the first steps will be skipped "
            "until it backs off",
            value=ls.initial_scale,
            threshold=2.0**24,
            source=f"{src}.initial_scale",
        )
    if ls.initial_scale < 1:
        yield SCALER_PARAMS.finding(
            f"initial scale {ls.initial_scale:g} < 1 shrinks gradients instead of lifting them",
            value=ls.initial_scale,
            threshold=1.0,
            source=f"{src}.initial_scale",
        )
    if ls.growth_interval < 50:
        yield SCALER_PARAMS.finding(
            f"growth interval {ls.growth_interval} steps: the scale will grow into overflow "
            "over and over, skipping many steps",
            value=ls.growth_interval,
            threshold=50,
            source=f"{src}.growth_interval",
        )
    elif ls.growth_interval > 20000:
        yield SCALER_PARAMS.finding(
            f"growth interval {ls.growth_interval} steps: after a backoff the scale stays low "
            "for a very long time",
            value=ls.growth_interval,
            threshold=20000,
            source=f"{src}.growth_interval",
        )
    if ls.min_scale > 1:
        yield SCALER_PARAMS.finding(
            f"min scale {ls.min_scale:g} > 1: the scaler cannot back off below it, so a "
            "persistent overflow skips every step",
            value=ls.min_scale,
            threshold=1.0,
            source=f"{src}.min_scale",
        )
    if not (1 < ls.growth_factor <= 4) or not (0 < ls.backoff_factor < 1):
        yield SCALER_PARAMS.finding(
            f"growth factor {ls.growth_factor:g} / backoff factor {ls.backoff_factor:g}: "
            "expected growth in (1, 4] and backoff in (0, 1)",
            source=f"{src}.growth_factor",
        )


@plan_check(BF16_WITH_SCALING)
def scaling_with_bf16(plan: Plan) -> CheckOutput:
    if plan.precision.dtype in ("bf16", "fp32", "tf32") and (
        plan.precision.loss_scaling.mode != "none"
    ):
        yield BF16_WITH_SCALING.finding(
            f"{plan.precision.dtype} compute with {plan.precision.loss_scaling.mode} loss "
            "scaling: not needed with an 8-bit exponent",
            source="precision.loss_scaling.mode",
        )


@plan_check(LOW_PRECISION_MASTER)
def master_weights(plan: Plan) -> CheckOutput:
    p = plan.precision
    if p.master_weights != "fp32":
        yield LOW_PRECISION_MASTER.finding(
            f"master weights in {p.master_weights}: updates smaller than the dtype's spacing "
            "round away",
            source="precision.master_weights",
        )
    if p.optimizer_states in ("fp16", "bf16") and not plan.optimizer.eight_bit:
        yield LOW_PRECISION_MASTER.finding(
            f"optimizer states in {p.optimizer_states}: small second moments lose precision",
            source="precision.optimizer_states",
        )


@plan_check(FP16_LARGE_HIDDEN)
def fp16_headroom(plan: Plan) -> CheckOutput:
    m = plan.model
    if plan.precision.dtype != "fp16" or m is None:
        return
    # Outlier features appear around 6.7B parameters (hidden ≥ 4096) and grow with width.
    if m.hidden_size >= 4096:
        yield FP16_LARGE_HIDDEN.finding(
            f"fp16 with hidden size {m.hidden_size} ({m.num_layers} layers): outlier "
            "activations at this width approach fp16's max 65504",
            value=m.hidden_size,
            threshold=4096,
            source="model.hidden_size",
        )
