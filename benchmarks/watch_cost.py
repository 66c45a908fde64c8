"""What `sapper watch` costs next to a job: CPU share while a log grows by 1,000 records/s.

For each log format, starts ``sapper watch`` as its own process (as a user would, default
``--poll 1.0``), appends a healthy run's records at ``--rate`` records/s for a warm-up and
a measured window, then one record with a NaN loss. The watcher's CPU time over the
window is read from ``/proc/<pid>/stat`` (user + system, all its threads; start-up
imports excluded), so the share is of one core. Also printed: the records the watcher
read (it must keep up: every record written), and the time from the NaN record's write
to its R001 line in the watcher's output. Target: at most 3% of one core at 1,000
records/s with the default poll interval. A second table splits the cost per record
(measured in this process): following, parsing and the view, against the detectors —
the same per-record work ``sapper analyze`` and the in-loop monitor do.

    python benchmarks/watch_cost.py [--seconds 20] [--rate 1000] [--formats sapper,megatron]
    python benchmarks/watch_cost.py --compare /path/to/before/src --formats sapper,megatron

Formats: sapper (JSONL run log), megatron (text log), csv, tensorboard (SummaryWriter in
this process), and sapper-live (the rich live view drawn on a pseudo-terminal).

The per-record table's last column, *beyond*, is the watcher process's share less the
per-record work at the rate: what the process spends apart from the records (wakes,
``stat`` calls, timers, the view's redraws, the garbage collector). A last line gives a
watcher on a log that does not grow, which spends only that.

Measured on a shared 2-core machine (other jobs running), before and after the
detectors' shortcuts for records without the live monitor's fields; ``--compare``, the
median of 3 alternating runs of 15 s each, load average 1.5 at the start and 3.3 at the
end (CPU % of one core at 1,000 records/s):

    format        before  after
    sapper          2.07   1.53
    megatron        2.27   1.73
    csv             1.73   1.27
    tensorboard     2.00   1.60
    sapper-live     2.20   1.80

Per record, in-process (single runs at load average 1.1-1.3; before → after), the
detectors: sapper 12.0 → 9.1 µs, megatron 14.2 → 9.5, csv 10.5 → 6.0, tensorboard
8.8 → 4.9; following, parsing and the view 5.7-11.0 µs, unchanged. *beyond* after, in
two runs at load 1.1-1.6: -0.07 to 0.22 % of a core (run-to-run noise is about as
large); the idle watcher: 0.00 % (below the 0.1 % that 10 s of clock ticks resolve).
So the share is the per-record work. A poll after a second of sleep costs about 5% more
than one in a loop (cold caches; measured at load 2). An earlier run on a quiet machine
(load 0.5, before) read 3.87% for sapper against 2.35% in-process; at load 1-3 that gap
did not show, so rerun on a quiet machine before trusting a margin.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sapper.runtime.records import StepRecord

CLI = [sys.executable, "-c", "from sapper.cli.app import main; main()", "watch"]
FORMATS = ("sapper", "megatron", "csv", "tensorboard", "sapper-live")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def healthy(step: int, rng: random.Random) -> StepRecord:
    """A 7B-style pre-training step: falling loss, steady norm, warmup-cosine LR."""
    warm, total, peak = 2000, 200_000, 3e-4
    lr = peak * step / warm if step < warm else peak * 0.5 * (
        1 + math.cos(math.pi * min(1.0, (step - warm) / (total - warm)))
    )
    tps = 262_144 * (1 + rng.gauss(0, 0.01))
    return StepRecord(
        step=step,
        loss=2.1 + 8.0 * math.exp(-step / 3000) + rng.gauss(0, 0.01),
        grad_norm=0.35 + abs(rng.gauss(0, 0.03)),
        clip_threshold=1.0,
        lr=lr,
        memory_allocated_gib=14.2,
        memory_peak_gib=31.8,
        memory_limit_gib=79.6,
        step_time_s=65536 / tps,
        tokens=65536,
        tokens_per_s=tps,
        time=time.time(),
    )


class LogWriter:
    """Appends records in one format; ``write`` takes a batch and flushes it."""

    def __init__(self, fmt: str, folder: Path) -> None:
        self.fmt = fmt.removesuffix("-live")
        if self.fmt == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.path = folder / "tb"
            self._tb = SummaryWriter(str(self.path), flush_secs=3600)
            return
        suffix = {"sapper": ".jsonl", "megatron": ".log", "csv": ".csv"}[self.fmt]
        self.path = folder / f"train{suffix}"
        self._fh = self.path.open("w", encoding="utf-8")
        if self.fmt == "sapper":
            self._fh.write(json.dumps({"kind": "meta", "version": 1, "started": time.time()}))
            self._fh.write("\n")
        elif self.fmt == "csv":
            self._fh.write("step,train/loss,train/grad_norm,train/learning_rate,tokens_per_s\n")
        self._fh.flush()

    def write(self, records: list[StepRecord]) -> None:
        if self.fmt == "tensorboard":
            for r in records:
                self._tb.add_scalar("train/loss", r.loss, r.step)
                self._tb.add_scalar("train/grad_norm", r.grad_norm, r.step)
                self._tb.add_scalar("train/learning_rate", r.lr, r.step)
            self._tb.flush()
            return
        self._fh.write("".join(self._line(r) + "\n" for r in records))
        self._fh.flush()

    def _line(self, r: StepRecord) -> str:
        if self.fmt == "sapper":
            return json.dumps({"kind": "step", **r.to_json()})
        if self.fmt == "csv":
            return f"{r.step},{r.loss},{r.grad_norm},{r.lr},{r.tokens_per_s}"
        loss = "" if not math.isfinite(r.loss or 0) else f" lm loss: {r.loss:.6E} |"
        nan = 0 if loss else 1
        return (
            f" iteration {r.step:8d}/  200000 | consumed samples: {16 * r.step:12d} | elapsed "
            f"time per iteration (ms): {1000 * (r.step_time_s or 0):.1f} | learning rate: "
            f"{r.lr:.6E} | global batch size:    16 |{loss} loss scale: 1.0 | grad norm: "
            f"{r.grad_norm:.3f} | number of skipped iterations:   0 | number of nan "
            f"iterations: {nan:3d} |"
        )

    def close(self) -> None:
        if self.fmt == "tensorboard":
            self._tb.close()
        else:
            self._fh.close()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process and its threads, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


class Output:
    """Reads the watcher's output on a thread; notes when a pattern first appears."""

    def __init__(self, read: Callable[[], bytes]) -> None:
        self.read = read
        self.text = bytearray()
        self.seen: dict[bytes, float] = {}
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = self.read()
            except OSError:
                return
            if not chunk:
                return
            self.text += chunk
            for mark in (b"R001",):
                if mark not in self.seen and mark in self.text:
                    self.seen[mark] = time.time()


