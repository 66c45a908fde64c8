"""Check a: the model overfits one batch, and its loss targets the next token.

Overfitting one batch is the cheapest end-to-end proof that gradients reach the weights
and the optimizer moves them (S001). The label-shift probe (S002) trains a fresh copy on
key→value pairs ``k1 v1 k2 v2 …`` (keys uniform over K ids, each value a fixed function
of its key) and reads the step's loss on unseen pairs and on random keys alone:

- next-token targets: values predictable, keys not: pairs → ½·ln K, random keys ≥ ln K;
- targets not shifted (position t scored on token t, which it sees): both → 0;
- targets shifted twice (t scored on t+2): nothing is predictable, both stay at ln K.

No next-token predictor can beat ln K on random keys (the target is independent of all
it sees), so a loss well below it proves the targets leak into the inputs, whatever the
model; a pairs loss below ln K proves at least one target per pair follows from the
past, which a double shift rules out. The probe has its own AdamW and dropout off, so it
judges the targets, not the learning rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from sapper.rules.model import Finding
from sapper.smoke.batches import Batch, pad_samples
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.rules import LABEL_SHIFT, OVERFIT
from sapper.smoke.step import StepOptions

__all__ = ["ProbeResult", "key_value_batch", "probe_targets", "run"]


def key_value_batch(
    keys: int, batch: int, seq_len: int, gen: torch.Generator, perm: torch.Tensor
) -> Batch:
    """Sequences of (key, value) pairs: keys in [0, K), value = K + perm[key]."""
    pairs = max(2, seq_len // 2)
    k = torch.randint(0, keys, (batch, pairs), generator=gen)
    seq = torch.stack([k, keys + perm[k]], dim=-1).reshape(batch, 2 * pairs)
    return pad_samples(list(seq))


def _train_one_batch(ctx: SmokeContext, batch: Batch) -> list[float]:
    model = ctx.fresh_model(train=True)
    opt = ctx.optimizer(model)
    losses = []
    for _ in range(ctx.config.steps):
        opt.zero_grad(set_to_none=True)
        res = ctx.step(model, [batch], StepOptions())
        losses.append(res.loss)
        if not math.isfinite(res.loss):
            break
        opt.step()
    return losses


def _overfit(ctx: SmokeContext) -> Finding:
    tol = ctx.config.tolerances
    losses = _train_one_batch(ctx, ctx.batches(1)[0])
    first, last = losses[0], losses[-1]
    finite = all(math.isfinite(x) for x in losses)
    drop = 1.0 - last / first if finite and first > 0 else 0.0
    passed = finite and drop >= tol.overfit_min_drop
    numbers = dict(
        value=round(drop, 4),
        threshold=tol.overfit_min_drop,
        initial_loss=first,
        final_loss=last,
        steps=len(losses),
        lr=ctx.config.lr,
        losses=[round(x, 4) for x in losses],
    )
    if not finite:
        message = f"loss became non-finite at step {len(losses) - 1} while overfitting one batch"
    else:
        message = (
            f"one batch, {len(losses)} steps: loss {first:.3f} → {last:.3f} "
            f"({drop:.0%} drop; needs ≥ {tol.overfit_min_drop:.0%})"
        )
    return verdict(OVERFIT, passed, message, **numbers)


@dataclass
class ProbeResult:
    """Held-out losses of the probe, as fractions of ln K, at the last evaluation."""

    pairs: float = math.inf  # key→value sequences: ≈ 0.5 correct, 0 copy, ≥ 1 double shift
    keys: float = math.inf  # keys only (nothing predictable): ≥ 1 unless targets are visible
    steps: int = 0
    history: list[tuple[int, float, float]] = field(default_factory=list)


def probe_targets(ctx: SmokeContext, keys: int = 8) -> ProbeResult:
    """Train a fresh copy on key→value pairs with the user's step and sapper's own AdamW
    (the probe judges the targets, not the learning rate) until the verdict is clear."""
    tol = ctx.config.tolerances
    seed = ctx.config.seed
    perm = torch.randperm(keys, generator=torch.Generator().manual_seed(seed + 101))
    seq, batch = ctx.config.seq_len, max(4, ctx.config.micro_batch)
    held_out = key_value_batch(keys, 8, seq, torch.Generator().manual_seed(seed + 102), perm)
    rand = torch.randint(0, keys, (8, seq), generator=torch.Generator().manual_seed(seed + 103))
    keys_only = pad_samples(list(rand))
    model = ctx.fresh_model(train=False)  # dropout off: a faster, steadier probe
    opt = torch.optim.AdamW(model.parameters(), lr=tol.probe_lr, weight_decay=0.0)
    ln_k = math.log(keys)
    out = ProbeResult()
    for i in range(tol.probe_max_steps):
        gen = torch.Generator().manual_seed(seed + 1000 + i)
        opt.zero_grad(set_to_none=True)
        ctx.step(model, [key_value_batch(keys, batch, seq, gen, perm)], StepOptions())
        opt.step()
        if (i + 1) % 10:
            continue
        opt.zero_grad(set_to_none=True)
        pairs = ctx.step(model, [held_out], StepOptions()).loss / ln_k
        only = ctx.step(model, [keys_only], StepOptions()).loss / ln_k
        out.pairs, out.keys, out.steps = pairs, only, i + 1
        out.history.append((i + 1, round(pairs, 3), round(only, 3)))
        if not (math.isfinite(pairs) and math.isfinite(only)):
            break
        if only < tol.probe_copy_fraction:
            break  # targets visible: proven
        if pairs < tol.probe_learned_fraction and only >= 1.0 - tol.probe_noise:
            break  # values predicted, keys not: next-token targets, proven
    opt.zero_grad(set_to_none=True)
    return out


def _label_shift(ctx: SmokeContext) -> Finding:
    tol = ctx.config.tolerances
    keys = max(2, min(8, ctx.vocab_size // 2))
    res = probe_targets(ctx, keys)
    ln_k = math.log(keys)
    numbers = dict(
        value=round(res.pairs, 4),
        pairs_loss_over_ln_k=res.pairs,
        keys_loss_over_ln_k=res.keys,
        keys=keys,
        steps=res.steps,
        history=res.history,
    )
    if res.keys < tol.probe_copy_fraction:
        return verdict(
            LABEL_SHIFT,
            False,
            f"loss {res.keys * ln_k:.3f} on random keys, where no next-token predictor can "
            f"go below ln K = {ln_k:.2f}: the targets are not shifted (position t is scored "
            "on token t, which it sees)",
            threshold=tol.probe_copy_fraction,
            fix="compare logits[:, :-1] with labels[:, 1:] (shift exactly once)",
            **numbers,
        )
    if res.pairs < tol.probe_learned_fraction and res.keys >= 1.0 - tol.probe_noise:
        return verdict(
            LABEL_SHIFT,
            True,
            f"next-token targets: key→value loss {res.pairs:.2f}·ln K (≈ 0.5 expected), "
            f"random keys {res.keys:.2f}·ln K (≥ 1) after {res.steps} probe steps",
            **numbers,
        )
    if abs(res.pairs - 1.0) <= tol.probe_noise and res.keys >= 1.0 - tol.probe_noise:
        return verdict(
            LABEL_SHIFT,
            False,
            f"after {res.steps} probe steps the loss on key→value pairs is still "
            f"{res.pairs:.2f}·ln K although every value follows from its key (≈ 0.5 "
            "expected): the targets are shifted twice (position t scored on token t+2), "
            "or the model cannot learn a lookup",
            threshold=tol.probe_learned_fraction,
            fix="shift once: either pass labels=input_ids to a Hugging Face model or shift "
            "in the loop, not both",
            **numbers,
        )
    return verdict(
        LABEL_SHIFT,
        True,
        f"probe inconclusive after {res.steps} steps (key→value {res.pairs:.2f}·ln K, "
        f"random keys {res.keys:.2f}·ln K); see S001",
        warn=True,
        **numbers,
    )


def run(ctx: SmokeContext) -> list[Finding]:
    return [_overfit(ctx), _label_shift(ctx)]
