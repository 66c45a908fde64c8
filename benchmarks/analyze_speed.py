"""Offline analysis at scale: a 1M-step sapper run log through ``sapper analyze`` and
``sapper report``, and 1M-line text logs of the other formats beside it.

Targets: ``sapper analyze`` on a 1M-step JSONL log in at most 2 s end to end (read into
columns, every default detector, the JSON out); the same log through pandas
(``read_json(lines=True)`` and a rolling median over the loss) as the yardstick, with
the ratio; the peak memory of the analysis in a child process (``--steps 10000000``
shows it stays near the columns' ~100 bytes per step, the text read in blocks); with
``--report``, the report for 1M steps under 5 MB, opening in headless Chromium in under
2 s. The log is generated here (a realistic curve with noise, a few spikes and a NaN).
The time of each detector on the columns is listed with the path it took (a vectorised
twin, or the streaming detector over the rows it reads).

Then the text formats, each a generated log of ``--steps`` lines written as the
framework writes it (``--formats``, all by default): a Megatron-LM log (timestamps,
timers, validation and memory lines, warnings, checkpoint lines, fp16 overflows, a loss
spike, a NaN interval, a loss-scale collapse and a restart that goes back 700
iterations), the HF Trainer's console (printed dicts under a progress bar), torchtitan,
fairseq and nanoGPT lines; ``sapper analyze`` and ``sapper diagnose`` on each, the
JSONL beside them, each command in a fresh process as a user runs it (imports
included): wall and CPU seconds, and the peak RSS. Run::

    python benchmarks/analyze_speed.py [--steps 1000000] [--report] [--no-browser]
        [--formats sapper,megatron,hf_console,torchtitan,fairseq,nanogpt]

On the 2-core development machine (other work beside it), 1M lines, each command in a
fresh process, before (the streaming Megatron reader, its records fed one by one to the
detectors) and after (read into columns, the vectorised detectors), best of two by CPU::

    format        analyze: wall    CPU     peak RSS   diagnose: wall    CPU     peak RSS
    sapper JSONL  before    7.3 s   4.2 s    479 MiB            5.2 s   4.5 s    543 MiB
                  after     4.4 s   4.3 s    488 MiB            4.4 s   4.4 s    545 MiB
    megatron      before   56.7 s  53.2 s  1,257 MiB           54.2 s  53.4 s  1,383 MiB
                  after     8.7 s   8.6 s    610 MiB            8.7 s   8.6 s    725 MiB

The first table is the command as the user runs it: ``sapper analyze run.jsonl --format
json`` from process start to exit (imports, read, detectors, JSON out, exit), paired
round by round with a polars script (``read_ndjson`` and 50-step rolling medians of the
loss and the gradient norm, the yardstick: target ≤ 1.5× its wall time, peak memory at
most its peak) and the same in pandas. On the 2-core development machine (load about 2),
1M steps (264 MB), best of three paired rounds, wall / CPU / peak RSS:

    sapper at 48947bb (cross-rank pass and torch)    4.88 s   4.77 s   486 MiB   3.07×
    sapper at 525692b (the pipeline below the CLI)   3.48 s   3.47 s   492 MiB   2.26×
    sapper at b5f725b (blocks decoded whole)         3.14 s   3.10 s   402 MiB   2.10×
    polars read_ndjson + rolling medians             1.59 s   1.58 s   462 MiB   1.00×
    pandas read_json + rolling medians (load 7)      9.54 s   6.49 s  2916 MiB   4.0×

Then, four paired rounds in one run (load about 3), the twins made faster (polars'
rolling minimum and maximum for the bounds, the LR walk converting only the rows it
reads, the saturation rows counted once) and a resumed log kept in columns:

    sapper now                                       2.74 s   2.67 s   334 MiB   1.91×
      the log resumed (its last 5 % logged again)    2.93 s   2.89 s   325 MiB   1.95×
    sapper at 6cb234c (the twins before)             2.95 s   2.90 s   403 MiB   2.04×
    polars read_ndjson + rolling medians             1.48 s   1.53 s   462 MiB   1.00×

With both cores nearly free (load 0.8, four paired rounds, the memory twin's second pass
gone too), polars decodes on two threads and the ratio is larger: sapper now 2.36 s wall
/ 2.91 s CPU / 331 MiB (2.62×), the log resumed 2.44 s (2.76×), at 6cb234c 2.59 s / 3.14 s
/ 350 MiB (2.89×), polars 0.91 s / 1.60 s / 460 MiB.

The resumed log took the streaming reader before (the columnar one turned away steps
that go back): 16.0 s wall, 16.0 s CPU, 1,330 MiB, against 2.9-3.2 s, 3.2 s, 323 MiB
now (two runs each, alternated). Of sapper's ~2.7 s: imports ~0.45 s, the read ~1.4 s
(polars' own decoding ~1.0 s of it), the vectorised detectors ~0.75 s (1.0-1.1 s
before). The ratio moves with the load: with both
cores free polars decodes on two threads (1.1 s wall, 1.7 s CPU) and sapper, mostly
single-threaded, took 3.4 s (3.0×) at b5f725b; under load 7 it was 1.8×.

Then the read was made to take fewer fresh pages from the kernel (16 MB blocks, whose
buffers the allocator reuses; polars' freed pages kept a tenth of a second for the next
block; each block's rows copied once into columns reserved for the whole file instead of
pieces joined at the end; the block checks counted by numpy): the read's page faults fell
from ~215k to ~65k and its system time from ~0.55 s to ~0.25 s. Five paired rounds per
run, the checkout before these changes (bfebd71) run beside it with ``--baseline-src``;
wall best / median, CPU best, peak, the median of the rounds' ratios:

    load 2.5-3: polars decodes on two threads
    sapper now                            2.02 s  2.14 s  2.58 s   330 MiB   2.09×
    sapper at bfebd71                     2.43 s  2.68 s  3.14 s   328 MiB   2.56×
    polars read_ndjson + rolling medians  0.95 s  1.02 s  1.65 s   461 MiB   1.00×
    pandas read_json + rolling medians    6.52 s  6.75 s  6.61 s  2916 MiB   6.59×
    load 5-6: every process has about one core
    sapper now                            2.75 s  3.17 s  2.61 s   329 MiB   1.71×
      the log resumed                     2.90 s  2.93 s  2.80 s   327 MiB   1.69×
    sapper at bfebd71                     2.93 s  3.10 s  3.03 s   328 MiB   1.70×
    polars read_ndjson + rolling medians  1.72 s  1.80 s  1.62 s   465 MiB   1.00×
    pandas read_json + rolling medians    7.05 s  7.66 s  6.45 s  2916 MiB   3.91×

The 1.5× target is not met. sapper takes ~2.6 s of CPU to polars' ~1.6 s: imports
~0.25 s (typer and pydantic ~0.1 s of them), the read ~1.2 s (polars' decoding ~0.9 s
of it), the vectorised detectors ~0.7 s, one at a time. Run two at a time in threads,
the detectors took 0.50 s of wall time instead of 0.71 s, but two of them hold their
temporaries at once (~100 MB each) and the peak rose to 451-464 MiB, at or over polars';
under load 4-5 the threads were slower, not faster. They run one at a time.

Then the command was arranged around the read: ``sapper analyze`` of a file of 4 MB or
more starts reading it into columns in a thread before the arguments are parsed, and
imports the detectors and proves their twins while polars decodes
(``sapper.logs.columnar.early``); glibc keeps the arrays the detectors free for reuse
(about a third fewer page faults); OpenBLAS gets one thread (its per-core threads spun
for ~0.1 s of CPU at start-up); the gradient-norm twin takes its log norms from polars
(the C library's ``log``, as ``math.log``; checked bit for bit). Two runs of five paired
rounds, the checkout before these changes (5f02ed8) beside it:

    load 3-4, polars 1.16 s at best
    sapper now                            2.67 s  2.93 s  2.60 s   375 MiB   1.84×
      the log resumed                     2.84 s  3.28 s  2.81 s   377 MiB   1.98×
    sapper at 5f02ed8                     2.89 s  3.09 s  2.76 s   324 MiB   1.75×
    polars read_ndjson + rolling medians  1.16 s  1.82 s  1.72 s   461 MiB   1.00×
    pandas read_json + rolling medians    7.31 s  7.94 s  6.81 s  2916 MiB   4.40×
    load 3 rising to 7: every process has about one core
    sapper now                            2.60 s  2.81 s  2.46 s   377 MiB   1.39×
      the log resumed                     2.51 s  2.78 s  2.67 s   376 MiB   1.50×
    sapper at 5f02ed8                     2.84 s  2.86 s  2.73 s   326 MiB   1.54×
    polars read_ndjson + rolling medians  1.84 s  1.88 s  1.71 s   461 MiB   1.00×
    pandas read_json + rolling medians    7.57 s  8.15 s  6.89 s  2916 MiB   4.03×

Then what the read freed was handed back to the kernel before the detectors start
(``malloc_trim``); one more run, load 4-5 (medians inflated by it):

    sapper now                            2.80 s  3.30 s  2.64 s   345 MiB   1.29×
      the log resumed                     2.90 s  5.10 s  2.89 s   352 MiB   1.71×
    sapper at 5f02ed8                     3.02 s  4.62 s  2.96 s   324 MiB   1.64×
    polars read_ndjson + rolling medians  1.69 s  2.89 s  1.75 s   461 MiB   1.00×

sapper's best wall time fell by 0.2-0.25 s and its CPU by 0.15-0.3 s; the peak rose by
~20 MiB (the detectors' freed arrays kept, the read and the imports at once), still
under polars'. The 1.5× target is met only where the machine is loaded enough that polars
cannot use its second core; with a core free (polars at ~1.0-1.2 s) it is not: sapper's
critical path is the imports before the decoding can start (~0.3 s), the read (~1.2 s,
as long as polars' whole script) and then the vectorised detectors (~0.7 s, one at a
time), which nothing overlaps. Running the detectors two at a time would save ~0.2 s of
wall time with a core free, but their temporaries (~100 MB each) would take the peak
over polars'; shrinking those comes first.

Then the detectors' temporaries were cut and the process's ends trimmed (8b61b6d to
03486dc): the twins read whole columns in place where every row has the field, take the
spike and surge floors once per snapshot of the rolling window, their sliding minima and
maxima by doubling spans (a third of polars' rolling pass) and the throughput twin's
wall times only at the rows an episode reads (the detectors 0.67 -> 0.24 s on the
columns; each twin's temporaries ~100 -> 20-58 MB per million rows); two run side by
side where their declared temporaries fit a budget about the columns' size and the
other processes left a core free while the log was read (else one at a time: with no
core free a second thread only waited and faulted in an arena of its own); the command
line goes on once polars is decoding the first blocks, not as soon as the early read's
imports are done (its imports raced the read's start for the interpreter's lock); the
few lines the streaming parser reads are placed among the rows by binary search, not a
sort of a million lines; and once the answer is written the exit skips the garbage
collector's full sweeps over every live object (``gc.freeze``, ~0.09 s); then the few
rows the streaming parser read are made room for in the store's own arrays, no column
copied (e2c5b10). Paired rounds (five a run unless said), the checkout before (270dabd)
beside it; wall best / median, CPU best, peak, the median of the rounds' ratios:

    both cores free (load ~1.9 and falling; polars 0.87 s wall on 1.52 s of CPU), nine
    rounds, at e2c5b10 (the resumed log left out)
    sapper now                            1.13 s  1.16 s  1.74 s   352 MiB   1.32×
    sapper at 270dabd                     1.67 s  1.69 s  2.14 s   345 MiB   1.92×
    polars read_ndjson + rolling medians  0.87 s  0.89 s  1.52 s   461 MiB   1.00×
    pandas read_json + rolling medians    5.87 s  6.11 s  5.97 s  2916 MiB   6.90×
    load 2.2-3.2: about one core each, at e2c5b10
    sapper now                            1.84 s  2.13 s  1.72 s   300 MiB   1.18×
      the log resumed                     1.77 s  1.98 s  1.82 s   315 MiB   1.17×
    sapper at 270dabd                     2.21 s  2.53 s  2.08 s   345 MiB   1.47×
    polars read_ndjson + rolling medians  1.57 s  1.79 s  1.54 s   462 MiB   1.00×
    pandas read_json + rolling medians    6.33 s  6.59 s  5.78 s  2916 MiB   3.87×

The target (≤ 1.5× polars' whole process, peak at most polars') holds with both cores
free and under load. Of the nine paired runs made since the twins were cut (loads 0.5 to
4.4) eight had a median ratio of 1.09-1.39× (270dabd beside it: 1.27-1.92×); one, whose
load fell from 3.7 to 1.3 while it ran, 1.53× (270dabd 1.65×): polars had both cores in
rounds where sapper had one, and five rounds do not even that out. sapper's CPU fell by
~0.4 s in every run (2.08-2.24 -> 1.69-1.82 s at best); its peak stays 110-170 MiB under
polars' (352 MiB with two detectors side by side, ~300 MiB one at a time). Inside one
process: the read ~1.1 s of CPU (polars' own decoding ~0.8-0.9 s of it), the detectors
0.22-0.26 s. With both cores free the critical path is the imports before polars
decodes (~0.35 s: the command line, ``sapper.logs`` and numpy before polars itself,
where the polars script imports only polars, ~0.12 s), the read (~0.75 s) and the
detectors side by side (~0.15-0.2 s).

The console formats, CPU seconds of analyze / diagnose (one run each, a loaded machine):
the HF console 40.1 / 41.9 before, 16.3 / 17.2 after; fairseq 75 / 75 before, 48 / 51
after; nanoGPT 18.1 / 18.4 before, 16.2 / 17.0 after; torchtitan about 440 before (its
lines took the progress-bar pattern 400 µs each; measured on 200k lines), 36 / 33 after.
Their readers still parse line by line in Python (15-45 µs a line); their detectors now
run through the columns.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sapper.logs.analysis import analyze_log
from sapper.report.html import build_report_data, write_report

CHROMIUM = os.environ.get("SAPPER_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def write_log(path: Path, steps: int, seed: int = 0) -> None:
    """A run log as the monitor writes it: meta line, one step line per step."""
    rng = random.Random(seed)
    spikes = {steps // 3, steps // 2, (2 * steps) // 3}
    with path.open("w") as fh:
        fh.write('{"kind": "meta", "version": 1, "started": 1716100000.0}\n')
        for step in range(1, steps + 1):
            loss = 2.2 + 8.0 * math.exp(-step / 2000) + 0.3 * math.exp(-step / 200000)
            loss += rng.gauss(0, 0.02)
            grad = 0.35 + 1.5 * math.exp(-step / 3000) + abs(rng.gauss(0, 0.03))
            if step in spikes:
                loss, grad = loss * 2.5, grad * 40
            warm = min(1.0, step / 2000)
            lr = 3e-4 * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
            loss_text = "NaN" if step == steps - 10 else f"{loss:.5f}"
            loss_text = '"nan"' if loss_text == "NaN" else loss_text
            fh.write(
                f'{{"kind": "step", "step": {step}, "loss": {loss_text}, '
                f'"grad_norm": {grad:.5f}, "clip_threshold": 1.0, "lr": {lr:.6e}, '
                f'"memory_allocated_gib": 31.2, "memory_peak_gib": {52.0 + rng.random():.3f}, '
                f'"memory_limit_gib": 79.6, "step_time_s": {0.21 + rng.random() * 0.01:.4f}, '
                f'"tokens": 65536, "tokens_per_s": {300000 + rng.gauss(0, 3000):.1f}}}\n'
            )


def write_resumed_log(path: Path, steps: int, seed: int = 0, share: float = 0.05) -> None:
    """The run log of :func:`write_log` whose last ``share`` of steps was logged twice: the
    run resumed from a checkpoint that far back and logged them again (two attempts)."""
    write_log(path, steps, seed)
    first = steps - max(1, int(steps * share)) + 1
    size = path.stat().st_size
    with path.open("rb") as fh:  # the tail holding the steps logged again, not the file
        fh.seek(max(0, size - int(size * min(1.0, 2 * share)) - 4096))
        tail = fh.read()
    again = tail[tail.index(b'{"kind": "step", "step": %d, ' % first) :]
    with path.open("ab") as fh:
        fh.write(b'{"kind": "meta", "version": 1, "started": 1716200000.0}\n')
        fh.write(again)


MEGATRON_HEADER = """using world size: 64, data-parallel size: 8, context-parallel size: 1, \
tensor-model-parallel size: 4, pipeline-model-parallel size: 2
------------------------ arguments ------------------------
  fp16 .................................... True
  global_batch_size ....................... 1024
  log_interval ............................ 1
  lr ...................................... 0.00015
  train_iters ............................. 500000
