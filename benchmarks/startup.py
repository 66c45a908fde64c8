"""Start-up time of the ``sapper`` command, measured the way a user feels it (issue 12).

Each command is spawned as a fresh process, exactly as the ``sapper`` console script
runs it (``from sapper.cli.app import main; main()``), N times; the table shows the
median and the minimum wall time against the target. Listing and explaining rules must
not import torch, and checking a model of a known family must not import transformers,
so their targets are far below what importing either costs (~1 s and ~3 s).

``analyze``/``diagnose`` of a small log (a 30-record ``trainer_state.json``, a sapper run
log) must stay under 0.5 s: one log is one rank, so neither torch nor the cross-rank pass
is imported, and a small log is read as records without numpy. Beside the table, the
floors the commands stand on: a bare interpreter, and importing the command line. Best
wall time of five on the 2-core development machine (load about 2): analyze of a
``trainer_state.json`` 1.95 s (torch imported) → 0.53 s (one log, no cross-rank pass) →
0.32 s (no tensorboard probe, no numpy for a small log); diagnose of it 1.91 → 0.60 →
0.45 s.

``plan`` runs a Llama-3-style 462B model (benchmarks/data/llama-462b-6144.yaml) on 6,144
GPUs and on 32,768 GPUs: the target is for the whole command, start-up and search.

Run: python benchmarks/startup.py [--repeats 5] [--only rules,plan-32k] [--json]
Targets hold on an idle machine (``met`` compares the median wall time); on a busy one
the minimum wall and CPU columns say more.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN_462B = "benchmarks/data/llama-462b-6144.yaml"
HF_FLAGS = [
    "--model",
    "examples/hf/llama-2-7b.json",
    "--gpus",
    "64",
    "--gpus-per-node",
    "8",
    "--gpu",
    "A100-80GB",
    "--seq-len",
    "4096",
]
#: The console script's own body, so nothing but sapper's start-up is measured.
ENTRY = "from sapper.cli.app import main; main()"

#: The children's environment. An installed sapper runs from cached bytecode; a source
#: checkout under PYTHONDONTWRITEBYTECODE=1 compiles every module on every run (~70 ms
#: more), so by default bytecode is cached in a temporary folder (PYTHONPYCACHEPREFIX),
#: which leaves the source tree as it is. --no-bytecode-cache keeps the caller's setting.
ENV = dict(os.environ)


@dataclass(frozen=True)
class Case:
    """One command line and the wall time it must stay under."""

    key: str
    args: list[str]
    target_s: float


CASES: tuple[Case, ...] = (
    Case("help", ["--help"], 0.3),
    Case("rules", ["rules"], 0.3),
    Case("explain", ["explain", "N102"], 0.3),
    Case("analyze-hf", ["analyze", "examples/logs/hf-llama-sft/trainer_state.json"], 0.5),
    Case("analyze-json", ["analyze", "examples/logs/sapper-gpt2-healthy.jsonl", "--format",
                          "json"], 0.5),
    Case("diagnose-hf", ["diagnose", "examples/logs/hf-llama-sft/trainer_state.json"], 0.5),
    Case("diagnose-jsonl", ["diagnose", "examples/logs/sapper-gpt2-healthy.jsonl"], 0.5),
    Case("check-yaml", ["check", "examples/plans/healthy-llama-7b.yaml"], 1.0),
    Case("check-hf", ["check", *HF_FLAGS], 1.0),
    Case("memory-hf", ["memory", *HF_FLAGS, "--micro-batch", "1"], 1.0),
    Case("plan-6k", ["plan", PLAN_462B], 1.0),
    Case("plan-32k", ["plan", PLAN_462B, "--gpus", "32768", "--dp", "-1"], 1.0),
)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: What every command stands on, timed beside the cases: the interpreter alone, and the
#: command line's own import (typer, rich and the command modules).
FLOORS: tuple[tuple[str, str], ...] = (
    ("python", "pass"),
    ("import cli", "import sapper.cli.app"),
)


def time_once(args: list[str], entry: str = ENTRY) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh ``sapper ARGS`` process. CPU time is shown too
    because it moves less than wall time when other work shares the machine."""
    cpu = _children_cpu_s()
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", entry, *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - t
    if proc.returncode not in (0, 1):  # 1 = findings; anything else is a broken run
        raise SystemExit(f"sapper {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return elapsed, _children_cpu_s() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", "-n", type=int, default=5, help="Runs per command.")
    parser.add_argument("--only", default="", help="Comma-separated case keys.")
    parser.add_argument("--json", action="store_true", help="Print JSON, not a table.")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="Keep the caller's PYTHONDONTWRITEBYTECODE (every run compiles sapper).",
    )
    opts = parser.parse_args()
    if not opts.no_bytecode_cache:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="sapper-startup-pyc-")
    keys = {k.strip() for k in opts.only.split(",") if k.strip()}
    cases = [c for c in CASES if not keys or c.key in keys]
    for case in cases:  # warm the file and bytecode caches: no case pays for them
        time_once(case.args)

    rows = []
    for case in cases:
        runs = [time_once(case.args) for _ in range(opts.repeats)]
        times = [wall for wall, _ in runs]
        med = statistics.median(times)
        rows.append(
            {
                "case": case.key,
                "command": "sapper " + " ".join(case.args),
                "median_s": round(med, 3),
                "min_s": round(min(times), 3),
                "min_cpu_s": round(min(cpu for _, cpu in runs), 3),
                "target_s": case.target_s,
                "met": med < case.target_s,
            }
        )
    floors = []
    for key, code in FLOORS:
        runs = [time_once([], code) for _ in range(opts.repeats)]
        floors.append(
            {
                "case": key,
                "command": f"python -c {code!r}",
                "median_s": round(statistics.median(w for w, _ in runs), 3),
                "min_s": round(min(w for w, _ in runs), 3),
                "min_cpu_s": round(min(c for _, c in runs), 3),
            }
        )
    if opts.json:
        print(json.dumps({"cases": rows, "floors": floors}, indent=2))
        return
    width = max(len(r["case"]) + 2 for r in [*rows, *floors])
    print(f"{'case':<{width}}  median s   min s  min cpu s  target  met")
    for r in rows:
        met = "yes" if r["met"] else "NO"
        print(
            f"{r['case']:<{width}}  {r['median_s']:>8.3f}  {r['min_s']:>6.3f}  "
            f"{r['min_cpu_s']:>9.3f}  {r['target_s']:>6.1f}  {met}"
        )
    for r in floors:
        print(
            f"{'(' + r['case'] + ')':<{width}}  {r['median_s']:>8.3f}  {r['min_s']:>6.3f}  "
            f"{r['min_cpu_s']:>9.3f}  floor"
        )
    print()
    for r in [*rows, *floors]:
        print(f"{r['case']:<{width}}  {r['command']}")


if __name__ == "__main__":
    main()
