"""Writes a run's records as TensorBoard scalars with ``torch.utils.tensorboard``.

Run as a script by the watch tests: ``python tb_writer.py RECORDS LOGDIR --rate 200
--mark STEP --stamps F`` logs ``train/loss``, ``train/grad_norm`` and
``train/learning_rate`` per record (as the Hugging Face Trainer's TensorBoard callback
names them), flushes after each step, and records the wall-clock time right after the
marked step's events reached the event file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("logdir")
    ap.add_argument("--rate", type=float, default=200.0, help="steps per second")
    ap.add_argument("--mark", type=int, nargs="*", default=[])
    ap.add_argument("--stamps")
    ap.add_argument("--linger", type=float, default=0.0)
    args = ap.parse_args()
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(args.logdir, flush_secs=3600)
    gap = 1.0 / args.rate
    stamps: dict[int, float] = {}
    due = time.monotonic()
    for line in Path(args.records).read_text().splitlines():
        rec = json.loads(line)
        step = rec["step"]
        for tag, key in (
            ("train/loss", "loss"),
            ("train/grad_norm", "grad_norm"),
            ("train/learning_rate", "lr"),
        ):
            value = rec.get(key)
            if value is not None:
                writer.add_scalar(tag, float(value), step)  # "nan" in the run log reads as NaN
        writer.flush()
        if step in args.mark:
            stamps[step] = time.time()
        due += gap
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    if args.stamps:
        Path(args.stamps).write_text(json.dumps(stamps))
    time.sleep(args.linger)
    writer.close()


if __name__ == "__main__":
    main()
