"""The per-fault detection table: each fault the live monitor must name by its own code,
injected into a tiny real training run on CPU, with the monitor attached as a user would
(two lines, every default: values read every 20 steps, the detectors' own windows), and
the healthy twin of each run, which must raise no warning.

The runs are the test suite's (``tests/monitor``): the same models, loops and injected
faults, so the table describes what the tests assert, at the defaults rather than at the
tests' short windows. Printed per fault: the code expected, the step the fault starts,
the step of the first finding with that code (``-`` when not named), how many steps
after the onset that is, other warnings of the faulty run, and the warnings the healthy
twin raised.

    python benchmarks/fault_detection.py [--fast] [--load idle|busy|bursts]

``--fast`` uses the tests' short detector windows (``tinytrain.FAST``) instead;
``--load`` runs every case beside competing processes (one per core: spinning for the
whole run, or in staggered bursts), where the healthy twins must stay quiet too.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "monitor"))

from loadgen import competing_load
from test_norm_placement import MHAPostLN
from test_positions import Longer, _clamp, _wrap
from test_setup_faults import Epochs, _four_batches
from tinytrain import FAST, Run, gpt2, llama, nanogpt, post_ln, train

#: The Monitor's own defaults (tinytrain's loop reads every 5 steps for the tests).
DEFAULTS: dict[str, Any] = {
    "log_every": 20,
    "sample_every": 50,
    "localise_every": 500,
    "detector_options": {},
}


def _freeze_all(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.requires_grad_(False)


@dataclass
class Case:
    fault: str
    code: str
    onset: int
    run: Callable[[dict[str, Any]], Run]
    healthy: Callable[[dict[str, Any]], Run]


def _cases() -> list[Case]:
    def copy_of(model: torch.nn.Module) -> torch.nn.Module:
        return copy.deepcopy(model)

    return [
        Case(
            "loader cycling 4 batches",
            "R072",
            4,
            lambda m: train(gpt2(), data=itertools.cycle(_four_batches()), steps=60, monitor=m),
            lambda m: train(gpt2(), data=Epochs(100), steps=60, monitor=m),
        ),
        Case(
            "GA=4, loss outside the model, not divided",
            "R080",
            0,
            lambda m: train(
                llama(), ga=4, loss_outside=True, divide_loss=False, steps=30, monitor=m
            ),
            lambda m: train(llama(), ga=4, loss_outside=True, steps=30, monitor=m),
        ),
        Case(
            "script wraps position ids (GPT-2, T=80 > 64)",
            "R091",
            15,
            lambda m: train(gpt2(), data=Longer(), steps=30, position_ids=_wrap, monitor=m),
            lambda m: train(gpt2(), steps=30, position_ids=_wrap, monitor=m),
        ),
        Case(
            "script clamps position ids (GPT-2)",
            "R091",
            15,
            lambda m: train(gpt2(), data=Longer(), steps=30, position_ids=_clamp, monitor=m),
            lambda m: train(gpt2(), steps=30, position_ids=_clamp, monitor=m),
        ),
        Case(
            "model wraps positions inside (nanoGPT)",
            "R091",
            15,
            lambda m: train(nanogpt(positions="wrap"), data=Longer(), steps=30, monitor=m),
            lambda m: train(nanogpt(positions="wrap"), steps=30, monitor=m),
        ),
        Case(
            "deep Post-LN nn.MultiheadAttention stack, no warmup",
            "R101",
            0,
            lambda m: train(MHAPostLN(), steps=30, monitor=m),
            lambda m: train(
                MHAPostLN(), steps=30, schedule=lambda s: min(1.0, (s + 1) / 40), monitor=m
            ),
        ),
        Case(
            "deep Post-LN BERT, no warmup",
            "R101",
            0,
            lambda m: train(post_ln(), steps=30, monitor=m),
            lambda m: train(post_ln(), steps=30, schedule=lambda s: min(1.0, s / 40), monitor=m),
        ),
        Case(
            "optimizer built on a model copy",
            "R120",
            0,
            lambda m: (lambda g: train(g, optimizer_on=copy_of(g), steps=5, monitor=m))(gpt2()),
            lambda m: train(gpt2(), steps=5, monitor=m),
        ),
        Case(
            "every parameter frozen",
            "R121",
            0,
            lambda m: train(gpt2(), freeze=_freeze_all, steps=5, monitor=m),
            lambda m: train(gpt2(), steps=5, monitor=m),
        ),
        Case(
            "backward never called",
            "R122",
            0,
            lambda m: train(gpt2(), backward=False, steps=5, monitor=m),
            lambda m: train(gpt2(), steps=5, monitor=m),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="the tests' short windows")
    parser.add_argument("--load", default="idle", choices=("idle", "busy", "bursts"))
    args = parser.parse_args()
    options = dict(DEFAULTS)
    if args.fast:
        options = {"log_every": 5, "sample_every": 5, "localise_every": 5, "detector_options": FAST}
    torch.set_num_threads(1)
    rows = []
    started = time.perf_counter()
    with competing_load(args.load):
        outcomes = [(c, c.run(dict(options)), c.healthy(dict(options))) for c in _cases()]
    for case, run, healthy in outcomes:
        first = run.first_step(case.code)
        others = sorted(run.warnings() - {case.code})
        rows.append(
            (
                case.fault,
                case.code,
                str(case.onset),
                "-" if first is None else str(first),
                "-" if first is None else str(first - case.onset),
                ", ".join(others) or "none",
                ", ".join(sorted(healthy.warnings())) or "none",
            )
        )
    header = (
        "fault",
        "code",
        "onset",
        "named at",
        "steps late",
        "other warnings",
        "healthy twin warnings",
    )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(f"settings: {'tests (FAST)' if args.fast else 'Monitor defaults'}; load: {args.load}")
    print(line)
    print("-" * len(line))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    missed = [r[0] for r in rows if r[3] == "-"]
    noisy = [r[0] for r in rows if r[6] != "none"]
    print(
        f"\n{len(rows) - len(missed)}/{len(rows)} named by their own code; "
        f"{len(noisy)} healthy twin(s) warned; {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
