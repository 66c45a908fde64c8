"""Check c: activation checkpointing leaves the gradients unchanged.

Both runs use the user's step in training mode over the accumulation micro-batches (the
combination seed §3.2 warns about), from the same weights and the same RNG seed, so
dropout draws the same masks in the forward pass; a correct checkpoint replays them in the
recomputation (``preserve_rng_state``). Whether dropout is active is measured, not read from
a config: the reference step is run a second time under another seed, and if the gradients
change the step is stochastic and the RNG replay is being tested. The bytes saved for
backward are measured too, to prove that checkpointing actually took effect.
"""

from __future__ import annotations

import torch

from sapper.rules.model import Finding
from sapper.smoke.batches import Batch
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.grads import collect_grads, compare_grads
from sapper.smoke.measure import SavedTensorMeter
from sapper.smoke.rules import CHECKPOINTING
from sapper.smoke.step import StepOptions

__all__ = ["run"]


def _grads(
    ctx: SmokeContext, batches: list[Batch], seed: int, checkpointing: bool
) -> tuple[dict[str, torch.Tensor], int]:
    model = ctx.fresh_model(train=True)
    torch.manual_seed(seed)
    with SavedTensorMeter() as meter:
        res = ctx.step(model, batches, StepOptions(checkpointing=checkpointing))
    return collect_grads(model, res.grad_scale), meter.peak_bytes


def run(ctx: SmokeContext) -> list[Finding]:
    tol = ctx.config.tolerances
    batches = ctx.batches(max(1, ctx.config.grad_accum))
    seed = ctx.config.seed + 17
    ref, saved_plain = _grads(ctx, batches, seed, checkpointing=False)
    test, saved_ckpt = _grads(ctx, batches, seed, checkpointing=True)
    other_seed, _ = _grads(ctx, batches, seed + 1, checkpointing=False)
    cmp = compare_grads(test, ref)
    stochastic = compare_grads(other_seed, ref).rel_err > tol.fp32_rel_err
    effective = saved_ckpt < saved_plain
    dropout = (
        "dropout active: the recompute must replay its masks"
        if stochastic
        else "no dropout in this step, so the RNG replay is not exercised"
    )
    numbers = dict(
        value=cmp.rel_err,
        threshold=tol.fp32_rel_err,
        cosine=cmp.cosine,
        worst_layer=cmp.worst.layer if cmp.worst else None,
        stochastic=stochastic,
        saved_bytes_without=saved_plain,
        saved_bytes_with=saved_ckpt,
        layers=cmp.table(),
    )
    passed = cmp.finite and cmp.rel_err <= tol.fp32_rel_err
    if not passed:
        worst = cmp.worst
        where = f", worst in {worst.layer} (rel err {worst.rel_err:.2g})" if worst else ""
        message = (
            f"checkpointing changes the gradients: rel err {cmp.rel_err:.2g} > "
            f"{tol.fp32_rel_err:g}{where}; {dropout}"
        )
        return [verdict(CHECKPOINTING, False, message, **numbers)]
    saving = f"saved activations {saved_plain / 2**20:.2f} → {saved_ckpt / 2**20:.2f} MiB"
    if not effective:
        return [
            verdict(
                CHECKPOINTING,
                True,
                f"gradients equal (rel err {cmp.rel_err:.1e}) but checkpointing saved no "
                f"memory ({saving}): no block was checkpointed, so nothing was tested",
                warn=True,
                **numbers,
            )
        ]
    return [
        verdict(
            CHECKPOINTING,
            True,
            f"same gradients with and without checkpointing (rel err {cmp.rel_err:.1e}, "
            f"{saving}); {dropout}",
            **numbers,
        )
    ]
