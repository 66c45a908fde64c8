"""Check: the user's training step keeps the ``TrainStep`` contract (S012, docs/train-step.md).

Every other check calls the step and trusts what it leaves behind; a step that breaks the
contract makes their verdicts about the wrong thing (an accumulation check over a step that
zeroes the gradients itself, a precision check over a step that ignores the precision). So
this check runs the step a few times, fp32 unless said, dropout off, and tells which clause
it broke:

1. ``returns``: a :class:`~sapper.smoke.step.StepResult` with a finite ``loss``;
2. ``gradients``: it leaves a gradient in ``param.grad`` (a backward ran);
3. ``no optimizer``: the weights are unchanged (the optimizer step is the caller's);
4. ``accumulates``: gradients already in ``param.grad`` are added to, not replaced (the
   caller zeroes them before the step, the step never does);
5. ``tokens``: ``StepResult.tokens`` is the number of target tokens of the step
   (``labels[:, 1:] != -100`` over the micro-batches), a warning when it differs;
6. ``grad_scale``: under fp16 ``param.grad / grad_scale`` is the fp32 gradient's size (a
   loss scale applied but not reported, or reported but not applied, is off by the scale);
7. ``precision``: under bf16 the model's modules compute in bf16 (the step opened autocast);
8. ``wrapper``: given a DDP-like wrapper, the forward goes through the wrapper (``model(...)``,
   never ``model.module(...)``, which DDP's gradient all-reduce never sees), and the last
   micro-batch runs outside ``no_sync`` (else nothing is ever all-reduced); a step that
   syncs every micro-batch is correct but slower (reported, not failed).

The token all-reduce across ranks and the loss × world size are proven by S007 on a real
gloo group; this check stays in one process.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sapper.rules.model import Finding
from sapper.smoke.batches import Batch, target_tokens
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.grads import collect_grads, compare_grads
from sapper.smoke.rules import STEP_CONTRACT
from sapper.smoke.step import StepOptions, StepResult

__all__ = ["Clause", "DDPLike", "check_contract", "run"]


@dataclass
class Clause:
    """One clause of the contract and what the step did."""

    name: str
    kept: bool
    detail: str
    hard: bool = True  # a broken hard clause fails; a soft one warns


class DDPLike(nn.Module):
    """The two things a step sees of ``DistributedDataParallel``: ``.module`` and
    ``no_sync()``. It counts forwards through itself, forwards of the inner module, and
    forwards made under ``no_sync``, so the check can say how the step used it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.wrapper_forwards = 0
        self.inner_forwards = 0
        self.synced_forwards = 0
        self._no_sync = False
        module.register_forward_pre_hook(self._count_inner)

    def _count_inner(self, *_: Any) -> None:
        self.inner_forwards += 1

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.wrapper_forwards += 1
        if not self._no_sync:
            self.synced_forwards += 1
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        before, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = before


@dataclass
class _Run:
    result: Any
    grads: dict[str, torch.Tensor]
    weights_changed: bool
    has_grad: bool
    bf16_outputs: bool = False


def _call(
    ctx: SmokeContext,
    batches: list[Batch],
    options: StepOptions,
    *,
    preset: dict[str, torch.Tensor] | None = None,
    model: nn.Module | None = None,
) -> _Run:
    model = model if model is not None else ctx.fresh_model(train=False)
    inner = model.module if isinstance(model, DDPLike) else model
    if preset is not None:
        for name, p in inner.named_parameters():
            if name in preset:  # trainable parameters only (frozen ones never get a grad)
                p.grad = preset[name].clone().to(p.device, p.dtype)
    before = {n: p.detach().clone() for n, p in inner.named_parameters()}
    dtypes: set[torch.dtype] = set()

    def record(_m: nn.Module, _i: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            dtypes.add(out.dtype)

    handles = [m.register_forward_hook(record) for m in inner.modules()]
    try:
        result = ctx.step(model, batches, options)
    finally:
        for h in handles:
            h.remove()
    changed = any(not torch.equal(before[n], p.detach()) for n, p in inner.named_parameters())
    has_grad = any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in inner.parameters())
    grads = collect_grads(inner, _scale(result))
    return _Run(result, grads, changed, has_grad, torch.bfloat16 in dtypes)


def _norm(grads: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))


