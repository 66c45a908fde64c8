"""How fast `sapper check` scans a tokenized dataset for out-of-vocabulary ids (rule D103).

Writes datasets of each supported format to a temporary folder, scans each with
:func:`sapper.data.tokens.scan_token_ids` and prints tokens/s. Target: binary formats at
≥ 200M tokens/s on one core from the page cache (a 20 s budget then covers ≥ 4B tokens in
full; larger datasets are sampled evenly, and a cold scan runs at the storage's speed),
jsonl at ≥ 1M tokens/s.

    python benchmarks/bench_token_scan.py [--tokens 200_000_000]
"""

from __future__ import annotations

import argparse
import json
import struct
import tempfile
import time
from pathlib import Path

import numpy as np

from sapper.data.tokens import MEGATRON_MAGIC, scan_token_ids

VOCAB = 50257


def _write_raw(folder: Path, n: int, rng: np.random.Generator) -> Path:
    path = folder / "train.bin"
    with path.open("wb") as fh:
        for start in range(0, n, 1 << 24):
            count = min(1 << 24, n - start)
            fh.write(rng.integers(0, VOCAB, size=count, dtype=np.uint16).tobytes())
    return path


def _write_npy(folder: Path, raw: Path, n: int) -> Path:
    path = folder / "train.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(n,))
    out[:] = np.memmap(raw, dtype=np.uint16, mode="r", shape=(n,))
    out.flush()
    return path


def _write_megatron(folder: Path, raw: Path, n: int) -> Path:
    prefix = folder / "corpus_text_document"
    prefix.with_suffix(".bin").symlink_to(raw)
    docs = n // 2048
    sizes = np.full(docs, 2048, dtype=np.int32)
    with prefix.with_suffix(".idx").open("wb") as fh:
        fh.write(MEGATRON_MAGIC + struct.pack("<QBQQ", 1, 8, docs, docs + 1))
        fh.write(sizes.tobytes())
        fh.write((np.arange(docs, dtype=np.int64) * 4096).tobytes())
        fh.write(np.arange(docs + 1, dtype=np.int64).tobytes())
    return prefix.with_suffix(".bin")


def _write_jsonl(folder: Path, n: int, rng: np.random.Generator) -> Path:
    path = folder / "train.jsonl"
    with path.open("w") as fh:
        for _ in range(n // 1024):
            fh.write(json.dumps({"input_ids": rng.integers(0, VOCAB, 1024).tolist()}) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200_000_000)
    parser.add_argument("--jsonl-tokens", type=int, default=4_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        raw = _write_raw(folder, args.tokens, rng)
        cases = [
            ("bin uint16", raw, args.tokens),
            ("npy uint16", _write_npy(folder, raw, args.tokens), args.tokens),
            ("megatron uint16", _write_megatron(folder, raw, args.tokens), args.tokens),
            ("jsonl", _write_jsonl(folder, args.jsonl_tokens, rng), args.jsonl_tokens),
        ]
        for name, path, _n in cases:
            t0 = time.perf_counter()
            scan = scan_token_ids(path, 32000, budget_s=60.0)
            dt = time.perf_counter() - t0
            rows.append((name, scan.tokens_read, dt, scan.tokens_read / dt, scan.complete))
    print(f"{'format':<16} {'tokens':>14} {'seconds':>8} {'Mtokens/s':>10} complete")
    for name, n, dt, rate, complete in rows:
        print(f"{name:<16} {n:>14,} {dt:>8.2f} {rate / 1e6:>10.1f} {complete}")


if __name__ == "__main__":
    main()