-------------------- end of arguments ---------------------
> building GPT2BPETokenizer tokenizer ...
[after dataloaders are built] datetime: 2024-05-14 10:02:11
training ...
[before the start of training step] datetime: 2024-05-14 10:02:11
"""


def write_megatron_log(path: Path, lines: int, seed: int = 0) -> None:
    """A Megatron-LM log of about ``lines`` lines as Megatron-LM writes it with
    ``--log-interval 1``: mostly iteration lines behind a time stamp, with the timers
    every 100 iterations, validation (and test-set) lines and checkpoint saves every
    2,000, the memory report after the first, warnings, rare fp16 overflows (a skipped
    iteration without its loss, the scale halved) and the scale growing back; a loss
    spike at a fifth of the run and another at three fifths, a NaN interval at four
    fifths, a loss-scale collapse at nine tenths, and a restart at half way that goes
    back 700 iterations."""
    rng = random.Random(seed)
    total = 500_000
    per_it = 1.04  # lines per iteration, roughly
    iterations = int(lines / per_it)
    restart_at, resume_back = iterations // 2, 700
    spikes = {iterations // 5, (3 * iterations) // 5}
    nan_at = (4 * iterations) // 5
    collapse = range((9 * iterations) // 10, (9 * iterations) // 10 + 30)
    scale, it, done, written, restarted = 65536.0, 0, 0, 0, False
    with path.open("w") as fh:
        fh.write(MEGATRON_HEADER)
        written += MEGATRON_HEADER.count("\n")
        while written < lines:
            it += 1
            done += 1
            if not restarted and done == restart_at:
                restarted = True
                it -= resume_back
                fh.write(
                    "[W socket.cpp:663] [c10d] The client socket has failed to connect.\n"
                    "WARNING: rank 3 restarting after NCCL timeout\n"
                    f" loading checkpoint from /ckpt at iteration {it - 1}\n"
                    f"  successfully loaded checkpoint from /ckpt at iteration {it - 1}\n"
                    "[before the start of training step] datetime: 2024-05-15 02:00:00\n"
                )
                written += 5
            loss = 2.1 + 8.0 * math.exp(-it / 2000) + 0.3 * math.exp(-it / 200000)
            loss += rng.gauss(0, 0.02)
            grad = 0.35 + 1.5 * math.exp(-it / 3000) + abs(rng.gauss(0, 0.03))
            if done in spikes:
                loss, grad = loss * 2.5, grad * 40
            lr = 1.5e-4 * min(1.0, it / 2000) * (
                0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * it / total))
            )
            skipped = 0
            if done in collapse:
                skipped, scale = 1, max(1.0, scale / 2)
            elif rng.random() < 0.0005:
                skipped, scale = 1, scale / 2
            elif it % 1000 == 0 and scale < 65536.0:
                scale *= 2
            stamp = 1715680931 + int(it * 1.2)
            day, sec = divmod(stamp, 86400)
            head = (
                f" [2024-05-{14 + day % 10:02d} {sec // 3600:02d}:{sec // 60 % 60:02d}:"
                f"{sec % 60:02d}] iteration {it:8d}/{total:8d} | consumed samples: "
                f"{it * 1024:12d} | elapsed time per iteration (ms): "
                f"{1230.0 + rng.gauss(0, 15):.1f} | throughput per GPU (TFLOP/s/GPU): "
                f"{178.0 + rng.gauss(0, 2):.1f} | learning rate: {lr:.6E} | global batch "
                "size:  1024 |"
            )
            lm = "" if skipped or done == nan_at else f" lm loss: {loss:.6E} |"
            tail = (
                f" loss scale: {scale:.1f} | grad norm: {grad:.3f} | num zeros: "
                f"{rng.randint(0, 40)}.0 | number of skipped iterations: {skipped:3d} | "
                f"number of nan iterations: {int(done == nan_at):3d} |\n"
            )
            fh.write(head + lm + tail)
            written += 1
            if it == 1:
                fh.write(
                    "[Rank 0] (after 1 iterations) memory (MB) | allocated: 6518.5 | max "
                    "allocated: 21587.7 | reserved: 23412.0 | max reserved: 23412.0\n"
                )
                written += 1
            if it % 100 == 0:
                fh.write(
                    "(min, max) time across ranks (ms):\n"
                    "    forward-backward ...............................: (1101.23, 1102.45)\n"
                    "    optimizer ......................................: (40.12, 41.90)\n"
                )
                written += 3
            if it % 2000 == 0:
                v = loss + 0.05
                rule = "-" * 100
                fh.write(
                    f"{rule}\n validation loss at iteration {it} | lm loss value: {v:.6E} | "
                    f"lm loss PPL: {math.exp(v):.6E} |\n{rule}\n"
                    f"saving checkpoint at iteration {it:8d} to /ckpt\n"
                    f"  successfully saved checkpoint from iteration {it:8d} to /ckpt\n"
                )
                written += 5
            if rng.random() < 0.001:
                fh.write(
                    "/usr/lib/python3/dist-packages/torch/utils/checkpoint.py:90: UserWarning: "
                    "None of the inputs have requires_grad=True. Gradients will be None\n"
                )
                written += 1


def _console_curve(rng: random.Random, step: int, steps: int) -> tuple[float, float, float]:
    loss = 2.1 + 8.0 * math.exp(-step / 2000) + rng.gauss(0, 0.02)
    grad = 0.35 + 1.5 * math.exp(-step / 3000) + abs(rng.gauss(0, 0.03))
    if step in (steps // 3, (2 * steps) // 3):
        loss, grad = loss * 2.5, grad * 40
    return loss, grad, 3e-4 * min(1.0, step / 2000)


def write_hf_console_log(path: Path, lines: int, seed: int = 0) -> None:
    """The HF Trainer's console: a printed dict per logging step (every step here),
    the progress bar redrawn before every 100th, an eval dict every 5,000 steps."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        fh.write(f"***** Running training *****\n  Total optimization steps = {lines:,}\n")
        step = written = 0
        while written < lines:
            step += 1
            loss, grad, lr = _console_curve(rng, step, lines)
            if step % 100 == 0:
                fh.write(f"{100 * step // lines:3d}%|###    | {step}/{lines} "
                         "[01:02<07:40,  1.62it/s]\r")
            fh.write(f"{{'loss': {loss:.4f}, 'grad_norm': {grad:.6f}, 'learning_rate': "
                     f"{lr:.4e}, 'epoch': {step / 50000:.2f}}}\n")
            written += 1
            if step % 5000 == 0:
                fh.write(f"{{'eval_loss': {loss + 0.1:.4f}, 'eval_runtime': 3.2, "
                         f"'eval_samples_per_second': 31.1, 'epoch': {step / 50000:.2f}}}\n")
                written += 1


