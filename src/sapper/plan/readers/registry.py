"""Which reader a config file needs, decided by its content.

Every reader module listed in :data:`READERS` exposes ``FORMAT`` (see
:mod:`sapper.plan.readers.base`). A file is read once, each reader scores it, and the most
confident reader above :data:`MIN_CONFIDENCE` reads it. A file no reader recognises is
refused in one line saying what it looks like (another tool's YAML, or the closest reader
and what it looked for), or with its syntax error when its name or first byte promised
JSON, YAML or TOML. Adding a format is one module and one line here.
"""

from __future__ import annotations

import importlib
from functools import cache
from pathlib import Path

from sapper.errors import InputError
from sapper.plan.readers.base import ConfigFormat, Sniff, refuse_pickle
from sapper.plan.readers.py_recipes import refuse_python_recipe
from sapper.plan.sources import PlanSource

__all__ = ["MIN_CONFIDENCE", "READERS", "detect_config", "formats", "read_config"]

#: Reader modules, each with a ``FORMAT``. Order breaks ties in confidence.
READERS: tuple[str, ...] = (
    "sapper.plan.readers.hf_config",
    "sapper.plan.readers.deepspeed",
    "sapper.plan.readers.accelerate",
    "sapper.plan.readers.axolotl",
    "sapper.plan.readers.training_args",
    "sapper.plan.readers.megatron",
    "sapper.plan.readers.yaml_plan",
    "sapper.plan.readers.nemo",
    "sapper.plan.readers.torchtitan",
    "sapper.plan.readers.torchtune",
    "sapper.plan.readers.litgpt",
    "sapper.plan.readers.llmfoundry",
    "sapper.plan.readers.olmo",
    "sapper.plan.readers.nanotron",
    "sapper.plan.readers.llamafactory",
    "sapper.plan.readers.trl",
)

#: Below this, a reader's "maybe" is not enough to read a file as its format.
MIN_CONFIDENCE = 0.3


@cache
def formats() -> tuple[ConfigFormat, ...]:
    """Every registered format (imported on first use: ``--help`` never pays for them)."""
    return tuple(importlib.import_module(name).FORMAT for name in READERS)


def find_format(name: str) -> ConfigFormat:
    for fmt in formats():
        if fmt.name == name:
            return fmt
    raise InputError(
        "unknown config format",
        field="--config-format",
        value=name,
        expected=" / ".join(f.name for f in formats()),
    )


def detect_config(sniff: Sniff) -> ConfigFormat:
    """The format of ``sniff``'s file; :class:`InputError` when none is confident."""
    recipe = refuse_python_recipe(sniff)  # OLMo-core, NeMo 2, Megatron-Bridge: code
    if recipe is not None:
        raise recipe
    scored = [(fmt.recognise(sniff), -i, fmt) for i, fmt in enumerate(formats())]
    best, _, fmt = max(scored, key=lambda t: (t[0], t[1]))
    if best >= MIN_CONFIDENCE:
        return fmt
    syntax = sniff.error()
    if syntax is not None:
        raise syntax
    first = next((line.strip() for line in sniff.text.splitlines() if line.strip()), "")
    if not first:
        raise InputError("the file is empty", file=sniff.name, expected="a launch config")
    kind = _foreign_kind(sniff.mapping)
    looks = f"it looks like {kind}" if kind else f"first line: {first[:60]!r}"
    if best > 0:
        closest = f"closest: {fmt.title}, which needs {fmt.looks_for}"
    else:
        closest = "no reader recognises it (sapper reads " + ", ".join(
            f.name for f in formats()
        ) + ")"
    raise InputError(
        f"not a config sapper can read ({looks}); {closest}",
        file=sniff.name,
        expected="a launch config of a format sapper reads (--config-format NAME forces one)",
    )


def _foreign_kind(doc: dict[str, object] | None) -> str | None:
    """What another tool's YAML is, in words, from its top-level keys (for the refusal)."""
    if not isinstance(doc, dict):
        return None
    keys = {str(k) for k in doc}
    if "jobs" in keys and ("on" in keys or "True" in keys):  # YAML 1.1 reads ``on`` as true
        return "a GitHub Actions workflow"
    if "apiVersion" in keys and "kind" in keys:
        return f"a Kubernetes manifest (kind {str(doc.get('kind'))[:40]})"
    if "services" in keys and keys <= {"version", "services", "volumes", "networks",
                                       "configs", "secrets", "name", "include"}:
        return "a Docker Compose file"
    if isinstance(doc.get("defaults"), list):
        return "a Hydra config of another tool"
    return None


def read_config(path: str | Path | Sniff, fmt: str | None = None) -> PlanSource:
    """One config file as a Plan source, in the format its content shows (or ``fmt``).
    A :class:`Sniff` is text already in hand (a launch command line), read the same way."""
    if isinstance(path, Sniff):
        sniff = path
    else:
        try:
            sniff = Sniff.of(path)
        except InputError as exc:
            raise (refuse_pickle(path) or exc) from None
    reader = find_format(fmt) if fmt else detect_config(sniff)
    src = reader.read(sniff)
    src.format = src.format or reader.name
    return src
