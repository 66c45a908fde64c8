"""A plain loop with gradient accumulation and a GradScaler, its loss computed outside
the model: each micro-batch gives backward ``scaler.scale(loss / 2)``. It prints the
loss of every step as it computes it (the mean of its two micro-batches)."""

import json

import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
target = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)) / 4
data = torch.Generator().manual_seed(2)
losses = []
for _ in range(12):
    step_loss = 0.0
    for _ in range(2):
        x = torch.randn(64, 16, generator=data)
        loss = nn.functional.mse_loss(model(x), x @ target) / 2
        scaler.scale(loss).backward()
        step_loss += loss.item()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    losses.append(step_loss)
print(json.dumps(losses))
