"""The reduced exchange (the default above 64 ranks) on real gloo jobs: the same findings
as the all-gather where both apply, bounded waits, and stragglers that are real."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "monitor"))
from loadgen import competing_load

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

REDUCED = {"detail_ranks": 0}  # the reduced exchange only, as at 16k ranks


def found(job, r: int = 0) -> list[tuple[str, int | None, int | None]]:
    return sorted((f["code"], f["rank"], f["step"]) for f in job.rank(r)["findings"])


def quiet_elsewhere(job) -> None:
    for r in job.results:
        if r != 0:
            assert job.rank(r)["findings"] == [], (r, job.rank(r)["findings"])


@pytest.mark.parametrize("opts", [{}, REDUCED], ids=["gather", "reduce"])
def test_both_exchanges_name_the_same_ranks(job, opts) -> None:
    # rank 3's weights knocked off at step 4, a slow loader on rank 1, a NaN on rank 2
    j = job(4, {"steps": 12, "every": 3, "nan_rank": 2, "nan_step": 10, "slow_rank": 1,
                "slow_data_s": 0.04, "desync_rank": 3, "desync_step": 4, **opts})
    assert j.returncodes == [0, 0, 0, 0], j.explain()
    assert found(j) == [("X001", 2, 10), ("X002", 1, 8), ("X003", 3, 5)], j.rank(0)["findings"]
    quiet_elsewhere(j)
    x001 = next(f for f in j.rank(0)["findings"] if f["code"] == "X001")
    assert x001["message"].startswith("rank 2: loss became non-finite at step 10")
    last = j.rank(0)["records"][-1]["extra"]["dist"]
    assert ("named" in last) == bool(opts) and last["stats"]["world_size"] == 4


def test_reduce_finds_duplicate_samples_and_a_slow_forward(job) -> None:
    j = job(2, {"steps": 9, "every": 3, "unsharded": True, "slow_forward_rank": 1,
                "slow_forward_s": 0.03, **REDUCED})
    assert j.returncodes == [0, 0], j.explain()
    got = {f["code"]: f for f in j.rank(0)["findings"]}
    assert sorted(got) == ["X002", "X004"], j.rank(0)["findings"]
    assert got["X004"]["data"]["ranks"] == [0, 1] and got["X004"]["step"] == 2
    assert got["X004"]["value"] == pytest.approx(1.0)
    assert got["X002"]["rank"] == 1 and got["X002"]["data"]["metric"] == "forward_time_s"


def test_reduce_wait_is_bounded_when_a_rank_hangs(job) -> None:
    j = job(2, {"steps": 6, "every": 3, "wrap": "none", "checksum": False, "hang_rank": 1,
                "hang_step": 4, "hang_s": 5, "timeout_s": 1.5, **REDUCED})
    assert j.returncodes == [0, 0] and not j.killed, j.explain()
    [f] = j.rank(0)["findings"]
    assert f["code"] == "X005" and f["rank"] == 1 and f["data"]["timed_out"] is True
    assert 1.4 <= j.rank(0)["exchange_s"][-1] < 4.0


def test_healthy_ranks_under_cpu_load_are_not_stragglers(job) -> None:
    with competing_load("bursts"):
        j = job(3, {"steps": 21, "every": 3, **REDUCED}, timeout_s=120)
    assert j.returncodes == [0, 0, 0], j.explain()
    assert j.rank(0)["findings"] == [] and len(j.rank(0)["records"]) == 7
    quiet_elsewhere(j)


def test_a_rank_slower_by_half_a_step_every_step_is_named(job) -> None:
    # the forward of rank 1 sleeps ~ the others' whole step: half of its own step
    j = job(3, {"steps": 18, "every": 3, "slow_forward_rank": 1, "slow_forward_s": 0.02,
                **REDUCED})
    assert j.returncodes == [0, 0, 0], j.explain()
    [f] = j.rank(0)["findings"]
    assert (f["code"], f["rank"]) == ("X002", 1) and f["data"]["windows"] == 3
    assert f["data"]["metric"] == "forward_time_s"


def test_per_rank_run_logs_give_the_cross_rank_findings_offline(job, tmp_path) -> None:
    from typer.testing import CliRunner

    from sapper.cli.app import _register_commands, app

    _register_commands()

    j = job(2, {"steps": 9, "every": 3, "monitor": True, "nan_rank": 1, "nan_step": 4,
                "per_rank_log": True})
    assert j.returncodes == [0, 0], j.explain()
    logs = tmp_path / "out" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    res = CliRunner().invoke(app, ["analyze", str(logs), "--format", "json"])
    assert res.exit_code == 1, res.output
    findings = json.loads(res.output)["findings"]
    offline = [f for f in findings if f["source"].endswith("rank*.jsonl (2 ranks)")]
    x001 = [f for f in offline if f["code"] == "X001"]
    assert [(f["rank"], f["step"]) for f in x001] == [(1, 4)], offline
    # the live finding is in rank 0's log too; the per-rank findings stay with each rank
    live = [f for f in findings if f["code"] == "X001" and f not in offline]
    assert [(f["rank"], f["step"]) for f in live] == [(1, 4)]
    assert "rank 1: loss became non-finite at step 4" in x001[0]["message"]
