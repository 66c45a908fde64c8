"""How ``sapper smoke`` shows a run while it goes: streamed rows when the output is piped,
a transient progress line per check on a terminal. Imported only once the run starts (it
pulls in the smoke package and torch)."""

from __future__ import annotations

from rich.console import Console
from rich.status import Status

from sapper.smoke.render import render_header, render_outcomes
from sapper.smoke.runner import CheckOutcome, SmokeObserver, SmokeReport

__all__ = ["Progress", "Streaming"]


class Streaming(SmokeObserver):
    """Output piped to a file or a pager: the header, then each check's rows as soon as it
    finishes (a slow check no longer holds back the ones before it); the caller prints the
    fixes and the summary at the end."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.first = True

    def started(self, report: SmokeReport) -> None:
        self.console.print(render_header(report))

    def check_done(self, outcome: CheckOutcome) -> None:
        self.console.print(render_outcomes([outcome], show_header=self.first))
        self.first = False
        self.console.file.flush()


class Progress(SmokeObserver):
    """A terminal: a spinner naming the running check, one dim line when it ends (on
    stderr, so the report on stdout stays whole), the full report at the end."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.status: Status | None = None

    def check_started(self, name: str, index: int, total: int) -> None:
        self._stop()
        self.status = self.console.status(f"smoke: {name} ({index}/{total})")
        self.status.start()

    def check_done(self, outcome: CheckOutcome) -> None:
        self._stop()
        self.console.print(
            f"[dim]{outcome.name}: {outcome.status} in {outcome.seconds:.1f} s[/]",
            highlight=False,
        )

    def _stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
