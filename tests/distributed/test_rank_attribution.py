"""Per-rank attribution under real multi-process jobs (gloo on CPU): a single flipped bit
in one replica, the rank whose data first went non-finite, a lost rank named by the
heartbeat watcher wherever the survivors are blocked, X006 at construction."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from test_multiprocess import only

from sapper.distributed.checksum import ParamChecksum


def test_checksum_sees_any_single_bit_of_any_element() -> None:
    torch.manual_seed(0)
    params = [
        ("w", torch.randn(300, 7)),  # rows of 1024 words and a tail
        ("h", torch.randn(64, 32).bfloat16()),
        ("d", torch.randn(5, dtype=torch.float64)),
    ]
    ck = ParamChecksum(params)
    base = float(ck.compute())
    for _, p in params:
        words = p.view(-1).view(torch.int16 if p.element_size() == 2 else torch.int32)
        for i in (0, words.numel() // 2, words.numel() - 1):
            for bit in (0, 7, 15):
                words[i] ^= 1 << bit
                assert float(ck.compute()) != base, (p.dtype, i, bit)
                words[i] ^= 1 << bit
    assert float(ck.compute()) == base
    per = ck.per_param()
    assert per is not None and per.shape == (3,)



def test_checksum_in_chunks_sees_any_single_bit_and_moved_values() -> None:
    """The exchange's checksum concatenates small tensors into chunks: a bit flipped in
    any element of any chunk, at a chunk's edges or in a tensor summed alone, shows; so
    do two values swapped between tensors of one chunk (in different rows of it)."""
    torch.manual_seed(1)
    params = [
        ("a", torch.randn(1500)),
        ("b", torch.randn(40, 40)),
        ("c", torch.randn(3000)),  # more than a chunk: summed where it is
        ("d", torch.randn(1030)),
        ("e", torch.randn(9)),
    ]
    ck = ParamChecksum(params)
    ck.CHUNK_WORDS = 2048  # chunks: [a], [b], [c], [d, e]
    assert [len(c) for c in ck._chunks()] == [1, 1, 1, 2]
    base = float(ck.compute())
    twin = ParamChecksum([(n, p.clone()) for n, p in params])
    twin.CHUNK_WORDS = 2048
    assert float(twin.compute()) == base  # identical replicas agree
    for _, p in params:
        words = p.view(-1).view(torch.int32)
        for i in (0, 1, words.numel() // 2, words.numel() - 1):
            for bit in (0, 13, 31):
                words[i] ^= 1 << bit
                assert float(ck.compute()) != base, (p.shape, i, bit)
                words[i] ^= 1 << bit
    d, e = params[3][1], params[4][1]
    d[0], e[0] = e[0].clone(), d[0].clone()  # the same values, in other places
    assert float(ck.compute()) != base
    d[0], e[0] = e[0].clone(), d[0].clone()
    assert float(ck.compute()) == base


#: Both exchanges: every row all-gathered (up to 64 ranks) and the reduced one alone
#: (statistics, extreme ranks and their rows), as above 64 ranks.
EXCHANGES = pytest.mark.parametrize("detail_ranks", [64, 0], ids=["gathered", "reduced"])


@EXCHANGES
def test_one_flipped_bit_in_one_replica_is_named_within_one_exchange(
    job, detail_ranks: int
) -> None:
    j = job(
        2,
        {
            "detail_ranks": detail_ranks,
            "steps": 9,
            "every": 3,
            "flip_rank": 1,
            "flip_step": 4,
            "flip_param": "blocks.1.3.weight",
            "flip_index": 777,
        },
    )
    assert j.returncodes == [0, 0], j.explain()
    f = only(j, "X003")["X003"]
    assert f["step"] == 5  # the first exchange after the flip (exchanges at 2, 5, 8)
    assert f["data"]["last_agreed_step"] == 2
    assert f["data"]["params"] == {"1": ["blocks.1.3.weight"]}
    assert "rank 1: blocks.1.3.weight" in f["message"]


def test_healthy_replicas_stay_quiet(job) -> None:
    j = job(2, {"steps": 9, "every": 3})
    assert j.returncodes == [0, 0], j.explain()
    only(j)


@EXCHANGES
def test_huge_finite_loss_on_one_rank_is_named_before_the_all_reduce(
    job, detail_ranks: int
) -> None:
    # rank 1's loss is 1e29 (finite): after DDP's all-reduce both ranks' gradient norms
    # are Inf at step 4; only rank 1's local norm before the all-reduce was
    opts = {"steps": 6, "every": 3, "scale_rank": 1, "scale_step": 4, "scale": 2.5e28}
    j = job(2, {**opts, "detail_ranks": detail_ranks})
    assert j.returncodes == [0, 0], j.explain()
    f = only(j, "X001")["X001"]
    assert (f["rank"], f["step"]) == (1, 4), f["message"]
    assert f["data"]["first_step"] == {"0": 4, "1": 4}  # the all-reduce made them equal
    assert f["message"].startswith("rank 1 first: gradient norm became non-finite at step 4")
    assert (
        "its local gradient norm before the all-reduce was non-finite at step 4 "
        "(the others' finite)" in f["message"]
    )
    assert re.search(r"its loss was 1\.\de\+29 vs a median \d", f["message"])
    ev = f["data"]["evidence"]
    assert ev["loss_peak"]["1"] > 1e28 and ev["loss_peak"]["0"] < 10


def test_nan_in_one_ranks_input_is_named(job) -> None:
    j = job(2, {"steps": 6, "every": 3, "nan_input_rank": 0, "nan_step": 4})
    assert j.returncodes == [0, 0], j.explain()
    f = only(j, "X001")["X001"]
    assert (f["rank"], f["step"]) == (0, 4), f["message"]
    assert "its model output was non-finite at step 4 (the others' from step 5)" in f["message"]


def test_evidence_breaks_the_tie_the_all_reduce_made() -> None:
    from test_cross_rank_detectors import rec, table

    from sapper.distributed.detectors import NonFiniteRankDetector

    tied = dict(nonfinite_grad_step=[7.0] * 4, local_grad_nonfinite_step=[-1.0] * 4)
    # no local norm (FSDP): the loss alone speaks
    t = table(9, loss_peak=[1.1, 1.0, 1.2e29, 0.9], **tied)
    [f] = NonFiniteRankDetector().update(rec(t))
    assert f.rank == 2 and f.message.startswith("rank 2 first: gradient norm")
    assert "its loss was 1.2e+29 vs a median 1 on the others" in f.message
    # the local norm before the all-reduce outranks the loss
    t = table(9, loss_peak=[1.1, 1.0, 1.2e29, 0.9],
              **{**tied, "local_grad_nonfinite_step": [-1.0, 7.0, -1.0, -1.0]})
    [g] = NonFiniteRankDetector().update(rec(t))
    assert g.rank == 1
    # nothing stands out: every tied rank is named, as before
    [h] = NonFiniteRankDetector().update(rec(table(9, loss_peak=[1.0] * 4, **tied)))
    assert h.data["origin"] == [0, 1, 2, 3] and "first" not in h.message


# ---- a lost rank, wherever the survivors are blocked (plain torchrun defaults) ----------
BEAT = {"monitor": True, "steps": 9, "every": 3, "heartbeat_s": 0.5, "lost_after_s": 3.0,
        "hang_after_s": 3.0, "timeout_s": 20.0}


def _lost_in_run_log(tmp_path: Path, **fault: Any) -> tuple[list[dict], list[str], Any]:
    """Run under torchrun; rank 0's run log: its X005 findings, and the order of lines."""
    from distlaunch import run_torchrun

    job = run_torchrun(tmp_path, 2, {**BEAT, **fault}, timeout_s=90)
    log = tmp_path / "out" / "run-rank0.jsonl"
    assert log.exists(), job.explain()
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    order = [x.get("code") or f"step {x.get('step')}" for x in lines if x.get("kind") != "meta"]
    lost = [x for x in lines if x.get("code") == "X005"]
    return lost, order, job


