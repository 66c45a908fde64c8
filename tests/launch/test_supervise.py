"""The supervisor on its own: the console copy and its bound, a command that cannot
start, and a job that never logs a step (not a hang: no watch before the first step)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from sapper.launch import supervise
from sapper.launch.supervise import Supervisor


def _run(tmp_path: Path, code: str, **kw) -> tuple[supervise.Outcome, bytes, bytes]:
    out, err = io.BytesIO(), io.BytesIO()
    sup = Supervisor([sys.executable, "-c", code], env=dict(os.environ), cwd=tmp_path,
                     run_dir=tmp_path, stdout=out, stderr=err, **kw)
    result = sup.run()
    return result, out.getvalue(), err.getvalue()


def test_both_streams_are_copied_and_logged(tmp_path: Path) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(5)"
    result, out, err = _run(tmp_path, code, hang_after=None)
    assert (result.exit_code, result.outcome) == (5, "failed")
    assert (out, err) == (b"out\n", b"err\n")
    assert sorted((tmp_path / "console.log").read_bytes().splitlines()) == [b"err", b"out"]


def test_the_console_log_is_bounded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(supervise, "CONSOLE_LIMIT", 1000)
    result, out, _ = _run(tmp_path, "print('x' * 5000)", hang_after=None)
    assert result.outcome == "ok" and len(out) == 5001  # the terminal gets everything
    logged = (tmp_path / "console.log").read_bytes()
    assert logged.startswith(b"x" * 1000) and b"console.log stops at" in logged
    assert len(logged) < 1200


def test_no_watch_before_the_first_step(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    result, _, _ = _run(tmp_path, "import time; time.sleep(2)", hang_after=0.5)
    assert result.outcome == "ok" and result.stalled_s is None


def test_a_command_that_cannot_start(tmp_path: Path) -> None:
    sup = Supervisor(["sapper-no-such-program-here"], env=dict(os.environ), cwd=tmp_path,
                     run_dir=tmp_path, hang_after=None)
    with pytest.raises(FileNotFoundError):
        sup.run()


def test_console_log_keeps_each_streams_lines_whole(tmp_path: Path) -> None:
    """stdout and stderr written a piece at a time, interleaved: each line still stands
    whole in console.log."""
    code = (
        "import sys, time\n"
        "for i in range(20):\n"
        "    sys.stdout.write(f'out{i}'); sys.stdout.flush()\n"
        "    sys.stderr.write(f'err{i}'); sys.stderr.flush()\n"
        "    time.sleep(0.002)\n"
        "    sys.stdout.write('\\n'); sys.stdout.flush()\n"
        "    sys.stderr.write('\\n'); sys.stderr.flush()\n"
    )
    result, out, err = _run(tmp_path, code, hang_after=None)
    assert result.exit_code == 0
    assert out.count(b"\n") == err.count(b"\n") == 20  # the terminal got every byte
    lines = sorted((tmp_path / "console.log").read_bytes().splitlines())
    assert lines == sorted([f"out{i}".encode() for i in range(20)]
                           + [f"err{i}".encode() for i in range(20)])
