"""Terminal rendering of a layout search (rich), separate from printing."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sapper.parallel.search import Candidate, SearchResult

__all__ = ["render_search"]

_SHORT = {
    "compute": "compute",
    "tp_comm": "TP",
    "cp_comm": "CP",
    "ep_comm": "EP",
    "pp_p2p": "p2p",
    "bubble": "bubble",
    "dp_comm": "DP",
    "optimizer": "opt",
}


def _split(c: Candidate) -> str:
    lay = c.layout
    parts = [f"TP{lay.tp}" + ("+SP" if lay.sequence_parallel else "")]
    parts.append(f"PP{lay.pp}" + (f"x{lay.virtual_stages}" if lay.virtual_stages > 1 else "")
                 + _stages(lay.first_stage_layers, lay.last_stage_layers))
    if lay.cp > 1:
        parts.append(f"CP{lay.cp}")
    parts.append(f"DP{lay.dp}")
    if lay.ep > 1:
        parts.append(f"EP{lay.ep}")
    return " ".join(parts)


def _stages(first: int | None, last: int | None) -> str:
    """Explicit first/last stage layer counts, e.g. ``[5,…,5]``; empty for an even split."""
    if first is None and last is None:
        return ""
    return f"[{first if first is not None else '='},…,{last if last is not None else '='}]"


def _breakdown(c: Candidate) -> str:
    return " ".join(
        f"{_SHORT[k]} {100 * v:.0f}%" for k, v in c.cost.shares().items() if v >= 0.005
    )


def _row(rank: str, c: Candidate) -> list[str]:
    lay, cost = c.layout, c.cost
    ckpt = {"none": "-", "selective": "sel", "full": "full"}[lay.checkpointing]
    mem = "?" if c.memory_gib is None else f"{c.memory_gib:.0f}"
    return [
        rank,
        _split(c),
        str(lay.zero),
        ckpt,
        f"{lay.micro_batch}x{lay.grad_accum}",
        f"{cost.step_time_s:.3g}",
        f"{cost.model_tflops_per_gpu:.0f}",
        f"{100 * cost.mfu:.0f}%" + ("!" if cost.details.get("above_best_mfu") else ""),
        mem,
        _breakdown(c),
    ]


def render_search(result: SearchResult, why: int = 3) -> Group:
    """The ranked layouts as a table with the step breakdown, then the reasons for the
    first ``why`` of them and how the plan's own layout compares."""
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for name, justify in (("#", "left"), ("layout", "left"), ("ZeRO", "right"),
                          ("ckpt", "left"), ("mb x GA", "right"), ("step s", "right"),
                          ("TFLOP/s", "right"), ("MFU", "right"), ("GiB", "right"),
                          ("where the step goes", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, cand in enumerate(result.top, 1):
        table.add_row(*_row(str(i), cand))
    if result.current is not None:
        table.add_row(*_row("yours", result.current), style="dim")
    parts: list[object] = [
        Text(
            f"{result.enumerated:,} valid layouts of {result.gpus} GPUs ranked in "
            f"{result.elapsed_s:.2f} s ({result.memory_checks} memory estimates, "
            f"{result.memory_rejected} layouts ruled out by memory on the way)",
            style="dim",
        ),
        table,
    ]
    for i, cand in enumerate(result.top[:why], 1):
        parts.append(Text.from_markup(f"\n[bold]#{i} {escape(cand.layout.describe())}[/]"))
        parts.extend(Text(f"  - {line}") for line in cand.why)
        parts.extend(Text(f"  ! {w}", style="yellow") for w in cand.warnings)
    if result.current is not None and result.current.fits is False:
        parts.append(
            Text(
                f"\nyour layout needs {result.current.memory_gib:.0f} GiB per GPU: it does "
                "not fit",
                style="bold red",
            )
        )
    shown = [*result.top, *([result.current] if result.current else [])]
    if any(c.cost.details.get("above_best_mfu") for c in shown):
        parts.append(
            Text(
                "MFU marked ! is above the best any published run reached on this GPU: no "
                "run has shown it, read it as an upper bound",
                style="yellow",
            )
        )
    parts.extend(Text(n, style="yellow") for n in result.notes)
    return Group(*parts)
