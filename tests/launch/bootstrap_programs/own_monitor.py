"""A plain loop that already has sapper's two lines (and names no run log)."""

import torch
from torch import nn

import sapper

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
mon = sapper.Monitor(model, opt, console=False)
for _ in range(30):
    x = torch.randn(32, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    opt.step()
    opt.zero_grad()
    mon.step(loss)
mon.close()
print("steps", len(mon.history))
