"""Checklist item 2, gradient clipping (seed §2.3): on or off, threshold, order, scope.

Clipping bounds one bad batch's update. It works only when it is on, when the threshold
sits near the gradient norms the run actually has (≈ 0.1–1.0 in healthy pre-training,
hence the usual 1.0), when it measures true (unscaled) gradients, and when the global
norm is not set by a few huge matrices.
"""

from __future__ import annotations

from sapper.checks.engine import CheckOutput, not_evaluated, plan_check
from sapper.model import total_params
from sapper.model.derived import plan_architecture
from sapper.plan.schema import Plan
from sapper.rules.model import Rule, Severity

__all__ = [
    "CLIP_BEFORE_UNSCALE",
    "CLIP_THRESHOLD",
    "NO_CLIPPING",
    "USUAL_MAX_NORM",
    "VOCAB_DOMINATES_NORM",
    "vocab_param_share",
]

#: The threshold of seed §2.3 and of most published LLM recipes.
USUAL_MAX_NORM = 1.0
#: One decade either side of 1.0: below, every healthy step (norm 0.1–1) is clipped; above,
#: only a spike 10× larger than a healthy step is.
LOW_MAX_NORM = 0.1
HIGH_MAX_NORM = 10.0
#: Share of all parameters held by the vocabulary matrices above which they set the
#: global norm (see VOCAB_DOMINATES_NORM.why).
VOCAB_SHARE_LIMIT = 0.25

NO_CLIPPING = Rule(
    code="N201",
    name="no-gradient-clipping",
    check="clipping",
    severity=Severity.WARNING,
    title="Gradient clipping is off",
    why="""\
Now and then one batch is unusually "sharp" and its gradient is many times the usual norm.
Without clipping that one update moves the weights far into a bad region; the loss jumps
and often never comes back, or the next steps overflow to Inf/NaN. DeepSpeed's
`gradient_clipping` defaults to 0, which means off, so a DeepSpeed config that does not
set it trains unclipped.""",
    signs="""\
Isolated loss spikes that coincide with gradient-norm spikes of 10× or more; divergence
a few steps after one of them.""",
    fix="""\
Clip the global gradient norm at 1.0 after backward (and after unscaling, with fp16) and
before the optimizer step: `torch.nn.utils.clip_grad_norm_(params, 1.0)`, HF
`max_grad_norm=1.0`, DeepSpeed `"gradient_clipping": 1.0`. Log the norm for the first few
hundred steps to confirm it sits around 0.1–1.0.""",
    seed="§2.3",
)

CLIP_THRESHOLD = Rule(
    code="N202",
    name="clip-threshold-out-of-range",
    check="clipping",
    severity=Severity.WARNING,
    title="The clipping threshold is far from the usual range (≈ 1.0)",
    why="""\
Healthy pre-training runs see global gradient norms of about 0.1–1.0, so a threshold of
1.0 touches only unusual batches. Below 0.1 nearly every step is clipped: each update is
rescaled to a fixed norm, which silently lowers the learning rate by ‖g‖/max_norm and hides
the gradient norm as a signal. Above 10 the threshold lets through a spike ten times a
healthy step before it acts, so it no longer protects anything; a threshold raised to
silence frequent clipping hides a learning rate that is too high or bad data. (A negative
threshold, with which `clip_grad_norm_` would flip every clipped gradient, is refused as
input.)""",
    signs="""\
Tiny threshold: the logged gradient norm is above the threshold on every step and the loss
falls slowly. Huge threshold: loss spikes that clipping should have absorbed.""",
    fix="""\
Use max_norm ≈ 1.0. If the norms in the first few hundred steps are often 5–10, lower the
learning rate or fix the data rather than raising the threshold (seed §2.3).""",
    seed="§2.3",
)

