"""Check b: k micro-batches with gradient accumulation give the gradient of one k× batch.

Two cases run through the user's step, both in fp32 with dropout off (so the only
difference between the runs is how the batch was cut):

- the micro-batches as the data source gives them;
- the same tokens re-cut into micro-batches of deliberately different lengths, right padded.
  Packed fixed-length data hides a per-micro-batch mean (every micro-batch has the same
  token count); uneven padding exposes it, by the fraction by which the counts differ.
"""

from __future__ import annotations

from sapper.rules.model import Finding
from sapper.smoke.batches import Batch, concat_batches, recut_variable_length, target_tokens
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.grads import GradComparison, collect_grads, compare_grads
from sapper.smoke.rules import ACCUMULATION
from sapper.smoke.step import StepOptions

__all__ = ["accumulation_vs_batch", "run"]


def accumulation_vs_batch(ctx: SmokeContext, micro_batches: list[Batch]) -> GradComparison:
    """Gradients of ``micro_batches`` accumulated vs the same sequences as one batch."""
    model = ctx.fresh_model(train=False)
    opts = StepOptions()
    res = ctx.step(model, micro_batches, opts)
    accumulated = collect_grads(model, res.grad_scale)
    model.zero_grad(set_to_none=True)
    res = ctx.step(model, [concat_batches(micro_batches)], opts)
    return compare_grads(accumulated, collect_grads(model, res.grad_scale))


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
    head = (
        f"{k} accumulated micro-batches vs one batch"
        if passed
        else f"accumulated gradient differs from the large batch's ({worst_case}: rel err "
        f"{worst:.2g} > {tol.fp32_rel_err:g}); the loss is likely averaged per micro-batch"
    )
    return [
        verdict(
            ACCUMULATION,
            passed,
            f"{head}: " + "; ".join(parts),
            value=worst,
            threshold=tol.fp32_rel_err,
            **numbers,
        )
    ]
