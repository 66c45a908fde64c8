"""Checklist item 4, normalization (seed §2.4): Post-LN needs a real warmup.

The placement comes from the plan (``model.norm_placement``), which the HF loader infers
from the architecture where it is known. Thresholds come from the literature on Post-LN:
the original Transformer (6 Post-LN layers) used 4000 warmup steps; BERT (12 and 24
Post-LN layers) used 10,000 for pre-training and 10% of the steps for fine-tuning; Xiong
et al. 2020 ("On Layer Normalization in the Transformer Architecture") show that Post-LN
gradients near the output are large at initialization and that Post-LN models trained
without warmup fail even at 6 layers; Liu et al. 2020 ("Understanding the Difficulty of
Training Transformers") show the instability grows with depth.
"""

from __future__ import annotations

from sapper.checks.engine import CheckOutput, NotEvaluated, not_evaluated, plan_check
from sapper.checks.hyperparams import lr_reference
from sapper.plan.schema import NormPlacement, Plan
from sapper.rules.model import Rule, Severity

__all__ = [
    "NO_WARMUP_DEEP_STACK",
    "POST_LN_NO_WARMUP",
    "POST_LN_PREFER_PRE_LN",
    "POST_LN_SHORT_WARMUP",
    "required_post_ln_warmup",
]

#: Layers from which a Post-LN stack counts as deep (BERT-base depth and up).
DEEP_LAYERS = 12
#: Layers from which no warmup at all is reported (Xiong et al.: 6 layers already fail).
SHALLOW_LAYERS = 6
#: The original Post-LN Transformer's warmup (6 layers); a deeper stack needs at least this.
POST_LN_WARMUP_STEPS = 4000
#: BERT's fine-tuning warmup proportion: the floor used when the run is shorter.
WARMUP_FRACTION = 0.1
#: A Pre-LN stack started at this share of the published peak LR for its size (or more)
#: with no warmup is reported: every published run reached such an LR only after one.
HIGH_LR_SHARE = 1 / 3

POST_LN_NO_WARMUP = Rule(
    code="N401",
    name="post-ln-without-warmup",
    check="normalization",
    severity=Severity.ERROR,
    title="Post-LN stack trained without learning-rate warmup",
    why="""\
Post-LN puts LayerNorm after the residual add, so there is no clean identity path: the
gradient of the last layers' parameters is large at initialization and every block's
output passes through all later norms. At full learning rate from step 0 the first
updates are too large for the layers near the output and training diverges or settles at
a poor loss. Xiong et al. (2020) show Post-LN models without warmup fail even at 6
layers, and Liu et al. (2020) that the amplification grows with depth; from 12 layers on
this is an error (seed §2.4).""",
    signs="""\
Loss that drops for a few steps, then jumps and plateaus high, or NaN within the first
few hundred steps; gradient norms of the last layers far above the first layers'.""",
    fix="""\
Switch to Pre-LN (norm inside the residual branch) — the standard for large models. If
Post-LN must stay, warm the learning rate up linearly over ≥ 4000 steps (BERT: 10,000).""",
    seed="§2.4",
)

POST_LN_SHORT_WARMUP = Rule(
    code="N402",
    name="post-ln-short-warmup",
    check="normalization",
    severity=Severity.WARNING,
    title="Deep Post-LN stack with a short warmup",
    why="""\
A Post-LN stack tolerates the full learning rate only after its gradients have settled;
warmup gives it that time. The original 6-layer Post-LN Transformer needed 4000 warmup
steps and BERT's 12/24-layer stacks 10,000; a deep Post-LN stack warmed up over fewer
steps sees near-peak learning rates while its output-side gradients are still large
(Xiong et al. 2020). sapper asks for min(4000 steps, 10% of the run) — 10% being BERT's
fine-tuning proportion for runs too short for 4000.""",
    signs="""\
A loss spike or divergence right around the end of warmup, when the learning rate
reaches its peak; gradient-norm spikes in the top layers.""",
    fix="""\
Lengthen the warmup to ≥ 4000 steps (or ≥ 10% of a short run), lower the peak learning
rate, or switch to Pre-LN.""",
    seed="§2.4",
)

