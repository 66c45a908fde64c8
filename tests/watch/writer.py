"""Appends lines to a log at a steady rate, the way a training job writes it.

Run as a script by the watch tests (a separate process, like the job next to which
``sapper watch`` runs): ``python writer.py SRC DST --rate 500 --mark 50 51 --stamps F``
writes the lines of SRC to DST ('-' for stdout), flushing each one, and records in F the
wall-clock time right after each marked line (0-based) reached the file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--rate", type=float, default=500.0, help="lines per second")
    ap.add_argument("--mark", type=int, nargs="*", default=[])
    ap.add_argument("--stamps")
    ap.add_argument("--split", action="store_true", help="write each line in two parts")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds before creating DST")
    ap.add_argument("--linger", type=float, default=0.0, help="seconds alive after the end")
    args = ap.parse_args()
    lines = Path(args.src).read_text(encoding="utf-8").splitlines(keepends=True)
    time.sleep(args.delay)
    out = sys.stdout.buffer if args.dst == "-" else open(args.dst, "ab")
    stamps: dict[int, float] = {}
    gap = 1.0 / args.rate
    due = time.monotonic()
    for i, line in enumerate(lines):
        data = line.encode("utf-8")
        if args.split and len(data) > 2:
            half = len(data) // 2
            out.write(data[:half])
            out.flush()
            time.sleep(gap / 2)
            data = data[half:]
        out.write(data)
        out.flush()
        if i in args.mark:
            stamps[i] = time.time()
        due += gap
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    if args.stamps:
        Path(args.stamps).write_text(json.dumps(stamps))
    time.sleep(args.linger)
    if out is not sys.stdout.buffer:
        out.close()


if __name__ == "__main__":
    main()
