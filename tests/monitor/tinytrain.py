"""Tiny real training runs for the monitor's fault-injection tests.

Models are built from transformers configs (GPT-2, Llama, a Post-LN BERT decoder) with
hidden size 32-64 and a 256-token vocabulary; the data is a learnable Markov chain with
noise, so every sample is distinct and the loss falls. :func:`train` is one plain PyTorch
loop whose switches inject the failures the monitor must name.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import transformers
from torch import nn

from sapper.monitor import Monitor

transformers.logging.set_verbosity_error()

VOCAB = 256

#: Detector windows sized for runs of tens of steps; clean runs use the same settings.
FAST: dict[str, dict[str, Any]] = {
    "loss": {"flat_steps": 30, "window": 30, "min_history": 8},
    "gradnorm": {"skip_first": 5, "saturate_window": 10},
    "memory": {"warmup_steps": 5, "growth_min_steps": 10},
    "throughput": {"warmup_steps": 3, "window": 10, "min_records": 5},
    "scaler": {"skip_grace_steps": 5, "skip_min_records": 10},
    "structure": {"warmup_probe_steps": 5},
}


def gpt2(layers: int = 2, hidden: int = 32, positions: int = 64, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_embd=hidden,
        n_layer=layers,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=positions,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg)


def llama(layers: int = 2, hidden: int = 32, positions: int = 64, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        max_position_embeddings=positions,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg)


def post_ln(layers: int = 8, hidden: int = 32, seed: int = 0) -> nn.Module:
    """A deep Post-LN stack: BERT's layers (norm after the residual add) as a decoder."""
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        is_decoder=True,
        pad_token_id=0,
    )
    return transformers.BertLMHeadModel(cfg)


class NanoGPT(nn.Module):
    """nanoGPT's model in miniature: a ``config.block_size``, a learned ``transformer.wpe``
    and no transformers config. ``positions`` ("wrap" / "clamp") makes the model fit
    longer sequences into its table silently, as some forks do."""

    def __init__(
        self, layers: int = 2, hidden: int = 32, block_size: int = 64, positions: str = ""
    ) -> None:
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size, n_layer=layers, n_embd=hidden)
        self.positions = positions
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(VOCAB, hidden),
                "wpe": nn.Embedding(block_size, hidden),
                "h": nn.ModuleList(
                    nn.TransformerEncoderLayer(
                        hidden, 2, 2 * hidden, dropout=0.0, batch_first=True, norm_first=True
                    )
                    for _ in range(layers)
                ),
                "ln_f": nn.LayerNorm(hidden),
            }
        )
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        idx, t = input_ids, input_ids.shape[1]
        pos = torch.arange(t, device=idx.device)
        if self.positions == "wrap":
            pos = pos % self.config.block_size
        elif self.positions == "clamp":
            pos = pos.clamp(max=self.config.block_size - 1)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        for block in self.transformer.h:
            x = block(x, src_mask=mask, is_causal=True)
        logits = self.lm_head(self.transformer.ln_f(x))
        targets = (labels if labels is not None else idx)[:, 1:].reshape(-1)
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), targets)
        return SimpleNamespace(loss=loss, logits=logits)


def nanogpt(
    layers: int = 2, hidden: int = 32, block_size: int = 64, positions: str = "", seed: int = 0
) -> nn.Module:
    torch.manual_seed(seed)
    return NanoGPT(layers, hidden, block_size, positions)


