"""Merge plan sources into one validated :class:`Plan`.

Order (later wins): YAML plan file < HF ``config.json`` < DeepSpeed JSON < command line,
except that keys written in the YAML plan itself override the files it references.
A validation error becomes one :class:`InputError` that names the source file, the key
in that file (and the Plan field it maps to), the bad value and what was expected.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sapper.errors import InputError
from sapper.plan.schema import Plan, bounds_text, field_info
from sapper.plan.sources import PlanSource, leaves
from sapper.rules.model import Finding

if TYPE_CHECKING:
    from sapper.plan.readers.base import Sniff

__all__ = ["LoadedPlan", "build_plan", "load_plan"]


class LoadedPlan:
    """A validated plan plus what loading found about its sources."""

    def __init__(
        self,
        plan: Plan,
        findings: list[Finding],
        sources: list[str],
        origins: dict[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self.findings = findings
        self.sources = sources
        #: Dotted Plan field -> where its value came from, in the user's words
        #: (``ds.json: train_micro_batch_size_per_gpu``, ``--gpus``, ``derived: ...``).
        self.origins = origins or {}


def _origin_text(src: PlanSource, leaf: str) -> str:
    """Where ``src`` got ``leaf``: its file and key (``--flag`` alone on the command line)."""
    probe, key = leaf, None
    while probe and key is None:
        key = src.origin.get(probe)
        probe = probe.rpartition(".")[0]
    if src.name == "command line":
        return key or "command line"
    return f"{Path(src.name).name}: {key or leaf}"


def _is_set(tree: dict[str, Any], path: str) -> bool:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return node is not None


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _owner(path: str, owners: dict[str, PlanSource]) -> tuple[PlanSource | None, str]:
    """The source that supplied ``path`` (or the nearest enclosing/contained field)."""
    probe = path
    while probe:
        if probe in owners:
            return owners[probe], probe
        probe = probe.rpartition(".")[0]
    for leaf, src in owners.items():
        if leaf.startswith(path + "."):
            return src, path
    # A missing field (rope_scaling.type): the source that wrote its section.
    probe = path.rpartition(".")[0]
    while probe:
        for leaf, src in owners.items():
            if leaf.startswith(probe + "."):
                return src, path
        probe = probe.rpartition(".")[0]
    return None, path


def _expected(err: dict[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return "one of the documented fields (see docs/plan.md)"
    if kind == "missing":
        return "a value"
    if "expected" in ctx:
        return str(ctx["expected"])
    if any(bound in ctx for bound in ("gt", "ge", "lt", "le")):
        # The whole range, not only the side that was crossed.
        info = field_info(tuple(err.get("loc", ())))
        words = bounds_text(info) if info is not None else ""
        if not words:
            signs = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))
            words = ", ".join(f"{sign} {ctx[b]}" for b, sign in signs if b in ctx)
        return f"a number {words}"
    return (
        err.get("msg", "a valid value")
        .removeprefix("Input should be ")
        .removeprefix("Value error, ")
    )


#: Model fields without which the Plan has no model.
_MODEL_REQUIRED = ("hidden_size", "num_layers", "num_heads", "vocab_size")


def build_plan(sources: Sequence[PlanSource]) -> LoadedPlan:
    merged: dict[str, Any] = {}
    owners: dict[str, PlanSource] = {}
    findings: list[Finding] = []
    unresolved: list[str] = []
    origins: dict[str, str] = {}
    for src in sources:
        merged = _deep_merge(merged, src.data)
        for leaf in leaves(src.data):
            owners[leaf] = src
            origins = {k: v for k, v in origins.items() if not k.startswith(leaf + ".")}
            origins[leaf] = _origin_text(src, leaf)
        findings.extend(src.findings)
        # A later source that sets the field resolves it (e.g. --micro-batch over "auto").
        unresolved = [u for u in unresolved if u not in leaves(src.data)]
        unresolved.extend(u for u in src.unresolved if u not in unresolved)
    # A value any source gives resolves the field, whatever the order: a launch config
    # naming its model by hub id, or not knowing the vocabulary, is completed by the
    # --model config.json read before it.
    unresolved = [u for u in unresolved if not _is_set(merged, u)]
    if unresolved:
        merged["unresolved"] = unresolved
    model = merged.get("model")
    if isinstance(model, dict) and any(
        f"model.{name}" in unresolved and name not in model for name in _MODEL_REQUIRED
    ):
        # A launch config gives the shape but not, say, the vocabulary (a NeMo YAML, a
        # Megatron script): the model is unknown, not an error, unless a later source
        # (--model config.json) completed it.
        merged.pop("model")
    try:
        plan = Plan.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = ".".join(str(p) for p in err["loc"])
        src, owned = _owner(path, owners)
        field = path
        if src is not None and owned in src.origin:
            field = f"{src.origin[owned]} (plan field {path})"
        value = err.get("input")
        has_value = err.get("type") != "missing"
        problem = "unknown field" if err.get("type") == "extra_forbidden" else "invalid value"
        if err.get("type") == "missing":
            problem = "missing value"
        more = len(exc.errors()) - 1
        if more:
            problem += f" (and {more} more problem{'s' if more > 1 else ''})"
        raise InputError(
            problem,
            file=src.name if src else None,
            field=field,
            value=value if has_value else None,
            has_value=has_value and not isinstance(value, dict),
            expected=_expected(err),
        ) from None
    _stages_hold_layers(plan, owners)
    if not (plan.model_fields_set - {"name", "unresolved"}):
        names = ", ".join(s.name for s in sources)
        raise InputError(
            "nothing to check: no model, hardware, batch, precision or layout values",
            file=names,
            expected="a plan with at least one section (see docs/plan.md), --model "
            "config.json, --deepspeed ds.json or plan options",
        )
    from sapper.plan.frameworks import resolve

    before = leaves(plan.model_dump(mode="json"))
    plan, resolved = resolve(plan)
    findings.extend(resolved)
    for leaf, value in leaves(plan.model_dump(mode="json")).items():
        if before.get(leaf, value) != value or leaf not in before:
            origins[leaf] = f"derived: what {plan.framework} computes from the other values"
    return LoadedPlan(plan, findings, [s.name for s in sources], origins)


def _stages_hold_layers(plan: Plan, owners: dict[str, PlanSource]) -> None:
    """More pipeline stages than the model has layers is no layout any framework runs (a
    stage would hold no layer): the degree is out of its range, an input error naming
    where it came from. Declared first/last stage sizes are judged by the layout check
    (P107) instead."""
    model, par = plan.model, plan.parallel
    if model is None or par.pp <= model.num_layers:
        return
    if par.first_stage_layers is not None or par.last_stage_layers is not None:
        return
    src, _ = _owner("parallel.pp", owners)
    field = "parallel.pp"
    if src is not None and field in src.origin:
        field = f"{src.origin[field]} (plan field parallel.pp)"
    layers_src, _ = _owner("model.num_layers", owners)
    layers_from = f" of {layers_src.name}" if layers_src is not None else ""
    raise InputError(
        "more pipeline stages than the model has layers: a stage would hold no layer",
        file=src.name if src else None,
        field=field,
        value=par.pp,
        expected=f"a pipeline degree from 1 to num_layers ({model.num_layers}{layers_from})",
    )


def _identity(path: str | Path) -> Path:
    """The file a path names, for telling whether two paths are one file: the path with
    its links followed, or as written where they cannot be (a link that points to
    itself, which Python reports as RuntimeError; reading the file then says why)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return Path(os.path.abspath(path))