def run_one(
    fmt: str, rate: float, warmup: float, seconds: float, src: str | None = None
) -> dict[str, object]:
    """One watcher process following one growing log; ``src``: import sapper from that
    tree instead (a before/after comparison on the same machine)."""
    with tempfile.TemporaryDirectory() as tmp:
        writer = LogWriter(fmt, Path(tmp))
        rng = random.Random(0)
        live = fmt.endswith("-live")
        args = [*CLI, str(writer.path), "--format", "live" if live else "plain",
                "--idle-timeout", "3"]
        env = {**os.environ, "COLUMNS": "120", "LINES": "40"}
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
        if live:
            import pty

            master, slave = pty.openpty()
            proc = subprocess.Popen(args, stdout=slave, stderr=slave, env=env)
            os.close(slave)
            out = Output(lambda: os.read(master, 1 << 16))
        else:
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env={**env, "PYTHONUNBUFFERED": "1"})
            assert proc.stdout is not None
            out = Output(lambda: os.read(proc.stdout.fileno(), 1 << 16))  # type: ignore[union-attr]
        step, begin = 0, time.monotonic()
        cpu0 = wall0 = None
        while True:
            now = time.monotonic()
            if cpu0 is None and now - begin >= warmup:
                cpu0, wall0 = cpu_seconds(proc.pid), now
            if now - begin >= warmup + seconds:
                break
            due = int((now - begin) * rate)
            if due > step:
                writer.write([healthy(s, rng) for s in range(step + 1, due + 1)])
                step = due
            time.sleep(0.05)
        cpu1, wall1 = cpu_seconds(proc.pid), time.monotonic()
        bad = healthy(step + 1, rng)
        bad.loss = math.nan
        writer.write([bad, healthy(step + 2, rng)])
        written_at = time.time()
        step += 2
        deadline = time.monotonic() + 10
        while b"R001" not in out.seen and time.monotonic() < deadline:
            time.sleep(0.01)
        writer.close()
        proc.wait(60)
        out.thread.join(5)
        text = out.text.decode("utf-8", errors="replace")
        match = re.search(r"watch ended .*?([\d,]+) records", text)
        share = None
        if cpu0 is not None and cpu1 is not None and wall0 is not None:
            share = 100.0 * (cpu1 - cpu0) / (wall1 - wall0)
        return {
            "format": fmt,
            "written": step,
            "read": int(match.group(1).replace(",", "")) if match else None,
            "cpu": share,
            "latency": out.seen[b"R001"] - written_at if b"R001" in out.seen else None,
        }