def write_torchtitan_log(path: Path, lines: int, seed: int = 0) -> None:
    """torchtitan's metrics line behind its logger prefix, every step."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for step in range(1, lines + 1):
            loss, grad, _ = _console_curve(rng, step, lines)
            t = 1716100000 + step
            fh.write(
                f"[rank0]:[titan] 2025-06-{16 + t // 86400 % 10:02d} {t // 3600 % 24:02d}:"
                f"{t // 60 % 60:02d}:{t % 60:02d},735 - root - INFO - step: {step:5d}  loss: "
                f"{loss:8.4f}  grad_norm: {grad:7.4f}  memory: 49.66GiB(52.28%)  tps: "
                f"{5856 + rng.randint(-50, 50):,}  tflops: 339.16  mfu: 34.29%\n"
            )


def write_fairseq_log(path: Path, lines: int, seed: int = 0) -> None:
    """fairseq's ``| epoch N | loss ... | num_updates N | ...`` line, every update."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for step in range(1, lines + 1):
            loss, grad, lr = _console_curve(rng, step, lines)
            fh.write(
                f"| epoch {step // 300 + 1:03d} | loss {loss:.3f} | nll_loss {loss * 0.6:.3f} "
                f"| ppl {2 ** loss:.2f} | wps 279460 | ups 3 | wpb 110529.673 | bsz 3780.211 "
                f"| num_updates {step} | lr {lr:.9f} | gnorm {grad:.3f} | clip 0.000 | oom "
                f"0.000 | loss_scale 64.000 | wall {step * 2} | train_wall {step * 2 - 1}\n"
            )


