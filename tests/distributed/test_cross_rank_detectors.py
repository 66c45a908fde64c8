"""The cross-rank detectors on hand-made per-rank tables, live and from a logged record."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from sapper.distributed import DIST_KEY, RankTable, default_distributed_detectors
from sapper.distributed.detectors import (
    DuplicateSamplesDetector,
    NonFiniteRankDetector,
    ReplicaDivergenceDetector,
    StepSkewDetector,
    StragglerDetector,
    lost_rank_finding,
)
from sapper.distributed.reduce import ChannelLost
from sapper.distributed.sampling import sample_hashes
from sapper.distributed.stats import SampleBuckets
from sapper.distributed.table import COLUMNS
from sapper.runtime.detector import DetectorSet
from sapper.runtime.records import StepRecord


def table(at: int, world: int = 4, prev: int | None = None, sketches: Any = None,
          groups: Any = None, **cols: list[float | None]) -> RankTable:
    """A full table; ``sketches``: each rank's sample ids (hashed into the buckets)."""
    step = at
    base: dict[str, list[float | None]] = {name: [None] * world for name in COLUMNS}
    base["step"] = [float(step)] * world
    base["step_time_s"] = [0.1] * world
    base["nonfinite_loss_step"] = [-1.0] * world
    base["nonfinite_grad_step"] = [-1.0] * world
    base.update(cols)
    everyone = [list(range(world))]
    t = RankTable(step=step, columns=base, data_groups=groups or everyone,
                  param_groups=groups or everyone, prev_step=step - 5 if prev is None else prev)
    if sketches is not None:
        group_of = [next(g for g, rs in enumerate(t.data_groups) if r in rs) for r in range(world)]
        ids = [sample_hashes([int(v) for v in s]) for s in sketches]
        t.job().buckets = SampleBuckets().summed(ids, group_of)
    return t


def rec(t: RankTable) -> StepRecord:
    return StepRecord(step=t.step, extra={DIST_KEY: t})


def test_nonfinite_names_the_origin_once_and_rearms() -> None:
    det = NonFiniteRankDetector()
    assert det.update(rec(table(4))) == []
    bad = table(9, nonfinite_loss_step=[-1, -1, 7, -1], nonfinite_grad_step=[7, 7, 7, 7])
    [f] = det.update(rec(bad))
    assert (f.code, f.rank, f.step) == ("X001", 2, 7)
    assert f.message.startswith("rank 2: loss became non-finite at step 7; then ranks 0, 1, 3")
    later = table(14, nonfinite_loss_step=[10, 10, 10, 10], nonfinite_grad_step=[10] * 4)
    assert det.update(rec(later)) == []  # the same outbreak
    assert det.update(rec(table(19))) == []
    again = table(24, nonfinite_grad_step=[-1, 21, -1, -1])
    [g] = det.update(rec(again))
    assert (g.rank, g.step) == (1, 21) and "gradient norm" in g.message


def test_straggler_needs_persistence_and_a_real_excess() -> None:
    det = StragglerDetector(persist=3)
    slow = {"data_time_s": [0.001, 0.051, 0.001, 0.002]}
    assert det.update(rec(table(4, **slow))) == []
    assert det.update(rec(table(9, **slow))) == []
    [f] = det.update(rec(table(14, **slow)))
    assert (f.code, f.rank, f.step) == ("X002", 1, 14)
    assert f.data["metric"] == "data_time_s" and f.value is not None and f.value > 30
    assert "steps 0–14" in f.message and "50% of each 0.1 s step" in f.message
    assert f.data["mean_others_s"] == pytest.approx(0.004 / 3)
    assert det.update(rec(table(19, **slow))) == []  # reported once
    tiny = StragglerDetector(persist=1)  # 3× slower but 0.2 ms: noise, not a straggler
    assert tiny.update(rec(table(4, data_time_s=[0.0001, 0.0003, 0.0001, 0.0001]))) == []
    # 2.4× on a 2 ms forward of a 0.1 s step: a loaded machine's jitter, not a straggler
    noisy = StragglerDetector(persist=1)
    assert noisy.update(rec(table(4, forward_time_s=[0.002, 0.0048, 0.002, 0.002]))) == []


def test_straggler_must_be_the_same_rank_in_a_row() -> None:
    det = StragglerDetector(persist=3)
    for at, slow in ((4, 1), (9, 2), (14, 1), (19, 3), (24, 2)):  # the slowest moves
        times = [0.01] * 4
        times[slow] = 0.08
        assert det.update(rec(table(at, data_time_s=times))) == []


def test_straggler_in_step_time_when_ranks_are_not_lockstep() -> None:
    det = StragglerDetector(persist=1)
    [f] = det.update(rec(table(4, step_time_s=[0.1, 0.1, 0.1, 0.3])))
    assert f.rank == 3 and f.data["metric"] == "step_time_s" and f.value == pytest.approx(3)


