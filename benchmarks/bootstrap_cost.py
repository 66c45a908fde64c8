"""What ``sapper run``'s bootstrap costs a process (src/sapper/launch/site/sitecustomize.py,
src/sapper/monitor/attach.py).

1. **Start-up**, per process: ``python -c pass`` with the bootstrap's folder first on
   ``PYTHONPATH`` and ``SAPPER_RUN_DIR`` set, against the bare interpreter, in pairs run
   back to back (the order alternating), many times; the table gives the median of each
   and the median of the paired differences (target < 20 ms). The same for ``python -c
   "import torch"``: what a process that imports torch pays on top (the hooks, the dump
   thread, no monitor yet).
2. **The monitor inside a bootstrapped run** against the same program with sapper's two
   lines in its code (target: the same, within noise), and the bare loop for scale: a
   tiny GPT-2 (from a config) trained by a plain PyTorch loop on one thread, the mean time
   of a step after the first ones (the bootstrap finds the model at the first step: that
   one-off cost shows in the ``first steps`` column).

Run: python benchmarks/bootstrap_cost.py [--pairs 40] [--repeats 5] [--steps 200]
[--only startup|monitor]. On a busy machine the CPU columns (user + system time of the
child) say more than wall. An installed sapper runs its bootstrap from bytecode compiled
at install; a source checkout under PYTHONDONTWRITEBYTECODE=1 would compile it in every
process (~1.5 ms), so bytecode is cached in a temporary folder (PYTHONPYCACHEPREFIX) for
both sides of each pair, as benchmarks/startup.py does; --no-bytecode-cache keeps the
caller's setting.
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
from pathlib import Path

import sapper

SITE = Path(sapper.__file__).parent / "launch" / "site"
START_TARGET_MS = 20.0

#: The training program: ``bare`` (no monitor), ``code`` (sapper's two lines) or ``run``
#: (nothing in the code; the bootstrap attaches the monitor).
PROGRAM = r"""
import json, sys, time
import torch, transformers
mode, steps, warm, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64,
                              bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
if mode == "code":
    import sapper
    mon = sapper.Monitor(model, opt, run_log=log)
data = torch.randint(0, 256, (warm + steps, 8, 64), generator=torch.Generator().manual_seed(1))
start, start_cpu = time.perf_counter(), time.process_time()
for i, batch in enumerate(data):
    if i == warm:
        warmed, warmed_cpu = time.perf_counter(), time.process_time()
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    if mode == "code":
        mon.step(loss)
end, end_cpu = time.perf_counter(), time.process_time()
print(json.dumps({"step_ms": (end - warmed) / steps * 1e3, "first_ms": (warmed - start) * 1e3,
                  "cpu_ms": (end_cpu - warmed_cpu) / steps * 1e3}))
