"""Check d: bf16/fp16 autocast gradients agree with fp32; activations fit in fp16.

Agreement (S005): the user's step runs the same micro-batch in fp32 and under each
low-precision autocast, dropout off, and the gradients are compared per layer (cosine and
relative error; thresholds per dtype, measured on correct toys). fp16 gradients come back
multiplied by the step's loss scale; when they overflow at that scale the check backs off
by 2× like ``GradScaler`` (each backoff is a skipped step in a real run) and reports the
scale that worked.

Headroom (S006): forward hooks on every module record the largest |output| of an fp32
forward — the value fp16 would have to hold — against fp16's maximum 65504; an fp16
autocast forward then names the first module whose output is no longer finite. When every
module fits, the user's whole step runs under fp16 autocast at loss scale 1 through
:mod:`sapper.smoke.trace`: the loss computation outside the model (the user's own softmax,
``exp``, sums) must stay finite and its fp16 values below 65504.

When low-precision gradients are not finite (S005), the same trace says where the first
non-finite value appeared — a module's forward, the loss, or only the backward — so the
message blames the loss scale only when the forward and the loss were finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from sapper.rules.model import Finding
from sapper.smoke.batches import Batch
from sapper.smoke.context import SmokeContext, Tolerances, verdict
from sapper.smoke.grads import GradComparison, collect_grads, compare_grads
from sapper.smoke.rules import FP16_HEADROOM, PRECISION_AGREEMENT
from sapper.smoke.step import Precision, StepOptions, autocast, logits_of
from sapper.smoke.trace import StepTrace, trace_step

__all__ = ["FP16_MAX", "activation_maxima", "run"]

FP16_MAX = 65504.0
_MAX_BACKOFFS = 24


def _tensors(out: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        if out.is_floating_point():
            yield out
    elif depth < 2 and isinstance(out, dict):
        for v in out.values():
            yield from _tensors(v, depth + 1)
    elif depth < 2 and isinstance(out, tuple | list):
        for v in out:
            yield from _tensors(v, depth + 1)


def activation_maxima(
    model: nn.Module, batch: Batch, device: torch.device, precision: Precision = "fp32"
) -> dict[str, float]:
    """Largest |output| of every module in one forward (``inf``/``nan`` kept as such)."""
    maxima: dict[str, float] = {}
    order: list[str] = []

    def hook(name: str):
        def record(_m: nn.Module, _inp: Any, out: Any) -> None:
            for t in _tensors(out):
                t = t.detach()
                value = float(t.abs().max()) if t.numel() else 0.0
                if not torch.isfinite(t).all():
                    value = math.inf
                if name not in maxima:
                    order.append(name)
                maxima[name] = max(maxima.get(name, 0.0), value)

        return record

    handles = [m.register_forward_hook(hook(n or "<model>")) for n, m in model.named_modules()]
    try:
        with torch.no_grad(), autocast(device, precision):
            logits_of(model, {k: v.to(device) for k, v in batch.items()})
    finally:
        for h in handles:
            h.remove()
    return {n: maxima[n] for n in order}


def _low_precision_grads(
    ctx: SmokeContext, batch: Batch, precision: Precision
) -> tuple[dict[str, torch.Tensor], float, int]:
    """Gradients under autocast (unscaled), the loss scale that worked, and backoffs."""
    scale: float | None = None
    for backoff in range(_MAX_BACKOFFS + 1):
        model = ctx.fresh_model(train=False)
        res = ctx.step(model, [batch], StepOptions(precision=precision, loss_scale=scale))
        grads = collect_grads(model, res.grad_scale)
        finite = all(bool(torch.isfinite(g).all()) for g in grads.values())
        if finite or precision != "fp16" or not math.isfinite(res.loss):
            return grads, res.grad_scale, backoff
        scale = res.grad_scale / 2.0
        if scale < 1.0:
            break
    return grads, res.grad_scale, _MAX_BACKOFFS


def _limits(tol: Tolerances, precision: Precision) -> tuple[float, float]:
    if precision == "bf16":
        return tol.bf16_min_cosine, tol.bf16_max_rel_err
    return tol.fp16_min_cosine, tol.fp16_max_rel_err


def _flushed(test: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """Share of gradient elements that are zero in low precision but not in fp32."""
    lost = total = 0
    for name, r in ref.items():
        nonzero = r != 0
        total += int(nonzero.sum())
        lost += int((nonzero & (test[name] == 0)).sum())
    return lost / total if total else 0.0


def _agreement(
    ctx: SmokeContext, precision: Precision, cmp: GradComparison, extra: dict[str, Any]
) -> Finding:
    min_cos, max_rel = _limits(ctx.config.tolerances, precision)
    worst = cmp.worst
    numbers = dict(
        value=cmp.min_cosine,
        threshold=min_cos,
        precision=precision,
        cosine=cmp.cosine,
        rel_err=cmp.rel_err,
        min_layer_cosine=cmp.min_cosine,
        max_layer_rel_err=cmp.max_rel_err,
        max_rel_err_allowed=max_rel,
        worst_layer=worst.layer if worst else None,
        layers=cmp.table(),
        **extra,
    )
    where = f"worst layer {worst.layer}" if worst else "no layers"
    if not cmp.finite:
        bad = [d.layer for d in cmp.layers if not d.finite]
        origin: StepTrace | None = extra.pop("origin", None)
        grads = f"{precision} gradients are not finite in {len(bad)} layer(s) (first: {bad[0]})"
        fix = None
        if origin is None or origin.phase in (None, "backward"):
            message = f"{grads} even at loss scale {extra.get('loss_scale', 1):g}"
            if origin is not None:
                message += "; the forward and the loss are finite: the backward overflows"
        elif origin.phase == "forward":
            message = (
                f"{grads}: the first non-finite value appears in {origin.where()}, before any "
                "loss scaling — an activation overflows (see S006)"
            )
            fix = (
                f"keep {origin.module} in fp32 (or train in bf16), or rescale it (init, a norm "
                "before it); a loss scale cannot help with a forward overflow"
            )
        else:
            message = (
                f"{grads}: the first non-finite value appears in {origin.where()}: the loss "
                f"is computed in {precision}, where it overflows; no loss scale fixes that"
            )
            fix = (
                "compute the loss in fp32: logits.float() before the softmax, exp or sum "
                "(torch.nn.functional.cross_entropy on fp32 logits), outside autocast"
            )
        numbers.update(
            first_nonfinite_phase=origin.phase if origin else None,
            first_nonfinite_module=origin.module if origin else None,
            first_nonfinite_op=origin.op if origin else None,
        )
        return verdict(PRECISION_AGREEMENT, False, message, fix=fix, **numbers)
    passed = cmp.min_cosine >= min_cos and cmp.max_rel_err <= max_rel
    summary = (
        f"{precision} vs fp32 gradients: min layer cosine {cmp.min_cosine:.5f} "
        f"(≥ {min_cos}), max layer rel err {cmp.max_rel_err:.3g} (≤ {max_rel}), {where}"
    )
    if extra.get("backoffs"):
        summary += f"; fp16 overflowed until the loss scale backed off to {extra['loss_scale']:g}"
    return verdict(PRECISION_AGREEMENT, passed, summary, **numbers)


def _headroom(ctx: SmokeContext, batch: Batch) -> Finding:
    tol = ctx.config.tolerances
    maxima = activation_maxima(ctx.fresh_model(train=False), batch, ctx.device)
    top = sorted(maxima.items(), key=lambda kv: -kv[1])[:5]
    largest_name, largest = top[0] if top else ("<none>", 0.0)
    first_bad = None
    loss: StepTrace | None = None
    if "fp16" in ctx.config.precisions:
        fp16 = activation_maxima(ctx.fresh_model(train=False), batch, ctx.device, "fp16")
        first_bad = next((n for n, v in fp16.items() if not math.isfinite(v)), None)
        if first_bad is None:  # the model's outputs fit: does the loss computation?
            loss = trace_step(ctx.fresh_model(train=False), ctx.step, [batch], "fp16", 1.0)
    loss_max = loss.loss_max_low if loss else 0.0
    loss_overflow = loss is not None and (loss.phase == "loss" or loss_max >= FP16_MAX)
    numbers = dict(
        value=largest,
        threshold=FP16_MAX,
        headroom=FP16_MAX / largest if largest > 0 else math.inf,
        largest_module=largest_name,
        top_modules=[{"module": n, "max_abs": v} for n, v in top],
        first_nonfinite_in_fp16=first_bad,
        loss_fp16_max_abs=loss_max,
        loss_fp16_max_op=loss.loss_max_op if loss else None,
        loss_first_nonfinite_op=loss.op if loss and loss.phase == "loss" else None,
    )
    if loss_overflow and largest < FP16_MAX:
        assert loss is not None
        what = (
            f"the first non-finite value appears in {loss.where()}"
            if loss.phase == "loss"
            else f"its fp16 values reach {loss_max:.4g} ({loss.loss_max_op})"
        )
        return verdict(
            FP16_HEADROOM,
            False,
            f"the loss computation overflows fp16 (loss scale 1): {what}; the model's "
            f"activations fit (largest {largest:.4g} in {largest_name})",
            fix="compute the loss in fp32: logits.float() before any softmax, exp or sum, "
            "or call torch.nn.functional.cross_entropy on fp32 logits",
            **numbers,
        )
    if largest >= FP16_MAX or first_bad is not None:
        where = f"; under fp16 autocast the first non-finite output is {first_bad}" if (
            first_bad
        ) else ""
        return verdict(
            FP16_HEADROOM,
            False,
            f"largest activation {largest:.4g} in {largest_name} exceeds fp16's max "
            f"{FP16_MAX:g}{where}",
            **numbers,
        )
    headroom = FP16_MAX / largest if largest > 0 else math.inf
    return verdict(
        FP16_HEADROOM,
        True,
        f"largest activation {largest:.4g} in {largest_name}: {headroom:.3g}× below fp16's "
        f"max {FP16_MAX:g}"
        + (" — little room for the growth of a larger model" if (
            headroom < tol.fp16_headroom_warn
        ) else ""),
        warn=headroom < tol.fp16_headroom_warn,
        **numbers,
    )


def run(ctx: SmokeContext) -> list[Finding]:
    batch = ctx.batches(1)[0]
    model = ctx.fresh_model(train=False)
    res = ctx.step(model, [batch], StepOptions())
    ref = collect_grads(model, res.grad_scale)
    findings = []
    for precision in ctx.config.precisions:
        if precision == "fp32":
            continue
        if not torch.amp.is_autocast_available(ctx.device.type):
            continue
        test, scale, backoffs = _low_precision_grads(ctx, batch, precision)
        extra: dict[str, Any] = {"flushed_to_zero": _flushed(test, ref)}
        if precision == "fp16":
            extra.update(loss_scale=scale, backoffs=backoffs)
        if not all(bool(torch.isfinite(g).all()) for g in test.values()):
            model = ctx.fresh_model(train=False)
            extra["origin"] = trace_step(
                model, ctx.step, [batch], precision, scale if precision == "fp16" else None
            )
        findings.append(_agreement(ctx, precision, compare_grads(test, ref), extra))
    findings.append(_headroom(ctx, batch))
    return findings
