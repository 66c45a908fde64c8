"""Time and peak memory to analyse flight-recorder dumps of 1k and 16k ranks: sapper's
hang analysis against torch's own analyzer (``python -m
torch.distributed.flight_recorder.fr_trace``) on the same files.

The folders are made from the recorded gloo dumps of ``tests/hangs/data/skip_allreduce``:
every rank gets the recorded all-reduce entry (with its Python frames) repeated over
``--history`` sequence numbers, the last one not completed; one rank (``ranks // 3``)
stops a collective earlier, like the recorded rank 1. The dumps are written the way NCCL
writes them (a ``pg_config`` whose default group lists every rank, entry states), since
torch's analyzer stops on gloo's empty ``pg_config``. Each tool runs in its own process;
its wall time and peak RSS are measured from outside (``/usr/bin/time``-style rusage).

    python benchmarks/hang_scale.py                      # 1k and 16k ranks
    python benchmarks/hang_scale.py --ranks 1000 --history 200
"""

from __future__ import annotations

import argparse
import copy
import os
import pickle
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sapper.unpickle import Vocabulary, restricted_loads

DATA = Path(__file__).parents[1] / "tests" / "hangs" / "data" / "skip_allreduce"
SAPPER = """
import sys, json
from pathlib import Path
from sapper.hangs import diagnose_hang
c = diagnose_hang(Path(sys.argv[1])).to_json()["causes"][0]
print("suspects", c["suspects"], c["cause"], "#%d" % c["collective"]["seq"])
"""


def _load(name: str) -> dict[str, Any]:
    path = DATA / name
    return restricted_loads(path.read_bytes(), Vocabulary(), str(path))


def _history(template: dict[str, Any], ranks: int, last: int, done_to: int) -> bytes:
    """One rank's dump: ``last`` all-reduces (``done_to`` of them completed)."""
    dump = copy.deepcopy(template)
    model = next(e for e in dump["entries"] if e["collective_seq_id"] == 1)
    entries = []
    for seq in range(1, last + 1):
        e = dict(model)
        done = seq <= done_to
        e.update(collective_seq_id=seq, record_id=seq - 1, op_id=seq,
                 time_created_ns=model["time_created_ns"] + seq * 1_000_000,
                 profiling_name="nccl:all_reduce",
                 state="completed" if done else "scheduled", retired=done)  # fmt: skip
        entries.append(e)
    dump["entries"] = entries
    dump["pg_config"] = {"0": {"name": "0", "desc": "default_pg",
                               "ranks": str(list(range(ranks)))}}  # fmt: skip
    dump["pg_status"] = {"0": {"last_enqueued_collective": last, "last_started_collective": -1,
                               "last_completed_collective": done_to}}  # fmt: skip
    return pickle.dumps(dump)


def make_folder(out: Path, ranks: int, history: int) -> tuple[int, int]:
    """``ranks`` dumps under ``out`` (``rank_<r>``); the rank that stops early and the
    folder's bytes."""
    waiting = _history(_load("nccl_trace_rank_0"), ranks, history, history - 1)
    behind = _history(_load("nccl_trace_rank_1"), ranks, history - 1, history - 1)
    suspect = ranks // 3
    out.mkdir(parents=True)
    for r in range(ranks):
        (out / f"rank_{r}").write_bytes(behind if r == suspect else waiting)
    return suspect, (ranks - 1) * len(waiting) + len(behind)


