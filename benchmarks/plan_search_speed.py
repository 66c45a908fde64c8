"""Search speed: the whole layout space of a 1T-parameter model on 3072 GPUs (< 1 s).

The model and cluster are those of Narayanan et al. 2021's largest run (GPT 1008B,
3072 A100-80GB, global batch 3072 x 2048 tokens). Prints the space size, the memory
estimates spent, the time of each phase (cold first call, then the median of warm
calls; `sapper plan` shows 5 layouts and explains 3 by default) and the cost of one
memory estimate at several pipeline depths.

Run: python benchmarks/plan_search_speed.py
"""

from __future__ import annotations

import statistics
import time

from rich.console import Console
from rich.table import Table

from sapper.memory import estimate
from sapper.parallel import Layout, search
from sapper.parallel.published import PUBLISHED_RUNS

TARGET_S = 1.0
REPEATS = 5


def memory_call_ms(plan, pp: int) -> float:
    lay = Layout.from_plan(plan)
    assert lay is not None
    variant = lay.with_(
        pp=pp, dp=3072 // (8 * pp), grad_accum=3072 * pp // 3072, virtual_stages=1, schedule="1f1b"
    ).apply(plan)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        estimate(variant)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    plan = next(r for r in PUBLISHED_RUNS if r.name == "GPT 1008B").to_plan()
    cold = search(plan, top=5, explain=3)
    warm = [search(plan, top=5, explain=3) for _ in range(REPEATS)]
    every = [search(plan, top=5, explain=True) for _ in range(REPEATS)]
    table = Table(title="sapper plan: GPT 1008B on 3072 A100-80GB (top 5, as the CLI runs it)")
    for col in (
        "run",
        "layouts",
        "memory estimates",
        "enumerate s",
        "cost s",
        "memory s",
        "explain s",
        "total s",
    ):
        table.add_column(col, justify="right")

    def row(name: str, res) -> None:
        t = res.timings
        table.add_row(
            name,
            f"{res.enumerated:,}",
            str(res.memory_checks),
            f"{t['enumerate']:.3f}",
            f"{t['cost']:.3f}",
            f"{t['memory']:.3f}",
            f"{t['explain']:.3f}",
            f"{res.elapsed_s:.3f}",
        )

    row("cold, 3 explained", cold)
    med = sorted(warm, key=lambda r: r.elapsed_s)[len(warm) // 2]
    row(f"warm, 3 explained (median of {REPEATS})", med)
    all5 = sorted(every, key=lambda r: r.elapsed_s)[len(every) // 2]
    row(f"warm, all 5 explained (median of {REPEATS})", all5)
    console = Console(width=140)
    console.print(table)
    mem = Table(title="one memory estimate (sapper.memory.estimate)")
    mem.add_column("pipeline stages", justify="right")
    mem.add_column("ms per call", justify="right")
    for pp in (1, 8, 32, 64, 128):
        mem.add_row(str(pp), f"{memory_call_ms(plan, pp):.2f}")
    console.print(mem)
    best = cold.best
    assert best is not None
    console.print(
        f"best: {best.layout.describe()}, {best.cost.model_tflops_per_gpu:.0f} TFLOP/s per GPU"
    )
    worst = max(cold.elapsed_s, med.elapsed_s, all5.elapsed_s)
    verdict = "OK" if worst < TARGET_S else "TOO SLOW"
    console.print(f"slowest {worst:.3f} s vs target {TARGET_S:.1f} s: {verdict}")


if __name__ == "__main__":
    main()
