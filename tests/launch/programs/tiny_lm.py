"""A tiny language model trained on one batch of token ids, unchanged by sapper: the
bootstrap attaches the monitor, which counts the tokens of each step."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 100))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 100, (8, 33))
for _step in range(int(sys.argv[1])):
    logits = model(ids[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 100), ids[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
