"""Check e: data parallel over gloo gives the update of one process; ranks read disjoint data.

Two processes (``torch.multiprocessing.spawn``) join a real gloo process group, build the
toy from the same initial weights, wrap it in ``DistributedDataParallel``, read their
micro-batches from the data source *for their rank*, run the user's step and one plain
SGD step (Adam's first update is ≈ lr·sign(g) and would hide a wrongly scaled gradient).
The parent then runs the same step in one process over all the micro-batches the ranks
read and compares:

- S007: the DDP update against the single-process update (and the ranks against each
  other): per-rank loss normalisation with uneven token counts, a gradient that is not
  all-reduced, or ranks starting from different weights show here;
- S008 (:mod:`sapper.smoke.sharding`): over a whole epoch of the data source, every sample
  read by exactly one rank; reported even when the DDP run itself failed.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sapper.errors import SapperError
from sapper.rules.model import Finding
from sapper.smoke.batches import BatchSource, fingerprints, take
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.grads import compare_grads
from sapper.smoke.rules import DATA_PARALLEL, UNSHARDED_SAMPLER
from sapper.smoke.sharding import run_epoch_check
from sapper.smoke.step import StepOptions, TrainStep
from sapper.smoke.toy import ModelFactory

__all__ = ["DPJob", "run"]

#: Seconds a rank waits in a collective before giving up (gloo's default is 30 minutes).
_TIMEOUT_S = 120


@dataclass(frozen=True)
class DPJob:
    """What each rank needs; everything here must pickle."""

    factory: ModelFactory
    source: BatchSource
    step: TrainStep
    seed: int
    micro_batches: int
    lr: float
    folder: str


def _updates(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        key = name.removeprefix("module.")
        out[key] = p.detach().float().cpu() - before[key].float().cpu()
    return out


def _worker(rank: int, world: int, job: DPJob) -> None:
    """One rank. It leaves with ``os._exit`` once its result is on disk: tearing down DDP
    from Python can deadlock (the reducer's last reference destroys the gloo group, which
    joins a thread that waits for the GIL the destroying thread holds), and a finished
    smoke rank has nothing left to clean up. A failure writes the traceback for the parent;
    the parent's join then stops the other rank, and the group's timeout bounds a rank
    left waiting in a collective."""
    torch.set_num_threads(1)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    folder = Path(job.folder)
    code = 0
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{folder / 'store'}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=_TIMEOUT_S),
        )
        from torch.nn.parallel import DistributedDataParallel

        initial = torch.load(folder / "initial.pt", weights_only=True)
        model = job.factory.build(job.seed)
        model.load_state_dict(initial)
        model.eval()  # dropout off: the runs must be comparable
        ddp = DistributedDataParallel(model)
        batches = take(job.source, job.micro_batches, rank, world)
        opt = torch.optim.SGD(ddp.parameters(), lr=job.lr)
        res = job.step(ddp, batches, StepOptions())
        if res.grad_scale != 1.0:
            for p in ddp.parameters():
                if p.grad is not None:
                    p.grad.div_(res.grad_scale)
        opt.step()
        out = {
            "updates": _updates(model, initial),
            "batches": batches,
            "fingerprints": [fp for b in batches for fp in fingerprints(b)],
        }
        torch.save(out, folder / f"rank{rank}.pt")
        dist.barrier()
    except BaseException:
        (folder / f"rank{rank}.err").write_text(traceback.format_exc())
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _spawn(ctx: SmokeContext, folder: Path, world: int, k: int) -> list[dict[str, Any]]:
    torch.save(ctx.initial_state, folder / "initial.pt")
    job = DPJob(ctx.factory, ctx.source, ctx.step, ctx.config.seed, k, ctx.config.lr, str(folder))
    env_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        mp.start_processes(
            _worker,
            args=(world, job),
            nprocs=world,
            join=True,
            start_method=ctx.config.dp_start_method,
        )
    finally:
        if env_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_threads
    # Tensors, dicts and text only: read back as any file is, without running its pickle.
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(world)]


def _crashed(folder: Path, world: int, exc: BaseException) -> Finding:
    # The rank that failed first wrote first: the others then fail in their collectives
    # ("connection closed by peer"), which says nothing about the cause.
    errors = sorted(
        (e for e in (folder / f"rank{r}.err" for r in range(world)) if e.exists()),
        key=lambda e: e.stat().st_mtime_ns,
    )
    text = errors[0].read_text() if errors else str(exc)
    last = text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
    return verdict(
        DATA_PARALLEL,
        False,
        f"the step failed under DistributedDataParallel (gloo, {world} ranks): {last}",
        traceback=text,
    )


def run(ctx: SmokeContext) -> list[Finding]:
    tol = ctx.config.tolerances
    world = ctx.config.dp_world_size
    k = max(1, ctx.config.grad_accum)
    with tempfile.TemporaryDirectory(prefix="sapper-dp-") as tmp:
        folder = Path(tmp)
        try:
            ranks = _spawn(ctx, folder, world, k)
        except Exception as exc:  # the user's step or model failed under DDP
            return [_crashed(folder, world, exc), _epoch(ctx)]
    batches = [b for r in ranks for b in r["batches"]]
    model = ctx.fresh_model(train=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=ctx.config.lr)
    res = ctx.step(model, batches, StepOptions())
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(res.grad_scale)
    opt.step()
    ref = _updates(model, before)
    cmp = compare_grads(ranks[0]["updates"], ref)
    spread = max(
        float((r["updates"][n] - ranks[0]["updates"][n]).abs().max())
        for r in ranks[1:]
        for n in ref
    )
    numbers: dict[str, Any] = dict(
        value=cmp.rel_err,
        threshold=tol.fp32_rel_err,
        world_size=world,
        norm_ratio=_norm_ratio(ranks[0]["updates"], ref),
        micro_batches_per_rank=k,
        cosine=cmp.cosine,
        ranks_max_abs_diff=spread,
        worst_layer=cmp.worst.layer if cmp.worst else None,
        layers=cmp.table(),
    )
    passed = cmp.finite and cmp.rel_err <= tol.fp32_rel_err and spread == 0.0
    if passed:
        message = (
            f"DP={world} (gloo, DDP) update equals one process's over the same "
            f"{len(batches)} micro-batches (rel err {cmp.rel_err:.1e}); ranks identical"
        )
    else:
        parts = [f"DP={world} update differs from one process's: rel err {cmp.rel_err:.2g}"]
        if spread:
            parts.append(
                f"ranks disagree by up to {spread:.2g}: their gradients were not all-reduced "
                "(a forward through model.module, every micro-batch under no_sync, a "
                "parameter outside DDP; the contract check, S012, names the clause)"
            )
        elif cmp.finite:
            cause, text = _scale_cause(_norm_ratio(ranks[0]["updates"], ref), cmp.cosine, world)
            numbers["cause"] = cause
            parts.append(text)
        message = "; ".join(parts)
    return [verdict(DATA_PARALLEL, passed, message, **numbers), _epoch(ctx)]


def _norm_ratio(test: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """‖DDP update‖ / ‖one process's update‖."""
    num = sum(float(test[n].double().pow(2).sum()) for n in ref)
    den = sum(float(ref[n].double().pow(2).sum()) for n in ref)
    return (num / den) ** 0.5 if den else float("inf")


