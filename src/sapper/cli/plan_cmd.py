"""``sapper plan``: every valid parallel layout for the model and cluster, ranked."""

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
def plan(
    inputs: PlanInputs,
    fmt: FormatOpt = OutputFormat.text,
    top: int = typer.Option(5, "--top", "-k", min=1, max=100, help="Layouts to show."),
    why: int = typer.Option(3, "--why", min=0, help="Explain the first N layouts."),
) -> None:
    """Rank every valid layout (TP, PP, CP, DP, ZeRO, recomputation, micro-batch,
    virtual stages) by predicted throughput, keep those that fit in memory, and say why
    each wins. Takes the same inputs as `sapper check`; the global batch stays fixed."""
    from sapper.parallel import search
    from sapper.parallel.render import render_search

    def body() -> int:
        loaded = load_from_options(inputs)
        if stop_on_layout_errors(loaded, fmt == OutputFormat.json):
            return 1
        result = search(loaded.plan, top=top, explain=min(why, top))
        if fmt == OutputFormat.json:
            emit_json(result.to_json())
        else:
            console.print(render_search(result, why=why))
        return 0 if result.top or result.current_is_best else 1

    run_guarded(body)
