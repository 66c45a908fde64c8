"""A plain PyTorch loop under torchrun (gloo, DDP), with no sapper in it: every rank
regresses a fixed linear map."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
model = DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.2)
target = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)) / 4
data = torch.Generator().manual_seed(100 + rank)
steps = int(os.environ.get("STEPS", "30"))
for _ in range(steps):
    x = torch.randn(128, 16, generator=data)
    loss = nn.functional.mse_loss(model(x), x @ target)
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
print(f"rank {rank} done")
dist.destroy_process_group()
