"""Check sapper's cross-rank monitoring on one GPU node with NCCL (CI does not run this).

    torchrun --standalone --nproc-per-node=NUM_GPUS benchmarks/gpu_distributed_check.py
    torchrun --standalone --nproc-per-node=2 benchmarks/gpu_distributed_check.py --cpu
    torchrun --standalone --nproc-per-node=NUM_GPUS benchmarks/gpu_distributed_check.py --reduced

Needs 2+ CUDA GPUs. Training runs on NCCL; sapper's exchange runs on its own gloo side
group beside it, or with ``--reduced`` as above 64 ranks: fixed-size all-reduces on an
NCCL side group of its own, on the GPU. Each check trains a small model for a few
steps and compares what sapper reports with what was injected; rank 0 prints one line
per check and the timings, and the exit code is the number of failed checks.

1. DDP, clean: no finding; the per-step calls never synchronize with the GPU
   (``torch.cuda.set_sync_debug_mode("error")`` around them).
2. DDP, a NaN on the last rank at step 6: X001 names that rank and step.
3. DDP, a slow data loader on rank 1: X002 names rank 1 (data wait).
4. DDP, one replica's weight changed at step 4: X003 names that rank.
5. FSDP2 (``fully_shard``): sapper's global gradient norm equals the norm of the same
   step computed on one GPU with the whole batch.
6. FSDP2 under the live Monitor: its gradient norm (reduced over the mesh on NCCL,
   float64 sums in one fused kernel) is logged on every step and equals that single-GPU
   norm; no R190.
7. DDP, the last rank's loss blown up to ~1e29 (finite) at step 6: every rank's norm is
   Inf after the NCCL all-reduce; X001 names that rank first, from its local gradient
   norm taken in sapper's communication hook before the all-reduce.
8. DDP, one bit of one element flipped in the last rank's weights at step 4: X003
   within one exchange, naming the parameter (full-tensor checksum on the GPU).
"""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sapper.distributed import RankTracker, global_grad_norm

VOCAB, SEQ, BATCH, WIDTH = 512, 129, 8, 256


def _model() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        WIDTH, 4, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True
    )
    return nn.Sequential(
        nn.Embedding(VOCAB, WIDTH),
        nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
        nn.Linear(WIDTH, VOCAB),
    )


def _batch(rank: int, step: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).to(device)


