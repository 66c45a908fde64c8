"""The plan inputs of one invocation, and the Plan they describe.

Below the command line so that every caller builds its plan one way: ``sapper check``'s
options, and ``sapper run``'s launch command (its config files, the flags on its command
line, the launcher's process counts and the machine's GPU) become the same
:class:`PlanInputs` and go through the same readers (:func:`sapper.plan.load.load_plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.errors import InputError
from sapper.plan.flags import OPTION_FIELDS

if TYPE_CHECKING:
    from sapper.plan.load import LoadedPlan
    from sapper.plan.readers.base import Sniff

__all__ = ["PlanInputs", "Preset", "load_inputs", "loss_scaling"]


@dataclass(frozen=True)
class Preset:
    """A plan value a caller knows from outside the config files (``sapper run``: the
    launcher's ``--nproc-per-node``, the machine's GPU), with its origin in the user's
    words (``torchrun --nproc-per-node``, ``this machine: NVIDIA H100 80GB HBM3``)."""

    field: str
    value: Any
    origin: str


class PlanInputs:
    """The parsed plan options of one command invocation."""

    def __init__(
        self,
        plan: Path | None,
        model: Path | None,
        deepspeed: Path | None,
        values: dict[str, Any],
        configs: list[Path] | None = None,
        config_format: str | None = None,
        show_plan: bool = False,
        texts: list[Sniff] | None = None,
        presets: list[Preset] | None = None,
    ) -> None:
        self.plan, self.model, self.deepspeed, self.values = plan, model, deepspeed, values
        self.configs = configs or []
        self.config_format = config_format
        #: ``--show-plan``: print the plan as read, each value with its origin, first.
        self.show_plan = show_plan
        #: The command prints JSON (``--format json``): the plan goes into its document.
        self.as_json = False
        #: Config text that is no file of its own (a launch command line), read after
        #: ``configs`` by the same readers; its path names where relative paths start.
        self.texts = texts or []
        #: Values known from outside the files; read before the command-line options,
        #: after the files (a config's own process count is the same number or stale).
        self.presets = presets or []


def loss_scaling(text: str) -> dict[str, Any]:
    """``--loss-scale``: ``dynamic``, ``none``, or a static scale such as ``1024``."""
    word = text.strip().lower()
    if word in ("dynamic", "none"):
        return {"mode": word}
    try:
        scale = float(word)
    except ValueError:
        scale = math.nan
    if not math.isfinite(scale) or scale <= 0:
        raise InputError(
            "invalid value",
            file="command line",
            field="--loss-scale",
            value=text[:200],
            expected="dynamic, none, or a positive static scale such as 1024",
        )
    return {"mode": "static", "static_scale": scale}


def load_inputs(inputs: PlanInputs) -> LoadedPlan:
    """The Plan the inputs describe. The loaders (pydantic, YAML) are imported here, not
    at the top, so every command's ``--help`` and ``sapper rules`` start without them."""
    from sapper.plan.load import load_plan
    from sapper.plan.sources import PlanSource

    overrides = PlanSource(name="command line")
    for preset in inputs.presets:
        overrides.set(preset.field, preset.value, origin=preset.origin)
    for key, value in inputs.values.items():
        if value is None:
            continue
        origin = "--" + key.replace("_", "-")
        if key == "loss_scale":
            for sub, v in loss_scaling(value).items():
                overrides.set(f"{OPTION_FIELDS[key]}.{sub}", v, origin=origin)
        else:
            overrides.set(OPTION_FIELDS[key], value, origin=origin)
    return load_plan(
        inputs.plan,
        configs=[*inputs.configs, *inputs.texts],
        hf_config=inputs.model,
        deepspeed=inputs.deepspeed,
        overrides=overrides,
        config_format=inputs.config_format,
    )