def measure(cmd: list[str], timeout: float, mem_gb: float) -> tuple[float | None, float, str]:
    """Wall seconds (None past ``timeout``), peak RSS in MB, and the output's gist."""
    def limit() -> None:
        cap = int(mem_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    # The peak RSS of a tool killed at the timeout is measured too (rusage of the
    # children waited for).
    runner = ("import resource, subprocess, sys, time\n"
              "t = time.perf_counter()\n"
              "try:\n"
              "    p = subprocess.run(sys.argv[2:], capture_output=True, text=True,"
              " timeout=float(sys.argv[1]))\n"
              "except subprocess.TimeoutExpired:\n"
              "    print('TIMEOUT')\n"
              "    p = subprocess.CompletedProcess([], -9, '', '')\n"
              "print('WALL', time.perf_counter() - t)\n"
              "print('RSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
              "print('RC', p.returncode)\n"
              "out = p.stdout[:3000] + p.stdout[-3000:] + p.stderr[:3000] + p.stderr[-3000:]\n"
              "sys.stdout.write(out)\n")  # fmt: skip
    try:
        out = subprocess.run([sys.executable, "-c", runner, str(timeout), *cmd],
                             capture_output=True, text=True, timeout=timeout + 60,
                             preexec_fn=limit).stdout  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, float("nan"), "timed out"
    if "WALL" not in out:
        return None, float("nan"), "timed out"
    wall = float(re.search(r"WALL (\S+)", out).group(1))  # type: ignore[union-attr]
    rss = int(re.search(r"RSS (\d+)", out).group(1)) / 1024  # type: ignore[union-attr]
    if "TIMEOUT" in out:
        return None, rss, f"no answer within {timeout:.0f} s (killed)"
    rc = int(re.search(r"RC (-?\d+)", out).group(1))  # type: ignore[union-attr]
    return wall, rss, _gist(out, rc)


def _gist(out: str, rc: int) -> str:
    if m := re.search(r"suspects (\[.*?\]) (\S+) (#\d+)", out):
        return f"rank {m.group(1)[1:-1]} ({m.group(2)} {m.group(3)})"
    if m := re.search(r"missing ranks: (\{.*?\})", out):
        seq = re.search(r"sequence number: (\d+)", out)
        return f"missing ranks {m.group(1)} (#{seq.group(1) if seq else '?'})"
    if rc != 0:
        last = [ln for ln in out.splitlines() if ln.strip()][-1:] or ["?"]
        return f"failed (exit {rc}): {last[0][:60]}"
    return "no answer printed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1000, 16000])
    parser.add_argument("--history", type=int, default=50,
                        help="collectives recorded per rank (torch keeps up to 2000)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--mem-gb", type=float, default=16.0,
                        help="address-space cap per tool run")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args()
    rows = []
    for n in args.ranks:
        folder = Path(tempfile.mkdtemp(prefix=f"fr{n}-"))
        try:
            t0 = time.perf_counter()
            suspect, size = make_folder(folder / "dumps", n, args.history)
            print(f"{n} ranks: {size / 1e6:.0f} MB of dumps made in "
                  f"{time.perf_counter() - t0:.1f} s; rank {suspect} stops early", flush=True)
            tools = [("sapper", [sys.executable, "-c", SAPPER, str(folder / "dumps")])]
            if not args.no_torch:
                tools.append(("torch fr_trace", [
                    sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                    str(folder / "dumps"), "-p", "rank_"]))  # fmt: skip
            for name, cmd in tools:
                wall, rss, gist = measure(cmd, args.timeout, args.mem_gb)
                rows.append((n, size, name, wall, rss, gist))
                print(f"  {name}: {wall if wall is None else round(wall, 1)} s, "
                      f"{rss:.0f} MB: {gist}", flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print()
    print(f"{'ranks':>6} {'dumps MB':>9}  {'tool':<15} {'seconds':>8} {'peak MB':>8}  answer")
    for n, size, name, wall, rss, gist in rows:
        secs = f"{wall:8.1f}" if wall is not None else f"{'>' + str(int(args.timeout)):>8}"
        print(f"{n:>6} {size / 1e6:>9.0f}  {name:<15} {secs} {rss:>8.0f}  {gist}")
    print(f"\n{os.cpu_count()} CPUs; {args.history} collectives recorded per rank")


if __name__ == "__main__":
    main()
