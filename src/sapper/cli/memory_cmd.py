"""``sapper memory``: where every byte of a planned job goes (checklist item 5)."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sapper.cli.options import (
    PlanInputs,
    load_from_options,
    stop_on_layout_errors,
    with_plan_options,
)
from sapper.cli.output import FormatOpt, OutputFormat, console, emit_json, run_guarded

if TYPE_CHECKING:
    from sapper.plan.load import LoadedPlan

#: A config.json is a few KB; a larger .json among the sources is something else.
MAX_CONFIG_BYTES = 1 << 20


class Device(str, enum.Enum):
    """Where the step runs, for the memory model's overheads and kernels."""

    cuda = "cuda"
    cpu = "cpu"


def _hf_config_of(inputs: PlanInputs, loaded: LoadedPlan) -> Path | None:
    """The user's own config.json: --model, else a source of the plan that is one (a
    plan's ``hf_config``, a launch config's model), so --traced builds the real model."""
    candidates = [inputs.model] if inputs.model is not None else []
    candidates += [Path(name) for name in loaded.sources if name.endswith(".json")]
    for path in candidates:
        try:
            if path.is_file() and path.stat().st_size < MAX_CONFIG_BYTES:
                data = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(data, dict) and isinstance(data.get("model_type"), str):
                    return path
        except (OSError, ValueError):
            continue
    return None


@with_plan_options
def memory(
    inputs: PlanInputs,
    fmt: FormatOpt = OutputFormat.text,
    traced: bool = typer.Option(
        False,
        "--traced",
        help="Also run one step of the real model on fake tensors (exact, one device).",
    ),
    device: Device = typer.Option(
        Device.cuda,
        "--device",
        help="cuda: the CUDA context, NCCL buffers and the caching allocator's slack on top "
        "of the tensors, bool dropout masks, GPU kernels; cpu: the tensors alone, as a CPU "
        "run allocates them (torch's CPU defaults: the per-tensor optimizer loop).",
    ),
) -> None:
    """Estimate per-GPU memory: parameters, gradients, optimizer states, activations and
    temporaries per pipeline stage, whether it fits, and what to change first."""

    def body() -> int:
        from sapper.memory.report import render_memory
        from sapper.memory.verdict import verdict

        loaded = load_from_options(inputs)
        if stop_on_layout_errors(loaded, fmt == OutputFormat.json):
            return 1
        plan = loaded.plan
        from sapper.memory import MemoryOptions

        options = (
            MemoryOptions(context_bytes=0, nccl_bytes=0, fragmentation=0.0, device="cpu")
            if device == Device.cpu
            else MemoryOptions()
        )
        v = verdict(plan, options)
        trace, skipped = None, None
        if traced:
            from sapper.errors import SapperError
            from sapper.memory.traced import trace_plan

            try:
                trace = trace_plan(plan, _hf_config_of(inputs, loaded))
            except SapperError as exc:  # InputError too: tracing is an extra, not the verdict
                skipped = str(exc)
        if fmt == OutputFormat.json:
            payload: dict[str, object] = {
                "estimate": v.estimate.to_json(),
                "verdict": v.to_json(),
            }
            if trace is not None:
                payload["traced"] = trace.to_json()
            if skipped is not None:
                payload["traced_skipped"] = skipped
            emit_json(payload)
        else:
            console.print(render_memory(plan, v))
            if trace is not None:
                from sapper.memory.units import fmt_bytes

                cats = ", ".join(f"{k} {fmt_bytes(b)}" for k, b in trace.breakdown.items())
                console.print(
                    f"\ntraced (one unsharded device, CPU kernels): peak "
                    f"{fmt_bytes(trace.peak_bytes)} in {trace.peak_phase} — {cats} "
                    f"({trace.seconds:.1f} s)"
                )
                if device != Device.cpu:
                    console.print(
                        "traced under the CUDA caching allocator's rules: allocated "
                        f"{fmt_bytes(trace.cuda_allocated_bytes)}, reserved "
                        f"{fmt_bytes(trace.cuda_reserved_bytes)}",
                        highlight=False,
                    )
                for note in trace.notes:
                    console.print(f"note: {note}", style="dim")
            if skipped is not None:
                console.print(f"\ntraced: skipped — {skipped}", style="yellow", highlight=False)
        return 1 if v.estimate.fits is False else 0

    run_guarded(body)