def test_crash_in_the_forward_is_on_disk_before_torchrun_tears_down(tmp_path: Path) -> None:
    # rank 0 waits in DDP's all-reduce; torchrun SIGTERMs it right after rank 1 dies
    lost, _, job = _lost_in_run_log(
        tmp_path, forward_fault_rank=1, forward_fault_step=4, forward_fault="die"
    )
    assert job.returncodes != [0], job.explain()
    [f] = lost
    assert f["rank"] == 1 and f["data"]["kind"] == "crash"
    assert f["message"].startswith("rank 1 stopped: its heartbeat ended")
    # rank 0's all-reduce fails at once ("connection reset"): named before it exits
    assert "rank 0 in the backward (or DDP's gradient all-reduce) of step 4" in f["message"]


def test_crash_before_the_exchange_is_named(tmp_path: Path) -> None:
    lost, _, job = _lost_in_run_log(tmp_path, die_rank=1, die_step=5)
    assert job.returncodes != [0], job.explain()
    [f] = lost  # the exchange saw it first; the watcher does not say it twice
    assert f["rank"] == 1 and f["step"] == 5, lost


def test_hang_in_the_forward_is_named_while_the_others_wait_in_the_all_reduce(
    tmp_path: Path,
) -> None:
    lost, order, job = _lost_in_run_log(
        tmp_path, forward_fault_rank=1, forward_fault_step=4, forward_fault="hang", hang_s=9.0
    )
    assert job.returncodes == [0], job.explain()
    [f] = lost
    assert f["rank"] == 1 and f["data"]["kind"] == "hang" and f["data"]["phase"] == "forward"
    assert 3.0 <= f["value"] < 8.0  # named after T, while rank 1 still hangs
    assert "rank 0 in the backward (or DDP's gradient all-reduce) of step 4" in f["message"]
    assert order.index("X005") < order.index("step 5")  # written while rank 0 was blocked


