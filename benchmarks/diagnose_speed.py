"""``sapper diagnose`` on a 1M-step log costs at most 10 % more than ``sapper analyze``.

diagnose reads and analyzes the log exactly as analyze does, then reasons over the
findings: the onsets it reads back from the records (bounded walks), the restarts (the
learning rates and sample hashes of the attempts around a blow-up) and the causal map.
Both commands run as the user runs them, each a fresh ``sapper … --format json``
process from start to exit (imports included), paired round by round with the polars
yardstick of benchmarks/analyze_speed.py, on the same generated log (its realistic curve
with noise, three spikes and a NaN), best of ``--repeat``; and on the same log with a
rollback (the last 5 % of the steps logged again after a resume), where the restart
reasoning walks the attempts. Beside them, the same two commands called in this process
through the command line (imports already paid), as a breakdown.

    python benchmarks/diagnose_speed.py [--steps 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyze_speed import (
    POLARS_SCRIPT,
    ProcessRun,
    paired_runs,
    process_env,
    process_run,
    write_log,
)
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

TARGET = 1.10


def with_rollback(src: Path, dst: Path, steps: int) -> None:
    """``src`` and then its last 5 % of steps again: a resume from a checkpoint."""
    resume = steps - steps // 20
    with src.open() as fh, dst.open("w") as out:
        tail = []
        for line in fh:
            out.write(line)
            if '"step": ' in line and int(line.split('"step": ', 1)[1].split(",", 1)[0]) >= resume:
                tail.append(line)
        out.writelines(tail)


def timed(runner: CliRunner, command: str, path: Path) -> float:
    started = time.perf_counter()
    res = runner.invoke(app, [command, str(path), "--format", "json"])
    elapsed = time.perf_counter() - started
    if res.exit_code not in (0, 1):
        raise SystemExit(f"{command} {path}: exit {res.exit_code}\n{res.output[-2000:]}")
    return elapsed


def _best(runs: list[ProcessRun]) -> str:
    return f"{min(r.wall for r in runs):.2f} s ({min(r.cpu for r in runs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    ns = parser.parse_args()
    _register_commands()
    runner = CliRunner()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plain = work / "run.jsonl"
        write_log(plain, ns.steps)
        restarted = work / "restarted.jsonl"
        with_rollback(plain, restarted, ns.steps)
        env = process_env(work / "pyc")
        polars_script = work / "yardstick_polars.py"
        polars_script.write_text(POLARS_SCRIPT)
        small = Path(__file__).resolve().parent.parent / "examples/logs/sapper-gpt2-healthy.jsonl"
        process_run(["sapper", "diagnose", str(small)], env, work / "peak")  # bytecode
        print(f"whole process, start to exit, {ns.steps:,} steps, best of {ns.repeat} paired "
              "rounds: wall s (CPU s); in process: the command-line call alone")
        print("| log | analyze | diagnose | diagnose / analyze | polars yardstick | "
              "in process: analyze | diagnose | ratio | target |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, path in (("one attempt", plain), ("rolled back 5 %", restarted)):
            contenders = {
                command: (["sapper", command, str(path), "--format", "json"], env)
                for command in ("analyze", "diagnose")
            }
            contenders["polars"] = ([str(polars_script), str(path)], env)
            runs = paired_runs(contenders, ns.repeat, work)
            ratio = statistics.median(
                d.wall / a.wall for a, d in zip(runs["analyze"], runs["diagnose"], strict=True)
            )
            best = {"analyze": float("inf"), "diagnose": float("inf")}
            for _ in range(ns.repeat):
                for command in best:
                    best[command] = min(best[command], timed(runner, command, path))
            inner = best["diagnose"] / best["analyze"]
            verdict = "ok" if ratio <= TARGET else "OVER"
            print(f"| {name} | {_best(runs['analyze'])} | {_best(runs['diagnose'])} | "
                  f"{ratio:.3f} | {_best(runs['polars'])} | {best['analyze']:.2f} s | "
                  f"{best['diagnose']:.2f} s | {inner:.3f} | ≤ {TARGET:.2f} {verdict} |")


if __name__ == "__main__":
    main()
