"""The derived numbers every report shows up front (nanoGPT-style), from one place.

The parameter counts are :mod:`sapper.model.params`' — the numbers ``memory`` and
``plan`` work with — so the checklist's summary cannot print another count than they do.
"""

from __future__ import annotations

from sapper.errors import InputError
from sapper.model.architecture import Architecture, architecture_from_plan
from sapper.model.params import active_params, total_params
from sapper.plan.schema import Plan

__all__ = ["derived", "plan_architecture"]


def plan_architecture(plan: Plan) -> Architecture | None:
    """The plan's architecture, or None without a model or with one that cannot be read
    (heads that do not divide the width: the checklist reports that itself)."""
    if plan.model is None:
        return None
    try:
        return architecture_from_plan(plan)
    except InputError:
        return None


def derived(plan: Plan) -> dict[str, object]:
    """Parameters (active ones for MoE), world size, DP, accumulation, batch, tokens."""
    arch = plan_architecture(plan)
    return {
        "parameters": total_params(arch) if arch else None,
        "active_parameters": active_params(arch) if arch and arch.moe else None,
        "world_size": plan.world_size,
        "dp": plan.dp_degree,
        "gradient_accumulation": plan.grad_accum,
        "global_batch": plan.global_batch,
        "tokens_per_step": plan.tokens_per_step,
    }
