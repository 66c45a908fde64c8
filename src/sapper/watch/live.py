"""How a watch shows itself: a live terminal view, plain lines, or JSON lines.

On a terminal, :class:`LiveView` redraws one screen after each poll (rich ``Live``,
refreshed by the loop, not by a timer, so an idle watch costs nothing): where the log
stands, the five metrics of seed §5.2 with their latest value and a sparkline, and the
findings with step and fix, newest first. When stdout is not a terminal (a log file, a
CI job, ``nohup``), :class:`PlainView` prints one line per event instead — each finding
the moment it fires, notes, and a status line with the five metrics at most every
``status_every`` seconds. :class:`JsonView` prints JSON lines for other programs. All
three render with pure ``format_*``/``render_*`` functions and only print in the sink
methods.
"""

from __future__ import annotations

import time
from collections import deque
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sapper.errors import printable
from sapper.jsontext import dumps
from sapper.report.terminal import SEVERITY_STYLE, render_findings
from sapper.report.terminal import safe_markup as escape
from sapper.rules.model import Finding, Severity
from sapper.runtime.records import StepRecord
from sapper.watch.metrics import NONFINITE_BAR, MetricBoard, sparkline
from sapper.watch.watcher import Watcher, WatchResult, WatchSink

__all__ = [
    "VIEWS",
    "JsonView",
    "LiveView",
    "PlainView",
    "format_finding",
    "format_summary",
    "make_view",
    "render_screen",
]

#: Values of ``--format``.
VIEWS = ("auto", "live", "plain", "json")
_SHOWN = 6  # findings on the live screen (newest first); all are printed at the end


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def format_finding(f: Finding) -> str:
    """One line: where, what, and the first sentence of the fix."""
    where = f"step {f.step}" if f.step is not None else "end of run"
    if f.rank is not None:
        where += f", rank {f.rank}"
    return f"{where}: {f.code} {f.severity.value}: {f.message} — fix: {_first_sentence(f.fix)}"


def format_summary(result: WatchResult) -> str:
    why = {
        "idle": "the log stopped growing",
        "input ended": "the input ended",
        "interrupted": "interrupted",
        "stopped": "stopped",
    }.get(result.reason, result.reason)
    span = ""
    if result.first_step is not None and result.last_step is not None:
        span = f", steps {result.first_step:,}–{result.last_step:,}"
    if result.attempts > 1:
        span += f", {result.attempts} attempts"
    counts = (
        f"{result.count(Severity.ERROR)} error(s), {result.count(Severity.WARNING)} warning(s), "
        f"{result.count(Severity.INFO)} info"
    )
    kind = f"{result.format} log" if result.format else "log (format never recognized)"
    return f"watch ended ({why}): {result.path}: {kind}, {result.records:,} records{span}; {counts}"


def _status(watcher: Watcher) -> str:
    fol = watcher.follower
    if fol.waiting:
        return fol.waiting
    if fol.last_data is None:
        return "waiting for data"
    quiet = time.monotonic() - fol.last_data
    return f"following, last data {quiet:.0f} s ago" if quiet >= 2 else "following"


def render_screen(
    watcher: Watcher, board: MetricBoard, findings: list[Finding], notes: list[str]
) -> Group:
    """The live screen: header, metrics with sparklines, findings, recent notes."""
    fol = watcher.follower
    fmt_name = f"{fol.format} log" if fol.format else "format not known yet"
    head = f"[bold]sapper watch[/] {escape(fol.name)} · {escape(fmt_name)}"
    if board.last_step is not None:
        head += f" · step {board.last_step:,} · {board.records:,} records"
    parts: list[Any] = [Text.from_markup(head), Text(printable(_status(watcher)), style="dim")]
    parts.extend(_metric_lines(board))
    if findings:
        ft = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        ft.add_column("step", justify="right")
        ft.add_column("finding")
        ft.add_column("fix", ratio=1)
        for f in reversed(findings[-_SHOWN:]):
            style = SEVERITY_STYLE[f.severity]
            ft.add_row(
                "" if f.step is None else f"{f.step:,}",
                Text.from_markup(f"[{style}]{f.code} {f.severity.value}[/] {escape(f.message)}"),
                Text(printable(_first_sentence(f.fix)), style="dim"),
            )
        if len(findings) > _SHOWN:
            ft.caption = f"{len(findings) - _SHOWN} earlier finding(s) not shown"
        parts.append(ft)
    else:
        parts.append(Text("no findings yet", style="green"))
    for note in notes[-3:]:
        parts.append(Text.from_markup(f"[yellow]note:[/] {escape(note)}"))
    return Group(*parts)


