"""Check f: activations and gradients keep their scale across layers at initialisation.

One fp32 step of the user's step on the initial weights, dropout off. Hooks on every
transformer block (the model's longest ``ModuleList``) record the std over real tokens of
the residual stream entering and leaving it, and of the gradient flowing back into its
output; the parameters' gradient std is read per block after the backward.

Two numbers decide, both measured on healthy toys of many architectures and on the same
toys with a 10-50× too large init (docs/smoke.md):

- amplification, max over blocks of std(out) / std(in): a block whose output dwarfs its
  input (Pre-LN: the first block swamping the embeddings) adds activations that grow with
  depth; healthy toys stay below ~9 (sandwich norms), too large an init gives 20-600;
- gradient spread, max / min over blocks of the parameters' gradient std: gradients that
  shrink by orders of magnitude on the way back leave the first layers untrained.

The toy keeps the full model's init std while its width shrinks, and a fixed-std init acts
differently at another width (a layer's output std grows with std·sqrt(width)), so this
check speaks for the toy's scheme and its depth trend; read it with that in mind.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sapper.rules.model import Finding
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.grads import layer_of
from sapper.smoke.rules import INIT_HEALTH
from sapper.smoke.step import StepOptions
from sapper.smoke.toy import find_blocks

__all__ = ["layer_statistics", "run"]


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    value = kwargs.get("hidden_states")
    return value if isinstance(value, torch.Tensor) else None


def layer_statistics(ctx: SmokeContext) -> dict[str, list[Any]]:
    """Per block: input and output std, output-gradient std, parameter-gradient std."""
    model = ctx.fresh_model(train=False)
    batch = ctx.batches(1)[0]
    mask = batch["attention_mask"].bool()
    blocks = find_blocks(model)
    names = [n for n, _ in blocks]
    act: dict[str, float] = {}
    act_in: dict[str, float] = {}
    act_grad: dict[str, float] = {}

    def std(t: torch.Tensor | None) -> float | None:
        if t is None or t.dim() != 3 or t.shape[:2] != mask.shape:
            return None
        return float(t.detach()[mask.to(t.device)].float().std())

    def pre_hook(name: str):
        def record(_m: torch.nn.Module, args: Any, kwargs: Any) -> None:
            value = std(_hidden(args, kwargs))
            if value is not None:
                act_in[name] = value

        return record

    def hook(name: str):
        def record(_m: torch.nn.Module, _inp: Any, out: Any) -> None:
            t = _first_tensor(out)
            value = std(t)
            if t is None or value is None:
                return
            act[name] = value
            if t.requires_grad:
                t.register_hook(lambda g: act_grad.__setitem__(name, std(g)))

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in blocks]
    handles += [m.register_forward_pre_hook(pre_hook(n), with_kwargs=True) for n, m in blocks]
    try:
        res = ctx.step(model, [batch], StepOptions())
    finally:
        for h in handles:
            h.remove()
    per_block: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for pname, p in model.named_parameters():
        layer = layer_of(pname)
        if layer in per_block and p.grad is not None:
            per_block[layer].append(p.grad.detach().float().reshape(-1) / res.grad_scale)
    param_grad = [
        float(torch.cat(per_block[n]).std()) if per_block[n] else math.nan for n in names
    ]
    return {
        "layers": names,
        "input_std": [act_in.get(n, math.nan) for n in names],
        "activation_std": [act.get(n, math.nan) for n in names],
        "activation_grad_std": [act_grad.get(n, math.nan) for n in names],
        "param_grad_std": param_grad,
    }


def _amplification(inputs: list[float], outputs: list[float]) -> float:
    ratios = [o / i for i, o in zip(inputs, outputs, strict=True) if i > 0 and math.isfinite(o)]
    return max(ratios, default=1.0)


def _spread(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    if not finite:
        return math.inf
    return max(finite) / min(finite)


def run(ctx: SmokeContext) -> list[Finding]:
    tol = ctx.config.tolerances
    stats = layer_statistics(ctx)
    if len(stats["layers"]) < 2:
        return [
            verdict(
                INIT_HEALTH,
                True,
                "fewer than two repeated blocks found (no ModuleList of blocks): per-layer "
                "statistics need at least two",
                warn=True,
                **stats,
            )
        ]
    amplification = _amplification(stats["input_std"], stats["activation_std"])
    grad_spread = _spread(stats["param_grad_std"])
    nonfinite = any(
        not math.isfinite(v) for key in ("activation_std", "param_grad_std") for v in stats[key]
    )
    numbers: dict[str, Any] = dict(
        value=amplification,
        threshold=tol.init_amplification,
        amplification=amplification,
        param_grad_spread=grad_spread,
        grad_spread_threshold=tol.init_grad_spread,
        **stats,
    )
    problems = []
    if nonfinite:
        problems.append("non-finite activations or gradients at initialisation")
    if amplification > tol.init_amplification:
        problems.append(
            f"a block multiplies the std of the residual stream by {amplification:.3g} "
            f"(> {tol.init_amplification:g})"
        )
    if grad_spread > tol.init_grad_spread:
        problems.append(
            f"per-layer gradient std spans ×{grad_spread:.3g} (> {tol.init_grad_spread:g})"
        )
    acts = ", ".join(f"{v:.3g}" for v in stats["activation_std"])
    first_in = stats["input_std"][0]
    summary = (
        f"residual std {first_in:.3g} in, {acts} after each block (max ×{amplification:.3g} "
        f"per block); gradient std spread ×{grad_spread:.3g} across layers"
    )
    if problems:
        return [verdict(INIT_HEALTH, False, "; ".join(problems) + f" — {summary}", **numbers)]
    return [verdict(INIT_HEALTH, True, summary, **numbers)]
