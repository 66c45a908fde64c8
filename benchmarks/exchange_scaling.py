"""sapper's cross-rank exchange as the world grows: the all-gather design vs the reduce.

For each world size both designs run in one job (gloo on CPU, one process per rank):

* ``gather``: every rank all-gathers its packed row (the columns, the mask and a 16-value
  sample sketch), builds the ``(world, n)`` table and rank 0 runs the cross-rank
  detectors over it;
* ``reduce``: the three rounds of :func:`sapper.distributed.exchange.reduce_window`
  (fixed-size all-reduces: statistics, extreme ranks, the named ranks' rows), then the
  same detectors over the statistics.

Printed per world and design: setup (forming sapper's side group), the sockets rank 0
holds afterwards, the median exchange on rank 0 (collectives + detectors), the bytes
each rank receives per exchange, and rank 0's peak RSS. The ranks meet at a barrier
before every exchange, so the time is the exchange's, not the skew between processes.

    python benchmarks/exchange_scaling.py [--worlds 2 4 8 16 32] [--exchanges 12]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _worker(exchanges: int) -> None:
    import torch
    import torch.distributed as dist

    from sapper.distributed import RankTable
    from sapper.distributed.detectors import default_distributed_detectors
    from sapper.distributed.exchange import reduce_window
    from sapper.distributed.reduce import SideChannel
    from sapper.distributed.sampling import sample_hashes
    from sapper.distributed.stats import SampleBuckets, default_buckets
    from sapper.distributed.table import COLUMNS, DIST_KEY, pack_row
    from sapper.runtime.detector import DetectorSet
    from sapper.runtime.records import StepRecord

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(rank)
    groups = [list(range(world))]
    out: dict[str, dict[str, float]] = {}
    for design in ("gather", "reduce"):
        base = _sockets()
        t0 = time.perf_counter()
        ch = SideChannel(120.0)
        setup = time.perf_counter() - t0
        sockets = _sockets() - base
        detectors = DetectorSet(default_distributed_detectors())
        sketcher = SampleBuckets(default_buckets(world))
        nb = sketcher.size
        times: list[float] = []
        received = 0
        for i in range(exchanges):
            step = (i + 1) * 10
            values = {name: float(torch.rand((), generator=gen)) for name in COLUMNS}
            values.update(step=step, steps=10, nonfinite_loss_step=-1, nonfinite_grad_step=-1)
            batch = torch.randint(0, 50_000, (80, 64), generator=gen)
            hashes = sample_hashes(batch)
            dist.barrier()
            t = time.perf_counter()
            if design == "gather":
                sketch = torch.sort(hashes)[0][:16].to(torch.float64)
                row = pack_row(values, sketch)
                got = ch.all_gather(row, step)
                assert got is not None
                received = got.numel() * 8
                table = RankTable.from_tensor(got, data_groups=groups, param_groups=groups)
            else:
                head = pack_row(values, torch.zeros(0, dtype=torch.float64))
                buckets = sketcher.local(hashes, 0, rank, world)
                res = reduce_window(
                    ch, COLUMNS, head, buckets, step=step, param_group=0, n_groups=1, max_named=32
                )
                assert res is not None
                stats, rows = res
                n = len(COLUMNS)
                received = 8 * (
                    (4 * n + 3 * nb) + (2 * n + 2 + 2 * nb) + (3 * n + 4)
                    + len(rows) * (n + 1) + 2 * n
                )
                table = RankTable.from_rows(
                    rows, world, stats, data_groups=groups, param_groups=groups
                )
            if rank == 0:
                detectors.update(StepRecord(step=step, extra={DIST_KEY: table}))
            times.append(time.perf_counter() - t)
        out[design] = {
            "setup_s": setup,
            "sockets": sockets,
            "exchange_ms": statistics.median(times[2:] or times) * 1e3,
            "received_bytes": received,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(world: int, exchanges: int) -> dict[str, dict[str, float]]:
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
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--exchanges"]
        procs.append(
            subprocess.Popen(
                [*cmd, str(exchanges)],
                env=env,
                stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                text=True,
            )
        )
    out, _ = procs[0].communicate(timeout=900)
    for p in procs[1:]:
        p.wait(timeout=900)
    if any(p.returncode for p in procs):
        raise SystemExit(f"world {world}: a rank failed ({[p.returncode for p in procs]})")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    ap.add_argument("--exchanges", type=int, default=12)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.exchanges)
        return
    print(
        f"sapper exchange scaling: gloo on CPU, {os.cpu_count()} cores, "
        f"{args.exchanges} exchanges per design\n"
    )
    head = (
        f"{'world':>5} | {'design':>6} | {'setup s':>7} | {'sockets':>7} | "
        f"{'exchange ms':>11} | {'recv KiB':>8} | {'RSS MiB':>7}"
    )
    print(head)
    print("-" * len(head))
    for world in args.worlds:
        res = _run(world, args.exchanges)
        for design in ("gather", "reduce"):
            d = res[design]
            print(
                f"{world:>5} | {design:>6} | {d['setup_s']:>7.3f} | {d['sockets']:>7.0f} | "
                f"{d['exchange_ms']:>11.2f} | {d['received_bytes'] / 1024:>8.1f} | "
                f"{d['rss_mib']:>7.0f}"
            )
    print(
        "\nsetup: forming sapper's gloo side group (new_group); sockets: those rank 0 "
        "opened for it; exchange: median on rank 0, collectives + detectors; recv: bytes "
        "of collective results per rank and exchange; RSS: rank 0's peak (both designs "
        "in one process: the reduce row includes the gather's peak)."
    )


if __name__ == "__main__":
    main()
