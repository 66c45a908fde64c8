"""Checklist item 3, initialization (seed §2.4): std vs width, residual scaling vs depth.

A linear layer with fan-in h and weights drawn from N(0, std²) multiplies the size of its
input by about std·√h. That "gain" is the number to check: 1 keeps activations the same
size layer to layer (std = 1/√h), GPT-2's fixed 0.02 gives 0.55 at h = 768 and 2.2 at
h = 12288. The residual stream adds one attention and one MLP output per layer, so its
variance grows with 2L unless those output projections are scaled by 1/√(2L).
None of this applies when the weights come from a checkpoint (``init.from_pretrained``).
"""

from __future__ import annotations

import math

from sapper.checks.engine import CheckOutput, not_evaluated, plan_check
from sapper.plan.schema import Plan
from sapper.rules.model import Rule, Severity

__all__ = [
    "INIT_STD_VS_WIDTH",
    "RESIDUAL_NOT_SCALED",
    "RESIDUAL_SCALE_MISMATCH",
    "depth_scale",
    "init_gain",
]

GPT2_STD = 0.02
#: Gain std·√h outside [LOW_GAIN, HIGH_GAIN] is a warning, above ERROR_GAIN an error.
LOW_GAIN = 0.2
HIGH_GAIN = 2.0
ERROR_GAIN = 5.0
#: Depth from which an unscaled residual stream has grown ≥ 4× in std (√(2L+1) ≥ 4.1).
MIN_LAYERS_FOR_SCALING = 8
#: A custom residual scale this many times off the 1/√(2L) rule is reported.
SCALE_TOLERANCE = 3.0

INIT_STD_VS_WIDTH = Rule(
    code="N301",
    name="init-std-vs-width",
    check="init",
    severity=Severity.WARNING,
    title="Initialization std does not fit the hidden size",
    why="""\
Each matmul with fan-in h and weights of std σ scales activations by about σ·√h. Too large
(σ·√h well above 1) and attention logits grow with its square: softmax saturates on one
token (attention entropy collapse), branch outputs swamp the residual stream and fp16
overflows (seed §2.4). Too small and every block starts as almost nothing: activations and
gradients of deep layers shrink towards zero and training starts slowly or stalls. The
usual schemes: GPT-2/Megatron 0.02 regardless of width (fine up to h ≈ 8192),
1/√h (gain 1; PaLM), and the "small init" √(2/(5h)) used by GPT-NeoX. sapper warns outside
a gain of 0.2–2 and reports an error above 5.""",
    signs="""\
Too large: loss spikes or NaN in the first hundred steps, attention maps collapsing onto
one token, activation maxima growing layer by layer. Too small: a loss that stays near
ln(vocab) for many steps, tiny gradient norms.""",
    fix="""\
Use std ≈ 1/√h to √(2/(5h)) for wide models (h = 8192: 0.011–0.007), or 0.02 for widths
up to a few thousand, and scale residual output projections by 1/√(2L).

When the weights come from a checkpoint the init never runs: set
init.from_pretrained: true.""",
    seed="§2.4",
)

RESIDUAL_NOT_SCALED = Rule(
    code="N302",
    name="residual-projections-not-scaled",
    check="init",
    severity=Severity.WARNING,
    title="Residual output projections are not scaled for depth",
    why="""\
Every block adds two branch outputs (attention and MLP) to the residual stream. With the
same init everywhere, the stream's variance grows by one branch variance per add, so after
L layers its std is about √(2L+1)× that of the first layer: 8× at 32 layers, 14× at 96.
Deep layers then see inputs dominated by the sum, later layers' updates matter less, and
in fp16 the largest activations approach 65504. GPT-2 and Megatron scale the output
projections (attention out, MLP down) by 1/√(2L) so the sum stays the size of one branch;
the deeper the model, the smaller the factor (seed §2.4).""",
    signs="""\
Activation norms of the residual stream growing steadily with layer index at step 0;
instability that appears only when the same recipe is made deeper.""",
    fix="""\
Initialize attention-output and MLP-down projections with std / √(2L) (Megatron:
`init_method_std / sqrt(2 * num_layers)`; set init.residual_scaling: depth).

When the weights come from a checkpoint the init never runs: set
init.from_pretrained: true.""",
    seed="§2.4",
)

RESIDUAL_SCALE_MISMATCH = Rule(
    code="N303",
    name="residual-scale-vs-depth",
    check="init",
    severity=Severity.WARNING,
    title="A custom residual scale is far from what the depth calls for",
    why="""\
The residual factor exists to keep the sum of 2L branch outputs the size of one, which
needs 1/√(2L). A factor several times larger lets the stream grow as if unscaled; one
several times smaller makes every block start as a near-no-op, so deep layers learn
slowly at first.""",
    signs="""\
Residual-stream activation norms that grow (factor too big) or stay flat and tiny (too
small) across layers at step 0.""",
    fix="""\
Use residual_scale = 1/√(2L), or residual_scaling: depth; keep a deliberately different
scheme (DeepNet, μP) documented with its own derivation.""",
    seed="§2.4",
)


