"""The live monitor on sharded training (FSDP2, HSDP, FSDP2 + TP), real gloo processes.

Each job trains the tiny LM of ``shard_worker.py`` for 8 steps; every rank also computes
the gradient norms of the same model unsharded, in one process, on the whole global
batch. The monitor's gradient norm (its own, or the one ``clip_grad_norm_`` returned)
must equal that reference on every step, its per-layer norms on the sampled steps, with
no monitor failure (R190) and the cross-rank exchange still producing its table.

What runs on gloo (torch 2.13, CPU): ``fully_shard`` on 1-D and 2-D (HSDP) meshes,
``parallelize_module`` with Colwise/RowwiseParallel under ``fully_shard`` on the ``dp``
dimension, and ``clip_grad_norm_`` on FSDP2/HSDP. ``clip_grad_norm_`` under FSDP2 + TP
fails in torch itself (the per-parameter norms live on two meshes, ``dp`` and
``dp × tp``, and cannot be stacked), so that layout is tested with the monitor's own norm.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from distlaunch import Job, run_job

WORKER = Path(__file__).with_name("shard_worker.py")
STEPS, EVERY, SAMPLE = 6, 3, 2


def _run(tmp: Path, world: int, **opts: Any) -> Job:
    opts = {"steps": STEPS, "every": EVERY, "sample": SAMPLE, **opts}
    j = run_job(tmp, world, opts, timeout_s=120.0, worker=WORKER)
    assert all(rc == 0 for rc in j.returncodes), j.explain()
    return j


def _check(j: Job, world: int) -> dict[str, Any]:
    r = j.rank(0)
    codes = [f["code"] for f in r["findings"]]
    assert "R190" not in codes, r["findings"]
    loud = [f for f in r["findings"] if f["code"][:2] in ("R0", "X0") or f["code"] == "R190"]
    assert loud == [], loud
    records, refs = r["records"], r["refs"]
    assert [rec["step"] for rec in records] == list(range(STEPS))
    for rec, ref in zip(records, refs, strict=True):  # logged on every step, and right
        assert rec["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5, abs=1e-6)
    sampled = [rec for rec in records if rec["extra"].get("grad_sampled")]
    assert [rec["step"] for rec in sampled] == list(range(0, STEPS, SAMPLE))
    for rec in sampled:  # per-layer norms are of whole tensors, not of local shards
        assert "grad_stats_local" not in rec["extra"]
        layers, ref = rec["extra"]["grad_norm_layers"], refs[rec["step"]]["layers"]
        assert layers.keys() == ref.keys()
        for name, value in layers.items():
            assert value == pytest.approx(ref[name], rel=1e-5), name
        assert rec["extra"]["zero_grad_params"] == []
        assert "nonfinite_grads" not in rec["extra"]
    assert r["exchanges"] == STEPS // EVERY  # the cross-rank checks ran at each boundary
    for rec in records[EVERY - 1 :: EVERY]:
        table = rec["extra"]["dist"]
        assert table["world_size"] == world
        norms = table["ranks"]["grad_norm"]
        assert len(norms) == world and all(math.isclose(n, rec["grad_norm"]) for n in norms)
    return r


@pytest.mark.parametrize("clip", [False, True], ids=["own-norm", "clip_grad_norm_"])
def test_fsdp2_monitor_grad_norm_equals_single_process(tmp_path: Path, clip: bool) -> None:
    _check(_run(tmp_path, 2, layout="fsdp", clip=clip), 2)


def test_hsdp_norm_counts_each_replica_once(tmp_path: Path) -> None:
    """(replicate, shard) = (2, 2): summing over the replicate dimension too would read
    √2 × the norm; the replicas' copies are counted once."""
    _check(_run(tmp_path, 4, layout="hsdp"), 4)


def test_fsdp2_with_tensor_parallel_norm_spans_both_meshes(tmp_path: Path) -> None:
    """(dp, tp) = (2, 2): the MLP weights are sharded on both dims, their TP-replicated
    biases and the rest on ``dp`` only; the Plan tells that TP peers share their data."""
    plan = {"parallel": {"tp": 2, "dp": 2}}
    _check(_run(tmp_path, 4, layout="tp", plan=plan), 4)
