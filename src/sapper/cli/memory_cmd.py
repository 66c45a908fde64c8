"""``sapper memory``: where every byte of a planned job goes (checklist item 5)."""

from __future__ import annotations

import typer

from sapper.cli.options import (
    PlanInputs,
    load_from_options,
    stop_on_layout_errors,
    with_plan_options,
)
from sapper.cli.output import FormatOpt, OutputFormat, console, emit_json, run_guarded


@with_plan_options
def memory(
    inputs: PlanInputs,
    fmt: FormatOpt = OutputFormat.text,
    traced: bool = typer.Option(
        False,
        "--traced",
        help="Also run one step of the real model on fake tensors (exact, one device).",
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
        v = verdict(plan)
        trace = None
        if traced:
            from sapper.memory.traced import trace_plan

            trace = trace_plan(plan)
        if fmt == OutputFormat.json:
            payload: dict[str, object] = {
                "estimate": v.estimate.to_json(),
                "verdict": v.to_json(),
            }
            if trace is not None:
                payload["traced"] = trace.to_json()
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
                for note in trace.notes:
                    console.print(f"note: {note}", style="dim")
        return 1 if v.estimate.fits is False else 0

    run_guarded(body)
