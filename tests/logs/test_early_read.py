"""A long run log read before the command needs it (``sapper.logs.columnar.early``): the
reader takes the early read's result only for the very file it began on, a read nobody
takes is stopped and let go, and the command line starts one only for ``sapper analyze``
of a large file whose logs are read into columns as they are."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from sapper.cli import analyze_cmd
from sapper.logs import read_log
from sapper.logs.columnar import early, read_columnar, runlog
from sapper.runtime.records import StepRecord
from sapper.runtime.runlog import RunLogWriter


def _write(path: Path, n: int, first: int = 1) -> None:
    writer = RunLogWriter(path, meta={"run": "early"}) if first == 1 else None
    records = [
        StepRecord(step=s, loss=2.0 + 1.0 / s, grad_norm=0.5, lr=3e-4, step_time_s=0.2)
        for s in range(first, first + n)
    ]
    if writer is not None:
        writer.write_steps(records)
        writer.close()
    else:  # more steps at the end, as a run still writing its log
        with path.open("a") as fh:
            for r in records:
                fh.write(json.dumps({"kind": "step", **r.to_json()}) + "\n")


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runlog, "MIN_BYTES", 1000)
    monkeypatch.setattr(runlog, "BLOCK_BYTES", 8_000)
    yield
    early.discard()


def _read_ahead(path: Path) -> threading.Thread:
    ready = threading.Event()
    thread = threading.Thread(target=early.read_ahead, args=(str(path), ready))
    thread.start()
    assert ready.wait(30)
    return thread


def _steps(log: object) -> list[int]:
    return [r.step for r in log.records]  # type: ignore[attr-defined]


def test_the_reader_takes_the_early_read_of_the_same_file(
    tmp_path: Path, small_blocks: None
) -> None:
    path = tmp_path / "run.jsonl"
    _write(path, 2000)
    thread = _read_ahead(path)
    assert early._key(path) in early._pending
    got = read_columnar(path, "sapper")
    thread.join(30)
    assert not early._pending  # taken: a second read reads the file itself
    assert got is not None and got.columns is not None
    assert _steps(got) == _steps(read_log(path)) == list(range(1, 2001))
    again = read_columnar(path, "sapper")
    assert again is not got and _steps(again) == _steps(got)


def test_a_file_changed_since_the_early_read_began_is_read_again(
    tmp_path: Path, small_blocks: None
) -> None:
    path = tmp_path / "run.jsonl"
    _write(path, 2000)
    thread = _read_ahead(path)
    thread.join(30)
    _write(path, 500, first=2001)
    got = read_columnar(path, "sapper")
    assert got is not None and _steps(got) == list(range(1, 2501))


def test_another_threshold_reads_the_file_itself(tmp_path: Path, small_blocks: None) -> None:
    path = tmp_path / "run.jsonl"
    _write(path, 2000)
    thread = _read_ahead(path)
    got = runlog.read_runlog_columnar(path, min_bytes=500)
    thread.join(30)
    assert not early._pending
    assert got is not None and _steps(got) == list(range(1, 2001))


def test_an_untaken_early_read_is_stopped_and_let_go(tmp_path: Path, small_blocks: None) -> None:
    path = tmp_path / "run.jsonl"
    _write(path, 20_000)
    thread = _read_ahead(path)
    entry = early._pending[early._key(path)]
    early.discard()
    thread.join(30)
    assert not thread.is_alive() and not early._pending
    assert entry.done.is_set()
    assert entry.result is None or len(entry.result.records) == 20_000
    if entry.result is None:
        assert isinstance(entry.error, runlog.ReadStopped)


def test_a_log_of_another_format_is_not_read_early(tmp_path: Path, small_blocks: None) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss\n" + "".join(f"{s},{2.0 + 1 / s}\n" for s in range(1, 3000)))
    thread = _read_ahead(path)
    thread.join(30)
    assert not early._pending


@pytest.mark.parametrize(
    ("extra", "started"),
    [
        ([], True),
        (["--format", "json"], True),
        (["--merge"], False),
        (["--map", "x=loss"], False),
        (["--log-format=sapper"], False),
        (["--help"], False),
    ],
)
def test_the_command_line_starts_it_for_analyze_of_a_large_file(
    tmp_path: Path,
    small_blocks: None,
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    started: bool,
) -> None:
    monkeypatch.setattr(analyze_cmd, "EARLY_READ_BYTES", 1000)
    path = tmp_path / "run.jsonl"
    _write(path, 2000)
    analyze_cmd.start_early_read(["analyze", *extra, str(path)])
    assert (early._key(path) in early._pending) is started
    early.discard()
    analyze_cmd.start_early_read(["diagnose", str(path)])
    assert not early._pending


def test_a_small_file_is_not_read_early(tmp_path: Path, small_blocks: None) -> None:
    path = tmp_path / "run.jsonl"
    _write(path, 2000)  # some 100 kB: under the command line's threshold
    analyze_cmd.start_early_read(["analyze", str(path)])
    assert not early._pending


def test_analyze_gives_the_same_answer_with_the_early_read(tmp_path: Path) -> None:
    """The whole command on a log over the threshold: read early, and (with the format
    forced, which turns the early read off) read when the pipeline reaches it."""
    import os
    import subprocess
    import sys

    path = tmp_path / "run.jsonl"
    records = [
        StepRecord(
            step=s,
            loss=(9.0 if s == 15_000 else 2.0 + 1.0 / s),
            grad_norm=0.5 + (s % 7) * 0.01,
            lr=3e-4,
            step_time_s=0.2,
            tokens=4096,
            tokens_per_s=20000.0 + s % 13,
        )
        for s in range(1, 30_001)
    ]
    writer = RunLogWriter(path, meta={"run": "early"})
    writer.write_steps(records)
    writer.close()
    assert path.stat().st_size >= analyze_cmd.EARLY_READ_BYTES

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        code = (
            "import os, sys\n"
            "from sapper.cli.app import main\n"
            "sys.argv[0] = 'sapper'\n"
            "try:\n"
            "    main()\n"
            "finally:\n"
            "    print('blas', os.environ.get('OPENBLAS_NUM_THREADS'), file=sys.stderr)\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        return subprocess.run(
            [sys.executable, "-c", code, "analyze", str(path), "--format", "json", *args],
            capture_output=True, text=True, check=False, timeout=120, env=env,
        )

    fast, plain = run(), run("--log-format", "sapper")
    assert fast.returncode == plain.returncode
    assert json.loads(fast.stdout) == json.loads(plain.stdout)
    assert "R002" in fast.stdout  # the spike, found through the columns
    # OpenBLAS is asked for one thread only where the log is read early (before numpy)
    assert fast.stderr.strip().endswith("blas 1"), fast.stderr
    assert plain.stderr.strip().endswith("blas None"), plain.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_the_caller_goes_on_once_the_first_blocks_are_decoding(
    tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """``ready`` waits for the read to be under way (its imports and first blocks, Python
    work that would race the caller's imports), not for the whole read."""
    monkeypatch.setattr(runlog, "DECODE_WORKERS", workers)
    path = tmp_path / "run.jsonl"
    _write(path, 3000)
    block = runlog._Reader.block
    gate = threading.Event()

    def held(self: object, *args: object) -> bool:  # the read waits at its first block
        assert gate.wait(30)
        return block(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(runlog._Reader, "block", held)
    ready = threading.Event()
    thread = threading.Thread(target=early.read_ahead, args=(str(path), ready))
    thread.start()
    assert ready.wait(30)
    assert early._key(path) in early._pending  # registered before
    entry = early._pending[early._key(path)]
    assert not entry.done.is_set()  # and the read not over
    gate.set()
    thread.join(30)
    got = early.claim(path, runlog.MIN_BYTES)
    assert got is not None and _steps(got.wait()) == list(range(1, 3001))


def test_the_caller_goes_on_at_once_for_a_file_not_read_early(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a run log\n" * 10)
    ready = threading.Event()
    early.read_ahead(str(path), ready)
    assert ready.is_set() and not early.pending()