class Markov:
    """Endless learnable batches: each token follows a fixed permutation of the previous
    one, with 30% random tokens (so samples are distinct: two agree with probability ~1e-12)."""

    def __init__(self, batch: int = 8, seq: int = 32, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(VOCAB, generator=self.gen)
        self.batch, self.seq = batch, seq
        self.ready: list[torch.Tensor] = []

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        # Batches are made 16 at a time: loading must not dominate a millisecond step.
        if not self.ready:
            self.ready = list(self.sample(16 * self.batch, self.seq).split(self.batch))
        return self.ready.pop(0)

    def sample(self, batch: int, seq: int) -> torch.Tensor:
        g = self.gen
        cols = [torch.randint(0, VOCAB, (batch,), generator=g)]
        for _ in range(seq - 1):
            noise = torch.rand(batch, generator=g) < 0.3
            rand = torch.randint(0, VOCAB, (batch,), generator=g)
            cols.append(torch.where(noise, rand, self.perm[cols[-1]]))
        return torch.stack(cols, dim=1)


@dataclass
class Run:
    """What a test inspects after training."""

    monitor: Monitor
    losses: list[float] = field(default_factory=list)
    error: BaseException | None = None

    def codes(self) -> set[str]:
        return {f.code for f in self.monitor.findings}

    def first_step(self, code: str) -> int | None:
        steps = [f.step for f in self.monitor.findings if f.code == code and f.step is not None]
        return min(steps) if steps else None

    def warnings(self) -> set[str]:
        return {f.code for f in self.monitor.findings if f.severity.value != "info"}


def train(
    model: nn.Module,
    *,
    steps: int = 40,
    lr: float = 1e-3,
    ga: int = 1,
    data: Iterator[torch.Tensor] | None = None,
    fp16: bool = False,
    clip: float | None = 1.0,
    schedule: Callable[[int], float] | None = None,
    divide_loss: bool = True,
    loss_factor: float = 1.0,
    scaler: bool | None = None,
    bare_step: bool = False,
    clip_before_unscale: bool = False,
    scheduler_per_micro: bool = False,
    inject: Callable[[int, nn.Module], None] | None = None,
    stall: Callable[[int], float] | None = None,
    leak: Callable[[int], int] | None = None,
    optimizer: str = "adamw",
    monitor: dict[str, Any] | None = None,
    loss_outside: bool = False,
    freeze: Callable[[nn.Module], None] | None = None,
    optimizer_on: nn.Module | None = None,
    backward: bool = True,
    position_ids: Callable[[torch.Tensor], torch.Tensor] | None = None,
    evaluate: Callable[[int, nn.Module], Any] | None = None,
) -> Run:
    """One plain training loop, with ``Monitor`` attached by two lines.

    ``loss_outside``: the model returns logits and the loop computes the cross-entropy
    (``divide_loss`` still says whether it is divided by ``ga``); ``freeze`` runs on the
    model before the optimizer is built, which then holds only the trainable
    parameters; ``optimizer_on`` builds the optimizer on another module's parameters;
    ``backward=False`` never calls backward; ``position_ids`` makes the loop pass the
    position ids it computes from each batch (a script that wraps or clamps them);
    ``evaluate`` runs after each step and what it returns (unless None) goes to
    ``Monitor.eval_loss``."""
    data = data if data is not None else Markov()
    if freeze is not None:
        freeze(model)
    target = optimizer_on if optimizer_on is not None else model
    params = [p for p in target.parameters() if p.requires_grad or freeze is None]
    if not params:  # everything frozen: the optimizer is built on the frozen tensors
        params = list(target.parameters())
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=lr)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if schedule else None
    use_scaler = fp16 if scaler is None else scaler
    grad_scaler = torch.amp.GradScaler("cpu") if use_scaler else None
    options = {"log_every": 5, "sample_every": 5, "localise_every": 5, "console": False}
    options.update(monitor or {})
    options.setdefault("detector_options", FAST)
    mon = Monitor(model, opt, scaler=grad_scaler, scheduler=sched, **options)  # line 1
    run = Run(mon)
    kept: list[torch.Tensor] = []
    model.train()
    try:
        for step in range(steps):
            if inject is not None:
                inject(step, model)
            for _ in range(ga):
                if stall is not None and stall(step) > 0:
                    time.sleep(stall(step))
                x = next(data)
                ctx = (
                    torch.autocast("cpu", dtype=torch.float16) if fp16 else contextlib.nullcontext()
                )
                extra = {"position_ids": position_ids(x)} if position_ids is not None else {}
                with ctx:
                    if loss_outside:
                        logits = model(input_ids=x, **extra).logits[:, :-1]
                        raw = nn.functional.cross_entropy(
                            logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1)
                        )
                    else:
                        raw = model(input_ids=x, labels=x, **extra).loss
                loss = (raw / ga if divide_loss else raw) * loss_factor
                if backward:
                    (grad_scaler.scale(loss) if grad_scaler else loss).backward()
                if sched is not None and scheduler_per_micro:
                    sched.step()
            if grad_scaler is not None and not clip_before_unscale and not bare_step:
                grad_scaler.unscale_(opt)
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if grad_scaler is not None and not bare_step:
                grad_scaler.step(opt)
                grad_scaler.update()
            else:
                opt.step()
            if sched is not None and not scheduler_per_micro:
                sched.step()
            opt.zero_grad(set_to_none=True)
            if leak is not None and leak(step):
                kept.append(torch.ones(leak(step) // 4))  # a buffer kept across steps
            run.losses.append(float(raw.detach()))
            mon.step(raw)  # line 2
            if evaluate is not None and (value := evaluate(step, model)) is not None:
                mon.eval_loss(value)
    except Exception as exc:  # the test decides whether an error was expected
        run.error = exc
    mon.close()
    return run
