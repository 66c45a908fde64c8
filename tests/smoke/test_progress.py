"""How `sapper smoke` shows a run as it goes: a progress line per check on a terminal, and
each check's rows as soon as it finishes when the output is piped."""

from __future__ import annotations

import io
import re

from rich.console import Console

from sapper.cli.smoke_progress import Progress, Streaming
from sapper.smoke.runner import run_smoke


def test_a_terminal_gets_one_line_per_check(llama) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    report = run_smoke(llama, checks=["padding", "accumulation"], observer=Progress(console))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # the spinner's redraws
    lines = [line.strip() for line in text.splitlines() if " in " in line]
    assert [line.split(":")[0].strip() for line in lines][-2:] == ["padding", "accumulation"]
    assert all("pass in" in line for line in lines[-2:])
    assert report.errors == 0


def test_piped_output_shows_each_check_before_the_next_runs(llama) -> None:
    out = io.StringIO()
    seen: list[str] = []

    class Recording(Streaming):
        def check_started(self, name: str, index: int, total: int) -> None:
            seen.append(out.getvalue())  # what was already written when this check began

    console = Console(file=out, width=100, color_system=None)
    run_smoke(llama, checks=["padding", "accumulation"], observer=Recording(console))
    assert "S011" not in seen[0]  # nothing of padding before it ran
    assert "S011" in seen[1] and "S003" not in seen[1]  # padding's row before accumulation
    assert "S003" in out.getvalue()
