"""The training step the monitor benchmarks time (``monitor_overhead.py``,
``monitor_features.py``), defined once so that both time the same loop: a tiny GPT-2
built from a config (no download), AdamW with clipping, and the monitor's ``step`` when
a monitor is given."""

from __future__ import annotations

from typing import Any

import torch
import transformers

transformers.logging.set_verbosity_error()

__all__ = ["build", "train_step"]


def build(layers: int, hidden: int, heads: int, seq: int) -> torch.nn.Module:
    """A GPT-2 of this shape with a 1,024-token vocabulary, seeded (same weights each
    call)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        vocab_size=1024,
        n_positions=seq,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg)


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, mon: Any = None
) -> None:
    """One optimizer step on token ids ``x`` (labels = inputs), clipped at norm 1."""
    out = model(input_ids=x, labels=x)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if mon is not None:
        mon.step(out.loss)
