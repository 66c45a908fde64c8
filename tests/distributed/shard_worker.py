"""One rank of a sharded training job watched by the live monitor (gloo, CPU).

``python shard_worker.py job OUT_DIR OPTIONS_JSON`` (started like torchrun). Layouts:

* ``fsdp``: ``fully_shard`` on a 1-D mesh of every rank;
* ``hsdp``: ``fully_shard`` on a 2-D ``(replicate, shard)`` mesh (world 4: 2 × 2);
* ``tp``: FSDP2 + tensor parallelism on a 2-D ``(dp, tp)`` mesh (world 4: 2 × 2), the
  MLP of each block split by ``ColwiseParallel``/``RowwiseParallel``, FSDP2 over ``dp``.

Every step, each rank also runs the same model unsharded, in one process, on the whole
global batch (the weights copied from the sharded model first), and records that
reference's gradient norm and per-layer norms; rank 0 writes them beside the monitor's
records, so the test compares the two.

What works on gloo in torch 2.13 (CPU): ``fully_shard`` (all-gather, reduce-scatter),
its 2-D HSDP variant, ``parallelize_module`` with Colwise/Rowwise on a 2-D mesh, and
``clip_grad_norm_`` over DTensor gradients (its total norm a DTensor).
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from worker import VOCAB, TinyLM  # the same miniature language model (this folder)

from sapper.monitor import Monitor
from sapper.plan.schema import Plan
from sapper.runtime.runlog import read_runlog

SEQ, WIDTH, PER_RANK = 9, 32, 4


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def _shard(model: nn.Module, layout: str, world: int) -> tuple[nn.Module, int, int]:
    """Wrap ``model``; returns it with this rank's data-parallel index and the dp size."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank = dist.get_rank()
    if layout == "fsdp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
        dp_rank, dp = rank, world
    elif layout == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        dp_rank, dp = rank, world  # every rank has its own data; HSDP averages over all
    else:
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh2 = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        for block in model.blocks:
            parallelize_module(block, mesh2["tp"], {"1": ColwiseParallel(), "3": RowwiseParallel()})
        mesh = mesh2["dp"]
        dp_rank, dp = mesh2.get_local_rank("dp"), 2  # the tp ranks of a dp group share data
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, dp_rank, dp


def _reference(ref: nn.Module, model: nn.Module, batch: torch.Tensor) -> dict[str, Any]:
    """The unsharded model's gradient norms on the whole global batch (same weights)."""
    with torch.no_grad():
        for r, p in zip(ref.parameters(), model.parameters(), strict=True):
            r.copy_(p.full_tensor() if hasattr(p, "full_tensor") else p)
    ref.zero_grad(set_to_none=True)
    _loss(ref, batch).backward()
    norms = {n: float(torch.linalg.vector_norm(p.grad, dtype=torch.float64))
             for n, p in ref.named_parameters()}
    layers = {
        f"blocks.{i}": math.sqrt(sum(v * v for n, v in norms.items()
                                     if n.startswith(f"blocks.{i}.")))
        for i in range(2)
    }
    return {"grad_norm": math.sqrt(sum(v * v for v in norms.values())), "layers": layers}


def train(rank: int, world: int, opts: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = TinyLM(WIDTH)
    ref = copy.deepcopy(model)
    model, dp_rank, dp = _shard(model, opts["layout"], world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run_log = Path(opts["out"]) / f"run-rank{rank}.jsonl"
    plan = Plan.model_validate(opts["plan"]) if opts.get("plan") else None
    mon = Monitor(
        model, opt, plan=plan, log_every=opts.get("every", 4), sample_every=opts.get("sample", 3),
        run_log=run_log, console=False,
        distributed={"timeout_s": 20.0, "min_interval_s": 0.0},  # exchanges counted exactly
    )
    data = torch.Generator().manual_seed(1234)
    refs: list[dict[str, Any]] = []
    for _ in range(opts.get("steps", 6)):
        batch = torch.randint(0, VOCAB, (dp * PER_RANK, SEQ), generator=data)
        refs.append(_reference(ref, model, batch))
        mine = batch[dp_rank * PER_RANK : (dp_rank + 1) * PER_RANK]
        loss = _loss(model, mine)
        loss.backward()
        if opts.get("clip"):
            nn.utils.clip_grad_norm_(model.parameters(), 1e6)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step(loss)
    findings = mon.close()
    records = [r.to_json() for r in read_runlog(run_log).steps] if run_log.exists() else []
    return {"rank": rank, "findings": [f.to_json() for f in findings], "records": records,
            "refs": refs, "exchanges": mon.dist.tracker.exchanges if mon.dist else 0}


def main() -> None:
    out_dir, opts = Path(sys.argv[2]), json.loads(sys.argv[3])
    opts["out"] = str(out_dir)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    result = train(rank, world, opts)
    result["elapsed_s"] = time.perf_counter() - t0
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
