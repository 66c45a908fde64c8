"""Calibration of the step cost model against published runs (issue 4).

For each run of Narayanan et al. 2021 Table 1 and Llama 3 405B: the published TFLOP/s
per GPU, the prediction for the published layout in the same convention, the error, the
memory model's verdict on the published layout, and the planner's choice on the same
GPUs and global batch (predicted in the same convention) with why it differs.

Run: python benchmarks/parallel_calibration.py [--markdown]
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from sapper.memory import estimate
from sapper.parallel import predict_step, search
from sapper.parallel.explain import compare
from sapper.parallel.published import PUBLISHED_RUNS

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
        assert best is not None
        same = best.layout == cost.layout
        out.append(
            {
                "run": run.name,
                "gpus": plan.hardware.total_gpus,
                "layout": cost.layout.describe(),
                "published": run.tflops,
                "predicted": pred,
                "error": 100 * (pred / run.tflops - 1),
                "convention": run.convention,
                "memory": f"{mem.peak_bytes / GIB:.0f} GiB {'fits' if mem.fits else 'NO FIT'}",
                "planner": best.layout.describe(),
                "planner_tflops": conv(best.cost),
                "why": "same layout" if same else "published is " + compare(best.cost, cost),
                "search_s": res.elapsed_s,
            }
        )
    return out


def main() -> None:
    data = rows()
    if "--markdown" in sys.argv:
        print(
            "| run | published layout | pub. | pred. | err | memory | planner's choice |"
            " planner | published vs planner |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in data:
            print(
                f"| {r['run']} | {r['layout']} | {r['published']:.0f} | {r['predicted']:.0f}"
                f" | {r['error']:+.1f}% | {r['memory']} | {r['planner']} |"
                f" {r['planner_tflops']:.0f} | {r['why']} |"
            )
        return
    table = Table(title="Step cost model vs published runs (TFLOP/s per GPU)")
    for col in (
        "run",
        "GPUs",
        "published layout",
        "pub.",
        "pred.",
        "err",
        "conv.",
        "memory",
        "planner's choice",
        "planner",
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
            f"{r['planner_tflops']:.0f}",
            str(r["why"]),
        )
    console = Console(width=220)
    console.print(table)
    worst = max(abs(float(r["error"])) for r in data)  # type: ignore[arg-type]
    console.print(f"largest error {worst:.1f}% (target ±20%)")


if __name__ == "__main__":
    main()
