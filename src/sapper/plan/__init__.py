"""The training Plan and the loaders that build it from files users already have.

The public names load lazily: the rule modules import :mod:`sapper.plan.schema` (and so
this package) whenever sapper lists its rules, which must not pay for the loaders (YAML,
Hugging Face and DeepSpeed readers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapper.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
