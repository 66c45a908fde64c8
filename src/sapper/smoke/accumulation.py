"""Check b: k micro-batches with gradient accumulation give the gradient of one k× batch.

Two cases run through the user's step, both in fp32 with dropout off (so the only
difference between the runs is how the batch was cut):

- the micro-batches as the data source gives them;
- the same tokens re-cut into micro-batches of deliberately different lengths, right padded.
  Packed fixed-length data hides a per-micro-batch mean (every micro-batch has the same
  token count); uneven padding exposes it, by the fraction by which the counts differ.

When they differ, discriminating probes name the cause instead of guessing one, in this
order (each one rules out what the next would be confused with):

- repeat: the same step twice from fresh copies of the same weights; a difference means the
  step itself is not repeatable (state kept in the step object, randomness with dropout off);
- state: the same step twice on one model; a difference means a layer carries state from
  one forward to the next (running statistics updated in eval mode, a cache);
- padding: the same micro-batches with extra padded columns (mask 0, label -100); a
  difference means padding reaches the loss (targets taken from ``input_ids``, the mask or
  -100 ignored);
- even counts: micro-batches cut to equal real-token counts without padding; equal there but
  different with uneven counts is the per-micro-batch average; different even there means
  the micro-batches' gradients are not summed (a zero_grad or a missing backward inside the
  loop, a loss divided by the wrong count).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sapper.rules.model import Finding
from sapper.smoke.batches import (
    IGNORE_INDEX,
    Batch,
    concat_batches,
    pad_samples,
    recut_variable_length,
    target_tokens,
)
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.grads import GradComparison, collect_grads, compare_grads
from sapper.smoke.rules import ACCUMULATION
from sapper.smoke.step import StepOptions

__all__ = ["Diagnosis", "accumulation_vs_batch", "diagnose", "run"]


def accumulation_vs_batch(ctx: SmokeContext, micro_batches: list[Batch]) -> GradComparison:
    """Gradients of ``micro_batches`` accumulated vs the same sequences as one batch."""
    model = ctx.fresh_model(train=False)
    opts = StepOptions()
    res = ctx.step(model, micro_batches, opts)
    accumulated = collect_grads(model, res.grad_scale)
    model.zero_grad(set_to_none=True)
    res = ctx.step(model, [concat_batches(micro_batches)], opts)
    return compare_grads(accumulated, collect_grads(model, res.grad_scale))


def _grads(ctx: SmokeContext, model: torch.nn.Module, batches: list[Batch]) -> dict:
    model.zero_grad(set_to_none=True)
    res = ctx.step(model, batches, StepOptions())
    return collect_grads(model, res.grad_scale)


def with_extra_padding(batch: Batch, extra: int) -> Batch:
    """The batch with ``extra`` more padded columns on the right (mask 0, label -100)."""
    pads = {"input_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX}
    return {
        key: torch.nn.functional.pad(value, (0, extra), value=pads.get(key, 0))
        for key, value in batch.items()
    }


def even_counts(batches: list[Batch], k: int) -> list[Batch]:
    """``k`` micro-batches of sequences cut to one common length: equal real-token counts
    and no padding."""
    rows = [
        ids[mask.bool()]
        for b in batches
        for ids, mask in zip(b["input_ids"], b["attention_mask"], strict=True)
    ]
    length = max(3, min(int(r.numel()) for r in rows))
    per = max(1, len(rows) // k)
    return [pad_samples([r[:length] for r in rows[i * per : (i + 1) * per]]) for i in range(k)]


#: The fix for each cause; the per-micro-batch average keeps the rule's own.
FIXES: dict[str, str] = {
    "not repeatable": "make the step a pure function of the model and the micro-batches: no "
    "counters or caches on the step object, no random draws outside dropout",
    "stateful layer": "update running statistics only in training mode (or not at all in "
    "a language model), and reset caches (use_cache=False, past_key_values=None) on every "
    "forward",
    "unmasked padding": "take the targets from batch['labels'] with ignore_index=-100 (or "
    "mask them with the attention mask) and count only those targets",
    "not summed": "call backward once per micro-batch without zeroing gradients in between, "
    "and divide by the target tokens of the whole step",
}


@dataclass
class Diagnosis:
    """The cause the probes point at, and each probe's relative error."""

    cause: str
    explanation: str
    probes: dict[str, float]


def _rel(a: dict, b: dict) -> float:
    cmp = compare_grads(a, b)
    return cmp.rel_err if cmp.finite else float("inf")


