"""The checklist of a launch command, before it runs: the plan ``sapper check`` would read
from the same files and flags, plus what the launcher and the machine say.

The plan goes through :func:`sapper.plan.inputs.load_inputs`, the one path ``sapper
check`` takes: the config files the command names, the command line itself as text for
the readers of Trainer and Megatron command lines (a ``Sniff`` rooted at the command's
working directory, so its relative paths resolve as the program's do), the DeepSpeed JSON
and the local model folder's ``config.json``. The launcher's process counts and the GPU
model of this machine come after the files, so they win over a stale count in a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.errors import InputError
from sapper.launch.command import Launch

if TYPE_CHECKING:
    from sapper.checks.engine import CheckReport
    from sapper.plan.inputs import PlanInputs
    from sapper.plan.load import LoadedPlan

__all__ = ["Given", "Preflight", "plan_inputs", "preflight"]

#: What the command-line text is called in origins and findings.
COMMAND_NAME = "launch command"
#: The checklist's step-cost prediction (its value: the job's tokens/s).
STEP_PREDICTION = "P116"


@dataclass
class Given:
    """What the user tells ``sapper run`` besides the command (``--gpu``, ``--model``,
    ``--config`` ...): read like ``sapper check``'s options, after everything else."""

    #: Plan option values keyed as :data:`sapper.plan.flags.OPTION_FIELDS`.
    values: dict[str, Any] = field(default_factory=dict)
    model: Path | None = None
    configs: list[Path] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.configs or self.model or any(
            v is not None for v in self.values.values()))


@dataclass
class Preflight:
    """The checklist of one launch, or why there is none."""

    loaded: LoadedPlan | None = None
    report: CheckReport | None = None
    #: Why no checklist ran: nothing to read, or a file that could not be read.
    skipped: str | None = None
    #: The files and texts the plan was read from, in the user's words.
    sources: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return self.report.errors if self.report is not None else 0

    def to_json(self) -> dict[str, Any] | None:
        """check's JSON (``sapper check --format json``), or None when none ran."""
        return self.report.to_json() if self.report is not None else None

    def predicted_tokens_per_s(self) -> float | None:
        """The step-cost model's tokens/s for the whole job, when the checklist made one."""
        if self.report is None:
            return None
        for f in self.report.findings:
            if f.code == STEP_PREDICTION and isinstance(f.value, (int, float)):
                return float(f.value)
        return None


def _text_config(launch: Launch, cwd: Path) -> Any:
    """The command line as a config text, when a reader recognises and reads it (a
    Trainer's or Megatron's flags); None otherwise."""
    from sapper.plan.readers.base import Sniff
    from sapper.plan.readers.registry import read_config

    if not launch.trains or "--" not in launch.text:
        return None
    try:
        # Read once here: flags a reader recognises but cannot read (a command line
        # whose Trainer flags are all the shell's) must not cost the config files.
        read_config(Sniff(cwd / COMMAND_NAME, launch.text))
    except InputError:
        return None
    return Sniff(cwd / COMMAND_NAME, launch.text)


def plan_inputs(
    launch: Launch,
    cwd: Path,
    gpu: str | None = None,
    gpu_origin: str = "this machine",
    given: Given | None = None,
) -> PlanInputs | None:
    """The plan inputs of a launch, or None when it names nothing sapper reads."""
    from sapper.plan.inputs import PlanInputs, Preset

    given = given or Given()
    text = _text_config(launch, cwd)
    if not launch.configs and text is None and launch.deepspeed is None and not given:
        return None
    presets: list[Preset] = []
    origins = launch.origins
    if launch.world_size is not None:
        presets.append(Preset("hardware.num_gpus", launch.world_size,
                              origins.get("world_size", launch.launcher)))
    if launch.nproc_per_node is not None and (launch.nnodes or 1) > 1:
        presets.append(Preset("hardware.gpus_per_node", launch.nproc_per_node,
                              origins.get("nproc_per_node", launch.launcher)))
    if launch.nnodes is not None:
        presets.append(Preset("hardware.nodes", launch.nnodes,
                              origins.get("nnodes", launch.launcher)))
    if gpu is not None:
        presets.append(Preset("hardware.gpu", gpu, gpu_origin))
    presets.extend(Preset(f, v, o) for f, v, o in launch.values)
    return PlanInputs(
        None,
        given.model or launch.model,
        launch.deepspeed,
        dict(given.values),
        configs=[*launch.configs, *given.configs],
        texts=[text] if text is not None else [],
        presets=presets,
    )


def preflight(
    launch: Launch,
    cwd: Path,
    gpu: str | None = None,
    gpu_origin: str = "this machine",
    given: Given | None = None,
) -> Preflight:
    """Read the launch's plan and run the checklist on it. A file that cannot be read is
    said (``skipped``), not raised: the program may still read it, and the run goes on."""
    from sapper.checks.engine import run_checklist
    from sapper.plan.inputs import load_inputs

    inputs = plan_inputs(launch, cwd, gpu, gpu_origin, given)
    if inputs is None:
        return Preflight(skipped="the command names no config or flags sapper reads")
    sources = [str(p) for p in inputs.configs] + [COMMAND_NAME for _ in inputs.texts]
    if inputs.deepspeed is not None:
        sources.insert(0, str(inputs.deepspeed))
    if inputs.model is not None:
        sources.insert(0, str(inputs.model))
    try:
        loaded = load_inputs(inputs)
    except InputError as exc:
        return Preflight(skipped=f"could not read the plan: {exc}", sources=sources)
    return Preflight(loaded, run_checklist(loaded), sources=sources)
