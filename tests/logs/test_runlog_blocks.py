"""The columnar run-log reader on logs of plain step lines in many blocks: each field's
blocks put end to end (or scattered around the rows the streaming parser reads) give
the records, attempts and findings the streaming reader and detectors give, whether a
field is on every line, on some lines only, or first appears blocks into the log."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.logs.columnar import read_columnar, runlog
from sapper.logs.columnar.twins import engine
from sapper.runtime.detectors import default_detectors
from sapper.runtime.records import StepRecord
from sapper.runtime.runlog import RunLogWriter


def _records(n: int, *, gaps: bool, nan_at: int | None) -> list[StepRecord]:
    """A training curve with a spike; ``gaps``: the gradient norm missing on some lines
    and the token count only from the middle on (whole blocks without it)."""
    rng = np.random.default_rng(3)
    out = []
    for k in range(n):
        step = k + 1
        loss = 2.0 + 6.0 * math.exp(-step / 300) + float(rng.normal(0, 0.01))
        grad: float | None = 0.5 + abs(float(rng.normal(0, 0.02)))
        if step == n // 2:
            loss, grad = loss * 3, 40.0
        if gaps and step % 7 == 0:
            grad = None
        out.append(
            StepRecord(
                step=step,
                loss=math.nan if step == nan_at else loss,
                grad_norm=grad,
                lr=3e-4,
                step_time_s=0.2 + float(rng.random()) * 0.01,
                tokens=None if gaps and step < n // 2 else 4096,
                tokens_per_s=None if step == nan_at else 20000.0 + float(rng.normal(0, 100)),
            )
        )
    return out


def _same_values(a: StepRecord, b: StepRecord) -> bool:
    fa = {k: "nan" if isinstance(v, float) and v != v else v for k, v in a.__dict__.items()}
    fb = {k: "nan" if isinstance(v, float) and v != v else v for k, v in b.__dict__.items()}
    return fa == fb and {k: type(v) for k, v in a.__dict__.items()} == {
        k: type(v) for k, v in b.__dict__.items()
    }


@pytest.mark.parametrize("gaps", [False, True])
@pytest.mark.parametrize("nan_at", [None, 1234])
@pytest.mark.parametrize("workers", [1, 2])
def test_plain_blocks_read_as_the_streaming_reader_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gaps: bool, nan_at: int | None,
    workers: int,
) -> None:
    """Also the detectors one after another or two at once (as on a long log): the
    same findings in the same order."""
    n = 3000
    monkeypatch.setattr(runlog, "BLOCK_BYTES", 20_000)  # some twenty blocks
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)
    monkeypatch.setattr(engine, "TWIN_WORKERS", workers)
    monkeypatch.setattr(engine, "PARALLEL_ROWS", 0)
    monkeypatch.setattr(engine, "_core_free", lambda: True)  # whatever the machine's load
    path = tmp_path / "run.jsonl"
    writer = RunLogWriter(path, meta={"run": "blocks"})
    writer.write_steps(_records(n, gaps=gaps, nan_at=nan_at))
    writer.close()
    expected = read_log(path)
    got = read_columnar(path, "sapper", min_bytes=0)
    assert got is not None and got.columns is not None
    assert len(got.records) == len(expected.records) == n
    assert all(_same_values(a, b) for a, b in zip(got.records, expected.records, strict=True))
    assert got.attempts == expected.attempts
    assert got.notes == expected.notes
    cols = got.columns
    for name, values in cols.values.items():  # NaN wherever a row lacks the field
        assert np.isnan(values[~cols.present[name]]).all(), name
    if gaps:  # the fields that are not on every line say where they are
        assert not cols.present["grad_norm"][6::7].any()
        assert cols.present["grad_norm"][:6].all()
        assert not cols.present["tokens"][: n // 2 - 1].any()
        assert cols.present["tokens"][n // 2 - 1 :].all()
    if nan_at is not None:
        assert cols.present["loss"][nan_at - 1] and math.isnan(cols.values["loss"][nan_at - 1])
    streaming = analyze_log(expected, default_detectors())
    columnar = analyze_log(got, default_detectors())
    key = [(f.code, f.step, f.message) for f in streaming.findings]
    assert [(f.code, f.step, f.message) for f in columnar.findings] == key
    assert any(f.step == n // 2 for f in columnar.findings)  # the spike is found
    assert columnar.unevaluated == streaming.unevaluated


def test_columns_grow_past_the_first_blocks_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first block's long lines (steps with a long extra, read by the streaming
    parser) make the rows per byte look few: the columns grow as the short lines after
    them come, and hold the same records."""
    monkeypatch.setattr(runlog, "BLOCK_BYTES", 20_000)
    monkeypatch.setattr(runlog, "SPECIAL_SHARE", 1.0)  # the columnar path, whatever the mix
    records = _records(4000, gaps=True, nan_at=None)
    for rec in records[:40]:
        rec.extra["note"] = "x" * 1500
    path = tmp_path / "run.jsonl"
    writer = RunLogWriter(path)
    writer.write_steps(records)
    writer.close()
    grown: list[int] = []
    reserve = runlog._Store.reserve

    def watch(store: runlog._Store, rows: int) -> None:
        before = store.cap
        reserve(store, rows)
        if before and store.cap > before:
            grown.append(store.cap)

    monkeypatch.setattr(runlog._Store, "reserve", watch)
    expected = read_log(path)
    got = read_columnar(path, "sapper", min_bytes=0)
    assert got is not None
    assert grown  # the estimate was too low and the columns grew
    assert all(_same_values(a, b) for a, b in zip(got.records, expected.records, strict=True))
    assert len(got.records) == len(expected.records)
    assert got.notes == expected.notes


@pytest.mark.parametrize("k", [1, 2, 7, 300])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_few_parsed_lines_go_where_a_sort_of_every_line_puts_them(k: int, seed: int) -> None:
    """The lines the streaming parser read (a meta line, a NaN spelled as a string, a
    step with extras) placed among the plain rows by a binary search each: the rows,
    runs and merged values a sort of every row's line gives."""
    rng = np.random.default_rng(seed)
    lines = rng.permutation(5000)[: 2000 + k]
    full_lines = np.sort(lines[:k])
    plain_lines = np.sort(lines[k:])
    if seed:  # a parsed line first (the meta line) and last
        full_lines[0] = -1
        full_lines[-1] = 10_000
        full_lines = np.sort(full_lines)
    n = len(plain_lines) + k
    order = np.argsort(np.concatenate([plain_lines, full_lines]), kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    few = runlog._few_between(plain_lines, full_lines)
    assert few is not None
    full_rows, runs = few
    assert np.array_equal(full_rows, rank[len(plain_lines) :])
    assert runs == runlog._runs(rank[: len(plain_lines)])
    merged = runlog._merged(plain_lines, full_lines, full_rows, runs, n)
    assert np.array_equal(merged, np.sort(np.concatenate([plain_lines, full_lines])))
    room = np.full(n + 3, -7, dtype=np.int64)  # the store's array: its rows, then room
    room[: len(plain_lines)] = plain_lines
    assert np.array_equal(runlog._spread(room, runs, full_rows, full_lines, n), merged)
    assert runlog._few_between(plain_lines, full_lines[::-1]) is None or k == 1
