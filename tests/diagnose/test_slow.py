"""Why is it slow: ``diagnose`` splits a slow run's step time into data wait, memory
pressure (allocator retries), a straggler rank and the rest, from what the log has, and
names the cause the largest share points at; a slowdown the log cannot split is told
with its breakdown, not blamed on a cause. The tables use the column names people log
(``iter_time``, ``tokens_per_sec``, ``data_wait_s``, ``gpu_mem_gb``)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

runner = CliRunner()
_register_commands()


def _table(path: Path, *, retries: bool, data: bool) -> Path:
    """600 steps whose step time doubles at step 300 (throughput halves), with the data
    wait, the allocator's retries, or neither growing with it."""
    rng = random.Random(0)
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["step", "loss", "iter_time", "tokens_per_sec", "data_wait_s",
                      "num_alloc_retries", "gpu_mem_gb"])
        count = 0
        for step in range(600):
            slow = step >= 300
            t = (2.0 if slow else 1.0) * (1 + 0.05 * rng.random())
            wait = (0.9 if slow and data else 0.01) * (1 + 0.05 * rng.random())
            count += int(slow and retries)
            out.writerow([step, 3.0 - step * 1e-3, t, 1000.0 / t, wait, count,
                          70.0 + (5.0 if slow else 0.0)])
    return path


def _diagnose(path: Path) -> tuple[int, dict]:
    res = runner.invoke(app, ["diagnose", str(path), "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


@pytest.mark.parametrize(
    ("retries", "data", "cause", "bottleneck"),
    [(True, False, "memory-pressure", "memory pressure"),
     (False, True, "data-stall", "data wait")],
)
def test_the_largest_share_of_a_slowdown_names_its_cause(
    tmp_path: Path, retries: bool, data: bool, cause: str, bottleneck: str
) -> None:
    code, doc = _diagnose(_table(tmp_path / "run.csv", retries=retries, data=data))
    assert code == 1 and doc["summary"]["question"] == "slow"
    first = doc["causes"][0]
    assert first["cause"] == cause
    assert abs(first["first_step"] - 300) <= 30  # the slowdown began at step 300
    ranked = doc["summary"]["bottlenecks"]
    assert ranked[0]["name"] == bottleneck and ranked[0]["share"] >= 0.5
    assert [b["share"] for b in ranked] == sorted((b["share"] for b in ranked), reverse=True)


def test_a_slowdown_the_log_cannot_split_is_told_not_blamed(tmp_path: Path) -> None:
    code, doc = _diagnose(_table(tmp_path / "run.csv", retries=False, data=False))
    assert doc["causes"] == [] and code == 0
    assert [s["code"] for s in doc["symptoms"]] == ["R061"]
    (only,) = doc["summary"]["bottlenecks"]
    assert only["name"] == "compute or communication" and only["cause"] is None
    # told with what could produce it and the tests that would decide
    (question,) = doc["summary"]["open"]
    assert question["code"] == "R061" and "data-stall" in question["could_be"]
    assert question["to_decide"]
    text = runner.invoke(app, ["diagnose", str(tmp_path / "run.csv")]).output
    assert "compute or communication" in text


def test_a_straggler_rank_is_the_slow_runs_hardware(tmp_path: Path) -> None:
    """The cross-rank pass found one rank persistently slower (X002): every rank waits
    for it at each collective, and the split names it (the hardware cause)."""
    from sapper.diagnose.slow import slow_verdicts
    from sapper.logs import read_log
    from sapper.pipeline.logs import analyze_logs
    from sapper.rules.registry import get_rule

    (analysis,) = analyze_logs([read_log(_table(tmp_path / "run.csv", retries=False,
                                                data=False))], None, [], [])
    analysis.findings.append(get_rule("X002").finding(
        "rank 3 is 40% slower than the others", step=320, rank=3))
    verdicts, ranked = slow_verdicts([analysis])
    assert ranked[0].name == "straggler rank"
    assert [v.cause for v in verdicts] == ["hardware"]
