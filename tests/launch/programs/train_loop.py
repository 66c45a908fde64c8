"""A plain torch training loop that creates its own sapper.Monitor (as a user's loop
with the two lines does), for ``sapper run`` tests.

Usage: train_loop.py STEPS [--lr LR] [--nan-at STEP] [--hang-rank R --hang-at STEP]
[--gloo]. ``--nan-at`` plants a fault: from that step the inputs are scaled by 1e30, so
the loss overflows to inf/NaN and the program raises (a crash). ``--hang-rank`` makes one
rank stop before the all-reduce of ``--hang-at`` while the others wait in it.
"""

import argparse
import faulthandler
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn

import sapper

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--nan-at", type=int, default=None)
parser.add_argument("--hang-rank", type=int, default=None)
parser.add_argument("--hang-at", type=int, default=5)
parser.add_argument("--gloo", action="store_true")
args = parser.parse_args()

run_dir = Path(os.environ["SAPPER_RUN_DIR"])
rank = int(os.environ.get("RANK", "0"))
if args.gloo:
    import torch.distributed as dist

    dist.init_process_group("gloo")
# What the bootstrap does in every training process: SIGUSR1 dumps the stacks into an
# (empty until then) file named after the rank and pid.
(run_dir / "stacks").mkdir(parents=True, exist_ok=True)
stacks = open(run_dir / "stacks" / f"rank{rank}-{os.getpid()}.txt", "a")
faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
mon = sapper.Monitor(model, opt, run_log=run_dir / "logs" / f"rank{rank}.jsonl",
                     log_every=1, console=False, distributed=False)
x = torch.randn(64, 16)
y = x.sum(dim=1, keepdim=True)
for step in range(args.steps):
    scale = 1e30 if args.nan_at is not None and step >= args.nan_at else 1.0
    loss = nn.functional.mse_loss(model(x * scale), y)
    opt.zero_grad()
    loss.backward()
    if args.gloo:
        if args.hang_rank == rank and step >= args.hang_at:
            while True:
                time.sleep(0.5)
        for p in model.parameters():
            dist.all_reduce(p.grad)
    opt.step()
    mon.step(loss)
    if not torch.isfinite(loss):
        mon.close()
        raise RuntimeError(f"loss is {loss.item()} at step {step}")
mon.close()
print(f"rank {rank} done after {args.steps} steps")