def write_nanogpt_log(path: Path, lines: int, seed: int = 0) -> None:
    """nanoGPT's ``iter N: loss X, time Yms, mfu Z%``, every iteration."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for step in range(lines):
            loss, _, _ = _console_curve(rng, step + 1, lines)
            fh.write(f"iter {step}: loss {loss:.4f}, time {560 + rng.random() * 5:.2f}ms, "
                     f"mfu {40 + rng.random():.2f}%\n")


#: Format -> (file name, writer of a log of N lines).
TEXT_FORMATS = {
    "sapper": ("run.jsonl", write_log),
    "megatron": ("megatron.log", write_megatron_log),
    "hf_console": ("hf_console.txt", write_hf_console_log),
    "torchtitan": ("torchtitan.log", write_torchtitan_log),
    "fairseq": ("fairseq.log", write_fairseq_log),
    "nanogpt": ("nanogpt.log", write_nanogpt_log),
}


class Clock:
    """Wall and CPU seconds of one phase. On a shared machine the wall time grows with
    the load average; the process's CPU time does much less, so both are printed."""

    def __init__(self, wall: float, cpu: float) -> None:
        self.wall, self.cpu = wall, cpu

    def __add__(self, other: Clock) -> Clock:
        return Clock(self.wall + other.wall, self.cpu + other.cpu)

    def __str__(self) -> str:
        return f"{self.wall:.2f} s (CPU {self.cpu:.2f} s)"


