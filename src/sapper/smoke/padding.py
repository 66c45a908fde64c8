"""Check: padding in the labels of the user's own batches is ignored by the loss (S011).

The other checks feed the step batches sapper pads itself, so a collator that sets
``labels = input_ids`` without ``-100`` at padding passes them all. This check reads the
data source's first micro-batches as they are and finds the padded positions:
``attention_mask == 0``, or, for a loader without a mask, the trailing run of the model's
``pad_token_id`` in each row. Where a padded position carries a label (a token id: a
negative label is an ignore marker, ``-100`` or a step's own), the label is changed to
another token id and the step is run again on the same weights, fp32, dropout off: only
those labels differ between the two runs, so any change of the loss or the gradients is
the loss scoring padding. A step that masks padding by
itself (from the attention mask) changes nothing and passes, with the count reported.
"""

from __future__ import annotations

import math

import torch

from sapper.rules.model import Finding
from sapper.smoke.batches import Batch
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.grads import collect_grads, compare_grads
from sapper.smoke.rules import PADDING_IN_LABELS
from sapper.smoke.step import StepOptions

__all__ = ["padded_positions", "perturb_padded_labels", "run"]


def padded_positions(batch: Batch, pad_id: int | None) -> torch.Tensor:
    """Boolean [B, T]: padding by the attention mask, else the trailing run of ``pad_id``."""
    mask = batch["attention_mask"]
    if bool((mask == 0).any()) or pad_id is None:
        return mask == 0
    is_pad = batch["input_ids"] == pad_id
    # trailing run: a position is padding when it and everything after it is the pad id
    return torch.flip(torch.cumprod(torch.flip(is_pad.long(), [1]), dim=1), [1]).bool()


def perturb_padded_labels(batch: Batch, padded: torch.Tensor, vocab: int) -> tuple[Batch, int]:
    """A copy whose labels at padded positions that carry a target (a token id: any negative
    label is some loss's ignore marker, -100 or a step's own -1) are another token id; the
    number changed."""
    labels = batch["labels"]
    scored = padded & (labels >= 0)
    new = labels.clone()
    new[scored] = (labels[scored] + 1) % max(2, vocab)
    return {**batch, "labels": new}, int(scored.sum())


def _run_step(ctx: SmokeContext, batches: list[Batch]) -> tuple[float, dict[str, torch.Tensor]]:
    model = ctx.fresh_model(train=False)
    res = ctx.step(model, batches, StepOptions())
    return res.loss, collect_grads(model, res.grad_scale)


def run(ctx: SmokeContext) -> list[Finding]:
    tol = ctx.config.tolerances
    batches = ctx.batches(max(1, ctx.config.grad_accum))
    masks = [padded_positions(b, ctx.pad_token_id) for b in batches]
    padded = sum(int(m.sum()) for m in masks)
    positions = sum(int(b["labels"].numel()) for b in batches)
    perturbed, changed = [], 0
    for b, m in zip(batches, masks, strict=True):
        p, n = perturb_padded_labels(b, m, ctx.vocab_size)
        perturbed.append(p)
        changed += n
    how = (
        "attention_mask == 0"
        if any(bool((b["attention_mask"] == 0).any()) for b in batches)
        else f"trailing pad id {ctx.pad_token_id}"
    )
    numbers: dict[str, object] = dict(
        value=changed / padded if padded else 0.0,
        threshold=0.0,
        micro_batches=len(batches),
        label_positions=positions,
        padded_positions=padded,
        padded_with_labels=changed,
        padding_found_by=how if padded else None,
    )
    if not padded:
        found = "no attention_mask zeros" + (
            f" and no trailing pad id {ctx.pad_token_id}" if ctx.pad_token_id is not None else ""
        )
        return [
            verdict(
                PADDING_IN_LABELS,
                True,
                f"no padding in the loader's first {len(batches)} micro-batch(es) ({found}): "
                "packed or fixed-length data, nothing to mask",
                **numbers,
            )
        ]
    if not changed:
        return [
            verdict(
                PADDING_IN_LABELS,
                True,
                f"all {padded} padded positions ({how}) of the loader's first "
                f"{len(batches)} micro-batch(es) are labelled -100 (or another negative "
                "ignore label)",
                **numbers,
            )
        ]
    loss, grads = _run_step(ctx, batches)
    loss_p, grads_p = _run_step(ctx, perturbed)
    cmp = compare_grads(grads_p, grads)
    loss_change = abs(loss_p - loss) / abs(loss) if loss else abs(loss_p - loss)
    if not math.isfinite(loss_change):
        loss_change = math.inf
    numbers.update(
        loss=loss, loss_perturbed=loss_p, loss_rel_change=loss_change, grad_rel_err=cmp.rel_err
    )
    scored = loss_change > tol.fp32_rel_err or cmp.rel_err > tol.fp32_rel_err
    if scored:
        return [
            verdict(
                PADDING_IN_LABELS,
                False,
                f"the loss scores padding: {changed} of {padded} padded positions ({how}) "
                f"carry token ids as labels, and changing only those labels changes the "
                f"loss by {loss_change:.2g} (relative) and the gradients by rel err "
                f"{cmp.rel_err:.2g}; the collator likely sets labels = input_ids without "
                "masking padding",
                **numbers,
            )
        ]
    return [
        verdict(
            PADDING_IN_LABELS,
            True,
            f"{changed} of {padded} padded positions ({how}) carry labels, but the step "
            f"ignores them: changing them leaves the loss (rel change {loss_change:.1e}) and "
            f"gradients (rel err {cmp.rel_err:.1e}) unchanged",
            **numbers,
        )
    ]
