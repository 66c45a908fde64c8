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
from sapper.plan.readers.base import ConfigFormat, Sniff
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_plan_file"]


def read_plan_file(path: str | Path) -> PlanSource:
    """Read a YAML plan; the files it references are in ``refs``, for the caller to load
    first."""
    return _read(Sniff.of(path))


def _read(sniff: Sniff) -> PlanSource:
    path = sniff.path
    data = sniff.yaml
    if data is None and "yaml" in sniff.errors:
        raise sniff.errors["yaml"]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(
            "a plan file must be a mapping of sections",
            file=str(path),
            value=type(data).__name__,
            expected="keys such as model, precision, batch, parallel, hardware",
        )
    base = path.parent
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
    return PlanSource(name=str(path), data=_plain(data), refs=refs)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


#: A plan's own top-level keys, besides the Plan's fields.
_EXTRA_KEYS = frozenset({"deepspeed"})


def _recognise(sniff: Sniff) -> float:
    """A YAML mapping whose top-level keys are the Plan's sections. A plan with a typo in
    one section is still a plan (so its error names the typo); a mapping with no Plan
    section at all is not. An empty document is an (empty) plan."""
    doc = sniff.yaml
    if sniff.suffix in (".yaml", ".yml") and doc is None and "yaml" not in sniff.errors:
        return 0.5  # an empty document (or ``null``): an empty plan, which says so
    if not isinstance(doc, dict) or not doc:
        return 0.0
    from sapper.plan.schema import Plan

    known = set(Plan.model_fields) | _EXTRA_KEYS
    share = sum(str(k) in known for k in doc) / len(doc)
    return 0.3 + 0.6 * share if share else 0.0


FORMAT = ConfigFormat(
    name="sapper",
    title="a sapper plan (YAML)",
    looks_for="top-level sections such as model, precision, batch, parallel, hardware "
    "(docs/plan.md)",
    recognise=_recognise,
    read=_read,
)