def check_contract(ctx: SmokeContext) -> list[Clause]:
    """Run the step and judge each clause (see the module)."""
    tol = ctx.config.tolerances
    batches = ctx.batches(max(2, ctx.config.grad_accum))
    clauses: list[Clause] = []
    base = _call(ctx, batches, StepOptions())
    res = base.result
    loss = getattr(res, "loss", None)
    returns = isinstance(res, StepResult) or all(
        hasattr(res, a) for a in ("loss", "tokens", "grad_scale")
    )
    finite = isinstance(loss, int | float) and math.isfinite(loss)
    clauses.append(
        Clause(
            "returns",
            returns and finite,
            "returns a StepResult with a finite loss"
            if returns and finite
            else f"returned {type(res).__name__}"
            + ("" if returns else " instead of a StepResult(loss, tokens, grad_scale)")
            + ("" if finite or not returns else f" whose loss is {loss!r}"),
        )
    )
    clauses.append(
        Clause(
            "gradients",
            base.has_grad,
            "leaves the step's gradient in param.grad"
            if base.has_grad
            else "left no gradient in param.grad: call loss.backward() inside the step",
        )
    )
    clauses.append(
        Clause(
            "no optimizer",
            not base.weights_changed,
            "leaves the weights to the caller's optimizer"
            if not base.weights_changed
            else "changed the weights: the optimizer step (and scheduler) belong to the "
            "caller, after the step",
        )
    )
    if not (returns and base.has_grad):
        return clauses
    preset = {n: torch.full_like(g, 0.5) for n, g in base.grads.items()}
    acc = _call(ctx, batches, StepOptions(), preset=preset)
    added = {n: g - preset[n] / _scale(acc.result) for n, g in acc.grads.items() if n in preset}
    err = compare_grads(added, base.grads).rel_err
    clauses.append(
        Clause(
            "accumulates",
            err <= tol.fp32_rel_err,
            "adds to the gradients already in param.grad"
            if err <= tol.fp32_rel_err
            else "replaced the gradients already in param.grad (rel err "
            f"{err:.2g}): the caller zeroes them before the step; a zero_grad inside it "
            "loses the caller's accumulation",
        )
    )
    want = sum(target_tokens(b) for b in batches)
    tokens = getattr(res, "tokens", None)
    clauses.append(
        Clause(
            "tokens",
            tokens == want,
            f"reports the step's {want} target tokens"
            if tokens == want
            else f"reported tokens={tokens!r}, the step has {want} target tokens "
            "(labels[:, 1:] != -100 over its micro-batches)",
            hard=False,
        )
    )
    ref = _norm(base.grads)
    if "fp16" in ctx.config.precisions and torch.amp.is_autocast_available(ctx.device.type):
        half = _call(ctx, batches, StepOptions(precision="fp16", loss_scale=2.0**10))
        ratio = _norm(half.grads) / ref if ref else 1.0
        ok = 0.5 <= ratio <= 2.0 or not math.isfinite(ratio)  # overflow is S005's
        clauses.append(
            Clause(
                "grad_scale",
                ok,
                f"param.grad / grad_scale under fp16 matches fp32 (×{ratio:.3g})"
                if ok
                else f"under fp16 param.grad / grad_scale is ×{ratio:.3g} the fp32 gradient: "
                f"the reported grad_scale ({_scale(half.result):g}) is not the factor the "
                "step multiplied the loss by",
            )
        )
    if "bf16" in ctx.config.precisions and torch.amp.is_autocast_available(ctx.device.type):
        low = _call(ctx, batches, StepOptions(precision="bf16"))
        clauses.append(
            Clause(
                "precision",
                low.bf16_outputs,
                "computes under bf16 autocast when options.precision is bf16"
                if low.bf16_outputs
                else "no module computed in bf16 with options.precision='bf16': open "
                "torch.autocast(device_type, dtype) around the forward (sapper.smoke.step."
                "autocast)",
            )
        )
    wrapper = DDPLike(ctx.fresh_model(train=False))
    _call(ctx, batches, StepOptions(), model=wrapper)
    k = len(batches)
    through = wrapper.wrapper_forwards >= k
    last_synced = wrapper.synced_forwards >= 1
    detail = (
        f"calls the wrapped model (DDP) for its {k} micro-batches"
        if through
        else f"ran the forward through model.module ({wrapper.inner_forwards} forwards, "
        f"{wrapper.wrapper_forwards} through the wrapper): DDP only all-reduces gradients "
        "of forwards made through it; call model(...)"
    )
    if through and not last_synced:
        detail = (
            "ran every micro-batch under model.no_sync(), the last one too: the gradients "
            "are never all-reduced; leave the last micro-batch outside no_sync"
        )
    clauses.append(Clause("wrapper", through and last_synced, detail))
    if through and last_synced and wrapper.synced_forwards > 1:
        clauses.append(
            Clause(
                "no_sync",
                False,
                f"{wrapper.synced_forwards} of {k} micro-batches ran outside model.no_sync(): "
                "correct, but every one all-reduces; wrap all but the last in no_sync (a step "
                "that asks isinstance(model, DistributedDataParallel) sees sapper's stand-in "
                "here, not DDP; S007 runs the real one)",
                hard=False,
            )
        )
    return clauses


def _scale(result: Any) -> float:
    scale = getattr(result, "grad_scale", 1.0)
    return float(scale) if isinstance(scale, int | float) and scale > 0 else 1.0


def run(ctx: SmokeContext) -> list[Finding]:
    clauses = check_contract(ctx)
    broken = [c for c in clauses if not c.kept and c.hard]
    soft = [c for c in clauses if not c.kept and not c.hard]
    numbers: dict[str, Any] = dict(
        value=len(broken),
        threshold=0,
        clauses={c.name: {"kept": c.kept, "detail": c.detail, "hard": c.hard} for c in clauses},
        broken=[c.name for c in broken],
        warnings=[c.name for c in soft],
    )
    if broken:
        message = "the step breaks the TrainStep contract: " + "; ".join(
            f"[{c.name}] {c.detail}" for c in broken + soft
        )
        return [verdict(STEP_CONTRACT, False, message, **numbers)]
    kept = ", ".join(c.name for c in clauses if c.kept)
    message = f"the step keeps the TrainStep contract ({kept})"
    if soft:
        message += "; " + "; ".join(f"[{c.name}] {c.detail}" for c in soft)
    return [verdict(STEP_CONTRACT, True, message, warn=bool(soft), **numbers)]
