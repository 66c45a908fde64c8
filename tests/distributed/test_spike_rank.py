"""X010: the rank whose bad batch made a huge but finite loss — named under real
multi-process DDP jobs (gloo on CPU), with its samples; quiet on healthy runs and on a
spike every rank shares; the detector's thresholds on hand-made tables."""

from __future__ import annotations

from typing import Any

import pytest
from test_cross_rank_detectors import rec, table
from test_multiprocess import only

from sapper.distributed import RankTable
from sapper.distributed.detectors import SpikeRankDetector, spike_suspects

#: Exchanges at steps 2, 5, 8, 11: two windows of history before the spike at step 7.
RUN = {"steps": 12, "every": 3}
SPIKE = {**RUN, "spike_step": 7, "spike_factor": 1e3}


def _spike(j: Any, rank: int) -> dict[str, Any]:
    assert j.returncodes == [0] * len(j.returncodes), j.explain()
    f = only(j, "X010")["X010"]
    assert (f["rank"], f["step"]) == (rank, 7), f["message"]
    assert f["data"]["metric"] == "local_grad_norm"
    assert f["message"].startswith(f"rank {rank}: its local gradient norm before the all-reduce")
    assert f["data"]["ratio"] >= 10 and f["data"]["own_level"] is not None
    return f


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world, rank", [(2, 1), (4, 2)])
def test_one_ranks_bad_batch_is_named_with_its_sample_ids(job, world: int, rank: int) -> None:
    j = job(world, {**SPIKE, "spike_rank": rank, "with_ids": True})
    f = _spike(j, rank)
    # DistributedSampler(seed 0) gives this rank these dataset indices at step 7
    ids = f["data"]["samples"]
    assert f["data"]["samples_kind"] == "ids" and len(ids) == 4
    assert all(isinstance(i, int) and 0 <= i < 256 for i in ids)
    assert f"its samples of step 7 (ids): {', '.join(map(str, ids))}" in f["message"]
    expected = _sampler_ids(world, rank, step=7)
    assert ids == expected


@pytest.mark.distributed
@pytest.mark.slow
def test_without_ids_the_samples_fingerprints_are_named(job) -> None:
    f = _spike(job(2, {**SPIKE, "spike_rank": 0}), 0)
    assert f["data"]["samples_kind"] == "hashes" and len(f["data"]["samples"]) == 4
    assert "(fingerprints)" in f["message"]


@pytest.mark.distributed
@pytest.mark.slow
def test_under_the_monitor_the_spike_is_named_in_rank_0s_findings(job) -> None:
    j = job(2, {**SPIKE, "spike_rank": 1, "monitor": True})
    assert j.returncodes == [0, 0], j.explain()
    [f] = [f for f in j.rank(0)["findings"] if f["code"] == "X010"]
    assert (f["rank"], f["step"]) == (1, 7), f["message"]
    assert f["data"]["samples_kind"] == "fingerprints" and len(f["data"]["samples"]) == 4


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_healthy_run_of_the_same_length_is_quiet(job, world: int) -> None:
    j = job(world, {**RUN, "with_ids": True})
    assert j.returncodes == [0] * world, j.explain()
    only(j)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_spike_every_rank_shares_names_no_rank(job, world: int) -> None:
    # the learning rate times 300 for step 6: every rank's loss and norm jump at step 7
    j = job(world, {**RUN, "lr_spike_step": 6, "lr_spike_factor": 300.0})
    assert j.returncodes == [0] * world, j.explain()
    recs = j.rank(0)["records"]
    before = next(r for r in recs if r["step"] == 5)["extra"]["dist"]
    after = next(r for r in recs if r["step"] == 8)["extra"]["dist"]
    assert _peak(after) > 3 * _peak(before)  # the spike is real, on every rank
    only(j)