CLIP_BEFORE_UNSCALE = Rule(
    code="N203",
    name="clipping-on-scaled-gradients",
    check="clipping",
    severity=Severity.ERROR,
    title="Gradients are clipped while still multiplied by the loss scale",
    why="""\
With loss scaling the gradients after backward are scale × the true gradients (2^16 by
default). Clipping them before `scaler.unscale_(optimizer)` compares a norm that is
thousands of times too large with the threshold: every step is clipped, and the true
threshold becomes max_norm / scale. The update then depends on the current loss scale,
which doubles every growth interval and halves on every overflow, so the step size jumps
with it. Where nothing unscales afterwards (manual scaling), every update is scale× too
large. No error is raised; the loss rises in a strange way (seed §2.2).""",
    signs="""\
The logged gradient norm is huge (≈ scale × a normal norm) and always above the threshold;
the loss moves in steps that line up with loss-scale changes, or rises steadily.""",
    fix="""\
Call `scaler.unscale_(optimizer)` before `clip_grad_norm_`, then `scaler.step(optimizer)`
and `scaler.update()`. HF Trainer, Lightning and DeepSpeed do this in the right order when
clipping is configured through them rather than by hand.""",
    seed="§2.2, §2.3",
)

VOCAB_DOMINATES_NORM = Rule(
    code="N204",
    name="global-norm-set-by-vocab-matrices",
    check="clipping",
    severity=Severity.INFO,
    title="Embedding and output head dominate the global gradient norm",
    why="""\
Global clipping scales every gradient by max_norm/‖g‖ where ‖g‖² sums over all
parameters. The output head gets a dense gradient on every row (softmax error × hidden
state), the input embedding a sparse one on the rows of the tokens in the batch; both are
V × h matrices. sapper counts their share of the parameters (V·h, twice when the head is
not tied); at 25% or more, with even a similar gradient per parameter, they carry at least
a quarter of ‖g‖², and their own spikes (rare tokens, a new domain) decide when every
transformer block gets clipped, so the blocks' updates are suppressed by gradients that
are not theirs (seed §2.3).""",
    signs="""\
Clipping fires often although the blocks' per-layer gradient norms are small; the
embedding/head gradient norm is the largest entry of a per-parameter-group norm log.""",
    fix="""\
Log per-group gradient norms (embedding, head, blocks) for the first few hundred steps.
If the vocabulary matrices dominate, clip per parameter group, or put them in their own
optimizer group with their own threshold; tying the head to the embedding halves their
share.""",
    seed="§2.3",
)


def _enabled(plan: Plan) -> bool:
    return plan.clipping.max_norm is not None and plan.clipping.max_norm != 0


@plan_check(NO_CLIPPING)
def clipping_off(plan: Plan) -> CheckOutput:
    max_norm = plan.clipping.max_norm
    if max_norm is None and any("clipping" in key for key in plan.unresolved):
        return  # "auto": the launcher fills it in; C002 says so, nothing to guess
    if max_norm is None:
        yield NO_CLIPPING.finding(
            "clipping.max_norm is not set: gradients are never clipped, one sharp batch can "
            "move the weights arbitrarily far",
            fix=f"set clipping.max_norm: {USUAL_MAX_NORM}",
            source="clipping.max_norm",
        )
    elif max_norm == 0:
        yield NO_CLIPPING.finding(
            "clipping.max_norm is 0, which turns clipping off (DeepSpeed's "
            '"gradient_clipping": 0 is its default and means off)',
            fix=f'set clipping.max_norm / DeepSpeed "gradient_clipping" to {USUAL_MAX_NORM}',
            value=0.0,
            source="clipping.max_norm",
        )


@plan_check(CLIP_THRESHOLD)
def clip_threshold(plan: Plan) -> CheckOutput:
    max_norm = plan.clipping.max_norm
    if max_norm is None or max_norm == 0:
        return
    if max_norm < LOW_MAX_NORM:  # a negative one never gets here: the Plan refuses it
        yield CLIP_THRESHOLD.finding(
            f"max_norm {max_norm:g} < {LOW_MAX_NORM:g}: healthy norms are 0.1–1.0, so nearly "
            f"every step is clipped and the effective LR shrinks by ‖g‖/{max_norm:g}",
            fix=f"use max_norm ≈ {USUAL_MAX_NORM} and tune the learning rate instead",
            value=max_norm,
            threshold=LOW_MAX_NORM,
            source="clipping.max_norm",
        )
    elif max_norm > HIGH_MAX_NORM:
        yield CLIP_THRESHOLD.finding(
            f"max_norm {max_norm:g} > {HIGH_MAX_NORM:g}: {max_norm / USUAL_MAX_NORM:g}× the "
            "usual 1.0, a spike must exceed a healthy step tenfold before it is clipped",
            fix=f"use max_norm ≈ {USUAL_MAX_NORM}; if norms are often 5–10, lower the LR or "
            "fix the data",
            value=max_norm,
            threshold=HIGH_MAX_NORM,
            source="clipping.max_norm",
        )