def init_gain(std: float, hidden_size: int) -> float:
    """How much one fan-in-h matmul scales activations: std·√h."""
    return std * math.sqrt(hidden_size)


def depth_scale(num_layers: int) -> float:
    """The GPT-2/Megatron factor on residual output projections: 1/√(2L)."""
    return 1.0 / math.sqrt(2 * num_layers)


@plan_check(INIT_STD_VS_WIDTH)
def std_vs_width(plan: Plan) -> CheckOutput:
    std, m = plan.init.std, plan.model
    if plan.init.from_pretrained:
        return
    if std is None or m is None:
        missing = [f for f, v in (("model", m), ("init.std", std)) if v is None]
        yield not_evaluated(
            "the init std against the model's width (give init.std, or init.from_pretrained "
            "when the weights are loaded)",
            *missing,
        )
        return
    h = m.hidden_size
    gain = init_gain(std, h)
    unit = 1 / math.sqrt(h)
    small = math.sqrt(2 / (5 * h))
    schemes = f"1/√h = {unit:.3g}, √(2/5h) = {small:.3g}, GPT-2 {GPT2_STD}"
    if gain > HIGH_GAIN:
        severity = Severity.ERROR if gain > ERROR_GAIN else Severity.WARNING
        yield INIT_STD_VS_WIDTH.finding(
            f"init std {std:g} at hidden {h} gives a per-matmul gain std·√h = {gain:.2f} "
            f"(> {HIGH_GAIN:g}); width-aware stds: {schemes}",
            severity=severity,
            fix=f"use init.std ≈ {small:.3g}–{unit:.3g} for hidden {h}",
            value=round(gain, 4),
            threshold=ERROR_GAIN if severity == Severity.ERROR else HIGH_GAIN,
            source="init.std",
            std=std,
        )
    elif gain < LOW_GAIN:
        yield INIT_STD_VS_WIDTH.finding(
            f"init std {std:g} at hidden {h} gives a per-matmul gain std·√h = {gain:.2f} "
            f"(< {LOW_GAIN:g}): activations shrink ~{1 / gain:.0f}× per matmul; {schemes}",
            fix=f"use init.std ≈ {small:.3g}–{unit:.3g} for hidden {h}",
            value=round(gain, 4),
            threshold=LOW_GAIN,
            source="init.std",
            std=std,
        )


def _init_described(plan: Plan) -> bool:
    """The plan says something about init (a std or an explicit residual scheme);
    the default ``none`` alone is not taken as a statement."""
    return plan.init.std is not None or "residual_scaling" in plan.init.model_fields_set


@plan_check(RESIDUAL_NOT_SCALED)
def residual_not_scaled(plan: Plan) -> CheckOutput:
    m = plan.model
    if m is None or plan.init.residual_scaling != "none" or plan.init.from_pretrained:
        return
    if not _init_described(plan):
        yield not_evaluated(
            "whether residual output projections are scaled for depth",
            "init.residual_scaling",
        )
        return
    L = m.num_layers
    if L < MIN_LAYERS_FOR_SCALING:
        return
    factor = depth_scale(L)
    growth = math.sqrt(2 * L + 1)
    std = plan.init.std
    scaled = f" → std {std * factor:.2g}" if std is not None else ""
    yield RESIDUAL_NOT_SCALED.finding(
        f"residual output projections unscaled over {L} layers: the residual stream's std "
        f"grows ~{growth:.1f}× at init; depth calls for 1/√(2·{L}) = {factor:.3g}{scaled}",
        fix=f"scale attention-out and MLP-down init by {factor:.3g} (init.residual_scaling: depth)",
        value=L,
        threshold=MIN_LAYERS_FOR_SCALING,
        source="init.residual_scaling",
        depth_scale=round(factor, 6),
    )


@plan_check(RESIDUAL_SCALE_MISMATCH)
def residual_scale_mismatch(plan: Plan) -> CheckOutput:
    m = plan.model
    if m is None or plan.init.residual_scaling != "custom" or plan.init.from_pretrained:
        return
    L = m.num_layers
    factor = depth_scale(L)
    scale = plan.init.residual_scale
    if scale is None:
        yield RESIDUAL_SCALE_MISMATCH.finding(
            "init.residual_scaling is custom but init.residual_scale is not set",
            fix=f"set init.residual_scale (1/√(2·{L}) = {factor:.3g}) or use residual_scaling: "
            "depth",
            source="init.residual_scale",
            depth_scale=round(factor, 6),
        )
        return
    ratio = scale / factor
    if ratio > SCALE_TOLERANCE or ratio < 1 / SCALE_TOLERANCE:
        yield RESIDUAL_SCALE_MISMATCH.finding(
            f"residual_scale {scale:g} is {ratio:.2g}× the 1/√(2·{L}) = {factor:.3g} that "
            f"{L} layers call for (tolerated: {1 / SCALE_TOLERANCE:.2g}–{SCALE_TOLERANCE:g}×)",
            fix=f"set init.residual_scale: {factor:.3g}",
            value=scale,
            threshold=round(factor, 6),
            source="init.residual_scale",
            ratio=round(ratio, 4),
        )
