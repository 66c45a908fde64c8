"""Overhead of sapper's live monitor on a training step (target: ≤ 2% median, 0 host
syncs per step by default).

Tiny GPT-2 models on CPU at several sizes train with AdamW and clipping, in one process.
Three configurations run in interleaved blocks (the order rotates each round, so load
drifts hit all of them alike): the bare loop, the monitor with its defaults (every
detector, values read every 20 steps, per-parameter statistics every 50), and the
monitor with everything at its most frequent (values read and per-parameter statistics,
localisation hooks included, on every step). The overhead is the median over rounds of
the paired ratio of median step times, on the wall clock and on the process's CPU time
(on a shared machine the wall clock mostly measures other processes; the monitor's cost
is CPU work on the training thread, which CPU time isolates), and as the monitor's own
time: every entry point of the monitor (hooks, ``step``) is timed, outermost calls only,
which measures its cost directly rather than as a small difference of two noisy numbers.
Self time and step times cover the same timed steps of each block (after ``--skip``
untimed ones), so the two are printed side by side from one interleaved run; the
monitor's time in the untimed first steps, work done once per run (setup probe,
norm-placement trace) or every ``localise_every`` steps (the localiser, armed on the
first step), is printed apart, in milliseconds.
Host syncs are counted with
:class:`sapper.monitor.syncs.HostSyncCounter` and given in excess of the bare loop's
(torch's Adam reads its CPU step counters with .item()).

Both monitor configurations write a run log (a temporary file), as a run that wants its
records after a crash does: each read is written through to the OS at once, and reads
are due every ``flush_every_s`` (0.5 s) as well as every ``log_every`` steps. The cost of
one write-through (one record, one ``write`` + flush) is measured on its own and printed
under the table.

    python benchmarks/monitor_overhead.py [--rounds 6] [--steps 25] [--threads 1]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from monitor_step import build, train_step

from sapper.monitor import Monitor
from sapper.monitor.faults import Localiser
from sapper.monitor.positions import PositionWatch
from sapper.monitor.structure import StructureProbe
from sapper.monitor.syncs import HostSyncCounter
from sapper.monitor.training import TrainingObserver
from sapper.runtime.runlog import RunLogWriter

SIZES = {  # name: (layers, hidden, heads, seq, batch)
    "S": (2, 64, 2, 64, 8),
    "M": (4, 128, 4, 128, 8),
    "L": (6, 192, 4, 128, 8),
}

#: Where control enters the monitor during a step: the model's hooks, the loss and logits
#: tensor hooks, the optimizer's hooks, the clipping wrapper's calls, the position
#: module's pre-hook, the localiser's module and gradient hooks and the first forward's
#: norm-placement hooks (the residual trace itself runs inside the block's own forward
#: and is not separable from it).
ENTRY_POINTS = (
    (
        Monitor,
        (
            "_forward_pre",
            "_forward_post",
            "_on_loss_grad",
            "_on_logits_weight",
            "step",
            "on_optimizer_stepped",
        ),
    ),
    (TrainingObserver, ("_pre_step", "_post_step", "before_clip", "after_clip")),
    (PositionWatch, ("_pre_hook",)),
    (Localiser, ("_record", "_grad")),
    (StructureProbe, ("_stack_in", "_block_out", "_norm_out")),
)


class SelfTimer:
    """Times the monitor's entry points (outermost calls only) while active."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> SelfTimer:
        for cls, names in ENTRY_POINTS:
            for name in names:
                original = cls.__dict__[name]
                self._saved.append((cls, name, original))
                if isinstance(original, staticmethod):
                    setattr(cls, name, staticmethod(self._timed(original.__func__)))
                else:
                    setattr(cls, name, self._timed(original))
        return self

    def _timed(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - t0

        return call

    def __exit__(self, *exc: object) -> None:
        for cls, name, original in self._saved:
            setattr(cls, name, original)
        self._saved.clear()


CONFIGS: dict[str, dict | None] = {
    "bare": None,
    "default": {},
    "all": {"log_every": 1, "sample_every": 1},
}


def block(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batches: list[torch.Tensor],
    options: dict | None,
    counter: HostSyncCounter,
    skip: int,
    run_log: Path | None = None,
) -> tuple[list[float], list[float], float, float, float]:
    """Run one block of steps; per-step wall and CPU times (after ``skip``), syncs per
    step, the monitor's own seconds per step over the same steps, and its own seconds
    in the ``skip`` first steps (the once-per-run work: setup probe, norm-placement
    trace, the localiser armed on the run's first step)."""
    timer = SelfTimer()
    with timer:
        mon = (
            Monitor(model, opt, console=False, run_log=run_log, **options)
            if options is not None
            else None
        )
    timer.seconds = 0.0
    times: list[float] = []
    cpu: list[float] = []
    counter.reset()
    first = 0.0
    with counter, timer:
        for i, x in enumerate(batches):
            if i == skip:
                first, timer.seconds = timer.seconds, 0.0
            t0, c0 = time.perf_counter(), time.process_time()
            train_step(model, opt, x, mon)
            if i >= skip:
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
    syncs = counter.total / len(batches)
    own = timer.seconds / max(1, len(batches) - skip)
    if mon is not None:
        mon.close()
    return times, cpu, syncs, own, first


def measure(name: str, rounds: int, steps: int, skip: int) -> dict[str, float]:
    layers, hidden, heads, seq, batch = SIZES[name]
    model = build(layers, hidden, heads, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)

    def batches() -> list[torch.Tensor]:
        return [torch.randint(0, 1024, (batch, seq), generator=gen) for _ in range(steps)]

    counter = HostSyncCounter()
    block(model, opt, batches(), None, counter, skip)  # warm up allocator and kernels
    logs = Path(tempfile.mkdtemp(prefix="sapper-overhead-"))
    order = list(CONFIGS)
    wall: dict[str, list[float]] = {c: [] for c in order}
    cpu: dict[str, list[float]] = {c: [] for c in order}
    syncs: dict[str, list[float]] = {c: [] for c in order}
    own: dict[str, list[float]] = {c: [] for c in order}
    first: dict[str, list[float]] = {c: [] for c in order}
    for r in range(rounds):
        for c in order[r % len(order) :] + order[: r % len(order)]:
            log = logs / f"{name}-{c}.jsonl"
            times, cpus, s, mine, once = block(
                model, opt, batches(), CONFIGS[c], counter, skip, log
            )
            wall[c].append(statistics.median(times))
            cpu[c].append(statistics.median(cpus))
            syncs[c].append(s)
            own[c].append(mine)
            first[c].append(once)
    out: dict[str, float] = {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "bare_ms": 1e3 * statistics.median(wall["bare"]),
    }
    for c in ("default", "all"):
        out[f"{c}_ms"] = 1e3 * statistics.median(wall[c])
        for clock, series in (("wall", wall), ("cpu", cpu)):
            ratios = [m / b - 1 for m, b in zip(series[c], series["bare"], strict=True)]
            out[f"{c}_{clock}"] = 100 * statistics.median(ratios)
        out[f"{c}_syncs"] = statistics.mean(syncs[c]) - statistics.mean(syncs["bare"])
        ratios = [m / b for m, b in zip(own[c], wall["bare"], strict=True)]
        out[f"{c}_self"] = 100 * statistics.median(ratios)
        out[f"{c}_first_ms"] = 1e3 * statistics.median(first[c])
    return out


def table(rows: dict[str, dict[str, float]], log_every: int) -> str:
    head = (
        "| size | params (M) | bare ms/step | default: self time | Δ cpu | Δ wall | syncs/step "
        "| first steps ms | all-on: self time | Δ cpu | Δ wall | syncs/step |"
    )
    lines = [head, "|" + "---|" * 12]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['params_m']:.2f} | {r['bare_ms']:.2f} "
            f"| {r['default_self']:.2f}% | {r['default_cpu']:+.1f}% | {r['default_wall']:+.1f}% "
            f"| {r['default_syncs']:.2f} | {r['default_first_ms']:.1f} "
            f"| {r['all_self']:.2f}% | {r['all_cpu']:+.1f}% "
            f"| {r['all_wall']:+.1f}% | {r['all_syncs']:.2f} |"
        )
    lines.append(
        "\nself time: the monitor's own time per step (its hooks and step()) as a share of "
        "the bare step; Δ cpu / Δ wall: paired median step-time difference to the bare loop; "
        "all three over the same timed steps of the same interleaved blocks. first steps "
        "ms: the monitor's own time in each block's untimed first steps, once per run "
        "(setup probe, norm-placement trace, the localiser armed on the first step and "
        "again every localise_every steps)."
    )
    lines.append(
        f"\ndefault syncs/step: one read per {log_every} steps or per 0.5 s, whichever "
        "comes first (one copy per device and dtype), none on the other steps; all-on "
        "reads every step. Slow CPU steps make the time cadence the one that counts."
    )
    for name, r in rows.items():
        lines.append(
            f"\n{name}, default monitor: self time {r['default_self']:.2f}% of the bare step "
            f"| end-to-end step time Δ cpu {r['default_cpu']:+.2f}%, Δ wall "
            f"{r['default_wall']:+.2f}%"
        )
    return "\n".join(lines)


