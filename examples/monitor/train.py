"""The live monitor in a plain PyTorch loop: a plan loaded in Python, a ``with`` block,
a run log. Runs on a CPU in a few seconds, with torch alone:

    python examples/monitor/train.py [run.jsonl]

then ``sapper analyze run.jsonl`` reads the log offline. The plan is
``tiny-plan.yaml`` next to this file; ``sapper.load_plan`` reads it (or a Hugging Face
``config.json``, a DeepSpeed JSON, any mix of them) into the same validated ``Plan``
that ``sapper check tiny-plan.yaml`` checks, and an error in it is one
``sapper.InputError`` naming the file and the key.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import nn

import sapper

HERE = Path(__file__).parent


class TinyLM(nn.Module):
    """A next-token model small enough for a laptop: embedding, one GRU, a head."""

    def __init__(self, vocab: int = 64, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(input_ids))[0])


def batches(steps: int, batch: int = 16, seq: int = 32, vocab: int = 64):
    """Sequences that count up modulo ``vocab`` in strides of 1-7, with one token in five
    replaced at random: a pattern the model learns quickly, and every sample distinct (a
    repeated one would rightly be reported as duplicated data, R070)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=gen)
        stride = torch.randint(1, 8, (batch, 1), generator=gen)
        tokens = (start + stride * torch.arange(seq + 1)) % vocab
        noise = torch.rand(tokens.shape, generator=gen) < 0.2
        yield torch.where(noise, torch.randint(0, vocab, tokens.shape, generator=gen), tokens)


def main(run_log: str = "run.jsonl") -> list[sapper.Finding]:
    loaded = sapper.load_plan(HERE / "tiny-plan.yaml")  # or plan="tiny-plan.yaml" below
    plan = loaded.plan
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=plan.optimizer.lr)
    warmup, total = plan.schedule.warmup_steps, plan.schedule.total_steps
    floor = plan.schedule.min_lr / plan.optimizer.lr

    def lr_factor(step: int) -> float:  # linear warmup, cosine decay to min_lr
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, total - warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    with sapper.Monitor(model, opt, scheduler=sched, plan=loaded, run_log=run_log) as mon:
        for tokens in batches(total):
            x, y = tokens[:, :-1], tokens[:, 1:]
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), plan.clipping.max_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            mon.step(loss)
    # The with block closed the monitor: every record and finding is in the run log.
    last = mon.history[-1]
    print(f"{len(mon.history)} steps, last loss {last.loss:.3f}; run log: {run_log}")
    return mon.findings


if __name__ == "__main__":
    main(*sys.argv[1:])