"""


#: Where the children cache bytecode (None: the caller's setting).
PYCACHE: list[str] = []


def _env(run_dir: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SAPPER_RUN_DIR", "RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if PYCACHE:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE[0]
    if run_dir is not None:
        env["SAPPER_RUN_DIR"] = str(run_dir)
        env["SAPPER_RUN_COMMAND"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(SITE), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
        )
    return env


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall ms, child CPU ms, stdout) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    wall = (time.perf_counter() - start) * 1e3
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3
    return wall, cpu, proc.stdout


def startup(code: str, pairs: int, run_dir: Path) -> dict[str, float]:
    """Paired runs of ``python -c CODE`` without and with the bootstrap."""
    bare_env, boot_env = _env(None), _env(run_dir)
    walls: dict[str, list[float]] = {"bare": [], "boot": []}
    cpus: dict[str, list[float]] = {"bare": [], "boot": []}
    for i in range(pairs):
        order = ("bare", "boot") if i % 2 == 0 else ("boot", "bare")
        for key in order:
            wall, cpu, _ = _timed(
                [sys.executable, "-c", code], bare_env if key == "bare" else boot_env
            )
            walls[key].append(wall)
            cpus[key].append(cpu)
    def paired(runs: dict[str, list[float]]) -> float:
        return statistics.median(b - a for a, b in zip(runs["bare"], runs["boot"], strict=True))

    return {
        "bare_wall": statistics.median(walls["bare"]),
        "boot_wall": statistics.median(walls["boot"]),
        "diff_wall": paired(walls),
        "bare_cpu": statistics.median(cpus["bare"]),
        "boot_cpu": statistics.median(cpus["boot"]),
        "diff_cpu": paired(cpus),
    }


def monitor_cost(repeats: int, steps: int, warm: int, folder: Path) -> dict[str, dict[str, float]]:
    script = folder / "train.py"
    script.write_text(PROGRAM)
    step: dict[str, list[float]] = {"bare": [], "code": [], "run": []}
    cpu: dict[str, list[float]] = {"bare": [], "code": [], "run": []}
    first: dict[str, list[float]] = {"bare": [], "code": [], "run": []}
    for i in range(repeats):
        modes = ["bare", "code", "run"]
        for mode in modes[i % 3 :] + modes[: i % 3]:
            run_dir = folder / f"{mode}{i}"
            env = _env(run_dir if mode == "run" else None)
            log = str(run_dir / "code.jsonl")
            _, _, out = _timed(
                [sys.executable, str(script), mode, str(steps), str(warm), log], env
            )
            got = json.loads(out.strip().splitlines()[-1])
            step[mode].append(got["step_ms"])
            cpu[mode].append(got["cpu_ms"])
            first[mode].append(got["first_ms"])
    return {
        m: {
            "step_ms": statistics.median(step[m]),
            "spread_ms": (max(step[m]) - min(step[m])) / 2,
            "cpu_ms": statistics.median(cpu[m]),
            "cpu_spread_ms": (max(cpu[m]) - min(cpu[m])) / 2,
            "first_ms": statistics.median(first[m]),
        }
        for m in step
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=40, help="paired start-up runs")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each training mode")
    parser.add_argument("--steps", type=int, default=200, help="steps timed per run")
    parser.add_argument("--warm", type=int, default=10, help="first steps left out")
    parser.add_argument("--only", choices=("startup", "monitor"), help="one half only")
    parser.add_argument("--no-bytecode-cache", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sapper-bootstrap-") as tmp:
        folder = Path(tmp)
        if not args.no_bytecode_cache:
            PYCACHE.append(str(folder / "pycache"))
        if args.only != "monitor":
            _startup_table(args.pairs, folder)
        if args.only != "startup":
            _monitor_table(args.repeats, args.steps, args.warm, folder)


def _startup_table(pairs: int, folder: Path) -> None:
    rows = [
        ("python -c pass", startup("pass", pairs, folder / "s1"), START_TARGET_MS),
        ("python -c 'import torch'", startup("import torch", max(4, pairs // 4), folder / "s2"),
         None),
    ]  # fmt: skip
    print("Start-up per process (ms, medians; diff = median of paired differences)")
    print(f"{'command':<26}{'bare wall':>10}{'boot wall':>10}{'diff':>8}"
          f"{'bare cpu':>10}{'boot cpu':>10}{'diff':>8}  target")  # fmt: skip
    for name, r, target in rows:
        verdict = "" if target is None else (
            f"< {target:.0f} ms: {'met' if r['diff_wall'] < target else 'MISSED'}"
        )
        walls = f"{r['bare_wall']:>10.1f}{r['boot_wall']:>10.1f}{r['diff_wall']:>8.1f}"
        cpus = f"{r['bare_cpu']:>10.1f}{r['boot_cpu']:>10.1f}{r['diff_cpu']:>8.1f}"
        print(f"{name:<26}{walls}{cpus}  {verdict}")
    print()


def _monitor_table(repeats: int, steps: int, warm: int, folder: Path) -> None:
    cost = monitor_cost(repeats, steps, warm, folder)
    print(f"Monitor in a plain loop, tiny GPT-2, {steps} steps x {repeats} runs (ms, medians)")
    print(f"{'mode':<34}{'step':>8}{'± half range':>14}{'step cpu':>10}{'± half range':>14}"
          f"{'first steps':>13}")  # fmt: skip
    names = {
        "bare": "bare loop (no monitor)",
        "code": "two lines in the code",
        "run": "bootstrapped (no code change)",
    }
    for mode in ("bare", "code", "run"):
        c = cost[mode]
        wall = f"{c['step_ms']:>8.2f}{c['spread_ms']:>14.2f}"
        cpu = f"{c['cpu_ms']:>10.2f}{c['cpu_spread_ms']:>14.2f}"
        print(f"{names[mode]:<34}{wall}{cpu}{c['first_ms']:>13.1f}")
    code, boot = cost["code"], cost["run"]
    measures = (("wall", "step_ms", "spread_ms"), ("cpu", "cpu_ms", "cpu_spread_ms"))
    for what, key, spread in measures:
        delta = boot[key] - code[key]
        noise = max(code[spread], boot[spread])
        same = "the same within noise" if abs(delta) <= noise else "OUTSIDE the noise"
        print(f"bootstrapped - two lines ({what}): {delta:+.2f} ms a step "
              f"({same}: ± {noise:.2f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
