"""A plain loop with a planted mistake: the LR scheduler steps once per micro-batch
(two a step), so the schedule runs twice as fast as planned."""

import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
target = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)) / 4
data = torch.Generator().manual_seed(2)
for _ in range(20):
    for _ in range(2):
        x = torch.randn(64, 16, generator=data)
        (nn.functional.mse_loss(model(x), x @ target) / 2).backward()
        schedule.step()
    opt.step()
    opt.zero_grad()
print("done")
