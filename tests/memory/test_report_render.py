"""``sapper memory`` text at 80 columns: every stage of a deep pipeline is shown, no cell
is clipped to "…", micro-batches in flight read as exact counts or fractions."""

from __future__ import annotations

import io
import re
from fractions import Fraction
from pathlib import Path

import pytest
from rich.console import Console

from sapper.memory.estimate import estimate
from sapper.memory.report import fmt_in_flight, render_memory
from sapper.memory.verdict import verdict
from sapper.plan.load import load_plan
from sapper.plan.schema import Plan

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "examples" / "plans"


def _text(plan: Plan, width: int = 80) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    console.print(render_memory(plan, verdict(plan)))
    return out.getvalue()


def _stage_rows(text: str) -> dict[int, list[str]]:
    """The per-stage table's rows: stage number -> its cells."""
    rows: dict[int, list[str]] = {}
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["stage", "layers",
                                                                         "in"])
    for line in lines[start + 1:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows[int(cells[0])] = cells
    return rows


@pytest.mark.parametrize(
    ("name", "pp"),
    [("published-llama3-405b.yaml", 16), ("published-megatron-gpt-1t.yaml", 64)],
)
def test_deep_pipelines_stay_readable_at_80_columns(name: str, pp: int) -> None:
    plan = load_plan(PLANS / name).plan
    assert plan.parallel.pp == pp
    text = _text(plan)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    rows = _stage_rows(text)
    assert sorted(rows) == list(range(pp))  # every stage, in order
    est = estimate(plan)
    for s in est.stages:
        cells = rows[s.stage]
        assert int(cells[1]) == s.layers
        assert Fraction(cells[2]) == Fraction(s.in_flight).limit_denominator(max(s.layers, 1))
        assert re.fullmatch(r"\d+(/\d+)?", cells[2])  # never 3.4999
    assert rows[est.peak_stage][-1] == "◀"  # the peak stage is marked


def test_pp32_variant_fits_too() -> None:
    plan = load_plan(PLANS / "published-llama3-405b.yaml").plan
    plan = plan.model_copy(deep=True)
    plan.parallel.pp = 32
    plan.parallel.first_stage_layers = None
    plan.parallel.last_stage_layers = None
    text = _text(plan)
    assert "…" not in text
    assert sorted(_stage_rows(text)) == list(range(32))


def test_single_stage_keeps_the_category_table() -> None:
    text = _text(load_plan(PLANS / "healthy-llama-7b.yaml").plan)
    assert "…" not in text
    assert "optimizer states" in text and "share" in text


def test_fractions_are_exact() -> None:
    assert fmt_in_flight(4.0, 8) == "4"
    assert fmt_in_flight(3.5, 8) == "7/2"
    assert fmt_in_flight(157 / 7, 7) == "157/7"
    assert fmt_in_flight(3.4999999999999996, 8) == "7/2"


def test_memory_report_names_the_deepspeed_sizes_and_their_source() -> None:
    """A real HF Trainer ZeRO-2 config (tests/fixtures/deepspeed/hf-trainer-zero2.json)
    with a published 7B plan: its 2·10^8 buckets are reported as set."""
    ds = ROOT / "tests" / "fixtures" / "deepspeed" / "hf-trainer-zero2.json"
    plan = load_plan(PLANS / "healthy-llama-7b.yaml", deepspeed=ds).plan
    plan = plan.model_copy(deep=True)
    plan.parallel.zero_stage = 2
    text = _text(plan)
    assert "DeepSpeed ZeRO-2 sizes used" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("reduce_bucket_size"))
    assert "200,000,000" in line and "given" in line
    default = next(ln for ln in text.splitlines() if "allgather_bucket_size" in ln)
    assert "200,000,000" in default  # the file sets both
