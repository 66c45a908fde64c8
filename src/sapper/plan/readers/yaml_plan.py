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


#: Top-level keys so common in other tools' YAML (a workflow's ``name``) that they say
#: nothing about a file being a plan.
_GENERIC_KEYS = frozenset({"name"})


def _section_fits(value: Any, fields: set[str]) -> bool:
    """A section's content is the Plan's: a mapping most of whose keys are that section's
    fields (a typo allowed), or a scalar where the Plan has one (``framework: megatron``).
    Another tool's ``model: {lr, backbone}`` is not."""
    if not isinstance(value, dict):
        return not fields
    if not value:
        return True
    from sapper.plan.readers.base import closest

    hits = sum(str(k) in fields or closest(str(k), fields) is not None for k in value)
    return hits * 2 > len(value)


def _recognise(sniff: Sniff) -> float:
    """A YAML mapping whose top-level keys are the Plan's sections, each holding that
    section's fields. A plan with a typo in a key is still a plan (so its error names the
    typo); a mapping whose sections hold another tool's keys (a Hydra ``model:``), or with
    no Plan section at all (a workflow, a compose file, a manifest), is not. An empty
    document is an (empty) plan."""
    doc = sniff.yaml
    if sniff.suffix in (".yaml", ".yml") and doc is None and "yaml" not in sniff.errors:
        return 0.5  # an empty document (or ``null``): an empty plan, which says so
    if not isinstance(doc, dict) or not doc:
        return 0.0
    from sapper.plan.readers.base import closest
    from sapper.plan.schema import Plan

    sections = {name: _fields(info.annotation) for name, info in Plan.model_fields.items()}
    sections["deepspeed"] = set()
    sections["model"] = sections["model"] | {"hf_config"}
    known = 0
    evidence = 0
    for key, value in doc.items():
        name = str(key)
        if name not in sections:
            typo = closest(name, sections, cutoff=0.8)
            if typo is None or typo in _GENERIC_KEYS:
                continue
            name = typo
        if sections[name] and not isinstance(value, dict):
            known += 1  # ``precision: bf16``: a plan's mistake, which its error names
            continue
        if not _section_fits(value, sections[name]):
            return 0.0  # a Plan section holding another tool's keys: not a plan
        known += 1
        evidence += name not in _GENERIC_KEYS
    if not evidence:
        return 0.0
    return 0.3 + 0.6 * known / len(doc)


def _fields(annotation: Any) -> set[str]:
    """The field names of the Plan section ``annotation`` is (empty for a scalar)."""
    from pydantic import BaseModel

    for ann in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return set(ann.model_fields)
    return set()


FORMAT = ConfigFormat(
    name="sapper",
    title="a sapper plan (YAML)",
    looks_for="top-level sections such as model, precision, batch, parallel, hardware "
    "(docs/plan.md)",
    recognise=_recognise,
    read=_read,
)