def _loss(model: Any, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


#: ``--reduced``: the exchange sapper uses above 64 ranks (all-reduces only, on a side
#: group with the job's backend: NCCL on GPUs), at any world size.
TRACKER_OPTS: dict[str, Any] = {}

Fault = Callable[[int, nn.Module, torch.Tensor], torch.Tensor]
AfterStep = Callable[[int, nn.Module], None]


def _ddp_run(
    rank: int,
    device: torch.device,
    steps: int = 24,
    every: int = 4,
    fault: Fault | None = None,
    after_step: AfterStep | None = None,
    data_delay: float = 0.0,
    sync_check: bool = False,
) -> tuple[list[Any], RankTracker]:
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    model = DistributedDataParallel(_model().to(device), device_ids=ids)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tracker = RankTracker(model, every=every, timeout_s=60, **TRACKER_OPTS)
    findings: list[Any] = []
    for step in range(steps):
        if data_delay:
            time.sleep(data_delay)
        batch = _batch(rank, step, device)
        boundary = (step + 1) % every == 0  # this step's call exchanges (a sync, by design)
        if sync_check and not boundary and device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")  # any host sync raises from here
        try:
            tracker.batch(batch)
            loss = _loss(model, batch)
            if fault is not None:
                loss = fault(step, model, loss)
            loss.backward()
            norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if after_step is not None:
                after_step(step, model)
            findings.extend(tracker.step(step, loss=loss.detach(), grad_norm=norm))
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    tracker.close()
    return findings, tracker


def check_clean(rank: int, world: int, device: torch.device) -> tuple[bool, str]:
    found, tracker = _ddp_run(rank, device, sync_check=True)
    return not found, (
        f"{len(found)} finding(s); last exchange {tracker.last_exchange_s * 1e3:.2f} ms"
    )


def check_nan(rank: int, world: int, device: torch.device) -> tuple[bool, str]:
    bad = world - 1

    def inject(step: int, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        return loss * float("nan") if (rank, step) == (bad, 6) else loss

    found, _ = _ddp_run(rank, device, fault=inject)
    x1 = [f for f in found if f.code == "X001"]
    ok = rank != 0 or (len(x1) == 1 and (x1[0].rank, x1[0].step) == (bad, 6))
    return ok, "; ".join(f.message for f in x1) or "no X001"


def check_straggler(rank: int, world: int, device: torch.device) -> tuple[bool, str]:
    found, _ = _ddp_run(rank, device, data_delay=0.05 if rank == 1 else 0.0)
    x2 = [f for f in found if f.code == "X002"]
    ok = rank != 0 or any(f.rank == 1 and f.data["metric"] == "data_time_s" for f in x2)
    return ok, "; ".join(f.message for f in x2) or "no X002"


def check_desync(rank: int, world: int, device: torch.device) -> tuple[bool, str]:
    bad = world - 1

    def knock(step: int, model: nn.Module) -> None:
        if (rank, step) == (bad, 4):
            with torch.no_grad():  # one replica's weight changes outside the optimizer
                next(model.parameters()).add_(1e-3)

    found, _ = _ddp_run(rank, device, after_step=knock)
    x3 = [f for f in found if f.code == "X003"]
    named = [0, 1] if world == 2 else [bad]  # two replicas: no majority, both named
    ok = rank != 0 or (len(x3) == 1 and x3[0].data["ranks"] == named)
    return ok, "; ".join(f.message for f in x3) or "no X003"


def check_blowup(rank: int, world: int, device: torch.device) -> tuple[bool, str]:
    bad = world - 1

    def blow(step: int, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        return loss * 2.5e28 if (rank, step) == (bad, 6) else loss

    found, _ = _ddp_run(rank, device, fault=blow)
    x1 = [f for f in found if f.code == "X001"]
    ok = rank != 0 or (
        len(x1) == 1 and (x1[0].rank, x1[0].step) == (bad, 6) and "first" in x1[0].message
    )
    return ok, "; ".join(f.message for f in x1) or "no X001"


def check_bitflip(rank: int, world: int, device: torch.device) -> tuple[bool, str]:
    bad = world - 1
    name = ""

    def flip(step: int, model: nn.Module) -> None:
        nonlocal name
        if (rank, step) == (bad, 4):
            with torch.no_grad():  # one bit of one element: a memory fault on one replica
                name, p = list(model.module.named_parameters())[-1]
                p.view(-1).view(torch.int32)[p.numel() // 2] ^= 1

    found, _ = _ddp_run(rank, device, after_step=flip)
    x3 = [f for f in found if f.code == "X003"]
    ok = rank != 0 or (len(x3) == 1 and x3[0].step == 7 and str(bad) in x3[0].data["params"])
    return ok, "; ".join(f.message for f in x3) or "no X003"


def _fsdp_pair(world: int, device: torch.device) -> tuple[nn.Module, nn.Module]:
    """The model sharded with FSDP2 (each layer, then the whole) and an unsharded copy of
    its starting weights, the single-GPU reference."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model().to(device)
    reference = copy.deepcopy(model)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model[1].layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, reference


def _norm_of(model: nn.Module) -> float:
    """The global gradient norm of an unsharded model (one host read)."""
    return float(
        torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()])
        )
    )


def check_fsdp_norm(rank: int, world: int, device: torch.device) -> tuple[bool, str]:
    model, reference = _fsdp_pair(world, device)
    batch = _batch(rank, 0, device)
    _loss(model, batch).backward()
    ours = float(global_grad_norm(model))
    batches = [torch.empty_like(batch) for _ in range(world)]
    dist.all_gather(batches, batch)
    (sum(_loss(reference, b) for b in batches) / world).backward()
    ref = _norm_of(reference)
    ok = abs(ours - ref) <= 1e-4 * max(ref, 1e-12)
    return ok, f"sapper {ours:.6g} vs single GPU {ref:.6g}"


def check_fsdp_monitor(rank: int, world: int, device: torch.device) -> tuple[bool, str]:
    from sapper.monitor import Monitor

    model, reference = _fsdp_pair(world, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the reference keeps the weights
    mon = Monitor(model, opt, log_every=2, console=False, distributed={"timeout_s": 60})
    refs = []
    for step in range(4):
        batch = _batch(rank, step, device)
        batches = [torch.empty_like(batch) for _ in range(world)]
        dist.all_gather(batches, batch)
        reference.zero_grad(set_to_none=True)
        (sum(_loss(reference, b) for b in batches) / world).backward()
        refs.append(_norm_of(reference))
        loss = _loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step(loss)
    found = mon.close()
    norms = [rec.grad_norm for rec in mon.history]
    errors = [f.message for f in found if f.code == "R190"]
    ok = not errors and len(norms) == len(refs) and all(
        n is not None and abs(n - r) <= 1e-4 * max(r, 1e-12)
        for n, r in zip(norms, refs, strict=True)
    )
    shown = ", ".join(f"{n:.6g}/{r:.6g}" for n, r in zip(norms, refs, strict=False))
    return ok, "; ".join(errors) or f"monitor/single GPU {shown}"


CHECKS = [
    ("DDP clean, no host sync per step", check_clean),
    ("DDP NaN on the last rank -> X001", check_nan),
    ("DDP slow loader on rank 1 -> X002", check_straggler),
    ("DDP replica knocked out of sync -> X003", check_desync),
    ("FSDP2 global grad norm = single GPU", check_fsdp_norm),
    ("FSDP2 + Monitor grad norm every step", check_fsdp_monitor),
    ("DDP huge finite loss on the last rank -> X001 first", check_blowup),
    ("DDP one flipped bit in one replica -> X003 + parameter", check_bitflip),
]


def main() -> int:
    global VOCAB, SEQ, WIDTH
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if "--reduced" in sys.argv:
        TRACKER_OPTS["detail_ranks"] = 0
    if "--cpu" in sys.argv:  # a dry run of the script itself: gloo, a smaller model
        VOCAB, SEQ, WIDTH = 64, 33, 32
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            print(
                "needs 2+ CUDA GPUs; launch with torchrun --nproc-per-node=N "
                "(or add --cpu for a dry run on gloo)",
                file=sys.stderr,
            )
            return 2
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    failed = 0
    for name, check in CHECKS:
        t0 = time.perf_counter()
        try:
            ok, detail = check(rank, world, device)
        except Exception as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        dist.barrier()
        if rank == 0:
            mark = "PASS" if ok else "FAIL"
            print(f"{mark}  {name:<42} {time.perf_counter() - t0:6.1f} s  {detail}", flush=True)
        failed += not ok
    dist.destroy_process_group()
    return failed if rank == 0 else 0


if __name__ == "__main__":
    raise SystemExit(main())