POST_LN_PREFER_PRE_LN = Rule(
    code="N403",
    name="post-ln-deep-stack",
    check="normalization",
    severity=Severity.INFO,
    title="Deep Post-LN stack: Pre-LN is far more stable",
    why="""\
Even with enough warmup a deep Post-LN stack is more fragile than Pre-LN: it tolerates a
smaller peak learning rate and diverges more easily when the recipe is scaled up.
Pre-LN keeps an identity path from the loss to every layer (seed §2.4).""",
    signs="""\
Late-run instability at learning rates a Pre-LN model of the same size trains at.""",
    fix="""\
Prefer Pre-LN (or a variant such as sandwich-LN or DeepNorm) for new pre-training runs;
keep Post-LN only to match a pretrained checkpoint.""",
    seed="§2.4",
)


NO_WARMUP_DEEP_STACK = Rule(
    code="N404",
    name="deep-stack-without-warmup",
    check="normalization",
    severity=Severity.WARNING,
    title="Deep stack trained from scratch without warmup (placement unknown, or Pre-LN at "
    "a high LR)",
    why="""\
Two cases the Post-LN rules (N401/N402) cannot see. When the plan does not say where the
norms sit, a deep stack started at full LR diverges if it is Post-LN (Xiong et al. 2020:
Post-LN fails without warmup from 6 layers), and nothing in the plan rules that out.
When it is Pre-LN, the norms keep an identity path and Pre-LN can train without warmup at
moderate LRs (Xiong et al. 2020), but Adam's second-moment estimate rests on a handful of
gradients in the first steps, so its early steps are erratic and large (Liu et al. 2020,
"On the Variance of the Adaptive Learning Rate and Beyond"); at a pre-training peak LR
they hit a freshly initialised deep stack at once. Every published pre-training run of
a deep Pre-LN stack warms up (GPT-3 over 375M tokens, LLaMA 2000 steps, OLMo 2000-5000
steps). sapper reports a stack of 12 layers or more trained from scratch with no warmup,
when its placement is unknown, or when it is Pre-LN at a third or more of the peak LR
published for its size (N501's reference).""",
    signs="""\
A loss spike or NaN within the first hundred steps; gradient norms far above the
clipping threshold on the first steps, then a loss that plateaus higher than a warmed-up
run's.""",
    fix="""\
Warm the LR up linearly over the first 1-5% of steps (a few hundred to a few thousand),
and state the norm placement (model.norm_placement) so sapper can check it.""",
    seed="§2.4, §5.2",
)


def required_post_ln_warmup(total_steps: int | None) -> int:
    """Warmup steps sapper asks of a deep Post-LN stack: 4000, or 10% of a shorter run."""
    if total_steps is None:
        return POST_LN_WARMUP_STEPS
    return min(POST_LN_WARMUP_STEPS, max(1, int(WARMUP_FRACTION * total_steps)))


def _post_ln_layers(plan: Plan) -> int | None:
    m = plan.model
    if m is None or m.norm_placement != NormPlacement.POST:
        return None
    return m.num_layers


def _schedule_known(plan: Plan) -> bool:
    """The plan describes the schedule (any schedule field given, from any source); an
    absent schedule is unknown, not "no warmup"; so is a warmup a source left as "auto"."""
    if "schedule.warmup_steps" in plan.unresolved:
        return False
    return bool(plan.schedule.model_fields_set)


@plan_check(POST_LN_NO_WARMUP)
def post_ln_no_warmup(plan: Plan) -> CheckOutput:
    if plan.model is None:
        yield not_evaluated("norm placement (Pre-LN or Post-LN) and its warmup", "model")
        return
    L = _post_ln_layers(plan)
    if L is None or L < SHALLOW_LAYERS or plan.schedule.warmup_steps > 0:
        return
    if not _schedule_known(plan):
        return  # N403 warns: the warmup this stack needs cannot be verified
    deep = L >= DEEP_LAYERS
    need = required_post_ln_warmup(plan.schedule.total_steps)
    yield POST_LN_NO_WARMUP.finding(
        f"Post-LN with {L} layers and warmup_steps 0"
        + (f" (deep: ≥ {DEEP_LAYERS} layers)" if deep else "")
        + f": full learning rate from step 0; warm up over ≥ {need} steps or use Pre-LN",
        severity=None if deep else Severity.WARNING,
        fix=f"set schedule.warmup_steps ≥ {need}, or model.norm_placement: pre",
        value=0,
        threshold=need,
        source="schedule.warmup_steps",
        layers=L,
    )