@plan_check(CLIP_BEFORE_UNSCALE)
def clip_before_unscale(plan: Plan) -> CheckOutput:
    ls = plan.precision.loss_scaling
    if not _enabled(plan) or ls.mode == "none" or plan.precision.dtype != "fp16":
        return
    if "applied" not in plan.clipping.model_fields_set and plan.framework in (None, "torch"):
        # DeepSpeed, Megatron and the Trainer unscale before they clip; a hand-written
        # loop must call scaler.unscale_ itself, which no config file shows.
        yield not_evaluated(
            "whether the training loop calls scaler.unscale_ before clipping (sapper.Monitor "
            "sees it at runtime: R032, R033)",
            "clipping.applied",
        )
        return
    if plan.clipping.applied != "before_unscale":
        return
    scale = ls.static_scale if ls.mode == "static" else ls.initial_scale
    max_norm = plan.clipping.max_norm
    assert max_norm is not None
    if scale is None or scale <= 0:
        scale_text, true = "the loss scale", "max_norm / scale"
    else:
        scale_text, true = f"the {ls.mode} loss scale {scale:g}", f"{max_norm / scale:.2g}"
    yield CLIP_BEFORE_UNSCALE.finding(
        f"{plan.precision.dtype} clipping at max_norm {max_norm:g} before unscaling: gradients "
        f"still carry {scale_text}, so the true threshold is {true} and every step is clipped",
        fix="call scaler.unscale_(optimizer) before clip_grad_norm_ "
        "(set clipping.applied: after_unscale)",
        value=max_norm,
        source="clipping.applied",
        loss_scale=scale,
    )


def vocab_param_share(plan: Plan) -> tuple[int, int, float] | None:
    """(vocabulary-matrix parameters, all parameters, their share), or None without a model.

    The vocabulary matrices are the V × h input embedding and, when untied, the V × h
    output head.
    """
    m = plan.model
    if m is None:
        return None
    vocab = m.vocab_size * m.hidden_size * (1 if m.tied_embeddings else 2)
    arch = plan_architecture(plan)
    if arch is None:
        return None
    total = total_params(arch)
    return vocab, total, vocab / total


@plan_check(VOCAB_DOMINATES_NORM)
def vocab_dominates_norm(plan: Plan) -> CheckOutput:
    if not _enabled(plan) or plan.clipping.mode != "global":
        return
    if plan.model is None:
        yield not_evaluated("whether the embedding and head dominate the global norm", "model")
        return
    share = vocab_param_share(plan)
    if share is None or share[2] < VOCAB_SHARE_LIMIT:
        return
    vocab, total, frac = share
    m = plan.model
    assert m is not None
    what = (
        f"tied embedding/head ({m.vocab_size} × {m.hidden_size})"
        if m.tied_embeddings
        else f"embedding + untied head (2 × {m.vocab_size} × {m.hidden_size})"
    )
    yield VOCAB_DOMINATES_NORM.finding(
        f"{what} hold {frac:.0%} of the {total / 1e6:,.0f}M parameters "
        f"(≥ {VOCAB_SHARE_LIMIT:.0%}): they can set the global norm that clips every block",
        fix="log per-group gradient norms; clip the embedding/head in their own group if "
        "they dominate",
        value=round(frac, 4),
        threshold=VOCAB_SHARE_LIMIT,
        source="clipping.mode",
        vocab_params=vocab,
        params=total,
    )
