"""Writes real flight-recorder dumps: small gloo jobs on the CPU that hang the ways people
hit, each rank dumping its recorder (torch's own ``_dump_fr_trace``) and its Python stacks
(``faulthandler``) from a side thread once the job has been stuck for a moment, as a
collective-timeout dump would. ``python tests/hangs/make_dumps.py OUT [SCENARIO ...]``.

Each scenario is a function of (rank, world) run by every rank after
``init_process_group("gloo")`` with ``TORCH_FR_BUFFER_SIZE`` set. A rank whose work ends
before the dump waits like a finished rank would (in its next Python step), so the dump
shows where every rank was. ``died`` ranks exit before the dump: their file is absent.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Seconds after the last rank's start when every live rank writes its dump.
DUMP_AFTER_S = 4.0
#: The collective timeout the jobs run with: longer than the dump delay, so a dump shows
#: the hang itself and not the error that ends it.
TIMEOUT_S = 60.0


def _train_step(t: torch.Tensor, steps: int, group: dist.ProcessGroup | None = None) -> None:
    for _ in range(steps):
        dist.all_reduce(t, group=group)


def skip_allreduce(rank: int, world: int) -> None:
    """Every rank reduces three steps' gradients; on the last one rank 1's batch is empty
    and a data-dependent ``if`` skips its all-reduce."""
    t = torch.ones(8)
    _train_step(t, 2)
    if rank != 1:
        dist.all_reduce(t)
    _after_work()


def op_mismatch(rank: int, world: int) -> None:
    """At the same point rank 2 all-gathers while the others all-reduce."""
    t = torch.ones(8)
    _train_step(t, 2)
    if rank == 2:
        out = [torch.zeros(8) for _ in range(world)]
        dist.all_gather(out, t)
    else:
        dist.all_reduce(t)
    _after_work()


def size_mismatch(rank: int, world: int) -> None:
    """An uneven last batch: rank 3's all-reduce holds 5 elements, the others' 8."""
    t = torch.ones(8)
    _train_step(t, 2)
    last = torch.ones(5 if rank == 3 else 8)
    dist.all_reduce(last)
    _after_work()


def python_loop(rank: int, world: int) -> None:
    """Rank 0 spins in a Python loop (a retry that never succeeds) before its all-reduce."""
    t = torch.ones(8)
    _train_step(t, 2)
    if rank == 0:
        _spin_forever()
    dist.all_reduce(t)
    _after_work()


def _spin_forever() -> None:
    n = 0
    while True:
        n += 1


def rank_died(rank: int, world: int) -> None:
    """Rank 2 dies (a crash inside an extension) before the third all-reduce: no dump."""
    t = torch.ones(8)
    _train_step(t, 2)
    if rank == 2:
        _mark("done", rank)
        os._exit(1)
    dist.all_reduce(t)
    _after_work()


def two_groups(rank: int, world: int) -> None:
    """4 ranks as 2 data-parallel x 2 tensor-parallel. The TP group {2, 3} hangs (rank 3
    skips a TP all-reduce); the TP group {0, 1} and both DP groups finish their work."""
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    my_tp, my_dp = tp[rank // 2], dp[rank % 2]
    t = torch.ones(8)
    for _ in range(2):
        dist.all_reduce(t, group=my_tp)
        dist.all_reduce(t, group=my_dp)
    if rank != 3:
        dist.all_reduce(t, group=my_tp)
    _after_work()


def slow_healthy(rank: int, world: int) -> None:
    """No hang: every rank is slow (rank 1 slowest) but every all-reduce completes."""
    t = torch.ones(8)
    for _ in range(3):
        time.sleep(0.3 * (2 if rank == 1 else 1))
        dist.all_reduce(t)
    dist.barrier()
    _after_work()


SCENARIOS: dict[str, tuple[int, Callable[[int, int], None]]] = {
    "skip_allreduce": (4, skip_allreduce),
    "op_mismatch": (4, op_mismatch),
    "size_mismatch": (4, size_mismatch),
    "python_loop": (4, python_loop),
    "rank_died": (4, rank_died),
    "two_groups": (4, two_groups),
    "slow_healthy": (2, slow_healthy),
}


def _after_work() -> None:
    """Where a rank that left the collectives waits for the dump: its next Python step."""
    while True:
        time.sleep(0.05)


_SYNC = Path(".")


def _mark(what: str, rank: int) -> None:
    (_SYNC / f"{what}_{rank}").touch()


def _wait_all(what: str, world: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all((_SYNC / f"{what}_{r}").exists() for r in range(world)):
            return
        time.sleep(0.05)


def _dump(folder: Path, rank: int, json_ranks: frozenset[int]) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    if rank in json_ranks:
        (folder / f"nccl_trace_rank_{rank}.json").write_bytes(_dump_fr_trace_json())
    else:
        (folder / f"nccl_trace_rank_{rank}").write_bytes(_dump_fr_trace())
    with open(folder / f"stacks_rank_{rank}.txt", "w") as out:
        faulthandler.dump_traceback(out, all_threads=True)


def _worker(rank: int, world: int, name: str, folder: str, port: int,
            json_ranks: frozenset[int], sync: str) -> None:  # fmt: skip
    global _SYNC
    _SYNC = Path(sync)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TORCH_FR_BUFFER_SIZE="2000")  # fmt: skip
    import datetime

    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))  # fmt: skip
    _mark("ready", rank)

    def dump_then_exit() -> None:
        # Every rank dumps DUMP_AFTER_S after the last one is up, and none exits before
        # all have dumped (an exit would end the others' collectives with an error).
        _wait_all("ready", world, 60)
        time.sleep(DUMP_AFTER_S)
        _dump(Path(folder), rank, json_ranks)
        _mark("done", rank)
        _wait_all("done", world, 20)
        os._exit(0)

    threading.Thread(target=dump_then_exit, daemon=True).start()
    try:
        SCENARIOS[name][1](rank, world)
    except Exception as exc:  # a peer that died: the error is the rank's state
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        _after_work()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make(name: str, folder: Path, json_ranks: frozenset[int] = frozenset()) -> Path:
    """Runs scenario ``name`` and leaves its dumps in ``folder/name``."""
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    world = SCENARIOS[name][0]
    with tempfile.TemporaryDirectory() as sync:
        args = (world, name, str(out), _free_port(), json_ranks, sync)
        ctx = mp.start_processes(_worker, args=args, nprocs=world, join=False,
                                 start_method="spawn")  # fmt: skip
        deadline = time.monotonic() + DUMP_AFTER_S + 120
        for p in ctx.processes:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1])
    names = sys.argv[2:] or list(SCENARIOS)
    for scenario in names:
        # One rank of the op-mismatch job writes torch's JSON form, the rest pickles.
        print(make(scenario, target, frozenset({1}) if scenario == "op_mismatch" else frozenset()))
