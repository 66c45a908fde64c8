"""Calibration of the step cost model against published runs (issues 4 and 12).

For each published run (Narayanan et al. 2021 Table 1, Llama 3 405B, and the held-out
Megatron-Core weak-scaling table, BLOOM 176B and Llama 3's 128K-context stage): the
published TFLOP/s per GPU, the prediction for the published layout in the same FLOP
convention, the error, the memory model's verdict on the published layout, and the
planner's choice on the same GPUs and global batch with how the published layout's
measured rate compares with the planner's predicted one: with the band the calibration
supports, or withheld where the planner's layout lies outside what the calibration
covers.

Run: python benchmarks/parallel_calibration.py [--markdown]
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from sapper.memory import estimate
from sapper.parallel import predict_step, search
from sapper.parallel.cluster import Cluster
from sapper.parallel.confidence import claim, outside, prediction_band, ratio_band, spread
from sapper.parallel.published import FLOP_DEFINITIONS, PUBLISHED_RUNS
from sapper.parallel.workload import Workload

GIB = 1024**3


def rows() -> list[dict[str, object]]:
    out = []
    for run in PUBLISHED_RUNS:
        plan = run.to_plan()
        cost = predict_step(plan)
        conv = (
            (lambda c: c.hardware_tflops_per_gpu)
            if run.convention == "hardware"
            else (lambda c: c.model_tflops_per_gpu)
        )
        pred = conv(cost)
        mem = estimate(plan)
        res = search(plan, top=1, explain=False)
        best = res.best
        row: dict[str, object] = {
            "run": run.name + (" *" if run.held_out else ""),
            "gpus": plan.hardware.total_gpus,
            "layout": cost.layout.describe(),
            "published": run.tflops,
            "predicted": pred,
            "error": 100 * (pred / run.tflops - 1),
            "convention": FLOP_DEFINITIONS[run.flops],
            "memory": f"{mem.peak_bytes / GIB:.0f} GiB {'fits' if mem.fits else 'NO FIT'}",
            "search_s": res.elapsed_s,
        }
        if best is None:
            # every PP that divides the GPUs splits the layers unevenly unless the first
            # and last stages are set, which the planner does not search
            row.update(planner="none that passes sapper's checks (uneven stages)",
                       planner_tflops=float("nan"), planner_mark="", why="-")
            out.append(row)
            continue
        work, cluster = Workload.from_plan(plan), Cluster.from_plan(plan)
        reasons = outside(best.layout, work, cluster)
        same = best.layout == cost.layout
        # the published layout's measured step (its predicted step scaled by the row's
        # error) against the planner's predicted one: step times, so that recomputation
        # (counted in hardware FLOPs) does not distort the comparison
        measured_step = cost.step_time_s * pred / run.tflops
        text, _ = claim(
            measured_step / best.cost.step_time_s, reasons, band=prediction_band()
        )
        row.update(
            planner=best.layout.describe(),
            planner_tflops=best.cost.model_tflops_per_gpu,
            planner_mark="!" if best.cost.details.get("above_best_mfu") else "",
            why="same layout" if same else "published (measured) is " + text,
        )
        out.append(row)
    return out


def _summary(data: list[dict[str, object]]) -> str:
    errs = [float(r["error"]) for r in data]  # type: ignore[arg-type]
    worst = max(errs, key=abs)
    return (
        f"{len(data)} runs (* held out); largest error {worst:+.1f}% (target ±20%); "
        f"spread of ln(pred/pub) {100 * spread():.1f}%: a prediction holds to "
        f"±{100 * prediction_band():.0f}% of a measurement, a ratio of two predictions to "
        f"±{100 * ratio_band():.0f}%. Planner rates marked ! exceed the best MFU any "
        "published run reached on that GPU"
    )


def main() -> None:
    data = rows()
    if "--markdown" in sys.argv:
        print(
            "| run | published layout | pub. | pred. | err | FLOPs counted | memory |"
            " planner's choice | planner (model TFLOP/s) | published vs planner |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in data:
            print(
                f"| {r['run']} | {r['layout']} | {r['published']:.0f} | {r['predicted']:.0f}"
                f" | {r['error']:+.1f}% | {r['convention']} | {r['memory']} | {r['planner']} |"
                f" {r['planner_tflops']:.0f}{r['planner_mark']} | {r['why']} |"
            )
        print()
        print(_summary(data))
        return
    table = Table(title="Step cost model vs published runs (TFLOP/s per GPU)")
    for col in (
        "run",
        "GPUs",
        "published layout",
        "pub.",
        "pred.",
        "err",
        "FLOPs counted",
        "memory",
        "planner's choice",
        "planner (model)",
        "published vs planner",
    ):
        table.add_column(col, overflow="fold")
    for r in data:
        table.add_row(
            str(r["run"]),
            str(r["gpus"]),
            str(r["layout"]),
            f"{r['published']:.0f}",
            f"{r['predicted']:.0f}",
            f"{r['error']:+.1f}%",
            str(r["convention"]),
            str(r["memory"]),
            str(r["planner"]),
            f"{r['planner_tflops']:.0f}{r['planner_mark']}",
            str(r["why"]),
        )
    console = Console(width=240)
    console.print(table)
    console.print(_summary(data))


if __name__ == "__main__":
    main()
