"""What ``Monitor(plan=...)`` accepts: a Plan, a loaded plan, or the files ``sapper check``
reads.

    Monitor(model, opt, plan="plan.yaml")                   # sapper's YAML plan
    Monitor(model, opt, plan="ds_config.json")              # a DeepSpeed config
    Monitor(model, opt, plan="config.json")                 # a Hugging Face config.json
    Monitor(model, opt, plan=["config.json", "ds.json"])    # several, merged as check does
    Monitor(model, opt, plan=sapper.load_plan("plan.yaml")) # a LoadedPlan (or its .plan)

Each file's format is read from its content by the same readers as ``sapper check``
(any launch config it reads: a Megatron script, a NeMo or Axolotl YAML ...). Every problem is a
:class:`~sapper.errors.InputError` that names the file, raised from the constructor,
before training starts; the loading itself is :func:`sapper.plan.load_plan`'s, so a plan
the monitor accepts is the plan ``sapper check`` checks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sapper.errors import InputError
from sapper.plan.schema import Plan

__all__ = ["PlanLike", "resolve_plan"]

#: The forms ``plan=`` takes.
PlanLike = Any  # Plan | LoadedPlan | str | os.PathLike | Sequence[str | os.PathLike] | None

def resolve_plan(plan: PlanLike) -> Plan | None:
    """The :class:`Plan` behind any accepted form; :class:`InputError` otherwise."""
    from sapper.plan.load import LoadedPlan

    if plan is None or isinstance(plan, Plan):
        return plan
    if isinstance(plan, LoadedPlan):
        return plan.plan
    if isinstance(plan, (str, os.PathLike)):
        return _load([Path(plan)])
    if isinstance(plan, Sequence) and plan and all(
        isinstance(p, (str, os.PathLike)) for p in plan
    ):
        return _load([Path(p) for p in plan])
    raise InputError(
        "not a plan",
        field="plan",
        value=type(plan).__name__,
        expected="a sapper Plan, a LoadedPlan (sapper.load_plan(...)), or the path of a "
        "plan YAML, a Hugging Face config.json or a DeepSpeed JSON (or a list of them)",
    )


def _load(paths: list[Path]) -> Plan:
    from sapper.plan.load import load_plan

    return load_plan(configs=paths).plan
