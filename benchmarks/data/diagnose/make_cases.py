"""Writes the run logs of the planted cases of benchmarks/data/diagnose/CASES.yaml: tiny
real training runs on CPU (tests/monitor/tinytrain.py) with one fault each (or none, or
one the log cannot tell apart), the monitor attached at its tests' settings; and, from
some of them, the same records written as a user's own CSV would hold them, under the
column names people use (``mem_bytes``, ``tokens_per_sec``, ``data_wait_ms`` ...), so
that what `sapper diagnose` reads offline from such a table is scored too.

    python benchmarks/data/diagnose/make_cases.py [NAME ...]
"""

from __future__ import annotations

import csv
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "monitor"))

import torch  # noqa: E402
from tinytrain import Markov, gpt2, train  # noqa: E402


def _held_out_eval(every: int = 10) -> Callable[[int, Any], Any]:
    data = Markov()
    held_out = data.sample(16, 32)

    def evaluate(step: int, model: Any) -> Any:
        if step % every != every - 1:
            return None
        with torch.no_grad():
            return model(input_ids=held_out, labels=held_out).loss

    return evaluate


def _detach_block(index: int) -> Callable[[int, Any], None]:
    """From the first step on, block ``index``'s output leaves the graph (a stray
    ``.detach()``): the blocks below it receive no gradient and stop learning."""

    def inject(step: int, model: Any) -> None:
        if step != 0:
            return
        block = model.transformer.h[index]

        def cut(module: Any, args: Any, out: Any) -> Any:
            return (out[0].detach(), *out[1:]) if isinstance(out, tuple) else out.detach()

        block.register_forward_hook(cut)

    return inject


class OneSpike:
    """One step's logits multiplied (a batch the model has never seen the like of, or
    a transient fault): a loss spike and a gradient surge at one step, nothing before."""

    def __init__(self, at: int, factor: float) -> None:
        self.at, self.factor = at, factor

    def __call__(self, step: int, model: Any) -> None:
        if step != self.at:
            return
        handle = None

        def blow(module: Any, args: Any, out: Any) -> Any:
            handle.remove()  # type: ignore[union-attr]
            return out * self.factor

        handle = model.lm_head.register_forward_hook(blow)


class OneNaN(OneSpike):
    """One step's forward non-finite, in a run never resumed: a bad batch and a
    transient fault read alike."""

    def __init__(self, at: int) -> None:
        super().__init__(at, float("nan"))


def _few(n: int) -> list[Any]:
    data = Markov()
    return [next(data) for _ in range(n)]


CASES: dict[str, Callable[[dict[str, Any]], Any]] = {
    # The loader slows down from step 30: the steps wait for data (long enough for the
    # offline detectors' default windows too, read back from the user-column table).
    "stall": lambda m: train(gpt2(), stall=lambda s: 0.3 if s >= 30 else 0.0, steps=70,
                             monitor=m),
    # 16 MiB kept across steps from step 25.
    "leak-long": lambda m: train(gpt2(), leak=lambda s: (16 << 20) if s >= 25 else 0,
                                 steps=70, monitor=m),
    # Four batches served over and over, evaluated on held-out samples every 10 steps:
    # the model memorises them (the eval loss turns up while the training loss falls).
    "memorise": lambda m: train(gpt2(), data=itertools.cycle(_few(4)), steps=81, lr=1e-2,
                                clip=None, evaluate=_held_out_eval(), monitor=m),
    # fp16 with a GradScaler, but a bare optimizer.step(): updates carry the scale.
    "bare-step": lambda m: train(gpt2(), fp16=True, bare_step=True, clip=None, steps=20,
                                 monitor=m),
    # fp16 without a loss scaler, a small loss: the gradients underflow to zero.
    "underflow": lambda m: train(gpt2(), fp16=True, scaler=False, loss_factor=1e-6,
                                 clip=None, steps=120, monitor=m),
    # A stray detach after the first block: the embeddings and that block stop learning.
    "detached": lambda m: train(gpt2(layers=3), inject=_detach_block(0), steps=250,
                                monitor=m),
    # The loop never calls backward: the optimizer steps on no gradient.
    "no-backward": lambda m: train(gpt2(), backward=False, steps=20, monitor=m),
    # Gradient accumulation over 4 micro-batches, the loss not divided (inside the model).
    "accum-inside": lambda m: train(gpt2(), ga=4, divide_loss=False, steps=25, monitor=m),
    # AdamW at a peak LR of 1.0 (a thousand times the tiny model's working 1e-3).
    "lr-high": lambda m: train(gpt2(), lr=1.0, steps=40, monitor=m),
    # Cannot tell: one step's logits x50 in an fp32 run, never resumed.
    "one-spike": lambda m: train(gpt2(), inject=OneSpike(20, 50.0), steps=40, monitor=m),
    # Cannot tell: one non-finite forward at step 20, the run not resumed.
    "one-nan": lambda m: train(gpt2(), inject=OneNaN(20), steps=30, monitor=m),
    # Healthy twins: longer, and with a held-out evaluation on fresh data.
    "healthy-long": lambda m: train(gpt2(), steps=80, monitor=m),
    "healthy-eval": lambda m: train(gpt2(), steps=60, evaluate=_held_out_eval(), monitor=m),
    "healthy-fp16": lambda m: train(gpt2(), fp16=True, steps=40, monitor=m),
}