def diagnose(ctx: SmokeContext, given: list[Batch], k: int) -> Diagnosis:
    """Run the discriminating probes on a failed accumulation check (see the module)."""
    tol = ctx.config.tolerances.fp32_rel_err
    probes: dict[str, float] = {}
    first = _grads(ctx, ctx.fresh_model(train=False), given)
    probes["repeat"] = _rel(_grads(ctx, ctx.fresh_model(train=False), given), first)
    if probes["repeat"] > tol:
        return Diagnosis(
            "not repeatable",
            f"the step is not repeatable: two runs from the same weights on the same "
            f"micro-batches differ by rel err {probes['repeat']:.2g} (state kept in the step "
            "object, or randomness with dropout off)",
            probes,
        )
    model = ctx.fresh_model(train=False)
    once = _grads(ctx, model, given)
    probes["state"] = _rel(_grads(ctx, model, given), once)
    if probes["state"] > tol:
        return Diagnosis(
            "stateful layer",
            f"a layer carries state from one forward to the next: the same micro-batches on "
            f"the same weights give another gradient once the model has run (rel err "
            f"{probes['state']:.2g}), so micro-batch 2 sees what micro-batch 1 left behind "
            "(running statistics updated in eval mode, a cache, a counter)",
            probes,
        )
    padded = [with_extra_padding(b, 8) for b in given]
    probes["padding"] = _rel(_grads(ctx, ctx.fresh_model(train=False), padded), first)
    if probes["padding"] > tol:
        return Diagnosis(
            "unmasked padding",
            f"padding reaches the loss: 8 more padded columns (mask 0, label -100) change the "
            f"gradient by rel err {probes['padding']:.2g}, so a batch padded to another "
            "length gives another gradient (targets taken from input_ids, or the mask and "
            "-100 ignored)",
            probes,
        )
    even = even_counts(given, k)
    probes["even_counts"] = accumulation_vs_batch(ctx, even).rel_err
    if probes["even_counts"] <= tol:
        return Diagnosis(
            "per-micro-batch average",
            "the loss is averaged per micro-batch: with equal real-token counts accumulation "
            f"is exact (rel err {probes['even_counts']:.1e}), with uneven counts it is not, "
            "so a token in a short micro-batch weighs more than one in a long micro-batch",
            probes,
        )
    return Diagnosis(
        "not summed",
        "the micro-batches' gradients are not summed into one step's: even with equal token "
        f"counts and no padding accumulation differs (rel err {probes['even_counts']:.2g}); "
        "look for a zero_grad or a missing backward inside the loop, or a loss divided by "
        "the wrong count",
        probes,
    )


def run(ctx: SmokeContext) -> list[Finding]:
    tol = ctx.config.tolerances
    k = max(2, ctx.config.grad_accum)
    given = ctx.batches(k)
    cases = {"as given": given, "uneven padding": recut_variable_length(given, k)}
    numbers: dict[str, object] = {"micro_batches": k}
    worst_case, worst = "", -1.0
    parts = []
    for name, batches in cases.items():
        cmp = accumulation_vs_batch(ctx, batches)
        tokens = [target_tokens(b) for b in batches]
        numbers[name] = {
            "rel_err": cmp.rel_err,
            "cosine": cmp.cosine,
            "tokens_per_micro_batch": tokens,
            "worst_layer": cmp.worst.layer if cmp.worst else None,
            "layers": cmp.table(),
        }
        parts.append(f"{name} (tokens {'/'.join(map(str, tokens))}): rel err {cmp.rel_err:.1e}")
        err = cmp.rel_err if cmp.finite else float("inf")
        if err > worst:
            worst_case, worst = name, err
    passed = worst <= tol.fp32_rel_err
    head = f"{k} accumulated micro-batches vs one batch"
    fix = None
    if not passed:
        found = diagnose(ctx, given, k)
        numbers.update(cause=found.cause, probes=found.probes)
        fix = FIXES.get(found.cause)
        head = (
            f"accumulated gradient differs from the large batch's ({worst_case}: rel err "
            f"{worst:.2g} > {tol.fp32_rel_err:g}); {found.explanation}"
        )
    return [
        verdict(
            ACCUMULATION,
            passed,
            f"{head}: " + "; ".join(parts),
            value=worst,
            threshold=tol.fp32_rel_err,
            fix=fix,
            **numbers,
        )
    ]
