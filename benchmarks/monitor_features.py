"""The live monitor's own host time per step, feature by feature, on one process and
under DDP (gloo, CPU) at world 2 and 4. Target: under 1 ms per step at the defaults.

What is measured is the monitor's *self time*: every entry point of the monitor into a
training step (the model's forward hooks, the loss/logits tensor hooks, the optimizer's
hooks, the clipping wrapper, ``Monitor.step``, and under DDP the cross-rank tracker's
forward timer, output-max hook, the local-gradient-norm communication hook and the
heartbeat's marks) is wrapped in a clock, outermost calls only, and the time inside DDP's
own all-reduce launch is taken out. This is the cost itself rather than a small
difference between two noisy step times, which on a shared machine mostly measure the
neighbours.

Each row switches one feature off (through the monitor's own options or its per-part
switch, the same one that turns a failing part off) and runs alternating blocks of the
defaults and of that variant; the feature's cost is the paired median difference of self
time per step, and the attributed column is the time measured inside the feature's own
functions with the defaults on (the two should agree within noise). The exchange is
amortised: it runs once per ``log_every`` steps (or per ``flush_every_s``), so its time
is spread over the steps of its window.

    python benchmarks/monitor_features.py [--steps 60] [--rounds 4] [--worlds 2 4]
    python benchmarks/monitor_features.py --profile 2   # cProfile of rank 0 (CPU clock)
    python benchmarks/monitor_features.py --profile 2 --profile-rank 1  # of rank 1
    python benchmarks/monitor_features.py --src OLD/src  # the rows of another tree
    python benchmarks/monitor_features.py --compare OLD/src [--src NEW/src]  # paired

Latest, paired (``--compare`` against the tree before, 3 alternating rounds, 60 steps
a block; load 1.6 at the start, 3.1 at the end), self CPU ms per step at the defaults,
after: the rank evidence on the CPU folded as Python floats (one stack and ``tolist``
per window instead of a dozen tensor ops), a backward's bucket squares summed at the
fold, the sample buckets carried in the gathered rows up to 16 ranks (one collective an
exchange instead of two), X004 converting the summed buckets only when a sample is on
two ranks:

| run | bare step | before | after |
|---|---|---|---|
| 1 process | 9.8 ms | 0.329 | 0.326 |
| DDP world 2 | 14.3 ms | 0.852 | 0.603 |
| DDP world 4 | 36.7 ms | 1.058 | 0.886 |

Under 1 ms at world 2 and 4 at that load, not at every load: an earlier paired run of
the same changes (less the X004 one) at load 5.1, steps of 75 ms at world 4, gave
1.188 → 1.433 at world 4 and 1.039 → 0.790 at world 2, the spread between rounds there
as large as the changes. What moved, world 4, two back-to-back runs of each tree at
load 3.6–4.2 (steps of 36–38 ms), 4 rounds each, ms per step:

| feature | before | after |
|---|---|---|
| exchange (in read) | 0.190, 0.185 | 0.134, 0.143 |
| evidence fold (in exchange) | 0.020, 0.020 | 0.007, 0.007 |
| collectives + table (in exchange) | 0.066, 0.068 | 0.056, 0.065 |
| **defaults, self CPU** | 0.937, 0.947 | 0.869, 0.926 |

Per exchange on rank 0 at world 4 (a thread-CPU clock around each function,
120 steps timed, the two trees run twice in turn at load about 2.4): the whole exchange 4.67, 4.52 →
3.77, 3.26 ms; X004 0.69, 0.71 → 0.045, 0.044 ms (no sample shared); the parameter
checksum, untouched, 0.79–1.09 ms in all four (its integer row sums of every word are
now the largest part left, then the gather and the rank's bucket sketch).

Per step, the output's finiteness sum and the local gradient norm (about 0.1 ms each at
world 4) are their kernels' first read of a tensor just written: 70–75 µs against
18–20 µs for a second read of the same tensor. The bucket's first read moves out of
DDP's own division of it (then warm, and subtracted here as DDP's work), so part of the
local norm's figure is time DDP no longer spends.

Earlier figures, kept with the loads they were taken at:

Measured on 2 shared CPUs (other people's benchmarks running: load 2 to 8), before and
after: the parameter checksum in a few kernels per model, the output's finiteness by its
sum on every forward with max |output| on every 8th, the local gradient norm as a dot
product, the exchange's window folded in Python, the detectors run per read.

Defaults, self CPU ms per step, before → after, alternating rounds (``--compare``):

| run | load 3–5.5, 3 rounds | load 0.2–1.8, 2 rounds |
|---|---|---|
| 1 process | 0.587 → 0.546 | 0.680 → 0.709 |
| DDP world 2 | 1.156 → 1.482 | 1.233 → 1.081 |
| DDP world 4 | 1.936 → 1.789 | — |

Per feature, CPU ms per step inside its own functions (defaults on), before → after, two
full runs back to back (load 8.0 and 5.5 at their ends, 3 rounds each):

| feature | 1 process | DDP world 2 | DDP world 4 |
|---|---|---|---|
| optimizer/clip hooks | 0.128 → 0.115 | 0.168 → 0.223 | 0.274 → 0.251 |
| read + detectors + log | 0.144 → 0.115 | 0.395 → 0.483 | 0.717 → 0.565 |
| exchange (in read) | — | 0.230 → 0.322 | 0.458 → 0.342 |
| parameter checksum (in exchange) | — | 0.046 → 0.058 | 0.113 → 0.066 |
| output max | — | 0.160 → 0.149 | 0.208 → 0.153 |
| local grad norm | — | 0.132 → 0.145 | 0.178 → 0.183 |
| fingerprints | 0.034 → 0.032 | 0.040 → 0.044 | 0.052 → 0.048 |
| cpu wait | 0.011 → 0.009 | 0.036 → 0.036 | 0.051 → 0.047 |
| heartbeat marks | — | 0.026 → 0.032 | 0.044 → 0.036 |
| **defaults, self CPU** | 0.455 → 0.400 | 1.048 → 1.318 | 1.685 → 1.430 |

At this load the spread between runs (±0.2 ms at world 2 and 4, features untouched by
the change moving as much as the ones changed) is as large as the cuts. Side by side in
one minute at load 2–3 (world 2, 2 rounds), the output hook went from 0.187 to 0.097 ms
(its sum instead of a min/max pass) and the local norm from 0.177 to 0.116 (a dot
product). The target (under 1 ms at world 2 and 4) is not shown met on this machine:
world 2 at 1.08 on the quietest run, world 4 at 1.4–1.8 with four ranks on two CPUs.

Why "read + detectors + log" costs 3–5× more under DDP: that row contains the exchange
(``MonitorBridge.on_records`` runs inside the read). Less the exchange (the row printed
below it) the read costs 0.15–0.23 ms per step at world 2–4 against 0.12–0.19 in one
process, the same 1.2–2× that every other per-step feature shows with 2–4 ranks on two
CPUs. Profiled on the thread's CPU clock (``--profile 2 --profile-rank 0/1``): the run
log is one write and one flush per read (no fsync), the same on every rank; no detector
reruns per record; the heartbeat is 4 counter bumps a step. What is rank-specific is
per exchange: rank 0 alone runs the cross-rank detectors, builds the table's JSON
form and aggregates the job's numbers (about 1.5× rank 1's exchange). The exchange
itself is a few ms of host time each; on quick steps it now runs about once a second
(``min_interval_s`` 1, was 0.5), which halves its amortised cost where steps are under
about 50 ms, and changes nothing on slower steps (the step cadence rules there).

Paired (``--compare``, 120 steps a block, 20 untimed, 3 rounds, 2 alternating rounds;
load 0.5 at the start, 5.9 at the end: someone else's job), self CPU ms per step:

| run | bare step | before | after |
|---|---|---|---|
| 1 process | 15.0 ms | 0.537 | 0.538 |
| DDP world 2 | 41 ms | 1.115 | 1.216 |
| DDP world 4 | 76 ms | 1.555 | 1.544 |

At that load the steps (41 ms at world 2, 76 at world 4) were slow enough that neither
tree stretched the cadence, so the two trees ran the same exchanges and the difference
is noise. Back to back at world 2 (load 3.2, 120-step blocks, 2 rounds each; steps of
43–45 ms, where the new floor stretches the cadence from 20 to 23 steps), before → after:
exchange 0.302 → 0.229, read less the exchange 0.204 → 0.167, optimizer/clip hooks
0.258 → 0.230, output max 0.183 → 0.158 (untouched: the spread between runs), defaults
self CPU 1.478 → 1.256 (one process 0.487 → 0.521). The target (under 1 ms at world 2
and 4) is still not met on this machine.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import pstats
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from monitor_overhead import ENTRY_POINTS as MONITOR_ENTRY_POINTS
from monitor_step import build as build_gpt2
from monitor_step import train_step

from sapper.distributed import tracker as tracker_module
from sapper.distributed.bridge import MonitorBridge
from sapper.distributed.checksum import ParamChecksum
from sapper.distributed.detectors import default_distributed_detectors
from sapper.distributed.evidence import LocalGradNorm, OutputMax, WindowPeak
from sapper.distributed.heartbeat import Heartbeat
from sapper.distributed.stats import SampleBuckets
from sapper.distributed.timing import ForwardTimer
from sapper.distributed.tracker import RankTracker
from sapper.monitor import Monitor
from sapper.monitor import monitor as monitor_module
from sapper.monitor.cpuwait import RunQueueClock
from sapper.monitor.faults import GradStats, Localiser
from sapper.monitor.positions import PositionWatch
from sapper.monitor.system import MemoryReader
from sapper.monitor.training import TrainingObserver

#: Where control enters the monitor during a step (outermost calls are timed).
ENTRY_POINTS: tuple[tuple[type, tuple[str, ...]], ...] = (
    *MONITOR_ENTRY_POINTS,
    (ForwardTimer, ("_pre", "_post")),
    (OutputMax, ("_hook",)),
    (LocalGradNorm, ("_hook",)),
    (Heartbeat, ("mark", "step_done")),
)

#: Feature -> the functions whose time is that feature's (attributed, inclusive).
#: Module-level functions are given as (module, name).
ATTRIBUTED: dict[str, tuple[tuple[Any, str], ...]] = {
    "batch read": ((monitor_module, "read_batch"),),
    "fingerprints": ((monitor_module, "fingerprint_rows"),),
    "positions": (
        (PositionWatch, "on_inputs"),
        (PositionWatch, "after_forward"),
        (PositionWatch, "_pre_hook"),
    ),
    "loss weight hooks": (
        (Monitor, "_weighed"),
        (Monitor, "_on_loss_grad"),
        (Monitor, "_on_logits_weight"),
    ),
    "cpu wait": ((RunQueueClock, "read"),),
    "memory": ((MemoryReader, "read"),),
    "grad stats": ((GradStats, "measure"),),
    "localiser": ((Localiser, "arm"), (Localiser, "disarm"), (Localiser, "_record")),
    "optimizer/clip hooks": (
        (TrainingObserver, "_pre_step"),
        (TrainingObserver, "_post_step"),
        (TrainingObserver, "before_clip"),
        (TrainingObserver, "after_clip"),
    ),
    "read + detectors + log": ((Monitor, "_read"),),
    "exchange (in read)": ((MonitorBridge, "on_records"),),
    "parameter checksum (in exchange)": ((ParamChecksum, "compute"),),
    "evidence fold (in exchange)": ((WindowPeak, "take"),),
    "collectives + table (in exchange)": ((RankTracker, "_exchange"),),
    # a tree without one of these functions (an older one, --src) leaves it out
    "sample buckets (in collectives)": (
        (SampleBuckets, "local"),
        (SampleBuckets, "fold_gathered"),
        (tracker_module, "reduce_buckets"),
    ),
    "cross-rank detectors (in exchange, rank 0)": tuple(
        (type(d), "update") for d in default_distributed_detectors()
    ),
    "forward timer": ((ForwardTimer, "_pre"), (ForwardTimer, "_post")),
    "output max": ((OutputMax, "_hook"),),
    "local grad norm": ((LocalGradNorm, "_hook"),),
    "heartbeat marks": ((Heartbeat, "mark"), (Heartbeat, "step_done")),
}

#: Row name -> how to switch it off: Monitor options, and parts for its switch.
FEATURES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "fingerprints": ({"hash_samples": False}, ()),
    "positions": ({}, ("positions",)),
    "loss weight hooks": ({}, ("accumulation",)),
    "memory": ({}, ("memory",)),
    "grad stats": ({"sample_every": 10**9}, ()),
    "localiser": ({"localise_every": 10**9}, ()),
    "run log": ({"run_log": None}, ()),
    "cross-rank": ({"distributed": False}, ()),
    "parameter checksum": ({"distributed": {"checksum": False}}, ()),
    "rank evidence": ({"distributed": {"evidence": False}}, ()),
    "heartbeat": ({"distributed": {"heartbeat": False}}, ()),
}
#: Rows that only exist under torch.distributed.
CROSS_RANK = ("cross-rank", "parameter checksum", "rank evidence",
              "heartbeat")

SIZE = (2, 64, 2, 64, 4)  # layers, hidden, heads, seq, batch: ~10 ms a step on a CPU


class SelfTimer:
    """Times the monitor's entry points (outermost calls only) and, apart, the time
    inside each feature's functions, while active. DDP's all-reduce launch inside the
    communication hook is subtracted (it is DDP's work, not sapper's)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        #: The same calls' CPU time on the training thread (no time spent descheduled
        #: or blocked waiting for a peer in a collective).
        self.cpu = 0.0
        self.parts: dict[str, float] = dict.fromkeys(ATTRIBUTED, 0.0)
        self._depth = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> SelfTimer:
        for cls, names in ENTRY_POINTS:
            for name in names:
                self._patch(cls, name, self._entry)
        for feature, sites in ATTRIBUTED.items():
            for owner, name in sites:
                self._patch(owner, name, functools.partial(self._part, feature))
        self._patch_allreduce()
        return self

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__.get(name)
        if original is None:  # not in this tree (an older one, compared with --src)
            return
        self._saved.append((owner, name, original))
        if isinstance(original, staticmethod):
            setattr(owner, name, staticmethod(make(original.__func__)))
        elif isinstance(original, classmethod):
            setattr(owner, name, classmethod(make(original.__func__)))
        else:
            setattr(owner, name, make(original))

    def _patch_allreduce(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        original = default_hooks.allreduce_hook
        self._saved.append((default_hooks, "allreduce_hook", original))

        @functools.wraps(original)
        def launch(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                cpu = time.thread_time() - c0
                self.cpu -= cpu
                self.seconds -= time.perf_counter() - t0
                self.parts["local grad norm"] -= cpu

        default_hooks.allreduce_hook = launch  # type: ignore[assignment]

    def _entry(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth = 1
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth = 0
                self.cpu += time.thread_time() - c0
                self.seconds += time.perf_counter() - t0

        return call

    def _part(self, feature: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[feature] += time.thread_time() - c0

        return call

    def reset(self) -> None:
        self.seconds = self.cpu = 0.0
        self.parts = dict.fromkeys(ATTRIBUTED, 0.0)

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


def build() -> torch.nn.Module:
    layers, hidden, heads, seq, _ = SIZE
    return build_gpt2(layers, hidden, heads, seq)


def _wrap(module: torch.nn.Module) -> torch.nn.Module:
    """Under torch.distributed a fresh DDP wrapper per block: DDP takes one
    communication hook per wrapper, and each block's monitor sets its own."""
    if torch.distributed.is_initialized():
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module)
    return module


def block(
    module: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: list[torch.Tensor],
    options: dict[str, Any] | None,
    off: tuple[str, ...],
    skip: int,
    log: Path,
) -> dict[str, Any]:
    """One block of steps with a fresh monitor; its self time per step (after ``skip``
    untimed steps), per-feature time per step, and the median bare step."""
    model = _wrap(module)
    timer = SelfTimer()
    mon = None
    with timer:
        if options is not None:
            mon = Monitor(model, opt, console=False, **{"run_log": log, **options})
            mon._disabled.update(off)
        timer.reset()
        times = []
        for i, x in enumerate(batches):
            if i == skip:
                timer.reset()
            t0 = time.perf_counter()
            train_step(model, opt, x, mon)
            if i >= skip:
                times.append(time.perf_counter() - t0)
        n = max(1, len(batches) - skip)
        own = timer.seconds / n
        own_cpu = timer.cpu / n
        parts = {k: v / n for k, v in timer.parts.items()}
        if mon is not None:
            mon.close()
    return {"own": own, "cpu": own_cpu, "parts": parts, "step": statistics.median(times)}


def run_rows(
    steps: int, rounds: int, skip: int, features: list[str], seed: int = 1
) -> dict[str, Any]:
    """Alternating blocks: defaults vs each feature off; every round runs them all."""
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(seed)
    seq, batch = SIZE[3], SIZE[4]

    def batches() -> list[torch.Tensor]:
        return [torch.randint(0, 1024, (batch, seq), generator=gen) for _ in range(steps)]

    logs = Path(tempfile.mkdtemp(prefix="sapper-features-"))
    block(model, opt, batches(), None, (), skip, logs / "warm.jsonl")  # warm-up
    variants: dict[str, tuple[dict[str, Any] | None, tuple[str, ...]]] = {
        "bare": (None, ()),
        "defaults": ({}, ()),
        **{f"{name} off": FEATURES[name] for name in features},
    }
    got: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    order = list(variants)
    for r in range(rounds):
        for v in order[r % len(order) :] + order[: r % len(order)]:
            options, off = variants[v]
            got[v].append(block(model, opt, batches(), options, off, skip, logs / f"{v}.jsonl"))
    return got


def summarise(got: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    base = got["defaults"]
    out: dict[str, Any] = {
        "bare_ms": 1e3 * statistics.median(b["step"] for b in got["bare"]),
        "defaults_ms": 1e3 * statistics.median(b["own"] for b in base),
        "defaults_cpu_ms": 1e3 * statistics.median(b["cpu"] for b in base),
        "parts_ms": {
            k: 1e3 * statistics.median(b["parts"][k] for b in base) for k in ATTRIBUTED
        },
        "off": {},
    }
    for v, blocks in got.items():
        if not v.endswith(" off"):
            continue
        # CPU self time: the wall clock of a descheduled rank is its neighbours' work
        diffs = [d["cpu"] - b["cpu"] for d, b in zip(base, blocks, strict=True)]
        out["off"][v.removesuffix(" off")] = {
            "own_ms": 1e3 * statistics.median(b["cpu"] for b in blocks),
            "cost_ms": 1e3 * statistics.median(diffs),
        }
    return out


# ---- DDP --------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(args: argparse.Namespace) -> None:
    """One rank (or the one process of world 1): rows or a profile; rank 0 prints."""
    torch.set_num_threads(1)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if distributed else 0
    if args.profile:
        # the training thread's CPU time: a rank descheduled on a shared machine, or
        # waiting for a peer in a collective, is not the monitor's cost
        prof = cProfile.Profile(time.thread_time)
        DDPProfiled(args, prof).run()
        if rank == args.profile_rank:
            text = io.StringIO()
            stats = pstats.Stats(prof, stream=text).sort_stats(args.sort)
            stats.print_stats(args.match, 60)
            if args.callees:
                stats.print_callees(args.callees)
            print(text.getvalue())
    else:
        got = run_rows(args.steps, args.rounds, args.skip, args.features, seed=rank + 1)
        if rank == 0:
            print("RESULT " + json.dumps(summarise(got)), flush=True)
    if distributed:
        torch.distributed.destroy_process_group()


class DDPProfiled:
    """cProfile of the monitor's step path on one rank (defaults, DDP)."""

    def __init__(self, args: argparse.Namespace, prof: cProfile.Profile) -> None:
        self.args, self.prof = args, prof
        self.model = _wrap(build())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def run(self) -> None:
        seq, batch = SIZE[3], SIZE[4]
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        gen = torch.Generator().manual_seed(rank + 1)
        log = Path(tempfile.mkdtemp(prefix="sapper-prof-")) / "run.jsonl"
        mon = Monitor(self.model, self.opt, console=False, run_log=log)
        for i in range(self.args.steps):
            x = torch.randint(0, 1024, (batch, seq), generator=gen)
            if i == self.args.skip:
                self.prof.enable()
            train_step(self.model, self.opt, x, mon)
        self.prof.disable()
        mon.close()


def launch(
    world: int, args: argparse.Namespace, features: list[str], src: str | None = None
) -> str:
    """Run the worker on ``world`` ranks (one plain process for world 1), sapper imported
    from ``src`` when given (another tree, for a before/after comparison); rank 0's
    output."""
    port = _free_port()
    procs = []
    shown = args.profile_rank if args.profile else 0
    for r in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if world > 1:
            env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker",
               "--steps", str(args.steps), "--rounds", str(args.rounds),
               "--skip", str(args.skip), "--features", ",".join(features)]
        if args.profile:
            cmd += ["--profile", str(world), "--sort", args.sort, "--match", args.match,
                    "--callees", args.callees, "--profile-rank", str(args.profile_rank)]
        procs.append(subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE if r == shown else subprocess.DEVNULL, text=True
        ))
    out, _ = procs[shown].communicate(timeout=1800)
    for p in procs:
        p.wait(timeout=600)
    if any(p.returncode for p in procs):
        raise SystemExit(f"world {world}: a rank failed ({[p.returncode for p in procs]})")
    return out


def result(out: str) -> dict[str, Any]:
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def _label(world: int) -> str:
    return "1 process" if world == 1 else f"DDP world {world}"


def compare(args: argparse.Namespace, before: str, worlds: list[int]) -> str:
    """The defaults' self time with sapper from ``before`` and from this tree, the two
    alternating round by round (order swapped each round) on the same machine."""
    trees = {"before": before, "after": args.src}
    got: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in range(args.compare_rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name in order:
            for world in worlds:
                got.setdefault((name, world), []).append(
                    result(launch(world, args, [], trees[name]))
                )
        print(f"compare round {r + 1}: done", flush=True)

    def med(name: str, world: int, key: str) -> float:
        return statistics.median(x[key] for x in got[(name, world)])

    lines = [
        "monitor self time per step at the defaults, before vs after (ms; medians over "
        f"{args.compare_rounds} alternating rounds)",
        "",
        "| run | bare step | self CPU before | self CPU after | self wall before "
        "| self wall after |",
        "|---|---|---|---|---|---|",
    ]
    for world in worlds:
        lines.append(
            f"| {_label(world)} | {med('after', world, 'bare_ms'):.2f} "
            f"| {med('before', world, 'defaults_cpu_ms'):.3f} "
            f"| **{med('after', world, 'defaults_cpu_ms'):.3f}** "
            f"| {med('before', world, 'defaults_ms'):.3f} "
            f"| {med('after', world, 'defaults_ms'):.3f} |"
        )
    return "\n".join(lines)


def table(rows: dict[str, dict[str, Any]]) -> str:
    names = list(rows)
    lines = [
        "monitor self time per step, ms (median over rounds; lower is better)",
        "",
        "| row | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| bare step (ms) | " + " | ".join(f"{rows[n]['bare_ms']:.2f}" for n in names) + " |",
        "| **monitor, defaults: self time** | "
        + " | ".join(f"**{rows[n]['defaults_ms']:.3f}**" for n in names) + " |",
        "| **monitor, defaults: self CPU time** | "
        + " | ".join(f"**{rows[n]['defaults_cpu_ms']:.3f}**" for n in names) + " |",
    ]
    features = list(dict.fromkeys(f for n in names for f in rows[n]["off"]))
    for f in features:
        cells = []
        for n in names:
            r = rows[n]["off"].get(f)
            cells.append("—" if r is None else f"{r['cost_ms']:+.3f} (off: {r['own_ms']:.3f})")
        lines.append(f"| {f}: cost when on (self CPU off) | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("CPU time inside each feature's own functions, defaults on, ms per step:")
    lines.append("")
    lines.append("| feature | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for f in ATTRIBUTED:
        vals = [rows[n]["parts_ms"][f] for n in names]
        if any(v > 0 for v in vals):
            lines.append(f"| {f} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
        if f == "exchange (in read)":  # the read's own work, comparable across worlds
            rest = [
                rows[n]["parts_ms"]["read + detectors + log"] - rows[n]["parts_ms"][f]
                for n in names
            ]
            lines.append("| read + detectors + log, less the exchange | "
                         + " | ".join(f"{v:.3f}" for v in rest) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="steps per block")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--skip", type=int, default=10, help="untimed steps per block")
    ap.add_argument("--worlds", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--features", default=",".join(FEATURES))
    ap.add_argument("--profile", type=int, default=0, metavar="WORLD",
                    help="print a cProfile of rank 0 at this world size instead")
    ap.add_argument("--profile-rank", type=int, default=0, metavar="RANK",
                    help="the rank whose cProfile is printed (--profile)")
    ap.add_argument("--sort", default="cumulative", help="cProfile order (--profile)")
    ap.add_argument("--match", default="sapper", help="cProfile rows to print (--profile)")
    ap.add_argument("--callees", default="",
                    help="also print what the functions matching this call (--profile)")
    ap.add_argument("--compare", metavar="SRC", default=None,
                    help="also run sapper from another tree's src/ (before) against this one")
    ap.add_argument("--compare-rounds", type=int, default=2)
    ap.add_argument("--src", default=None,
                    help="sapper imported from this tree's src/: the feature rows of that "
                    "tree, or with --compare the 'after' side")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.features = [f for f in args.features.split(",") if f]
    for f in args.features:
        if f not in FEATURES:
            ap.error(f"unknown feature {f!r}; choose from {', '.join(FEATURES)}")
    if args.worker:
        _worker(args)
        return
    worlds = list(dict.fromkeys([1, *args.worlds]))  # 1 process always, once
    if args.profile:
        print(launch(args.profile, args, []))
        return
    if args.compare:
        print(compare(args, args.compare, worlds))
        print(f"\n{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end.")
        return
    rows = {}
    for world in worlds:
        features = [f for f in args.features if world > 1 or f not in CROSS_RANK]
        rows[_label(world)] = result(launch(world, args, features, args.src))
        print(f"{_label(world)}: done", flush=True)
    print(table(rows))
    print(
        f"\nGPT-2 {SIZE[0]}x{SIZE[1]}, seq {SIZE[3]}, batch {SIZE[4]}, AdamW + clipping, one "
        f"thread per rank, {args.steps} steps a block ({args.skip} untimed), {args.rounds} "
        f"rounds; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}. 'cost when on': "
        "paired median of (defaults − feature off) self CPU time; 'exchange (in read)' is "
        "part of 'read + detectors + log'; per-parameter statistics run on every 50th step "
        "(amortised here only when a block's timed steps include one)."
    )


if __name__ == "__main__":
    main()
