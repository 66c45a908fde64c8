"""`sapper smoke` wall time per check: where the seconds of a default run go.

Runs every default check on the shipped example (a Llama toy), on a hand-written model
through a factory, and on the example with the user's loader, ``--repeat`` times each in
this process (after one warm-up run, so imports and first-call costs are reported apart),
and prints the median seconds of each check and of the whole run, plus the load average
(the machine is often shared: read the numbers next to it). Target: ≤ 10 s for all default
checks on an idle machine.

    python benchmarks/smoke_runtime.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "smoke"))  # the hand-written model and loaders

T0 = time.perf_counter()
import smoke_planted  # noqa: E402

from sapper.smoke.batches import LoaderFactory  # noqa: E402
from sapper.smoke.runner import CHECKS, run_smoke  # noqa: E402
from sapper.smoke.toy import hf_toy_factory, user_factory  # noqa: E402

IMPORT_S = time.perf_counter() - T0
EXAMPLE = ROOT / "examples" / "smoke" / "llama-toy.json"


def _cases() -> dict[str, dict]:
    return {
        "llama toy (--model)": {"factory": hf_toy_factory(EXAMPLE)},
        "tinylm (--factory)": {"factory": user_factory(smoke_planted.tiny_lm)},
        "llama toy + loader": {
            "factory": hf_toy_factory(EXAMPLE),
            "source": LoaderFactory(smoke_planted.sharded_loader),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = _cases()
    names = list(CHECKS)
    rows = []
    for label, kwargs in cases.items():
        start = time.perf_counter()
        run_smoke(**kwargs)  # warm-up: first-call costs (fork, profiler, autocast kernels)
        first = time.perf_counter() - start
        per_check: dict[str, list[float]] = {n: [] for n in names}
        totals = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            report = run_smoke(**kwargs)
            totals.append(time.perf_counter() - start)
            for o in report.outcomes:
                per_check[o.name].append(o.seconds)
            assert report.errors == 0, [f.message for f in report.findings]
        rows.append(
            [label, f"{first:.1f}", f"{statistics.median(totals):.1f}"]
            + [f"{statistics.median(per_check[n]):.2f}" for n in names]
        )
    head = ["case", "first run s", "median s", *names]
    print(f"imports {IMPORT_S:.1f} s; load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs; {args.repeat} repeats\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
