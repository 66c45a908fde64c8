"""Per-rank attribution under real multi-process jobs (gloo on CPU): a single flipped bit
in one replica, the rank whose data first went non-finite, a lost rank named by the
heartbeat watcher wherever the survivors are blocked, X006 at construction."""

from __future__ import annotations

import re

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


def test_one_flipped_bit_in_one_replica_is_named_within_one_exchange(job) -> None:
    j = job(
        2,
        {
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


def test_huge_finite_loss_on_one_rank_is_named_before_the_all_reduce(job) -> None:
    # rank 1's loss is 1e29 (finite): after DDP's all-reduce both ranks' gradient norms
    # are Inf at step 4; only rank 1's local norm before the all-reduce was
    j = job(2, {"steps": 6, "every": 3, "scale_rank": 1, "scale_step": 4, "scale": 2.5e28})
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
