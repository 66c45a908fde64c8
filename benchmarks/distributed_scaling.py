"""Per-step cost of sapper's cross-rank monitoring at world size 1, 2 and 4 (gloo, CPU).

The per-step work (keeping the loss, hashing the batch's samples, host timers) is
independent of the world size; the one all-gather runs every N steps and moves one row
of float64 per rank, so the amortized cost per step must stay flat as ranks are added.
Each rank trains a tiny model; a barrier before every step stands in for DDP's
all-reduce (it keeps the ranks in lockstep) and is not timed. Wall time and the calling
thread's CPU time are both shown: on a machine with fewer cores than ranks, wall time
includes waiting to be scheduled, CPU time is sapper's own work.

    python benchmarks/distributed_scaling.py [--steps 300] [--every 10] [--worlds 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _worker(steps: int, every: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from sapper.distributed import RankTracker

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = RankTracker(model, every=every, timeout_s=60)
    gen = torch.Generator().manual_seed(dist.get_rank())
    observe, exchange, gather, cpu_obs, cpu_exc = [], [], [], [], []
    for step in range(steps):
        batch = torch.randint(0, 64, (8, 33), generator=gen)
        t0, c0 = time.perf_counter(), time.thread_time()
        tracker.batch(batch)
        t_batch, c_batch = time.perf_counter() - t0, time.thread_time() - c0
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()  # lockstep, as DDP's all-reduce would (not timed)
        before = tracker.exchanges
        t0, c0 = time.perf_counter(), time.thread_time()
        tracker.step(step, loss=loss.detach())
        spent = time.perf_counter() - t0 + t_batch
        cpu = time.thread_time() - c0 + c_batch
        if tracker.exchanges > before:
            exchange.append(spent)
            cpu_exc.append(cpu)
            gather.append(tracker.last_gather_s)
        else:
            observe.append(spent)
            cpu_obs.append(cpu)
    if dist.get_rank() == 0:
        print(
            json.dumps(
                {
                    "observe": observe,
                    "exchange": exchange,
                    "gather": gather,
                    "cpu_observe": cpu_obs,
                    "cpu_exchange": cpu_exc,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(world: int, steps: int, every: int, copies: int = 1) -> dict[str, list[float]]:
    """One job of ``world`` ranks (or ``copies`` independent ones side by side, to load
    the cores the same way without any cross-rank traffic); rank 0 of the first reports."""
    procs = []
    for copy in range(copies):
        port = _free_port()
        for r in range(world):
            env = dict(
                os.environ,
                RANK=str(r),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(r),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
            )
            first = copy == 0 and r == 0
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--steps",
                str(steps),
                "--every",
                str(every),
            ]
            procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE if first else subprocess.DEVNULL, text=True
                )
            )
    out, _ = procs[0].communicate(timeout=600)
    for p in procs[1:]:
        p.wait(timeout=600)
    if any(p.returncode for p in procs):
        raise SystemExit(f"world {world}: a rank failed ({[p.returncode for p in procs]})")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.steps, args.every)
        return
    print(
        f"sapper cross-rank monitoring: {args.steps} steps, one exchange every "
        f"{args.every} steps, gloo on CPU ({os.cpu_count()} cores)\n"
    )
    head = (
        f"{'world':>6} | {'step µs wall':>12} | {'step µs CPU':>11} | "
        f"{'exchange ms wall':>16} | {'in all-gather ms':>16} | {'exchange ms CPU':>15} | "
        f"{'amortized µs/step CPU':>21}"
    )
    print(head)
    print("-" * len(head))
    runs = [(str(w), w, 1, args.every) for w in args.worlds]
    crowd = max(args.worlds)
    if crowd > 1:  # controls: the same core load without any exchange
        runs.append((f"{crowd} (*)", crowd, 1, 10**9))
        runs.append((f"1 ×{crowd}", 1, crowd, args.every))
    for label, world, copies, every in runs:
        res = _run(world, args.steps, every, copies)

        def med(key: str, skip: int, scale: float, res: dict = res) -> float:
            vals = res[key][skip:] or res[key]
            return statistics.median(vals) * scale if vals else 0.0

        cpu_all = res["cpu_observe"][args.every :] + res["cpu_exchange"][1:]
        amortized = statistics.fmean(cpu_all) * 1e6 if cpu_all else 0.0
        print(
            f"{label:>6} | {med('observe', args.every, 1e6):>12.1f} | "
            f"{med('cpu_observe', args.every, 1e6):>11.1f} | "
            f"{med('exchange', 1, 1e3):>16.2f} | {med('gather', 1, 1e3):>16.2f} | "
            f"{med('cpu_exchange', 1, 1e3):>15.2f} | {amortized:>21.1f}"
        )
    print("\nmedians after the first window; the all-gather runs on gloo's own thread.")
    print(
        f"controls: '{crowd} (*)' is the {crowd}-rank job with the exchange switched off "
        f"(same per-step calls, same lockstep); '1 ×{crowd}' runs {crowd} single-rank jobs "
        "side by side (same core load, no lockstep)."
    )


if __name__ == "__main__":
    main()