def timed(fn):
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, Clock(time.perf_counter() - wall, time.process_time() - cpu)


def open_in_browser(report: Path) -> tuple[float, float] | None:
    """(wall seconds from navigation to drawn, the page's own render time in s)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path(CHROMIUM).exists():
        return None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto("about:blank")
        start = time.perf_counter()
        page.goto(report.as_uri())
        page.wait_for_function("window.sapperReport && window.sapperReport.ready")
        wall = time.perf_counter() - start
        render_ms = page.evaluate("window.sapperReport.renderedAt")
        errors = page.evaluate("window.sapperReport.errors")
        browser.close()
    if errors:
        raise SystemExit(f"the report failed to render: {errors}")
    return wall, render_ms / 1000


def analyze_json(path: Path) -> str:
    """What ``sapper analyze LOG --format json`` does, without the process start."""
    import json

    from sapper.pipeline.logs import analyses_json, analyze_logs, load_logs

    logs, failed = load_logs([path], None, {}, columnar=True)
    analyses = analyze_logs(logs, None, [], [])
    return json.dumps(analyses_json(analyses, failed), indent=2, default=str)


def pandas_baseline(path: Path) -> Clock | None:
    """``pandas.read_json(lines=True)`` and a 50-step rolling median of the loss."""
    try:
        import pandas as pd
    except ImportError:
        return None

    def run() -> float:
        frame = pd.read_json(path, lines=True)
        loss = pd.to_numeric(frame["loss"], errors="coerce")
        return float(loss.rolling(50).median().iloc[-1])

    return timed(run)[1]


CHILD = """
import resource, sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
from analyze_speed import analyze_json
start = time.perf_counter()
out = analyze_json(Path({path!r}))
wall = time.perf_counter() - start
# VmHWM is this process's own peak; ru_maxrss survives exec and may be the parent's.
try:
    status = Path("/proc/self/status").read_text()
    peak = int(status.split("VmHWM:")[1].split()[0]) / 1024
