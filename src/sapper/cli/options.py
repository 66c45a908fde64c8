"""Plan options shared by every command that reads a plan (check, memory, plan ...).

:class:`PlanInputs` and the reading itself live in :mod:`sapper.plan.inputs` (``sapper
run`` builds its plan there too); they are re-exported here for the commands.

Each option maps to one Plan field, so ``sapper check --model config.json --deepspeed
ds.json --gpus 64 --gpu A100-80GB --seq-len 4096`` needs no YAML at all.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sapper.plan.flags import OPTION_FIELDS
from sapper.plan.inputs import PlanInputs, load_inputs

if TYPE_CHECKING:
    from sapper.plan.load import LoadedPlan

__all__ = [
    "PlanInputs",
    "load_from_options",
    "show_plan",
    "stop_on_layout_errors",
    "with_plan_options",
]



def load_from_options(inputs: PlanInputs) -> LoadedPlan:
    """The Plan the options describe (:func:`sapper.plan.inputs.load_inputs`), printed
    first with its origins under ``--show-plan``."""
    loaded = load_inputs(inputs)
    if inputs.show_plan:
        show_plan(loaded, inputs.as_json)
    return loaded


PlanArg = Annotated[
    Path | None,
    typer.Argument(
        help="A config file in any format sapper reads (as --config).", show_default=False
    ),
]
ConfigOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--config",
        "-c",
        metavar="FILE",
        help="A launch config, its format read from its content: a sapper plan, a Megatron-LM "
        "script or argument dump, a NeMo, accelerate or Axolotl YAML, a torchtitan TOML, HF "
        "TrainingArguments (JSON or command line), a DeepSpeed JSON or an HF config.json. "
        "Repeatable; later files win.",
        show_default=False,
    ),
]
ConfigFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--config-format",
        metavar="FORMAT",
        help="Read every config file as this format instead of detecting it from its "
        "content (sapper, megatron, nemo, axolotl, llamafactory ...; an unknown name "
        "lists them all).",
        show_default=False,
    ),
]
ShowPlanOpt = Annotated[
    bool,
    typer.Option(
        "--show-plan",
        help="First print the plan as read: each value with the file and key it came "
        "from (or --flag, or how sapper derived it), and what is still unknown and why.",
    ),
]
ModelOpt = Annotated[
    Path | None,
    typer.Option(
        "--model", "-m", help="Hugging Face config.json of the model.", show_default=False
    ),
]
DeepSpeedOpt = Annotated[
    Path | None,
    typer.Option("--deepspeed", "--ds", help="DeepSpeed JSON config.", show_default=False),
]
GpusOpt = Annotated[int | None, typer.Option("--gpus", help="GPUs in the job.", show_default=False)]
GpnOpt = Annotated[
    int | None, typer.Option("--gpus-per-node", help="GPUs per node.", show_default=False)
]
NodesOpt = Annotated[int | None, typer.Option("--nodes", help="Nodes.", show_default=False)]
GpuOpt = Annotated[
    str | None, typer.Option("--gpu", help="GPU model, e.g. A100-80GB, H100.", show_default=False)
]
SeqOpt = Annotated[
    int | None, typer.Option("--seq-len", help="Tokens per sequence.", show_default=False)
]
MicroOpt = Annotated[
    int | None, typer.Option("--micro-batch", help="Sequences per GPU.", show_default=False)
]
GaOpt = Annotated[
    int | None,
    typer.Option("--grad-accum", help="Gradient accumulation steps.", show_default=False),
]
GlobalOpt = Annotated[
    int | None, typer.Option("--global-batch", help="Sequences per step.", show_default=False)
]
TpOpt = Annotated[
    int | None, typer.Option("--tp", help="Tensor-parallel degree.", show_default=False)
]
PpOpt = Annotated[
    int | None, typer.Option("--pp", help="Pipeline-parallel degree.", show_default=False)
]
DpOpt = Annotated[
    int | None, typer.Option("--dp", help="Data-parallel degree (-1 = infer).", show_default=False)
]
CpOpt = Annotated[
    int | None, typer.Option("--cp", help="Context-parallel degree.", show_default=False)
]
EpOpt = Annotated[
    int | None, typer.Option("--ep", help="Expert-parallel degree.", show_default=False)
]
ZeroOpt = Annotated[int | None, typer.Option("--zero", help="ZeRO stage 0-3.", show_default=False)]
CkptOpt = Annotated[
    str | None,
    typer.Option(
        "--checkpointing", help="Activation checkpointing: none/selective/full.", show_default=False
    ),
]
DtypeOpt = Annotated[
    str | None, typer.Option("--dtype", help="fp32 / bf16 / fp16 / fp8.", show_default=False)
]
LossScaleOpt = Annotated[
    str | None,
    typer.Option(
        "--loss-scale",
        help="fp16 loss scaling: dynamic, none, or a static scale (e.g. 1024).",
        show_default=False,
    ),
]
LrOpt = Annotated[
    float | None, typer.Option("--lr", help="Peak learning rate.", show_default=False)
]
WarmupOpt = Annotated[
    int | None, typer.Option("--warmup", help="Warmup steps.", show_default=False)
]
OptimizerImplOpt = Annotated[
    str | None,
    typer.Option(
        "--optimizer-impl",
        help="How the optimizer step runs: for_loop / foreach / fused / deepspeed_fused / "
        "deepspeed_cpu / apex / bnb_8bit (default: torch's default for the device).",
        show_default=False,
    ),
]
MaxNormOpt = Annotated[
    float | None, typer.Option("--max-norm", help="Clipping threshold.", show_default=False)
]
DatasetOpt = Annotated[
    str | None, typer.Option("--dataset", help="Tokenized dataset path.", show_default=False)
]


_PLAN_PARAMS: dict[str, Any] = {
    "plan": PlanArg,
    "config": ConfigOpt,
    "config_format": ConfigFormatOpt,
    "show_plan": ShowPlanOpt,
    "model": ModelOpt,
    "deepspeed": DeepSpeedOpt,
    "gpus": GpusOpt,
    "gpus_per_node": GpnOpt,
    "nodes": NodesOpt,
    "gpu": GpuOpt,
    "seq_len": SeqOpt,
    "micro_batch": MicroOpt,
    "grad_accum": GaOpt,
    "global_batch": GlobalOpt,
    "tp": TpOpt,
    "pp": PpOpt,
    "dp": DpOpt,
    "cp": CpOpt,
    "ep": EpOpt,
    "zero": ZeroOpt,
    "checkpointing": CkptOpt,
    "dtype": DtypeOpt,
    "loss_scale": LossScaleOpt,
    "lr": LrOpt,
    "optimizer_impl": OptimizerImplOpt,
    "warmup": WarmupOpt,
    "max_norm": MaxNormOpt,
    "dataset": DatasetOpt,
}


def with_plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command every plan option; it receives them as ``inputs: PlanInputs``.

    Written once so ``check``, ``memory`` and ``plan`` accept exactly the same inputs.
    """
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn, include_extras=True)
    own = [
        p.replace(annotation=hints.get(name, p.annotation))
        for name, p in sig.parameters.items()
        if name != "inputs"
    ]
    added = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=False if name == "show_plan" else None,
            annotation=ann,
        )
        for name, ann in _PLAN_PARAMS.items()
    ]

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        values = {k: kwargs.pop(k) for k in list(kwargs) if k in OPTION_FIELDS}
        inputs = PlanInputs(
            kwargs.pop("plan"),
            kwargs.pop("model"),
            kwargs.pop("deepspeed"),
            values,
            configs=kwargs.pop("config"),
            config_format=kwargs.pop("config_format"),
            show_plan=bool(kwargs.pop("show_plan")),
        )
        inputs.as_json = getattr(kwargs.get("fmt"), "value", None) == "json"
        return fn(inputs=inputs, **kwargs)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def stop_on_layout_errors(loaded: LoadedPlan, as_json: bool) -> bool:
    """Print the layout and batch errors ``sapper check`` would report and say whether
    there were any: ``memory`` and ``plan`` give no verdict on a job that cannot start."""
    from sapper.checks.parallel import layout_errors

    errors = layout_errors(loaded)
    if not errors:
        return False
    if as_json:
        from sapper.cli.output import emit_json

        emit_json({"findings": [f.to_json() for f in errors],
                   "summary": {"errors": len(errors), "stopped": "layout errors"}})
    else:
        from sapper.cli.output import console
        from sapper.report.terminal import render_findings

        console.print("the layout cannot start (as `sapper check` reports):")
        console.print(render_findings(errors))
    return True


def show_plan(loaded: LoadedPlan, as_json: bool) -> None:
    """``--show-plan``: the plan as read with each value's origin. In text, printed (as
    YAML with the origins as comments) before the command's own output; in JSON, added to
    the command's one document as top-level ``plan``, ``origins``, ``derived`` and
    ``unknown`` (field -> why)."""
    from sapper.checks.engine import run_checklist
    from sapper.report.plan_view import plan_view, render_plan_yaml

    report = run_checklist(loaded)  # what the checks lack is unknown too
    view = plan_view(loaded.plan, loaded.origins, report.findings, report.unverified)
    if as_json:
        from sapper.cli.output import attach_json

        attach_json(view)
        return
    from rich.text import Text

    from sapper.cli.output import console

    console.print(Text(render_plan_yaml(view)), soft_wrap=True)
    console.print()