def _metric_lines(board: MetricBoard) -> list[Text]:
    """The metrics as a table of aligned lines (metric, latest, step, sparkline): laid
    out here rather than by a rich Table, which costs several times more to render on
    every redraw of the screen."""
    rows = [
        (m.label, m.text(), "" if m.step is None else f"{m.step:,}", sparkline(m.values))
        for m in board.metrics
    ]
    heads = ("metric", "latest", "step", "recent")
    w0, w1, w2 = (max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads[:3]))
    lines = [Text(f"{heads[0]:<{w0}}  {heads[1]:>{w1}}  {heads[2]:>{w2}}  {heads[3]}",
                  style="bold", no_wrap=True, overflow="ellipsis")]
    for label, latest, step, spark in rows:
        line = Text(f"{label:<{w0}}  {latest:>{w1}}  {step:>{w2}}  ", no_wrap=True,
                    overflow="ellipsis")
        start = len(line)
        line.append(spark, style="cyan")
        for i, ch in enumerate(spark):
            if ch == NONFINITE_BAR:
                line.stylize("bold red", start + i, start + i + 1)
        lines.append(line)
    return lines


class LiveView(WatchSink):
    """A screen redrawn after each poll; the final screen and a summary stay printed."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.board = MetricBoard()
        self.findings: list[Finding] = []
        self.notes: deque[str] = deque(maxlen=20)
        self._watcher: Watcher | None = None
        self._live: Live | None = None

    def start(self, watcher: Watcher) -> None:
        self._watcher = watcher
        self._live = Live(
            console=self.console, auto_refresh=False, transient=False, redirect_stdout=False
        )
        self._live.start()
        self._draw()

    def records(self, records: list[StepRecord]) -> None:
        self.board.update(records)

    def finding(self, finding: Finding) -> None:
        self.findings.append(finding)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def tick(self, watcher: Watcher) -> None:
        self._draw()

    def _draw(self) -> None:
        if self._live is not None and self._watcher is not None:
            screen = render_screen(self._watcher, self.board, self.findings, list(self.notes))
            self._live.update(screen, refresh=True)

    def end(self, result: WatchResult) -> None:
        self._draw()
        if self._live is not None:
            self._live.stop()
            self._live = None
        if len(self.findings) > _SHOWN:
            self.console.print(Text(f"all {len(self.findings)} findings:", style="bold"))
            self.console.print(render_findings(self.findings))
        style = "bold red" if result.count(Severity.ERROR) else "bold green"
        self.console.print(Text(printable(format_summary(result)), style=style))


class PlainView(WatchSink):
    """One line per event, for logs and pipes."""

    def __init__(self, stream: IO[str], status_every: float = 60.0) -> None:
        self.stream = stream
        self.status_every = status_every
        # The plain view prints the latest values only (no sparklines): a history of one.
        self.board = MetricBoard(history=1)
        self._format: str | None = None
        self._waiting: str | None = None
        self._last_status = time.monotonic()
        self._status_records = 0
        self._watcher: Watcher | None = None

    def _line(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.stream.write(f"[{stamp}] {printable(text)}\n")  # log text: no escapes, one line
        self.stream.flush()

    def start(self, watcher: Watcher) -> None:
        self._watcher = w = watcher
        idle = f"{w.idle_timeout:g} s" if w.idle_timeout else "off"
        self._line(f"watching {w.follower.name} (poll {w.poll_s:g} s, idle timeout {idle})")

    def records(self, records: list[StepRecord]) -> None:
        if self._watcher is not None:
            self._announce(self._watcher)
        self.board.update(records)

    def _announce(self, watcher: Watcher) -> None:
        """The format once known, and each new reason for waiting."""
        fol = watcher.follower
        if fol.format != self._format and fol.format is not None:
            self._format = fol.format
            self._line(f"reading {fol.name} as a {fol.format} log")
        if fol.waiting != self._waiting:
            self._waiting = fol.waiting
            if fol.waiting:
                self._line(fol.waiting)

    def finding(self, finding: Finding) -> None:
        self._line(format_finding(finding))

    def note(self, text: str) -> None:
        self._line(f"note: {text}")

    def tick(self, watcher: Watcher) -> None:
        self._announce(watcher)
        now = time.monotonic()
        if (
            self.status_every > 0
            and now - self._last_status >= self.status_every
            and self.board.records > self._status_records
        ):
            self._last_status, self._status_records = now, self.board.records
            self._line(f"step {self.board.last_step:,}: {self.board.summary()}")

    def end(self, result: WatchResult) -> None:
        if self.board.records:
            self._line(f"last values at step {self.board.last_step:,}: {self.board.summary()}")
        self._line(format_summary(result))


class JsonView(WatchSink):
    """JSON lines: ``finding`` and ``note`` objects as they come, a ``summary`` at the end."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def _emit(self, obj: dict[str, Any]) -> None:
        self.stream.write(dumps(obj) + "\n")
        self.stream.flush()

    def finding(self, finding: Finding) -> None:
        self._emit({"kind": "finding", **finding.to_json()})

    def note(self, text: str) -> None:
        self._emit({"kind": "note", "text": text})

    def end(self, result: WatchResult) -> None:
        self._emit({"kind": "summary", **result.to_json()})


def make_view(kind: str, stream: IO[str], console: Console | None = None) -> WatchSink:
    """The view for ``--format`` (``auto``: live on a terminal, plain lines otherwise)."""
    if kind == "auto":
        kind = "live" if stream.isatty() else "plain"
    if kind == "live":
        return LiveView(console)
    if kind == "json":
        return JsonView(stream)
    return PlainView(stream)
