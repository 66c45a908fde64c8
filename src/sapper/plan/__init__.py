"""The training Plan and the loaders that build it from files users already have.

The public names load lazily: the rule modules import :mod:`sapper.plan.schema` (and so
this package) whenever sapper lists its rules, which must not pay for the loaders (YAML,
Hugging Face and DeepSpeed readers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sapper.plan.hardware import GPUS, GpuSpec, find_gpu
    from sapper.plan.load import LoadedPlan, build_plan, load_plan
    from sapper.plan.schema import Plan
    from sapper.plan.sources import PlanSource

__all__ = [
    "GPUS",
    "GpuSpec",
    "LoadedPlan",
    "Plan",
    "PlanSource",
    "build_plan",
    "find_gpu",
    "load_plan",
]

_HOME = {
    "GPUS": "hardware",
    "GpuSpec": "hardware",
    "find_gpu": "hardware",
    "LoadedPlan": "load",
    "build_plan": "load",
    "load_plan": "load",
    "Plan": "schema",
    "PlanSource": "sources",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'sapper.plan' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sapper.plan.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
