"""Real multi-process jobs (gloo on CPU, world size 2 and 4): each fault is named with its
rank and step on rank 0, clean runs report nothing, and a lost rank never hangs the rest."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from distlaunch import Job, run_torchrun

from sapper.distributed import DIST_KEY, RankTable
from sapper.runtime.records import StepRecord

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def only(job: Job, *codes: str) -> dict[str, dict]:
    """Rank 0 reported exactly ``codes`` (once each); every other rank reported nothing."""
    found = job.codes(0)
    assert sorted(found) == sorted(codes), (found, job.rank(0)["findings"])
    for r in job.results:
        if r != 0:
            assert job.codes(r) == [], (r, job.rank(r)["findings"])
    return {f["code"]: f for f in job.rank(0)["findings"]}


def test_nan_on_one_rank_names_the_rank_and_step(job) -> None:
    j = job(4, {"steps": 9, "every": 3, "nan_rank": 2, "nan_step": 4})
    assert j.returncodes == [0, 0, 0, 0], j.explain()
    f = only(j, "X001")["X001"]
    assert (f["rank"], f["step"]) == (2, 4)
    assert f["data"]["what"]["2"] == "loss"
    assert f["message"].startswith("rank 2: loss became non-finite at step 4")


def test_slow_data_rank_and_replica_out_of_sync(job) -> None:
    j = job(
        4,
        {
            "steps": 12,
            "every": 3,
            "slow_rank": 1,
            "slow_data_s": 0.04,
            "desync_rank": 3,
            "desync_step": 4,
        },
    )
    assert j.returncodes == [0, 0, 0, 0], j.explain()
    got = only(j, "X002", "X003")
    slow = got["X002"]
    assert slow["rank"] == 1 and slow["data"]["metric"] == "data_time_s"
    assert slow["data"]["seconds"] >= 0.04
    assert slow["value"] > 1.5
    drift = got["X003"]
    assert drift["rank"] == 3 and drift["step"] == 5  # the first exchange after step 4
    assert drift["data"]["last_agreed_step"] == 2


def test_unsharded_sampler_and_slow_forward(job) -> None:
    j = job(
        2,
        {"steps": 9, "every": 3, "unsharded": True, "slow_forward_rank": 1, "slow_forward_s": 0.03},
    )
    assert j.returncodes == [0, 0], j.explain()
    got = only(j, "X004", "X002")
    assert got["X004"]["data"]["ranks"] == [0, 1]
    assert got["X004"]["value"] == pytest.approx(1.0)
    assert got["X004"]["step"] == 2  # found at the first exchange
    assert got["X002"]["rank"] == 1 and got["X002"]["data"]["metric"] == "forward_time_s"


def test_crashed_rank_is_named_and_the_others_finish(job) -> None:
    j = job(4, {"steps": 6, "every": 3, "die_rank": 3, "die_step": 5, "timeout_s": 30})
    assert j.returncodes[:3] == [0, 0, 0] and j.returncodes[3] == 17, j.explain()
    f = only(j, "X005")["X005"]
    assert f["rank"] == 3 and f["step"] == 5 and f["data"]["ranks"] == [3]
    assert "last at step 2" in f["message"]
    for r in range(3):
        res = j.rank(r)
        assert res["active"] is False  # cross-rank checks stopped
        assert res["exchange_s"][-1] < 10  # a crash is seen at once, not after the timeout


def test_hung_rank_costs_at_most_the_timeout(job) -> None:
    j = job(
        2,
        {
            "steps": 6,
            "every": 3,
            "wrap": "none",
            "checksum": False,
            "hang_rank": 1,
            "hang_step": 4,
            "hang_s": 5,
            "timeout_s": 1.5,
        },
    )
    assert j.returncodes == [0, 0] and not j.killed, j.explain()
    f = only(j, "X005")["X005"]
    assert f["rank"] == 1 and f["data"]["timed_out"] is True
    waited = j.rank(0)["exchange_s"][-1]
    assert 1.4 <= waited < 4.0  # bounded by the timeout (+ a short grace), not the hang


def test_process_groups_against_plan_and_tp_aware_sampling(job) -> None:
    # TP=2 · DP=2 on 4 ranks, but the "nodes" interleave ranks (0,2 | 1,3): every TP
    # group spans two nodes. TP peers share samples (legitimate); DP ranks do not.
    plan = {"parallel": {"tp": 2}, "hardware": {"gpus_per_node": 2}}
    j = job(
        4,
        {
            "steps": 6,
            "every": 3,
            "plan": plan,
            "dp_size": 2,
            "dp_rank_of": {"0": 0, "1": 0, "2": 1, "3": 1},
        },
        node_of=[0, 1, 0, 1],
    )
    assert j.returncodes == [0, 0, 0, 0], j.explain()
    got = only(j, "X007", "X008")
    assert "not contiguous" in got["X007"]["message"]
    assert got["X008"]["data"]["group"] == [0, 1]
    assert j.rank(0)["layout"]["data"] == [[0, 2], [1, 3]]


def test_fsdp2_global_grad_norm_equals_single_process(job) -> None:
    j = job(2, {"steps": 3, "every": 3, "wrap": "fsdp", "model": "llama", "check_grad_norm": True})
    assert j.returncodes == [0, 0], j.explain()
    only(j)
    for r in (0, 1):
        for sapper_norm, reference, local_only in j.rank(r)["norms"]:
            assert sapper_norm == pytest.approx(reference, rel=1e-5)
            assert abs(local_only - reference) > 1e-3  # the naive shard norm is wrong
    assert j.rank(0)["layout"]["param"] == []  # fully sharded: no replicas to compare
    # clip_grad_norm_'s DTensor norm is logged as the global value on every rank
    table = RankTable.from_extra(j.rank(0)["records"][-1]["extra"][DIST_KEY])
    last = j.rank(0)["norms"][-1][0]
    assert table is not None and table.col("grad_norm") == pytest.approx([last, last])


def test_clean_run_under_torchrun(tmp_path: Path) -> None:
    j = run_torchrun(tmp_path, 2, {"steps": 6, "every": 3})
    assert j.returncodes == [0], j.explain()
    only(j)
    records = j.rank(0)["records"]
    assert [r["step"] for r in records] == [2, 5]
    assert j.rank(1)["records"] == []  # only rank 0 keeps the main log
    rec = StepRecord.from_json(records[-1])
    table = RankTable.from_extra(rec.extra[DIST_KEY])
    assert table is not None and table.world_size == 2
    assert table.col("tokens") == [3 * 4 * 17.0] * 2  # 3 steps of 4 sequences of 17
    assert rec.tokens == 2 * 3 * 4 * 17  # summed over the data-parallel ranks
    assert rec.step_time_s == max(table.col("step_time_s"))


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed (optional)"
)
def test_deepspeed_engine_clean_run(job) -> None:
    j = job(2, {"steps": 6, "every": 3, "wrap": "deepspeed", "zero": 2}, timeout_s=240)
    assert j.returncodes == [0, 0], j.explain()
    only(j)
    rec = StepRecord.from_json(j.rank(0)["records"][-1])
    table = RankTable.from_extra(rec.extra[DIST_KEY])
    assert table is not None
    norms = table.col("grad_norm")
    assert norms[0] is not None and norms[0] == pytest.approx(norms[1])  # engine's norm
    assert table.col("checksum")[0] == table.col("checksum")[1]  # ZeRO-2 replicas agree


def test_live_monitor_under_ddp_names_the_rank_and_only_rank0_logs(job) -> None:
    j = job(2, {"steps": 9, "every": 3, "monitor": True, "nan_rank": 1, "nan_step": 4})
    assert j.returncodes == [0, 0], j.explain()
    x = [f for f in j.rank(0)["findings"] if f["code"].startswith("X")]
    assert [(f["code"], f["rank"], f["step"]) for f in x] == [("X001", 1, 4)]
    assert not [f for f in j.rank(1)["findings"] if f["code"].startswith("X")]
    assert j.rank(0)["run_log"] and not j.rank(1)["run_log"]  # one main run log
    logged = [r for r in j.rank(0)["records"] if DIST_KEY in r.get("extra", {})]
    assert [r["step"] for r in logged] == [2, 5, 8]  # the exchange boundaries
    table = RankTable.from_extra(logged[0]["extra"][DIST_KEY])
    assert table is not None and table.col("samples_hashed") == [12.0, 12.0]


def test_rank0_crash_is_reported_by_rank1(job) -> None:
    # Outside torchrun rank 0 also hosts the job's store: no heartbeats to read.
    j = job(2, {"steps": 6, "every": 3, "die_rank": 0, "die_step": 5, "timeout_s": 30})
    assert j.returncodes == [17, 0], j.explain()
    [f] = j.rank(1)["findings"]
    assert (f["code"], f["step"]) == ("X005", 5)
    assert "store is unreachable" in f["message"] and "by peer" in f["message"]