except (OSError, IndexError):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(wall, peak, len(out))
"""


def child_peak(path: Path) -> tuple[float, float, int]:
    """(wall s, peak RSS MiB, findings) of the analysis in a fresh process."""
    import subprocess

    code = CHILD.format(bench=str(Path(__file__).parent), path=str(path))
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])  # wall, MiB, bytes of JSON


COMMAND = """
import os, sys, time
from pathlib import Path
start, cpu = time.perf_counter(), time.process_time()
keep = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
code = 0
try:
    from sapper.cli.app import main
    sys.argv = ["sapper", *sys.argv[1:]]
    main()
except SystemExit as exc:
    code = exc.code or 0
sys.stdout.flush()
os.dup2(keep, 1)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
peak = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) / 1024
print(wall, cpu, peak, code)
"""


#: One fresh process as a user starts it: ``sapper ARGS`` through the console script's
#: body, or a yardstick script (``python SCRIPT ARGS``). It writes its own peak memory
#: (VmHWM: this process's, where ru_maxrss may carry the forking parent's) to the file
#: named in SAPPER_BENCH_PEAK; wall and CPU are the parent's view, start to exit.
PROCESS = """
import os, runpy, sys
from pathlib import Path
mode, *args = sys.argv[1:]
code = 0
try:
    if mode == "sapper":
        sys.argv = ["sapper", *args]
        from sapper.cli.app import main
        main()
    else:
        sys.argv = [mode, *args]
        runpy.run_path(mode, run_name="__main__")
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
sys.stdout.flush()
status = Path("/proc/self/status").read_text()
Path(os.environ["SAPPER_BENCH_PEAK"]).write_text(status.split("VmHWM:")[1].split()[0])
sys.exit(code)
"""

#: The yardsticks: what a user would write instead, reading the same log and taking the
#: rolling medians the spike and surge detectors take (loss and gradient norm, 50 steps).
POLARS_SCRIPT = """
import sys
import polars as pl
frame = pl.read_ndjson(sys.argv[1], infer_schema_length=10_000, ignore_errors=True)
medians = frame.select(
    pl.col("loss").rolling_median(50), pl.col("grad_norm").rolling_median(50)
)
print(medians.tail(1))
"""
PANDAS_SCRIPT = """
import sys
import pandas as pd
frame = pd.read_json(sys.argv[1], lines=True)
loss = pd.to_numeric(frame["loss"], errors="coerce").rolling(50).median()
grad = pd.to_numeric(frame["grad_norm"], errors="coerce").rolling(50).median()
print(loss.iloc[-1], grad.iloc[-1])
"""


class ProcessRun:
    """Wall and CPU seconds (the parent's view: interpreter start to exit, every thread)
    and peak resident MiB of one fresh process."""

    def __init__(self, wall: float, cpu: float, peak_mib: float, code: int) -> None:
        self.wall, self.cpu, self.peak_mib, self.code = wall, cpu, peak_mib, code


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_env(pycache: Path, src: Path | None = None) -> dict[str, str]:
    """The children's environment: bytecode cached (in ``pycache``, outside the tree) as
    an installed sapper has it, not compiled on every run as PYTHONDONTWRITEBYTECODE=1
    makes a checkout do; ``src`` first on the path (an older checkout's ``src``)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    return env


def process_run(argv: list[str], env: dict[str, str], peak_file: Path) -> ProcessRun:
    """``argv`` (``["sapper", ...]`` or ``[script, ...]``) in a fresh process, its output
    thrown away as a pipe's reader would."""
    import subprocess

    env = {**env, "SAPPER_BENCH_PEAK": str(peak_file)}
    cpu, wall = _children_cpu(), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PROCESS, *argv], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, check=False,
    )
    wall, cpu = time.perf_counter() - wall, _children_cpu() - cpu
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return ProcessRun(wall, cpu, int(peak_file.read_text()) / 1024, proc.returncode)