def _scale_cause(ratio: float, cosine: float, world: int) -> tuple[str, str]:
    """Which normalisation the DDP update's size and direction point at. DDP averages the
    ranks' gradients, so a loss not multiplied by the world size gives 1/world of the
    update in the same direction; a token count that is only the rank's own (not
    all-reduced) gives about world times it (tilted by the uneven counts); a per-rank mean
    of the right size tilts the direction only."""
    aligned = cosine > 0.999
    if aligned and abs(ratio * world - 1.0) < 0.1:
        return "no world-size factor", (
            f"the update is 1/{world} of one process's in the same direction (×{ratio:.3g}): "
            f"DDP averages gradients over ranks, so the loss must be multiplied by the world "
            f"size ({world})"
        )
    if abs(ratio / world - 1.0) < 0.25:  # the per-rank counts also tilt it a little
        return "token count not all-reduced", (
            f"the update is about {world}× one process's (×{ratio:.3g}): each rank divides by "
            "its own target tokens, not the count all-reduced over ranks"
        )
    return "per-rank normalisation", (
        f"the update points elsewhere (cosine {cosine:.4g}, ×{ratio:.3g} in size): the loss "
        "is normalised per rank, so with uneven token counts the ranks' tokens weigh "
        "differently; divide by the token count summed over all ranks"
    )


def _epoch(ctx: SmokeContext) -> Finding:
    """S008 over the epoch; a loader that fails part-way through it is S008's failure (the
    DDP verdict above stands)."""
    try:
        return run_epoch_check(ctx)
    except SapperError:
        raise
    except Exception as exc:  # the user's loader failed while reading a whole epoch
        return verdict(
            UNSHARDED_SAMPLER,
            False,
            f"reading a whole epoch of the data source failed: {type(exc).__name__}: {exc}",
            crashed=True,
        )
