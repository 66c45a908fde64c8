"""On a CUDA machine: sapper's estimates against ``torch.cuda.max_memory_allocated`` and
``torch.cuda.max_memory_reserved``, over the accuracy benchmark's grid.

The rows are those of ``benchmarks/memory_accuracy.py`` (six families × precision ×
checkpointing × optimizer × size × attention). Each builds the real transformers model on
the GPU, runs two training steps (the first creates the optimizer states, the second
lets the caching allocator settle), resets the peak counters and measures the third.
Columns: measured allocated and reserved; the analytic estimate's tensor peak and its
reserved figure (CUDA kernels: bool dropout masks, GPU attention, foreach optimizer
temporaries); the traced step's allocated and reserved under the caching allocator's
rules (``sapper.memory.allocator``; fake tensors, CPU kernels). CI does not run it.

    python benchmarks/gpu_memory_check.py [--quick] [--family F] [--size BxS]
    python benchmarks/gpu_memory_check.py --dry-run --quick   # no GPU: estimates only
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_accuracy import FAMILIES, SIZES, Row, rows

from sapper.memory import MemoryOptions, estimate
from sapper.memory.traced import build_optimizer, run_step, trace_step

MIB = 1 << 20


@dataclass(frozen=True)
class Estimates:
    analytic_allocated: int
    analytic_reserved: int
    traced_allocated: int
    traced_reserved: int


def estimates(row: Row) -> Estimates:
    """Both estimators for one row, as a CUDA step would run it (no GPU needed)."""
    est = estimate(row.plan(), MemoryOptions(device="cuda"))
    config = row.hf_config()
    traced = trace_step(lambda: AutoModelForCausalLM.from_config(config), row.step(),
                        config.vocab_size)
    return Estimates(est.tensor_peak_bytes, est.reserved_bytes,
                     traced.cuda_allocated_bytes, traced.cuda_reserved_bytes)


def measure(row: Row) -> tuple[int, int]:
    """(max_memory_allocated, max_memory_reserved) of one steady-state CUDA step."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(row.hf_config()).cuda().train()
    step = row.step()
    if step.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = build_optimizer(model, step)
    vocab = FAMILIES[row.family]["vocab_size"]
    ids = torch.randint(0, vocab, (step.micro_batch, step.seq_len), device="cuda")
    for _ in range(2):
        run_step(model, opt, ids, step)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run_step(model, opt, ids, step)
    torch.cuda.synchronize()
    peaks = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    del model, opt, ids
    torch.cuda.empty_cache()
    return peaks


def _cell(x: int, truth: int | None) -> str:
    if truth is None:
        return f"{x / MIB:9.1f}"
    return f"{x / MIB:9.1f} ({100 * (x / truth - 1):+.2f}%)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two rows a family")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
    parser.add_argument("--size", action="append", choices=[f"{b}x{s}" for b, s in SIZES])
    parser.add_argument("--impl", action="append", choices=["foreach", "for_loop"],
                        help="the optimizer's implementations (repeatable; default foreach)")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: print the estimates of every row, nothing measured")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU (--dry-run prints the estimates)")
        return 1
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if not args.dry_run:
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print("| family | precision | ckpt | optimizer | b×s | attention | allocated MiB "
          "| reserved MiB | analytic alloc (err) | analytic reserved (err) "
          "| traced alloc (err) | traced reserved (err) |")
    print("|" + "---|" * 12)
    for row in rows(args.quick, args.impl or ["foreach"]):
        if args.family and row.family not in args.family:
            continue
        if args.size and f"{row.batch}x{row.seq}" not in args.size:
            continue
        alloc, resv = (None, None) if args.dry_run else measure(row)
        e = estimates(row)
        print(
            f"| {row.family} | {row.precision} | {'on' if row.ckpt else 'off'} "
            f"| {row.optimizer} {row.impl} | {row.batch}×{row.seq} | {row.attn} "
            f"| {'—' if alloc is None else f'{alloc / MIB:9.1f}'} "
            f"| {'—' if resv is None else f'{resv / MIB:9.1f}'} "
            f"| {_cell(e.analytic_allocated, alloc)} | {_cell(e.analytic_reserved, resv)} "
            f"| {_cell(e.traced_allocated, alloc)} | {_cell(e.traced_reserved, resv)} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
