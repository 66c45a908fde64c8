"""Per-step cost of sapper's cross-rank monitoring at world size 1, 2 and 4 (gloo, CPU).

The per-step work (device-side flags, the sample sketch, host timers) is independent of
the world size; the one all-gather runs every N steps and moves ~40 float64 per rank, so
the amortized cost per step must stay flat as ranks are added. Each rank trains a tiny
model; a barrier before every step stands in for DDP's all-reduce (it keeps the ranks in
lockstep, so the exchange time is the collective's own cost, not scheduling skew) and is
not timed.

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
    observe, exchange, gather = [], [], []
    for step in range(steps):
        batch = torch.randint(0, 64, (8, 33), generator=gen)
        t0 = time.perf_counter()
        tracker.batch(batch)
        t_batch = time.perf_counter() - t0
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()  # lockstep, as DDP's all-reduce would (not timed)
        before = tracker.exchanges
        t0 = time.perf_counter()
        tracker.step(step, loss=loss.detach())
        spent = time.perf_counter() - t0 + t_batch
        if tracker.exchanges > before:
            exchange.append(spent)
            gather.append(tracker.last_gather_s)
        else:
            observe.append(spent)
    if dist.get_rank() == 0:
        print(json.dumps({"observe": observe, "exchange": exchange, "gather": gather}), flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(world: int, steps: int, every: int) -> dict[str, list[float]]:
    port = _free_port()
    procs = []
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
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--worker",
                    "--steps",
                    str(steps),
                    "--every",
                    str(every),
                ],
                env=env,
                stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                text=True,
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
        f"{'world':>5} | {'per step µs (median)':>20} | {'exchange ms (median)':>20} | "
        f"{'in all-gather ms':>16} | {'exchange ms (p90)':>17} | {'amortized µs/step':>17}"
    )
    print(head)
    print("-" * len(head))
    for world in args.worlds:
        res = _run(world, args.steps, args.every)
        obs = res["observe"][args.every :]  # skip the first window (lazy setup)
        exc = res["exchange"][1:] or res["exchange"]
        per = statistics.median(obs) * 1e6
        ex_med = statistics.median(exc) * 1e3 if exc else 0.0
        ex_p90 = sorted(exc)[int(0.9 * (len(exc) - 1))] * 1e3 if exc else 0.0
        gat = res["gather"][1:] or res["gather"]
        in_gather = statistics.median(gat) * 1e3 if gat else 0.0
        total = (sum(obs) + sum(exc)) / max(len(obs) + len(exc), 1) * 1e6
        print(
            f"{world:>5} | {per:>20.1f} | {ex_med:>20.2f} | {in_gather:>16.2f} | "
            f"{ex_p90:>17.2f} | {total:>17.1f}"
        )


if __name__ == "__main__":
    main()