@plan_check(POST_LN_SHORT_WARMUP)
def post_ln_short_warmup(plan: Plan) -> CheckOutput:
    L = _post_ln_layers(plan)
    warmup = plan.schedule.warmup_steps
    if L is None or L < DEEP_LAYERS or warmup == 0:
        return
    need = required_post_ln_warmup(plan.schedule.total_steps)
    if warmup >= need:
        return
    basis = (
        "the original 6-layer Post-LN Transformer's warmup"
        if need == POST_LN_WARMUP_STEPS
        else f"10% of the {plan.schedule.total_steps}-step run"
    )
    yield POST_LN_SHORT_WARMUP.finding(
        f"Post-LN with {L} layers warms up over only {warmup} steps (< {need}, {basis})",
        fix=f"set schedule.warmup_steps ≥ {need}, or model.norm_placement: pre",
        value=warmup,
        threshold=need,
        source="schedule.warmup_steps",
        layers=L,
    )


@plan_check(POST_LN_PREFER_PRE_LN)
def post_ln_prefer_pre_ln(plan: Plan) -> CheckOutput:
    L = _post_ln_layers(plan)
    if L is None or L < SHALLOW_LAYERS:
        return
    need = required_post_ln_warmup(plan.schedule.total_steps)
    if not _schedule_known(plan):
        # Unverified is not PASS: the run diverges unless the script adds the warmup.
        yield POST_LN_PREFER_PRE_LN.finding(
            f"Post-LN with {L} layers and no schedule visible to sapper: it diverges unless "
            f"the training script warms up over ≥ {need} steps",
            severity=Severity.WARNING,
            fix=f"state the schedule (--warmup {need}, schedule.total_steps) so it can be "
            "checked, or use model.norm_placement: pre",
            source="schedule.warmup_steps",
            layers=L,
            warmup_needed=need,
        )
        return
    if L < DEEP_LAYERS:
        return
    if plan.schedule.warmup_steps >= need:
        message = (
            f"Post-LN with {L} layers: warmup {plan.schedule.warmup_steps} steps is enough, "
            "but Pre-LN trains deep stacks more stably"
        )
    else:
        return  # N401/N402 already say it, louder
    yield POST_LN_PREFER_PRE_LN.finding(
        message, source="model.norm_placement", layers=L, warmup_needed=need
    )


def _placement_known(plan: Plan) -> bool:
    """The plan says where the norms sit (Megatron-LM's GPT blocks are Pre-LN)."""
    m = plan.model
    assert m is not None
    return "norm_placement" in m.model_fields_set or m.implementation == "megatron"


@plan_check(NO_WARMUP_DEEP_STACK)
def deep_stack_no_warmup(plan: Plan) -> CheckOutput:
    m = plan.model
    if m is None or m.num_layers < DEEP_LAYERS or plan.init.from_pretrained:
        return  # no model: N401 says so; a fine-tune starts from trained weights
    known = _placement_known(plan)
    if known and m.norm_placement == NormPlacement.POST:
        return  # N401/N402
    if not _schedule_known(plan) or plan.schedule.warmup_steps > 0:
        return
    L = m.num_layers
    if not known:
        yield NO_WARMUP_DEEP_STACK.finding(
            f"{L} layers trained from scratch with warmup_steps 0 and no norm placement in "
            "the plan: if the blocks are Post-LN this diverges (N401)",
            fix="state model.norm_placement, and warm the LR up over the first 1-5% of steps",
            value=0,
            source="model.norm_placement",
            layers=L,
        )
        return
    lr = None if "optimizer.lr" in plan.unresolved else plan.optimizer.lr
    ref = lr_reference(plan)
    if lr is None or isinstance(ref, NotEvaluated):
        yield not_evaluated(
            f"whether the peak LR of this {L}-layer {m.norm_placement.value}-LN stack, "
            "started without warmup, is at pre-training level",
            *(ref.missing if isinstance(ref, NotEvaluated) else ("optimizer.lr",)),
        )
        return
    if lr < ref.lr * HIGH_LR_SHARE:
        return
    yield NO_WARMUP_DEEP_STACK.finding(
        f"{m.norm_placement.value}-LN stack of {L} layers trained from scratch with "
        f"warmup_steps 0 at peak LR {lr:g} ({lr / ref.lr:.2g}× the published peak {ref.lr:.2g} "
        f"for its size: {ref.run}): Adam's first steps land on fresh weights at full LR",
        fix="warm the LR up linearly over the first 1-5% of steps (LLaMA: 2000 steps)",
        value=lr,
        threshold=ref.lr * HIGH_LR_SHARE,
        source="schedule.warmup_steps",
        layers=L,
        reference_lr=ref.lr,
    )
