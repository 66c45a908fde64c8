"""Rich rendering of a memory estimate and verdict (pure functions; the CLI prints)."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sapper.memory.estimate import MemoryEstimate
from sapper.memory.phases import CATEGORIES, PHASES
from sapper.memory.units import fmt_bytes
from sapper.memory.verdict import MemoryVerdict
from sapper.plan.schema import Plan

__all__ = ["render_memory"]

_LABEL = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "temporaries": "temporaries",
    "overheads": "overheads (context, NCCL, fragmentation)",
}


def _layout(plan: Plan, est: MemoryEstimate) -> str:
    p, b = plan.parallel, plan.batch
    parts = [
        f"{est.num_params / 1e9:.2f}B params",
        f"micro batch {b.micro_batch_size} × seq {b.seq_len}",
        f"TP{p.tp} PP{p.pp} CP{p.cp} DP{plan.dp_degree or 1}",
        f"ZeRO-{p.zero_stage}",
        f"checkpointing {p.checkpointing.granularity}",
        plan.precision.dtype + (" autocast" if plan.precision.autocast else ""),
        plan.optimizer.type,
    ]
    return " · ".join(parts)


def _headline(plan: Plan, v: MemoryVerdict) -> Text:
    est = v.estimate
    if est.fits is None:
        return Text.from_markup(
            f"peak [bold]{fmt_bytes(est.peak_bytes)}[/] per GPU "
            "(no GPU in the plan: pass --gpu to get a verdict)"
        )
    gpu = plan.gpu.name if plan.gpu else "GPU"
    if est.fits:
        status = "[bold green]FITS[/]"
        room = f"{fmt_bytes(est.headroom_bytes or 0)} headroom"
    else:
        status = "[bold red]DOES NOT FIT[/]"
        room = f"short by {fmt_bytes(-(est.headroom_bytes or 0))}"
    return Text.from_markup(
        f"{status} on {escape(gpu)}: peak [bold]{fmt_bytes(est.peak_bytes)}[/] of "
        f"{fmt_bytes(est.gpu_bytes or 0)} ({room}) · stage {est.peak_stage}, "
        f"{est.peak_phase} · dominant: {v.dominant_part} ({_LABEL[v.dominant]})"
    )


def _breakdown(est: MemoryEstimate) -> Table:
    t = Table(title="per GPU at each stage's peak", title_justify="left", box=None)
    t.add_column("category")
    for s in est.stages:
        t.add_column(f"stage {s.stage}" if len(est.stages) > 1 else "bytes", justify="right")
    t.add_column("share", justify="right")
    worst = est.stages[est.peak_stage]
    for cat in (*CATEGORIES, "overheads"):
        share = worst.breakdown.get(cat, 0) / max(worst.peak_bytes, 1)
        t.add_row(
            _LABEL[cat],
            *(fmt_bytes(s.breakdown.get(cat, 0)) for s in est.stages),
            f"{100 * share:.0f}%",
        )
    t.add_row("[bold]peak[/]", *(f"[bold]{fmt_bytes(s.peak_bytes)}[/]" for s in est.stages), "")
    if len(est.stages) > 1:
        t.add_row("layers", *(str(s.layers) for s in est.stages), "")
        t.add_row("micro-batches in flight", *(f"{s.in_flight:g}" for s in est.stages), "")
    return t


def _phases(est: MemoryEstimate) -> Table:
    worst = est.stages[est.peak_stage]
    t = Table(
        title=f"stage {worst.stage} over the step (tensor bytes)", title_justify="left", box=None
    )
    t.add_column("phase")
    for cat in CATEGORIES:
        t.add_column(cat, justify="right")
    t.add_column("total", justify="right")
    for ph in PHASES:
        cats = worst.phases[ph]
        mark = " ◀ peak" if ph == worst.peak_phase else ""
        t.add_row(
            ph + mark,
            *(fmt_bytes(cats.get(c, 0)) for c in CATEGORIES),
            fmt_bytes(sum(cats.values())),
        )
    return t


def _fit(f: bool | None) -> str:
    return {True: "[green]fits[/]", False: "[red]no[/]", None: "—"}[f]


def _remedies(v: MemoryVerdict) -> Table:
    t = Table(
        title="remedies in the seed's order (§3.4), each on its own",
        title_justify="left",
        box=None,
    )
    for col, just in (
        ("#", "right"),
        ("change", "left"),
        ("peak", "right"),
        ("saves", "right"),
        ("", "left"),
        ("note", "left"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for i, r in enumerate(v.remedies, 1):
        t.add_row(
            str(i), r.name, fmt_bytes(r.peak_bytes), fmt_bytes(r.saves_bytes), _fit(r.fits), r.note
        )
    return t


def _what_if(v: MemoryVerdict) -> Table:
    mbs = sorted({w.micro_batch for w in v.what_if})
    t = Table(title="what if: peak per GPU by micro batch", title_justify="left", box=None)
    t.add_column("ZeRO")
    t.add_column("checkpointing")
    for mb in mbs:
        t.add_column(f"mb {mb}", justify="right")
    rows: dict[tuple[int, str], dict[int, str]] = {}
    for w in v.what_if:
        cell = fmt_bytes(w.peak_bytes)
        if w.fits is not None:
            cell = f"[green]{cell}[/]" if w.fits else f"[red]{cell}[/]"
        rows.setdefault((w.zero, w.checkpointing), {})[w.micro_batch] = cell
    for (z, ck), cells in rows.items():
        t.add_row(str(z), ck, *(cells.get(mb, "") for mb in mbs))
    return t


def render_memory(plan: Plan, v: MemoryVerdict) -> Group:
    est = v.estimate
    parts: list[object] = [
        Text.from_markup(f"[bold]{escape(plan.name or 'plan')}[/]: {escape(_layout(plan, est))}"),
        _headline(plan, v),
        Text(""),
        _breakdown(est),
        Text(""),
        _phases(est),
    ]
    states = f"model states {fmt_bytes(v.states_bytes)} per GPU"
    if v.states_exceed_gpu:
        states += " — [bold red]more than the GPU holds on their own[/]"
    parts += [Text(""), Text.from_markup(states)]
    if est.host_bytes_per_node or est.nvme_bytes_per_node:
        parts.append(
            Text(
                f"offload: {fmt_bytes(est.host_bytes_per_node)} CPU memory and "
                f"{fmt_bytes(est.nvme_bytes_per_node)} NVMe per node"
            )
        )
    if v.remedies:
        parts += [Text(""), _remedies(v)]
    if v.what_if:
        parts += [Text(""), _what_if(v)]
    if est.fits is not None:
        mb = v.max_micro_batch if v.max_micro_batch is not None else "none (not even 1)"
        sl = v.max_seq_len if v.max_seq_len is not None else "none"
        parts += [
            Text(""),
            Text(
                f"largest micro batch that fits: {mb} · largest sequence "
                f"length (multiples of 128): {sl}"
            ),
        ]
    for note in [*est.notes, *v.notes]:
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)