def idle_share(seconds: float, warmup: float = 3.0) -> float | None:
    """CPU % of a core of a watcher whose log does not grow: what it spends per second
    apart from reading records (its wakes, the log's ``stat``, timers)."""
    with tempfile.TemporaryDirectory() as tmp:
        writer = LogWriter("sapper", Path(tmp))
        writer.write([healthy(1, random.Random(0))])
        args = [*CLI, str(writer.path), "--format", "plain",
                "--idle-timeout", str(warmup + seconds + 30)]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(warmup)
            cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            cpu1, wall1 = cpu_seconds(proc.pid), time.monotonic()
        finally:
            proc.terminate()
            proc.wait(30)
            writer.close()
    if cpu0 is None or cpu1 is None:
        return None
    return 100.0 * (cpu1 - cpu0) / (wall1 - wall0)


def per_record(fmt: str, count: int = 20_000) -> tuple[float, float]:
    """CPU µs per record in this process: following without detectors (reading, parsing,
    the plain view), and with the default detectors. The first poll (format detection,
    building the detectors) is left out, as the watcher's start-up is from its share."""
    from sapper.watch import PlainView, Watcher, open_follower, watch_detectors

    costs = []
    for detectors in (lambda plan: [], watch_detectors):
        with tempfile.TemporaryDirectory() as tmp:
            writer = LogWriter(fmt, Path(tmp))
            rng = random.Random(0)
            view = PlainView(io.StringIO())
            watcher = Watcher(open_follower(writer.path), detectors=detectors, idle_timeout=0,
                              sinks=[view])
            spent = 0.0
            # one poll per 1,000 records, as at 1,000/s; the first one is the start-up
            for start in range(0, count + 1000, 1000):
                writer.write([healthy(s, rng) for s in range(start + 1, start + 1001)])
                begin = time.process_time()
                while watcher.tick() == 0.0:
                    pass
                if start:
                    spent += time.process_time() - begin
            writer.close()
            costs.append(1e6 * spent / count)
    return costs[0], costs[1]


