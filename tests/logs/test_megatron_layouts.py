"""The streaming Megatron reader's learned line layouts (``MegatronParser._by_layout``)
against its segment-by-segment reading (``max_layouts = 0``): the same records, notes,
meta and attempts on generated logs with every feature the forks print (time stamps,
prefixes, CRLF, seconds and milliseconds, MoE losses, colon-less early lines, a value
that is not a number, a key twice, NaN and all-skipped intervals, validation, memory and
timer lines, a restart), on damaged lines, at any batch size."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tests.logs.hostile import mutate_lines
from tests.logs.test_megatron_columnar import MEGATRON_LOGS, megatron_log

from sapper.logs import MegatronParser
from sapper.runtime.records import StepRecord


def _read(lines: list[str], batch: int, *, layouts: bool) -> tuple[MegatronParser, list[Any]]:
    parser = MegatronParser("train.log")
    if not layouts:
        parser.max_layouts = 0
    records: list[StepRecord] = []
    for i in range(0, len(lines), batch):
        records += parser.feed(lines[i : i + batch])
    records += parser.finish()
    return parser, [json.dumps(r.to_json(), sort_keys=True) for r in records]


def _assert_same(lines: list[str], batch: int) -> MegatronParser:
    fast, got = _read(lines, batch, layouts=True)
    slow, expected = _read(lines, batch, layouts=False)
    assert got == expected
    assert fast.notes == slow.notes
    assert fast.meta == slow.meta
    assert fast.attempts == slow.attempts
    return fast


@pytest.mark.parametrize("seed", range(8))
def test_generated_logs_read_the_same(seed: int) -> None:
    lines = megatron_log(seed, 1500, spike=300, nan=500, quiet_nan=560, collapse=800,
                         restart=1100, resume=950).split("\n")
    parser = _assert_same(lines, random.Random(seed).choice([1, 7, 100, 1000]))
    assert parser._layouts  # the lines were read by layout, not all segment by segment
    records = _read(lines, 1000, layouts=True)[1]
    assert any('"loss": "nan"' in r for r in records)  # the NaN interval is there


@pytest.mark.parametrize("path", MEGATRON_LOGS, ids=lambda p: p.name)
def test_every_megatron_log_reads_the_same(path: Path) -> None:
    text = path.read_bytes().decode("utf-8", errors="replace")
    _assert_same(text.split("\n"), 1000)


@pytest.mark.parametrize("seed", range(6))
def test_damaged_lines_read_the_same(seed: int) -> None:
    rng = random.Random(seed)
    lines = megatron_log(seed, 600, spike=100, nan=200, quiet_nan=250, collapse=300,
                         restart=450, resume=380).split("\n")
    share = rng.choice([0.02, 0.2, 0.6])
    body = [
        mutate_lines(rng, [line], "megatron", keep=0)[0] if rng.random() < share else line
        for line in lines[8:]
    ]
    _assert_same(lines[:8] + body, rng.choice([1, 50, 1000]))


def test_odd_values_in_a_learned_layout_read_the_same() -> None:
    """Lines of a learned layout whose values are not plain: NaN and inf spellings, a
    negative or fractional count, a count past int64, a word, padding, a step too long."""
    line = (" iteration {step:8d}/  200000 | consumed samples: {samples} | elapsed time per "
            "iteration (ms): 850.1 | learning rate: 1.0E-04 | global batch size:   {gbs} | "
            "lm loss: {loss} | loss scale: 1.0 | grad norm: {norm} | number of skipped "
            "iterations: {skipped} | number of nan iterations: {nan} |")
    base = dict(samples="256", gbs="256", loss="2.5E+00", norm="0.400", skipped="  0",
                nan="  0")
    odd = [
        {}, {"loss": "nan"}, {"loss": "-inf"}, {"loss": " Infinity "}, {"norm": "n/a"},
        {"skipped": " -1"}, {"skipped": "0.5"}, {"nan": "1e30"}, {"nan": "nan"},
        {"gbs": "-4"}, {"gbs": "2.5"}, {"samples": "1_000"}, {"norm": "1" * 1200},
        {"loss": ""}, {"norm": " "}, {}, {"skipped": "  3"}, {"nan": "  1", "loss": "nan"},
    ]
    lines = [line.format(step=10 * (i + 1), **{**base, **o}) for i, o in enumerate(odd)]
    lines.append(line.format(step=10**25, **base))
    lines.append(line.format(step=500, **base).replace("lm loss: 2.5E+00 |", ""))
    parser = _assert_same(lines, 4)
    assert parser._layouts


def test_a_new_layout_every_line_reads_the_same() -> None:
    """Past ``max_layouts`` the lines are read segment by segment; the records agree."""
    lines = [
        f" iteration {i:8d}/  1000 | lm loss: 2.5E+00 | key{i}: 1.0 | grad norm: 0.4 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |"
        for i in range(1, 200)
    ]
    parser = _assert_same(lines, 10)
    assert parser._learned == MegatronParser.max_layouts