def paired_runs(
    contenders: dict[str, tuple[list[str], dict[str, str]]], repeats: int, work: Path
) -> dict[str, list[ProcessRun]]:
    """Each contender ``repeats`` times, interleaved (the order rotates every round), so
    a load that comes and goes on a shared machine falls on all of them alike."""
    names = list(contenders)
    runs: dict[str, list[ProcessRun]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            argv, env = contenders[name]
            runs[name].append(process_run(argv, env, work / "peak"))
    return runs


def paired_table(runs: dict[str, list[ProcessRun]], yardstick: str) -> list[str]:
    """Best and median wall, best CPU and the peak of each contender, and its wall time
    over the yardstick's run by run (the median of the rounds' ratios)."""
    import statistics

    base = runs[yardstick]
    lines = [f"  {'':<36} {'wall best':>9} {'median':>7} {'CPU best':>8} {'peak MiB':>9} "
             f"{'× ' + yardstick.split()[0]:>10}"]
    for name, rs in runs.items():
        ratio = statistics.median(a.wall / b.wall for a, b in zip(rs, base, strict=True))
        lines.append(
            f"  {name:<36} {min(r.wall for r in rs):>8.2f}s "
            f"{statistics.median(r.wall for r in rs):>6.2f}s "
            f"{min(r.cpu for r in rs):>7.2f}s {max(r.peak_mib for r in rs):>9,.0f} "
            f"{ratio:>9.2f}×"
        )
    return lines


def whole_process(
    log_path: Path, work: Path, repeats: int, baseline: Path | None,
    resumed: Path | None = None,
) -> tuple[list[str], bool]:
    """``sapper analyze LOG --format json`` as the user runs it, paired with the polars
    and pandas yardsticks (and an older checkout's sapper with ``--baseline-src``, and
    with ``resumed`` the same log resumed from a checkpoint, its last steps logged
    again): the table, and whether the targets hold (wall ≤ 1.5× polars', paired run by
    run; peak memory ≤ polars')."""
    pycache = Path(tempfile.mkdtemp(prefix="sapper-bench-pyc-", dir=work))
    env = process_env(pycache)
    scripts = {"polars": POLARS_SCRIPT, "pandas": PANDAS_SCRIPT}
    contenders: dict[str, tuple[list[str], dict[str, str]]] = {
        "sapper analyze --format json": (["sapper", "analyze", str(log_path), "--format",
                                          "json"], env),
    }
    if resumed is not None:
        contenders["  the log resumed (last 5 % again)"] = (
            ["sapper", "analyze", str(resumed), "--format", "json"], env,
        )
    if baseline is not None:
        contenders[f"  the same, {baseline}"] = (
            ["sapper", "analyze", str(log_path), "--format", "json"],
            process_env(pycache, baseline),
        )
    for name, text in scripts.items():
        try:
            __import__(name)
        except ImportError:
            continue
        script = work / f"yardstick_{name}.py"
        script.write_text(text)
        label = f"{name} read + rolling medians"
        contenders[label] = ([str(script), str(log_path)], env)
    yardstick = next((n for n in contenders if n.startswith("polars")), None)
    if yardstick is None:
        return ["  (polars is not installed: no yardstick)"], True
    small = Path(__file__).resolve().parent.parent / "examples/logs/sapper-gpt2-healthy.jsonl"
    for argv, cenv in contenders.values():  # bytecode compiled once, as installed
        if argv[0] == "sapper":
            process_run(["sapper", "analyze", str(small), "--format", "json"], cenv,
                        work / "peak")
    runs = paired_runs(contenders, repeats, work)
    import statistics

    ours, theirs = runs["sapper analyze --format json"], runs[yardstick]
    ratio = statistics.median(a.wall / b.wall for a, b in zip(ours, theirs, strict=True))
    peak_ok = max(r.peak_mib for r in ours) <= max(r.peak_mib for r in theirs)
    ok = ratio <= 1.5 and peak_ok
    lines = paired_table(runs, yardstick)
    lines.append(
        f"  targets: wall ≤ 1.5× polars' ({ratio:.2f}×: {'PASS' if ratio <= 1.5 else 'FAIL'}), "
        f"peak ≤ polars' ({'PASS' if peak_ok else 'FAIL'})"
    )
    return lines, ok


def command_run(command: str, path: Path) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MiB, exit code) of ``sapper COMMAND PATH --format json``
    in a fresh process, its imports included."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", COMMAND, command, str(path), "--format", "json"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return float(out[0]), float(out[1]), float(out[2]), int(out[3])