def test_hang_before_the_exchange_is_named_with_where_it_is(tmp_path: Path) -> None:
    lost, order, job = _lost_in_run_log(tmp_path, hang_rank=1, hang_step=5, hang_s=9.0)
    assert job.returncodes == [0], job.explain()
    [f] = lost
    assert f["rank"] == 1 and f["data"]["kind"] == "hang" and f["data"]["phase"] == "data"
    assert "rank 0 in sapper's exchange" in f["message"]
    assert order.index("X005") < order.index("step 5")


def _beats(world: int = 2, **kw: Any) -> tuple[list[Any], list[Any], Any]:
    import torch.distributed as dist
    from distlaunch import free_port

    from sapper.distributed.heartbeat import Heartbeat

    store = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)
    found: list[Any] = []
    opts = {"interval_s": 0.1, "lost_after_s": 0.6, "hang_after_s": 0.6, **kw}
    hbs = [Heartbeat(store, r, world, found.extend, **opts) for r in range(world)]
    for hb in hbs:
        hb.prefix = "test/beat/"  # one job: the same keys on every "rank"
        hb.start()
    return hbs, found, store


def _until(cond: Any, seconds: float) -> float:
    import time

    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < seconds:
        time.sleep(0.02)
    return time.monotonic() - t0


def test_watcher_tells_a_crash_from_a_hang_and_stays_quiet_when_healthy() -> None:
    import time

    hbs, found, _ = _beats()
    try:
        for _ in range(10):  # healthy: both move
            for hb in hbs:
                hb.mark("forward")
            time.sleep(0.1)
        assert found == []
        hbs[1]._stop.set()  # rank 1's beats stop (a process gone), no "done"
        waited = _until(lambda: found, 5.0)
        [f] = found
        assert f.code == "X005" and f.rank == 1 and f.data["kind"] == "crash"
        assert 0.5 <= waited < 3.0
    finally:
        for hb in hbs:
            hb.stop()


def test_watcher_names_the_rank_stuck_behind_the_others() -> None:
    hbs, found, _ = _beats()
    try:
        hbs[1].mark("forward")  # rank 1 stays in the forward of step 0
        hbs[0].step_done()
        hbs[0].mark("backward")  # rank 0 is on, in step 1's all-reduce
        _until(lambda: found, 5.0)
        [f] = found
        assert (f.rank, f.data["kind"], f.data["phase"], f.step) == (1, "hang", "forward", 0)
        assert "rank 0 in the backward (or DDP's gradient all-reduce) of step 1" in f.message
    finally:
        for hb in hbs:
            hb.stop()


def test_ranks_that_finish_are_not_lost() -> None:
    import time

    hbs, found, _ = _beats()
    hbs[1].stop()  # a clean end writes "done"
    time.sleep(1.0)
    hbs[0].stop()
    assert found == []


def test_world_size_against_the_plan_is_logged_before_the_first_step(job, tmp_path: Path) -> None:
    j = job(2, {"steps": 3, "every": 3, "monitor": True, "plan": {"parallel": {"tp": 2, "dp": 2}}})
    assert j.returncodes == [0, 0], j.explain()
    [f] = [f for f in j.rank(0)["findings"] if f["code"] == "X006"]
    assert f["message"] == "world 2 ≠ tp 2 × pp 1 × cp 1 × dp 2 = 4 (step 0)"
    log = [json.loads(x) for x in (tmp_path / "out" / "run-rank0.jsonl").read_text().splitlines()]
    kinds = [x.get("code") or x["kind"] for x in log if x["kind"] != "meta"]
    assert kinds.index("X006") < kinds.index("step")  # at construction, not at an exchange