def _peak(dist: dict[str, Any]) -> float:
    """The smallest rank's peak local gradient norm of a logged window."""
    t = RankTable.from_extra(dist)
    assert t is not None
    return min(v for v in t.col("local_grad_norm") if v is not None)


def _sampler_ids(world: int, rank: int, step: int) -> list[int]:
    import torch
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(256), num_replicas=world, rank=rank, seed=0)
    order = list(sampler)
    return [int(i) for i in torch.tensor(order[step * 4 : step * 4 + 4])]


# ---- the detector on hand-made tables -----------------------------------------------------
def _window(at: int, norms: list[float], losses: list[float] | None = None) -> Any:
    world = len(norms)
    return table(at, world=world, local_grad_norm=norms,
                 local_grad_peak_step=[float(at - 1)] * world,
                 loss_peak=losses or [4.0] * world, loss_peak_step=[float(at)] * world)


def test_two_ranks_need_the_ranks_own_history() -> None:
    det = SpikeRankDetector()
    assert det.update(rec(_window(2, [1.0, 50.0]))) == []  # no history yet: not at world 2
    det = SpikeRankDetector()
    for at in (2, 5, 8):
        assert det.update(rec(_window(at, [1.0, 1.3]))) == []
    [f] = det.update(rec(_window(11, [1.1, 40.0], [4.0, 90.0])))
    assert (f.code, f.rank, f.step) == ("X010", 1, 10)
    assert "its loss 90 vs 4" in f.message
    assert det.update(rec(_window(14, [1.1, 45.0]))) == []  # the same episode
    assert det.update(rec(_window(17, [1.1, 1.2]))) == []
    assert len(det.update(rec(_window(20, [1.1, 45.0])))) == 1  # re-armed


def test_noise_and_shared_spikes_stay_quiet() -> None:
    import random

    rnd = random.Random(0)
    det = SpikeRankDetector()
    for at in range(2, 300, 3):  # batch noise: a few × apart, never 10×
        norms = [rnd.lognormvariate(0, 0.6) for _ in range(2)]
        losses = [4 * rnd.lognormvariate(0, 0.3) for _ in range(2)]
        assert det.update(rec(_window(at, norms, losses))) == [], (at, norms, losses)
    det = SpikeRankDetector()
    for at in (2, 5, 8):
        det.update(rec(_window(at, [1.0, 1.2, 0.9, 1.1])))
    # every rank jumps (an LR spike): one rank a little more is not the cause
    assert det.update(rec(_window(11, [30.0, 45.0, 400.0, 35.0]))) == []
    # a non-finite window is X001's
    nan = _window(14, [1.0, 1.0, 500.0, 1.0])
    nan.columns["nonfinite_grad_step"] = [13.0] * 4
    assert det.update(rec(nan)) == [] and spike_suspects(nan) == []


def test_four_ranks_name_the_outlier_without_history() -> None:
    t = _window(2, [1.0, 1.2, 900.0, 0.8])
    assert spike_suspects(t) == [2]
    [f] = SpikeRankDetector().update(rec(t))
    assert f.rank == 2 and "its own recent level" not in f.message



def test_offline_over_per_rank_logs_the_ranks_own_loss_names_it() -> None:
    from sapper.distributed.offline import cross_rank_records
    from sapper.runtime.detector import DetectorSet
    from sapper.runtime.records import StepRecord

    def log(rank: int) -> list[StepRecord]:
        def loss(s: int) -> float:
            return 900.0 if (rank, s) == (1, 20) else 4.0 - 0.01 * s + 0.1 * rank

        # the logged gradient norm is the all-reduced one: the same spike on both ranks
        return [StepRecord(step=s, loss=loss(s), grad_norm=300.0 if s == 20 else 1.0)
                for s in range(30)]

    records = cross_rank_records({0: log(0), 1: log(1)})
    [f] = DetectorSet([SpikeRankDetector()]).run(records)
    assert (f.code, f.rank, f.step) == ("X010", 1, 20) and f.data["metric"] == "loss_peak"
