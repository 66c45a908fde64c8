"""Cost of the full-tensor replica checksum (X003), measured and extrapolated to 7B.

``python benchmarks/replica_checksum.py [--elements 100000000] [--device cpu|cuda]``
times :func:`sapper.distributed.checksum.tensor_checksum` over one tensor of
``--elements`` elements per dtype (best of ``--repeat``), and prints the time per 100M
elements and the time for a 7B-parameter model at that rate (one checksum every
exchange, so the per-step cost is this divided by the exchange interval). The checksum
reads every word once (a row-sum reduction into int64, no full-size temporary), so on a
GPU it runs at memory bandwidth; on a CPU it is bounded by the cores given to torch.
"""

from __future__ import annotations

import argparse
import time

import torch

from sapper.distributed.checksum import ParamChecksum, tensor_checksum

SEVEN_B = 7_000_000_000


def _time(fn: object, repeat: int, device: torch.device) -> float:
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()  # type: ignore[operator]
        if device.type == "cuda":
            torch.cuda.synchronize()
        else:
            out.item()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=100_000_000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    device = torch.device(args.device)
    n = args.elements
    print(f"device {device}, torch threads {torch.get_num_threads()}, {n:,} elements per tensor")
    print(f"{'dtype':<9} {'GB read':>8} {'s / 100M':>9} {'GB/s':>7} {'7B model (s)':>13}")
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.randn(n, device=device).to(dtype)
        ck = ParamChecksum([("t", t)])
        ck.compute()  # warm-up and the cached row weights
        s = _time(ck.compute, args.repeat, device)
        gb = n * t.element_size() / 1e9
        per_100m = s * 1e8 / n
        print(
            f"{str(dtype).replace('torch.', ''):<9} {gb:>8.2f} {per_100m:>9.3f} "
            f"{gb / s:>7.1f} {per_100m * SEVEN_B / 1e8:>13.2f}"
        )
        del t, ck
    small = torch.randn(1000, device=device)
    s = _time(lambda: tensor_checksum(small), args.repeat, device)
    print(f"fixed cost per tensor (1000 elements): {s * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
