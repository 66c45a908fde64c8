"""A partial plan read from one place (a file or the command line), before merging.

Each loader turns what users already have into a :class:`PlanSource`: a nested dict in
the Plan's own shape, plus findings about the source itself (unknown keys, ``"auto"``
values). :func:`sapper.plan.load.build_plan` merges sources in order, later ones winning,
and remembers which source supplied each field so a validation error can name the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sapper.errors import InputError
from sapper.rules.model import Finding

__all__ = ["PlanSource", "read_json_file", "read_json_object", "read_yaml_file", "set_path"]


@dataclass
class PlanSource:
    """Values for the Plan from one place."""

    name: str
    data: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    #: Plan field path -> the key in the source file that supplied it (for messages).
    origin: dict[str, str] = field(default_factory=dict)

    def set(self, path: str, value: Any, origin: str | None = None) -> None:
        """Set a dotted Plan field path (``precision.loss_scaling.mode``)."""
        set_path(self.data, path, value)
        if origin:
            self.origin[path] = origin


def set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    node = tree
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _read_text(path: str | Path) -> str:
    p = Path(path)
    if not p.exists():
        raise InputError("file not found", file=str(path))
    if p.is_dir():
        raise InputError("is a folder, not a file", file=str(path))
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file ({exc})", file=str(path)) from None


def read_yaml_file(path: str | Path) -> Any:
    """Safe-load YAML; syntax errors name the line and column."""
    text = _read_text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"malformed YAML at {where}: {problem}", file=str(path)) from None


def read_json_file(path: str | Path) -> Any:
    """Load JSON; syntax errors name the line and column."""
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", file=str(path)
        ) from None


def read_json_object(path: str | Path, what: str, expected: str) -> dict[str, Any]:
    """Load a JSON file that must hold one object (a config), else an InputError saying
    ``what`` it should be and ``expected`` keys."""
    raw = read_json_file(path)
    if not isinstance(raw, dict):
        raise InputError(
            f"{what} must be a JSON object",
            file=str(path),
            value=type(raw).__name__,
            expected=expected,
        )
    return raw