def formats_table(work: Path, steps: int, formats: list[str]) -> list[str]:
    """``sapper analyze`` and ``sapper diagnose`` on a generated log of each format."""
    rows = []
    for fmt in formats:
        name, writer = TEXT_FORMATS[fmt]
        path = work / name
        if not path.exists():
            writer(path, steps)
        size = path.stat().st_size / 1e6
        cells = [f"{fmt:<11}", f"{size:5,.0f} MB"]
        for command in ("analyze", "diagnose"):
            wall, cpu, peak, code = command_run(command, path)
            if code not in (0, 1):
                raise SystemExit(f"sapper {command} {path}: exit {code}")
            cells.append(f"{wall:6.2f} s {cpu:6.2f} s {peak:6,.0f} MiB")
        rows.append("  ".join(cells))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--report", action="store_true",
                        help="also time the HTML report (reads the log a second time)")
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument(
        "--formats", default=",".join(TEXT_FORMATS),
        help="the logs of the formats table, comma-separated ('' for none): "
        + ", ".join(TEXT_FORMATS),
    )
    parser.add_argument("--repeats", type=int, default=3,
                        help="paired runs of each whole process (the first table)")
    parser.add_argument("--no-resumed", dest="resumed", action="store_false",
                        help="leave out the resumed log (its last 5 %% of steps logged "
                        "again after a restart) from the whole-process table")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="an older checkout's src/: its sapper analyze joins the pairs")
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    unknown = [f for f in formats if f not in TEXT_FORMATS]
    if unknown:
        parser.error(f"unknown formats {unknown}: {', '.join(TEXT_FORMATS)}")

    from sapper.logs.columnar.twins.engine import run_columns, twin_for
    from sapper.pipeline.logs import detectors_for, load_logs

    work = Path(tempfile.mkdtemp(prefix="sapper-bench-"))
    try:
        log_path = work / "run.jsonl"
        _, t_write = timed(lambda: write_log(log_path, args.steps))
        size_mb = log_path.stat().st_size / 1e6
        print(f"sapper analyze benchmark · python {sys.version.split()[0]} · "
              f"{os.cpu_count()} CPU(s) · load average {os.getloadavg()[0]:.1f}")
        print(f"\nwhole process, start to exit, {args.steps:,} steps ({size_mb:,.0f} MB), "
              f"{args.repeats} paired rounds:")
        resumed = None
        if args.resumed:
            resumed = work / "resumed.jsonl"
            write_resumed_log(resumed, args.steps)
        table, whole_ok = whole_process(
            log_path, work, args.repeats, args.baseline_src, resumed
        )
        for line in table:
            print(line)
        print("\nbreakdown: the library calls inside one process (imports excluded)")

        import polars  # noqa: F401  (its import is timed once, not inside the read)

        logs, t_read = timed(lambda: load_logs([log_path], None, {}, columnar=True)[0])
        log = logs[0]
        columnar = getattr(log, "columns", None) is not None
        analysis, t_detect = timed(lambda: analyze_log(log, detectors_for(None)))
        _, t_json = timed(lambda: analyze_json(log_path))
        t_end = t_json  # read + detectors + JSON, once more as one call
        # pandas holds the whole table as Python objects first: past a few million steps it
        # needs tens of GB, so the yardstick is measured on up to 2M steps.
        pandas = pandas_baseline(log_path) if args.steps <= 2_000_000 else None
        wall, peak, _ = child_peak(log_path)

        per_detector = []
        cols = getattr(log, "columns", None)
        if cols is not None:
            for det in detectors_for(None):
                path = "twin" if twin_for(det) is not None else "streaming, own rows"
                _, t = timed(lambda det=det: run_columns(cols, [det]))
                per_detector.append((type(det).__name__, path, t))

        ratio = f"{pandas.cpu / t_end.cpu:.1f}× faster than pandas" if pandas else ""
        # 2 s per million steps; wall or CPU, whichever the shared machine inflated less
        # (polars decodes on every core, so its CPU time can exceed the wall time).
        limit = 2.0 * args.steps / 1_000_000
        rows = [
            ("log", f"{args.steps:,} steps, {size_mb:,.0f} MB JSONL", "", ""),
            ("generate the log", str(t_write), "", ""),
            ("read" + (" (columnar)" if columnar else " (streaming)"), str(t_read), "", ""),
            (f"detectors ({len(analysis.findings)} findings)", str(t_detect), "", ""),
            ("analyze call (read + detectors + JSON)", str(t_end),
             f"≤ {limit:g} s", "PASS" if min(t_end.wall, t_end.cpu) <= limit else "FAIL"),
            ("pandas read_json(lines) + rolling median", str(pandas) if pandas else
             "not measured (no pandas, or over 2M steps)", "", ""),
            ("sapper vs pandas", ratio, "", ""),
            ("analyze in a fresh process: wall, peak RSS", f"{wall:.2f} s, {peak:,.0f} MiB "
             f"({peak * 2**20 / max(1, args.steps):,.0f} B/step)", "", ""),
        ]
        if args.report:
            from sapper.logs import read_log

            slog = read_log(log_path)
            s_analysis = analyze_log(slog, detectors_for(None))
            data, t_data = timed(lambda: build_report_data(s_analysis))
            report = work / "report.html"
            size, t_render = timed(lambda: write_report(report, data))
            browser = None if args.no_browser else open_in_browser(report)
            rows += [
                ("report data (decimate)", str(t_data), "", ""),
                ("report render + write", str(t_render), "", ""),
                ("report size", f"{size / 1e6:.2f} MB", "< 5 MB",
                 "PASS" if size < 5e6 else "FAIL"),
            ]
            if browser is None:
                rows.append(("open in Chromium", "not measured (no chromium/playwright)",
                             "< 2 s", ""))
            else:
                bwall, render = browser
                rows.append(("open in Chromium (navigate → drawn)", f"{bwall:.2f} s", "< 2 s",
                             "PASS" if bwall < 2 else "FAIL"))
                rows.append(("  of which the page's own load + draw", f"{render:.2f} s", "",
                             ""))
        width = max(len(r[0]) for r in rows)
        for name, value, target, verdict in rows:
            print(f"{name:<{width}}  {value:<38} {target:<8} {verdict}")
        if per_detector:
            print(f"\nper-detector time on the columns of all {args.steps:,} records:")
            for name, path, t in sorted(per_detector, key=lambda x: -x[2].cpu):
                print(f"  {name:<24} {path:<20} {t}")
        if formats:
            print(f"\nanalyze and diagnose, {args.steps:,} lines of each format, each in a fresh "
                  "process (wall, CPU, peak RSS):")
            print(f"  {'format':<11}  {'size':>8}  {'analyze':<32}  diagnose")
            for line in formats_table(work, args.steps, formats):
                print(f"  {line}")
        failed = [r for r in rows if r[3] == "FAIL"]
        return 1 if failed or not whole_ok else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