def compare(args: argparse.Namespace) -> None:
    """CPU share of the watcher from ``args.compare`` (before) and from this tree (after),
    the two alternating format by format and round by round (order swapped each round),
    so that load drifts on a shared machine reach both alike."""
    trees = {"before": args.compare, "after": None}
    got: dict[tuple[str, str], list[float]] = {}
    for r in range(args.compare_rounds):
        for fmt in args.formats.split(","):
            for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                row = run_one(fmt, args.rate, args.warmup, args.seconds, trees[name])
                if row["cpu"] is not None:
                    got.setdefault((fmt, name), []).append(float(row["cpu"]))  # type: ignore[arg-type]
                if row["read"] != row["written"]:
                    print(f"{fmt} ({name}): read {row['read']} of {row['written']} records")
        print(f"compare round {r + 1}: done", flush=True)
    print(f"sapper watch at {args.rate:,.0f} records/s, CPU % of a core, before vs after "
          f"(median of {args.compare_rounds} alternating runs of {args.seconds:g} s; "
          "target ≤ 3%)")
    print(f"{'format':<14} {'before':>8} {'after':>8}   runs (before | after)")
    for fmt in args.formats.split(","):
        b, a = got.get((fmt, "before"), []), got.get((fmt, "after"), [])
        med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "N/A"  # noqa: E731
        runs = " ".join(f"{x:.2f}" for x in b) + " | " + " ".join(f"{x:.2f}" for x in a)
        print(f"{fmt:<14} {med(b):>8} {med(a):>8}   {runs}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"(load average {load:.1f} on {os.cpu_count()} CPUs at the end)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="records per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per format")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--compare", metavar="SRC", default=None,
                    help="also run the watcher from another tree's src/ (before), alternating")
    ap.add_argument("--compare-rounds", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=10.0,
                    help="also measure a watcher on a log that does not grow (0: skip)")
    args = ap.parse_args()
    for fmt in args.formats.split(","):
        if fmt not in FORMATS:
            ap.error(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if args.compare:
        compare(args)
        return
    rows = []
    for fmt in args.formats.split(","):
        rows.append(run_one(fmt, args.rate, args.warmup, args.seconds))
    print(f"sapper watch at {args.rate:,.0f} records/s, poll 1.0 s, "
          f"{args.seconds:g} s measured after {args.warmup:g} s warm-up (target: CPU ≤ 3%)")
    print(f"{'format':<14} {'written':>9} {'read':>9} {'CPU % of a core':>16} "
          f"{'NaN → R001 (s)':>15}")
    for r in rows:
        cpu = "N/A" if r["cpu"] is None else f"{r['cpu']:.2f}"
        lat = "N/A" if r["latency"] is None else f"{r['latency']:.2f}"
        read = "N/A" if r["read"] is None else f"{r['read']:,}"
        print(f"{r['format']:<14} {r['written']:>9,} {read:>9} {cpu:>16} {lat:>15}")
    print()
    print("CPU µs per record, in-process (where the time goes); 'beyond': the watcher "
          "process's share less the per-record work at the rate")
    print(f"{'format':<14} {'follow+parse+view':>18} {'detectors':>10} {'total':>8} "
          f"{'% of a core at rate':>20} {'beyond':>7}")
    measured = {r["format"]: r["cpu"] for r in rows}
    for fmt in dict.fromkeys(f.removesuffix("-live") for f in args.formats.split(",")):
        bare, full = per_record(fmt)
        share = full * args.rate / 1e4
        cpu = measured.get(fmt)
        beyond = "N/A" if cpu is None else f"{float(cpu) - share:.2f}"  # type: ignore[arg-type]
        print(f"{fmt:<14} {bare:>18.1f} {full - bare:>10.1f} {full:>8.1f} {share:>20.2f} "
              f"{beyond:>7}")
    if args.idle_seconds > 0:
        idle = idle_share(args.idle_seconds)
        shown = "N/A" if idle is None else f"{idle:.2f}"
        print(f"\nthe watcher on a sapper log that stopped growing (its wakes, stat calls and "
              f"timers alone): {shown} % of a core over {args.idle_seconds:g} s")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"(load average {load:.1f} on {os.cpu_count()} CPUs while measuring)")


if __name__ == "__main__":
    main()