#: A reference a config makes (``refs`` key) -> the format that reads it.
_REF_FORMATS = {"hf_config": "hf", "deepspeed": "deepspeed"}


def load_plan(
    plan_file: str | Path | None = None,
    *,
    configs: Sequence[str | Path | Sniff] = (),
    hf_config: str | Path | None = None,
    deepspeed: str | Path | None = None,
    overrides: PlanSource | None = None,
    config_format: str | None = None,
) -> LoadedPlan:
    """Load a plan from any combination of config files of any format sapper reads (a
    sapper plan, a Megatron launch script, a NeMo or Axolotl YAML, ...; the format is
    read from the content unless ``config_format`` names it), an HF ``config.json``, a
    DeepSpeed JSON and command-line overrides.

    Later sources win: ``hf_config`` < ``deepspeed`` < each config file in order < the
    command line. A file a config references (a plan's ``hf_config``, a Trainer's
    ``deepspeed``) is read just before it, so the config's own keys win over it, unless
    the same kind of file was given explicitly."""
    from sapper.plan.readers.registry import read_config

    sources: list[PlanSource] = []
    given = {"hf_config": hf_config, "deepspeed": deepspeed}
    read: set[Path] = set()

    def add(path: str | Path | Sniff, fmt: str | None) -> PlanSource:
        src = read_config(path, fmt)
        for kind, ref in src.refs.items():
            if given.get(kind) is None and _identity(ref) not in read:
                read.add(_identity(ref))
                sources.append(read_config(ref, _REF_FORMATS.get(kind)))
        sources.append(src)
        return src

    for kind, path in given.items():
        if path is not None:
            read.add(_identity(path))
            add(path, _REF_FORMATS[kind])
    files = [plan_file] if plan_file is not None else []
    for path in [*files, *configs]:
        add(path, config_format)
    if overrides is not None and overrides.data:
        sources.append(overrides)
    if not sources:
        raise InputError(
            "nothing to check",
            expected="a config file (--config), --model config.json, --deepspeed ds.json "
            "or plan options",
        )
    return build_plan(sources)