#: Tables written from a run log: table -> (source run log, relative to this folder,
#: without ``.jsonl``; {StepRecord field: (user column, factor to the user's unit)}).
TABLES: dict[str, tuple[str, dict[str, tuple[str, float]]]] = {
    "leak-user-columns.csv": ("leak-long", {
        "loss": ("train_loss", 1.0), "lr": ("learning_rate", 1.0),
        "grad_norm": ("grad_norm", 1.0),
        "rss_gib": ("mem_bytes", float(2**30)),
        "step_time_s": ("step_time_ms", 1e3), "tokens_per_s": ("tokens_per_sec", 1.0)}),
    "stall-user-columns.csv": ("stall", {
        "loss": ("loss", 1.0), "lr": ("lr", 1.0),
        "rss_gib": ("gpu_mem_gb", 1.0),
        "step_time_s": ("iter_time", 1.0), "data_time_s": ("data_wait_ms", 1e3),
        "tokens_per_s": ("throughput", 1.0)}),
    "overflow-user-columns.csv": ("../../../tests/fixtures/diagnose/overflow", {
        "loss": ("loss", 1.0), "grad_norm": ("gnorm", 1.0),
        "loss_scale": ("scaler/scale", 1.0), "skipped": ("overflow", 1.0)}),
    "healthy-user-columns.csv": ("healthy-long", {
        "loss": ("loss", 1.0), "lr": ("lr", 1.0), "grad_norm": ("gnorm", 1.0),
        "rss_gib": ("max_memory_allocated", float(2**30)),
        "tokens_per_s": ("samples/s", 1.0 / 64)}),
}


def _table(name: str, source: str, columns: dict[str, tuple[str, float]]) -> None:
    rows = []
    for line in (HERE / f"{source}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind", "step") != "step" or "step" not in rec:
            continue
        row: dict[str, Any] = {"step": rec["step"]}
        for field, (column, factor) in columns.items():
            value = rec.get(field)
            if value in ("nan", "inf", "-inf"):  # how the run log writes non-finite numbers
                value = float(value)
            if isinstance(value, (int, float)):
                row[column] = value * factor
        if len(row) > 1:
            rows.append(row)
    names = ["step", *(c for c, _ in columns.values())]
    with (HERE / name).open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    chosen = sys.argv[1:] or [*CASES, *TABLES]
    for name in chosen:
        if name in CASES:
            log = HERE / f"{name}.jsonl"
            log.unlink(missing_ok=True)
            CASES[name]({"run_log": str(log)})
            print("wrote", log.name)
    for name in chosen:
        if name in TABLES:
            _table(name, *TABLES[name])
            print("wrote", name)
