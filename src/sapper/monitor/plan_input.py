"""What ``Monitor(plan=...)`` accepts: a Plan, a loaded plan, or the files ``sapper check``
reads.

    Monitor(model, opt, plan="plan.yaml")                   # sapper's YAML plan
    Monitor(model, opt, plan="ds_config.json")              # a DeepSpeed config
    Monitor(model, opt, plan="config.json")                 # a Hugging Face config.json
    Monitor(model, opt, plan=["config.json", "ds.json"])    # several, merged as check does
    Monitor(model, opt, plan=sapper.load_plan("plan.yaml")) # a LoadedPlan (or its .plan)

A JSON file is told apart by its keys (``model_type``/``architectures`` or the model's
widths: a Hugging Face config; DeepSpeed's documented top-level keys: a DeepSpeed
config); anything else is read as a YAML plan. Every problem is a
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

_HF_KEYS = frozenset({"model_type", "architectures"})
_HF_WIDTHS = frozenset({"hidden_size", "n_embd", "d_model"})
_HF_DEPTHS = frozenset({"num_hidden_layers", "n_layer", "num_layers"})


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

    chosen: dict[str, Path] = {}
    for path in paths:
        kind = file_kind(path)
        if kind in chosen:
            raise InputError(
                f"two {_WORDS[kind]} files given",
                file=f"{chosen[kind]}, {path}",
                expected="at most one plan YAML, one config.json and one DeepSpeed JSON",
            )
        chosen[kind] = path
    return load_plan(
        chosen.get("plan"), hf_config=chosen.get("hf"), deepspeed=chosen.get("deepspeed")
    ).plan


_WORDS = {"plan": "plan YAML", "hf": "Hugging Face config", "deepspeed": "DeepSpeed config"}


def file_kind(path: Path) -> str:
    """``"plan"``, ``"hf"`` or ``"deepspeed"``: which of ``sapper check``'s inputs the
    file is. Only JSON files are looked into (a plan is YAML)."""
    if path.suffix.lower() != ".json":
        return "plan"
    from sapper.plan.deepspeed_keys import SECTIONS
    from sapper.plan.sources import read_json_object

    raw = read_json_object(
        path,
        "a Hugging Face config.json or a DeepSpeed config",
        "model_type/hidden_size/... (config.json) or train_batch_size/zero_optimization/... "
        "(DeepSpeed)",
    )
    keys = set(raw)
    if keys & _HF_KEYS or (keys & _HF_WIDTHS and keys & _HF_DEPTHS):
        return "hf"
    if keys & (SECTIONS[""] or frozenset()):
        return "deepspeed"
    raise InputError(
        "neither a Hugging Face config.json nor a DeepSpeed config",
        file=str(path),
        value=", ".join(sorted(keys)[:8]) or "(no keys)",
        expected="model_type/hidden_size/... (config.json), train_batch_size/"
        "zero_optimization/... (DeepSpeed), or a sapper plan in YAML",
    )
