"""Rich rendering of a memory estimate and verdict (pure functions; the CLI prints)."""

from __future__ import annotations

from fractions import Fraction

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sapper.memory.buckets import DS_KEYS, zero_buckets
from sapper.memory.estimate import MemoryEstimate
from sapper.memory.phases import CATEGORIES, PHASES
from sapper.memory.units import GIB, fmt_bytes
from sapper.memory.verdict import MemoryVerdict
from sapper.plan.schema import Plan

__all__ = ["fmt_in_flight", "render_memory"]

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


def _table(title: str) -> Table:
    """A borderless table whose cells fold rather than end in "…" when the console is
    narrow: a clipped number ("5…") reads as a different number."""
    return Table(title=title, title_justify="left", box=None, pad_edge=False)


def _column(t: Table, header: str, justify: str = "left") -> None:
    """Right-justified (number) columns keep their width; text columns wrap first."""
    t.add_column(
        header, justify=justify, overflow="fold", no_wrap=justify == "right"  # type: ignore[arg-type]
    )


def fmt_in_flight(value: float, layers: int) -> str:
    """Micro-batches in flight exactly: ``4``, or ``7/2`` when a stage's interleaved chunks
    hold different counts (the value is a count weighted by the chunks' blocks, so its
    denominator divides the stage's block count)."""
    q = Fraction(value).limit_denominator(max(layers, 1))
    return str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}"


def _breakdown(est: MemoryEstimate) -> Table:
    if len(est.stages) > 1:
        return _per_stage(est)
    t = _table("per GPU at the peak")
    _column(t, "category")
    _column(t, "bytes", "right")
    _column(t, "share", "right")
    s = est.stages[0]
    for cat in (*CATEGORIES, "overheads"):
        share = s.breakdown.get(cat, 0) / max(s.peak_bytes, 1)
        t.add_row(_LABEL[cat], fmt_bytes(s.breakdown.get(cat, 0)), f"{100 * share:.0f}%")
    t.add_row("[bold]peak[/]", f"[bold]{fmt_bytes(s.peak_bytes)}[/]", "")
    return t


#: Short column headers of the per-stage table (the title spells them out).
_SHORT = {
    "params": "params",
    "grads": "grads",
    "optimizer": "optim",
    "activations": "activ",
    "temporaries": "temps",
    "overheads": "overhd",
}


def _unit(largest: int) -> tuple[str, int]:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if largest >= size:
            return unit, size
    return "B", 1


def _in_unit(n: int, size: int) -> str:
    """``12.3``; ``<0.1`` for a small non-zero amount, so it does not read as none."""
    if 0 < n < size / 20:
        return "<0.1"
    return f"{n / size:.1f}"


def _per_stage(est: MemoryEstimate) -> Table:
    """One row per pipeline stage, so PP64 grows the table down, not across: ten narrow
    columns in one unit fit 80 characters."""
    unit, size = _unit(max(s.peak_bytes for s in est.stages))
    t = _table(
        f"per GPU at each stage's peak ({unit}): optim = optimizer states, activ = "
        "activations, temps = temporaries, overhd = context, NCCL, fragmentation; "
        "in flight = micro-batches whose activations the stage holds"
    )
    _column(t, "stage", "right")
    _column(t, "layers", "right")
    _column(t, "in flight", "right")
    cats = (*CATEGORIES, "overheads")
    for cat in cats:
        _column(t, _SHORT[cat], "right")
    _column(t, "peak", "right")
    for s in est.stages:
        mark = s.stage == est.peak_stage
        peak = _in_unit(s.peak_bytes, size)
        t.add_row(
            f"[bold]{s.stage}[/]" if mark else str(s.stage),
            str(s.layers),
            fmt_in_flight(s.in_flight, s.layers),
            *(_in_unit(s.breakdown.get(c, 0), size) for c in cats),
            f"[bold]{peak} ◀[/]" if mark else peak,
        )
    return t


def _phases(est: MemoryEstimate) -> Table:
    worst = est.stages[est.peak_stage]
    t = _table(f"stage {worst.stage} over the step (tensor bytes; ◀ the peak phase)")
    _column(t, "phase")
    for cat in CATEGORIES:
        _column(t, cat, "right")
    _column(t, "total", "right")
    for ph in PHASES:
        cats = worst.phases[ph]
        mark = " ◀" if ph == worst.peak_phase else ""
        t.add_row(
            ph + mark,
            *(fmt_bytes(cats.get(c, 0)) for c in CATEGORIES),
            fmt_bytes(sum(cats.values())),
        )
    return t


