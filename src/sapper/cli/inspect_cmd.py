"""``sapper inspect PATH [PATH2]``: a checkpoint read streamed, without the model.

One path: per-tensor statistics, the optimizer's moments and the resume state, reported
as K findings. Two paths (an earlier and a later checkpoint of one run): also how far
each tensor moved and where non-finite values first appear. Exit 0 when no error is
found, 1 on an error finding, 2 when a checkpoint cannot be read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sapper.cli.output import FormatOpt, OutputFormat, console, emit_json, run_guarded

if TYPE_CHECKING:
    from rich.console import Group

    from sapper.checkpoint.inspect import InspectResult

__all__ = ["format_inspect", "inspect"]


def _num(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def format_inspect(result: InspectResult) -> Group:
    """The terminal view: one header per checkpoint, its tensors worst first (those a
    finding names, then non-finite, then by abs-max), the largest
    implied Adam updates, the largest changes of a pair, then the findings."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from sapper.report.safe import safe_markup
    from sapper.report.terminal import render_findings

    parts: list = []
    for rep in result.checkpoints:
        s = rep.summary()
        have = ", ".join(k for k, v in rep.pieces.items() if v) or "nothing"
        steps = ", ".join(f"{k} {v:g}" for k, v in rep.steps.items()) or "unknown"
        parts.append(
            Text.from_markup(
                f"[bold]{safe_markup(rep.path)}[/] ({safe_markup(rep.kind)}): {s['tensors']} "
                f"tensors, {s['parameters']:,} values; has {have}; step {steps}"
            )
        )
        flagged = {f.data.get("tensor") for f in rep.findings}
        worst = sorted(rep.weights, key=lambda t: (t.key not in flagged, -t.nonfinite, -t.abs_max))[
            :8
        ]
        if worst:
            table = Table(box=None, pad_edge=False, show_edge=False)
            for col in ("tensor", "dtype", "shape", "non-finite", "zero", "abs max", "rms"):
                table.add_column(col, justify="left" if col in ("tensor", "dtype") else "right")
            for t in worst:
                table.add_row(
                    safe_markup(t.key),
                    t.dtype,
                    "x".join(map(str, t.shape)) or "()",
                    str(t.nonfinite),
                    f"{t.zero_fraction:.1%}",
                    _num(t.abs_max),
                    _num(t.rms),
                )
            parts.append(table)
        layers = rep.layers()[:8]
        if layers:
            table = Table(
                box=None,
                pad_edge=False,
                show_edge=False,
                title_justify="left",
                title="layers, worst first",
            )
            for col in ("layer", "findings", "non-finite", "abs max", "rms", "max update"):
                table.add_column(col, justify="right")
            for row in layers:
                table.add_row(
                    str(row["layer"]),
                    str(row["findings"]),
                    str(row["nonfinite"]),
                    _num(row["abs_max"]),
                    _num(row["rms"]),
                    _num(row["max_update"]),
                )
            parts.append(table)
        jumps = sorted(rep.updates, key=lambda u: -u.ratio_max)[:5]
        if jumps:
            parts.append(Text("largest implied Adam update |m̂|/(√v̂+ε), in learning rates:"))
            for u in jumps:
                parts.append(
                    Text.from_markup(
                        f"  {safe_markup(u.name)}: max {_num(u.ratio_max)}, rms {_num(u.ratio_rms)}"
                    )
                )
    if result.changes:
        parts.append(Text("largest relative changes ||B-A||/||A||:"))
        for c in sorted(
            result.changes, key=lambda c: -c.relative if math.isfinite(c.relative) else -1e300
        )[:8]:
            parts.append(Text.from_markup(f"  {safe_markup(c.key)}: {_num(c.relative)}"))
    if result.findings:
        parts.append(render_findings(result.findings))
    else:
        parts.append(Text.from_markup("[green]no findings[/]"))
    return Group(*parts)


def inspect(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="A checkpoint (safetensors file or shard index, torch .pt/.bin/.ckpt, an HF "
            "Trainer checkpoint-N folder, a Distributed Checkpoint folder); a second one of "
            "the same run, later, to compare.",
            show_default=False,
        ),
    ],
    threads: Annotated[
        int,
        typer.Option(
            "--threads",
            min=1,
            help="Intra-op threads for the reductions (1: steady on a busy machine, and "
            "already ~4 GB/s).",
        ),
    ] = 1,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", "-j", min=1, help="Worker processes over the shards of a sharded checkpoint."
        ),
    ] = 1,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "--model",
            help="The model the checkpoint should fit: an HF config.json, or a model folder "
            "holding one. Compares the tensors with the model's (missing, extra, reshaped), "
            "the weights' scale with its planned init, and takes its dtype and ties.",
            show_default=False,
        ),
    ] = None,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Find NaNs, runaway layers, broken optimizer moments and resume mismatches in a
    checkpoint, streamed tensor by tensor without loading the model."""

    def body() -> int:
        from sapper.checkpoint.inspect import inspect_paths

        result = inspect_paths(paths, threads=threads, jobs=jobs, config=config)
        if fmt == OutputFormat.json:
            emit_json(result.to_json())
        else:
            console.print(format_inspect(result))
        return result.exit_code()

    run_guarded(body)
