"""Per-rank attribution under real multi-process jobs (gloo on CPU): a single flipped bit
in one replica, the rank whose data first went non-finite, a lost rank named by the
heartbeat watcher wherever the survivors are blocked, X006 at construction."""

from __future__ import annotations

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