def _fit(f: bool | None) -> str:
    return {True: "[green]fits[/]", False: "[red]no[/]", None: "—"}[f]


def _remedies(v: MemoryVerdict) -> Table:
    t = _table("remedies in the seed's order (§3.4), each on its own")
    for col, just in (("#", "right"), ("change", "left"), ("peak", "right"),
                      ("saves", "right"), ("", "left"), ("note", "left")):
        _column(t, col, just)
    for i, r in enumerate(v.remedies, 1):
        t.add_row(str(i), r.name, fmt_bytes(r.peak_bytes), fmt_bytes(r.saves_bytes),
                  _fit(r.fits), r.note)
    return t


def _what_if(v: MemoryVerdict) -> Table:
    mbs = sorted({w.micro_batch for w in v.what_if})
    t = _table("what if: peak per GPU by micro batch")
    _column(t, "ZeRO")
    _column(t, "checkpointing")
    for mb in mbs:
        _column(t, f"mb {mb}", "right")
    rows: dict[tuple[int, str], dict[int, str]] = {}
    for w in v.what_if:
        cell = fmt_bytes(w.peak_bytes)
        if w.fits is not None:
            cell = f"[green]{cell}[/]" if w.fits else f"[red]{cell}[/]"
        rows.setdefault((w.zero, w.checkpointing), {})[w.micro_batch] = cell
    for (z, ck), cells in rows.items():
        t.add_row(str(z), ck, *(cells.get(mb, "") for mb in mbs))
    return t


#: The sizes each ZeRO stage reads (stages 1-2 gather in place: no allgather buffer).
_STAGE_BUCKETS = {
    1: ("reduce_bucket_size", "allgather_bucket_size"),
    2: ("reduce_bucket_size", "allgather_bucket_size"),
    3: ("reduce_bucket_size", "prefetch_bucket_size", "max_live_parameters",
        "max_reuse_distance", "param_persistence_threshold", "sub_group_size"),
}


def _buckets(plan: Plan) -> Table | None:
    """Which DeepSpeed ZeRO sizes the estimate used and where each came from."""
    zb = zero_buckets(plan)
    stage = plan.parallel.zero_stage
    if not zb.deepspeed or stage == 0:
        return None
    flat = "" if zb.contiguous else "; contiguous_gradients false: no preallocated buffer"
    t = _table(f"DeepSpeed ZeRO-{stage} sizes used (elements{flat})")
    t.add_column("zero_optimization key", no_wrap=True, overflow="fold")
    _column(t, "elements", "right")
    _column(t, "from")
    for b in zb.all():
        if b.name in _STAGE_BUCKETS[stage]:
            n = "unknown" if b.elements is None else f"{b.elements:,}"
            t.add_row(DS_KEYS[b.name], n, escape(b.source))
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
    if est.reserved_bytes > est.tensor_peak_bytes:
        parts.append(Text(
            f"allocated {fmt_bytes(est.tensor_peak_bytes)} (max_memory_allocated) · reserved "
            f"≈ {fmt_bytes(est.reserved_bytes)} (max_memory_reserved: the caching "
            f"allocator's {fmt_bytes(est.reserved_bytes - est.tensor_peak_bytes)} of "
            "cached, unused blocks)"
        ))
    if est.host_bytes_per_node or est.nvme_bytes_per_node:
        parts.append(
            Text(
                f"offload: {fmt_bytes(est.host_bytes_per_node)} CPU memory and "
                f"{fmt_bytes(est.nvme_bytes_per_node)} NVMe per node"
            )
        )
    buckets = _buckets(plan)
    if buckets is not None:
        parts += [Text(""), buckets]
    if v.remedies:
        parts += [Text(""), _remedies(v)]
    if v.what_if:
        parts += [Text(""), _what_if(v)]
    if est.fits is not None:
        mb = v.max_micro_batch if v.max_micro_batch is not None else "none (not even 1)"
        sl = v.max_seq_len if v.max_seq_len is not None else "none"
        parts += [Text(""), Text(f"largest micro batch that fits: {mb} · largest sequence "
                                 f"length (multiples of 128): {sl}")]
    for note in [*est.notes, *v.notes]:
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)
