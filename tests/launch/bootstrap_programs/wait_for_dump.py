"""A program that imports torch (under torchrun: joins a gloo group and all-reduces),
says it is ready, and waits in ``wait_for_release`` until the test lets it go. With
``OWN_SIGUSR1=1`` it handles SIGUSR1 itself, as Lightning's SLURM requeue does."""

import os
import signal
import sys
import time
from pathlib import Path

import torch

folder = Path(sys.argv[1])
rank = int(os.environ.get("RANK", "0"))
if os.environ.get("OWN_SIGUSR1"):
    signal.signal(signal.SIGUSR1, lambda *_: print("own SIGUSR1 handler ran", flush=True))
if "WORLD_SIZE" in os.environ:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    for _ in range(3):
        dist.all_reduce(torch.ones(4))


def wait_for_release() -> None:
    (folder / f"ready{rank}").write_text(str(os.getpid()))
    while not (folder / "release").exists():
        time.sleep(0.05)


wait_for_release()
if "WORLD_SIZE" in os.environ:
    dist.destroy_process_group()
print("released")