def write_cost(records: int = 2000) -> tuple[float, float]:
    """Microseconds per record written through: one record per call (a read of one
    step), and 20 per call (a read every ``log_every`` steps)."""
    model = build(2, 64, 2, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mon = Monitor(model, opt, console=False, log_every=1)
    for _ in range(4):
        train_step(model, opt, torch.randint(0, 1024, (2, 64)), mon)
    mon.close()
    rec = mon.history[-1]
    out: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for per_call in (1, 20):
            writer = RunLogWriter(Path(tmp) / f"w{per_call}.jsonl")
            batch = [rec] * per_call
            t0 = time.perf_counter()
            for _ in range(records // per_call):
                writer.write_steps(batch)
            out.append(1e6 * (time.perf_counter() - t0) / records)
            writer.close()
    return out[0], out[1]


def main(argv: list[str] | None = None, run: Callable[..., dict] = measure) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=25, help="steps per block")
    parser.add_argument("--skip", type=int, default=3, help="untimed steps per block")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--sizes", default=",".join(SIZES))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = {}
    for name in args.sizes.split(","):
        rows[name] = run(name.strip(), args.rounds, args.steps, args.skip)
        print(f"{name}: done", flush=True)
    print(table(rows, Monitor.__init__.__kwdefaults__["log_every"]))
    one, twenty = write_cost()
    print(
        f"\nrun log write-through: {one:.1f} µs per record written alone (one write + "
        f"flush), {twenty:.1f} µs per record in a batch of 20"
    )


if __name__ == "__main__":
    main()
