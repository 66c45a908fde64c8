"""The progress bar of a long ``sapper analyze``: on a terminal only, never with JSON."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from sapper.cli import analyze_cmd


def _log(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    path.write_text(
        '{"kind": "meta", "version": 1}\n'
        + "".join(f'{{"kind": "step", "step": {s}, "loss": 2.0}}\n' for s in range(1, 50))
    )
    return path


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    monkeypatch.setattr(analyze_cmd, "err_console", console)
    monkeypatch.setattr(analyze_cmd, "PROGRESS_BYTES", 0)
    return out


def test_progress_on_a_terminal(tmp_path: Path, terminal: io.StringIO) -> None:
    path = _log(tmp_path)
    with analyze_cmd._Progress([path], True) as bar:
        assert bar.bar is not None
        bar.read(str(path))
        tick = bar.detectors(1, 3)
        assert tick is not None
        tick(3)
    assert "reading" in terminal.getvalue() or "detectors" in terminal.getvalue()


def test_no_progress_for_json_or_small_inputs(
    tmp_path: Path, terminal: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _log(tmp_path)
    assert analyze_cmd._Progress([path], False).bar is None  # --format json
    monkeypatch.setattr(analyze_cmd, "PROGRESS_BYTES", 1 << 30)
    assert analyze_cmd._Progress([path], True).bar is None  # well under a second


def test_no_progress_off_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(analyze_cmd, "err_console", Console(file=io.StringIO()))
    monkeypatch.setattr(analyze_cmd, "PROGRESS_BYTES", 0)
    assert analyze_cmd._Progress([_log(tmp_path)], True).bar is None
