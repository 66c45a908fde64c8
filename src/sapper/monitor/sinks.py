"""Where records and findings go: the console (rate-limited), the run log, TensorBoard.

A sink never raises into training: the monitor calls each through its guard, which turns
an error into one R190 finding and switches that sink off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from sapper.report.terminal import render_findings
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord
from sapper.runtime.runlog import RunLogWriter

__all__ = ["ConsoleSink", "RunLogSink", "Sink", "TensorBoardSink", "scalars"]


class Sink:
    def records(self, records: list[StepRecord]) -> None:
        """Logged steps, in order."""

    def findings(self, findings: list[Finding]) -> None:
        """New findings."""

    def close(self) -> None:
        """The run ended."""


class ConsoleSink(Sink):
    """Findings on stderr: a code at most once per ``per_code_s`` seconds, at most
    ``per_minute`` lines a minute; what was held back is counted at close."""

    def __init__(
        self, console: Console | None = None, *, per_code_s: float = 30.0, per_minute: int = 20
    ) -> None:
        self.console = console or Console(stderr=True)
        self.per_code_s = per_code_s
        self.per_minute = per_minute
        self._last: dict[str, float] = {}
        self._window: list[float] = []
        self.suppressed = 0

    def findings(self, findings: list[Finding]) -> None:
        shown = []
        now = time.monotonic()
        self._window = [t for t in self._window if now - t < 60.0]
        for f in findings:
            last = self._last.get(f.code)
            if (last is not None and now - last < self.per_code_s) or len(
                self._window
            ) >= self.per_minute:
                self.suppressed += 1
                continue
            self._last[f.code] = now
            self._window.append(now)
            shown.append(f)
        if shown:
            self.console.print("[bold]sapper[/]", render_findings(shown), highlight=False)

    def close(self) -> None:
        if self.suppressed:
            self.console.print(
                f"[dim]sapper: {self.suppressed} more finding(s) not shown (rate limit); "
                "see the run log[/]"
            )


class RunLogSink(Sink):
    """The JSONL run log (``sapper.runtime.runlog``), written through: each batch of
    records read is one write, in the file when the call returns.

    ``on_error`` is told once, with the path and the reason, when the file cannot be
    opened or a write fails (the monitor makes it an R191 warning); the sink is silent
    from then on and never raises into training."""

    def __init__(
        self,
        path: str | Path,
        meta: dict[str, Any],
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.writer = RunLogWriter(path, meta=meta, on_error=on_error)

    def records(self, records: list[StepRecord]) -> None:
        self.writer.write_steps(records)

    def findings(self, findings: list[Finding]) -> None:
        self.writer.write_findings(findings)

    def close(self) -> None:
        self.writer.close()


#: Record fields → TensorBoard tags (namespace and unit in the name).
_TAGS = {
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "lr": "train/lr",
    "loss_scale": "scaler/loss_scale",
    "memory_allocated_gib": "memory/allocated(GiB)",
    "memory_reserved_gib": "memory/reserved(GiB)",
    "memory_peak_gib": "memory/max_reserved(GiB)",
    "rss_gib": "memory/rss(GiB)",
    "step_time_s": "throughput/step_time(s)",
    "data_time_s": "throughput/data_wait(s)",
    "tokens_per_s": "throughput/tokens_per_s",
    "samples_per_s": "throughput/samples_per_s",
    "mfu": "throughput/mfu",
}


def scalars(record: StepRecord) -> dict[str, float]:
    """The scalar series of a record under their TensorBoard tags."""
    out = {tag: getattr(record, name) for name, tag in _TAGS.items()}
    out = {k: float(v) for k, v in out.items() if v is not None}
    if record.skipped is not None:
        out["scaler/skipped"] = float(record.skipped)
    share = record.extra.get("grad_zero_share")
    if isinstance(share, float):
        out["numerics/zero_grad_share"] = share
    return out


class TensorBoardSink(Sink):
    """Scalars per logged step and findings as text, in a TensorBoard event file."""

    def __init__(self, logdir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(logdir))

    def records(self, records: list[StepRecord]) -> None:
        for rec in records:
            for tag, value in scalars(rec).items():
                self.writer.add_scalar(tag, value, rec.step)

    def findings(self, findings: list[Finding]) -> None:
        for f in findings:
            text = f"**{f.code} {f.severity.value}**: {f.message}  \nfix: {f.fix}"
            self.writer.add_text(f"sapper/{f.code}", text, f.step or 0)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