def test_replica_divergence_majority_and_no_majority() -> None:
    det = ReplicaDivergenceDetector()
    assert det.update(rec(table(4, checksum=[1.5, 1.5, 1.5, 1.5]))) == []
    [f] = det.update(rec(table(9, checksum=[1.5, 1.5, 1.5, 1.6])))
    assert (f.rank, f.step) == (3, 9) and f.data["last_agreed_step"] == 4
    assert det.update(rec(table(14, checksum=[1.5, 1.5, 1.5, 1.7]))) == []  # once
    two = ReplicaDivergenceDetector()
    [g] = two.update(rec(table(4, world=2, checksum=[2.0, float("nan")])))
    assert g.rank is None and g.data["ranks"] == [0, 1] and "no majority" in g.message


def test_replicas_compared_only_within_groups_and_at_one_step() -> None:
    det = ReplicaDivergenceDetector()
    groups = [[0, 2], [1, 3]]  # TP shards differ; DP replicas of a shard agree
    assert det.update(rec(table(4, groups=groups, checksum=[1.0, 2.0, 1.0, 2.0]))) == []
    skewed = table(9, checksum=[1.0, 1.0, 1.0, 3.0], step=[9.0, 9.0, 9.0, 8.0])
    assert det.update(rec(skewed)) == []


def _ids(start: int, n: int = 6) -> list[float]:
    return [float(v) for v in range(start, start + n)]


def test_duplicate_samples_across_dp_ranks() -> None:
    det = DuplicateSamplesDetector()
    same = table(4, world=2, sketches=[_ids(10), _ids(10)], samples_hashed=[20.0, 20.0])
    [f] = det.update(rec(same))
    assert f.data["ranks"] == [0, 1] and f.value == 1.0 and "steps 0–4" in f.message
    assert det.update(rec(same)) == []  # reported once
    apart = table(4, world=2, sketches=[_ids(10), _ids(100)], samples_hashed=[20.0, 20.0])
    assert DuplicateSamplesDetector().update(rec(apart)) == []


def test_tp_peers_may_share_samples() -> None:
    sk = [_ids(10), _ids(10), _ids(50), _ids(50)]  # ranks 0,1 and 2,3 are TP pairs
    t = table(4, sketches=sk, groups=[[0, 2], [1, 3]], samples_hashed=[6.0] * 4)
    assert DuplicateSamplesDetector().update(rec(t)) == []
    everyone = table(4, sketches=sk, samples_hashed=[6.0] * 4)
    found = DuplicateSamplesDetector().update(rec(everyone))
    assert sorted(f.data["ranks"] for f in found) == [[0, 1], [2, 3]]


def test_step_skew_fires_once() -> None:
    det = StepSkewDetector()
    [f] = det.update(rec(table(9, step=[9.0, 9.0, 7.0, 9.0])))
    assert (f.rank, f.step, f.value) == (2, 9, 2.0)
    assert det.update(rec(table(14, step=[14.0, 14.0, 11.0, 14.0]))) == []


def test_lost_rank_message() -> None:
    lost = ChannelLost(step=20, reason="Connection closed by peer", missing=[3],
                       last_seen={0: 20, 1: 20, 2: 20, 3: 15}, timed_out=False, waited_s=0.01)
    f = lost_rank_finding(lost, 4, 300.0)
    assert (f.code, f.rank, f.step) == ("X005", 3, 20)
    assert f.message.startswith("rank 3 did not reach the exchange at step 20 (rank 3 last at "
                                "step 15): the connection failed")
    unknown = lost_rank_finding(ChannelLost(step=5, reason="boom", timed_out=True), 4, 30.0)
    assert unknown.rank is None and "no answer within 30 s" in unknown.message


def test_offline_run_log_gives_the_same_findings() -> None:
    live_tables = [
        table(4, nonfinite_loss_step=[-1, 3, -1, -1], checksum=[1.0, 1.0, 1.0, 1.0],
              data_time_s=[0.0, 0.09, 0.0, 0.0], loss=[2.0, math.nan, 2.0, 2.0]),
        table(9, checksum=[1.0, 1.0, 2.0, 1.0], data_time_s=[0.0, 0.09, 0.0, 0.0]),
        table(14, data_time_s=[0.0, 0.09, 0.0, 0.0]),
    ]
    live = DetectorSet(default_distributed_detectors()).run(rec(t) for t in live_tables)
    lines = []
    for t in live_tables:
        r = StepRecord(step=t.step, extra={DIST_KEY: t.to_extra()})
        lines.append(json.dumps({"kind": "step", **r.to_json()}))
    back = [StepRecord.from_json({k: v for k, v in json.loads(x).items() if k != "kind"})
            for x in lines]
    offline = DetectorSet(default_distributed_detectors()).run(back)
    assert [f.to_json() for f in offline] == [f.to_json() for f in live]
    assert [f.code for f in live] == ["X001", "X003", "X002"]


def test_large_worlds_log_a_summary_only() -> None:
    t = table(4, world=8, data_time_s=[0.0] * 7 + [0.5])
    extra = t.to_extra(max_ranks=4)
    assert "ranks" not in extra and extra["summary"]["data_time_s"]["max_rank"] == 7
    assert RankTable.from_extra(extra) is None
