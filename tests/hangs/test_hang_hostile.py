"""Dumps from an untrusted place: nothing in them runs, a hostile one is refused with one
line and exit 2, in bounded time and memory."""

from __future__ import annotations

import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.errors import InputError
from sapper.hangs import diagnose_hang
from sapper.hangs import dumps as dumps_module
from sapper.unpickle import Vocabulary, restricted_loads

DATA = Path(__file__).parent / "data"
runner = CliRunner()
_register_commands()


class Evil:
    """Runs ``touch marker`` when unpickled by ``pickle.load``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def job_with(tmp: Path, rank0: bytes) -> Path:
    """The skip_allreduce job with rank 0's dump replaced."""
    folder = tmp / "job"
    shutil.copytree(DATA / "skip_allreduce", folder)
    (folder / "nccl_trace_rank_0").write_bytes(rank0)
    return folder


def refused(folder: Path, text: str) -> None:
    result = runner.invoke(app, ["diagnose", str(folder)])
    assert result.exit_code == 2, result.output
    assert text in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "nccl_trace_rank_0" in result.output


def real_dump() -> dict[str, Any]:
    path = DATA / "skip_allreduce" / "nccl_trace_rank_0"
    return restricted_loads(path.read_bytes(), Vocabulary(), str(path))


def test_a_dump_that_would_run_a_command_never_runs_it(tmp_path):
    marker = tmp_path / "ran"
    dump = real_dump()
    dump["entries"][0]["frames"] = [Evil(marker)]
    folder = job_with(tmp_path, pickle.dumps(dump))
    refused(folder, "refused to unpickle")
    with pytest.raises(InputError, match=r"refused to unpickle.*system"):
        diagnose_hang(folder)
    assert not marker.exists()


def test_pg_config_ranks_are_never_evaluated(tmp_path):
    """torch's own analyzer ``eval``s pg_config's ranks string; sapper reads a list."""
    marker = tmp_path / "ran"
    dump = real_dump()
    dump["pg_config"] = {"0": {"name": "0", "desc": "default_pg",
                               "ranks": f"__import__('os').system('touch {marker}')"}}
    refused(job_with(tmp_path, pickle.dumps(dump)), "pg_config.0.ranks")
    assert not marker.exists()


def test_damaged_dumps_are_one_line(tmp_path):
    good = (DATA / "skip_allreduce" / "nccl_trace_rank_0").read_bytes()
    refused(job_with(tmp_path / "a", good[: len(good) // 2]), "not a readable pickle")
    dump = real_dump()
    dump["entries"] = "everything"
    refused(job_with(tmp_path / "b", pickle.dumps(dump)), "entries")
    dump = real_dump()
    dump["entries"][2]["input_sizes"] = [["8"]]
    refused(job_with(tmp_path / "c", pickle.dumps(dump)), "entries[2].input_sizes")
    dump = real_dump()
    dump["entries"][1]["collective_seq_id"] = "1; rm -rf /"
    refused(job_with(tmp_path / "d", pickle.dumps(dump)), "entries[1].collective_seq_id")


def test_deep_nesting_is_refused(tmp_path):
    """200k nested lists where a frame's list should be; 500k MARKs that never close."""
    dump = real_dump()
    dump["entries"][0]["frames"] = "SENTINEL"
    data = pickle.dumps(dump, protocol=4)
    # EMPTY_LIST x N, then APPEND each into the one below: one list 200k deep, in place
    # of the sentinel string (SHORT_BINUNICODE of 8 characters).
    nested = b"]" * 200_000 + b"a" * 199_999
    hostile = data.replace(b"\x8c\x08SENTINEL", nested, 1)
    assert hostile != data
    refused(job_with(tmp_path / "a", hostile), "entries[0].frames")
    refused(job_with(tmp_path / "b", b"\x80\x04" + b"(" * 500_000 + b"."), "not a readable")


def test_shared_references_cannot_make_reading_unbounded(tmp_path):
    """A 0.5 MB pickle whose shared references make billions of values (150k entries, each
    with 100k frames and 4096 shapes): only the few entries kept are read whole, so the
    answer comes in seconds."""
    dump = real_dump()
    frame = dump["entries"][0]["frames"][0]
    shape = [1] * 64
    entry = {**dump["entries"][0], "frames": [frame] * 100_000, "input_sizes": [shape] * 4096}
    dump["entries"] = [entry] * 150_000
    folder = job_with(tmp_path, pickle.dumps(dump))
    start = time.perf_counter()
    result = runner.invoke(app, ["diagnose", str(folder), "--format", "json"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert time.perf_counter() - start < 20


def test_the_reading_budget_refuses_a_dump_past_it(tmp_path, monkeypatch):
    monkeypatch.setattr(dumps_module, "MAX_WORK", 50)
    refused(DATA / "skip_allreduce", "larger than any torch writes")


def test_a_file_past_the_size_limit_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(dumps_module, "MAX_DUMP_BYTES", 1000)
    refused(job_with(tmp_path, b"\x80\x04" + b"\0" * 5000), "file too large")
