"""The training Plan and the loaders that build it from files users already have."""

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
