"""sapper's native plan file: YAML in the Plan's own shape (documented in docs/plan.md).

A plan file may point at the files users already have, resolved relative to the plan:
``model: {hf_config: path/to/config.json}`` and ``deepspeed: path/to/ds.json``; the keys
given next to them override what those files say. ``data.path`` is resolved the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sapper.errors import InputError
from sapper.plan.sources import PlanSource, read_yaml_file

__all__ = ["read_plan_file"]


def read_plan_file(path: str | Path) -> tuple[PlanSource, dict[str, Path]]:
    """Read a YAML plan. Returns the source and the referenced files
    (``hf_config``/``deepspeed``), so the caller can load those first."""
    data = read_yaml_file(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(
            "a plan file must be a mapping of sections",
            file=str(path),
            value=type(data).__name__,
            expected="keys such as model, precision, batch, parallel, hardware",
        )
    base = Path(path).parent
    refs: dict[str, Path] = {}
    model = data.get("model")
    if isinstance(model, dict) and "hf_config" in model:
        model = dict(model)
        refs["hf_config"] = base / str(model.pop("hf_config"))
        data = {**data, "model": model}
        if not model:
            data.pop("model")
    if "deepspeed" in data:
        data = dict(data)
        refs["deepspeed"] = base / str(data.pop("deepspeed"))
    dataset = data.get("data")
    if isinstance(dataset, dict) and isinstance(dataset.get("path"), str):
        # Like hf_config and deepspeed, a dataset path is relative to the plan file.
        resolved = os.path.normpath(base / Path(dataset["path"]).expanduser())
        data = {**data, "data": {**dataset, "path": resolved}}
    return PlanSource(name=str(path), data=_plain(data)), refs


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
