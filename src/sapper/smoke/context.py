"""What every smoke check shares: the toy model's initial weights, the data, the step, the
settings and the tolerances, and one way to turn a verdict into a finding."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sapper.errors import InputError
from sapper.rules.model import Finding, Rule, Severity
from sapper.smoke.batches import Batch, BatchSource, SyntheticTokens, take
from sapper.smoke.step import Precision, TrainStep
from sapper.smoke.toy import ModelFactory

__all__ = ["OptimizerFactory", "SmokeConfig", "SmokeContext", "Tolerances", "verdict"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class Tolerances:
    """Pass/fail thresholds; each was measured on correct code and on a planted bug at toy
    scale (the numbers are in docs/smoke.md)."""

    #: overfit: the loss on one batch must fall by at least this fraction of its start.
    overfit_min_drop: float = 0.5
    #: label-shift probe: loss on random keys below this fraction of ln K (the floor of
    #: any next-token predictor) means the targets are visible to the model.
    probe_copy_fraction: float = 0.5
    #: ... key→value loss below this fraction of ln K proves next-token targets (a double
    #: shift cannot go below 1).
    probe_learned_fraction: float = 0.7
    #: ... sampling noise of a held-out loss, as a fraction of ln K.
    probe_noise: float = 0.1
    #: ... the probe's own optimizer and step budget.
    probe_lr: float = 3e-3
    probe_max_steps: int = 200
    #: fp32 equivalence (accumulation, checkpointing, data parallel): global relative error.
    fp32_rel_err: float = 1e-4
    #: mixed precision vs fp32, per layer: minimum cosine and maximum relative error.
    bf16_min_cosine: float = 0.99
    bf16_max_rel_err: float = 0.2
    fp16_min_cosine: float = 0.998
    fp16_max_rel_err: float = 0.08
    #: fp16 headroom: warn when the largest activation is within this factor of 65504.
    fp16_headroom_warn: float = 16.0
    #: init health: a block multiplying the residual stream's std by more than this warns.
    init_amplification: float = 16.0
    #: ... and max/min per-layer parameter-gradient std above this ratio warns.
    init_grad_spread: float = 10.0
    #: sharding (S008): micro-batches read per rank to reach the end of the epoch; a source
    #: that goes on (a stream) is compared over this many.
    epoch_max_batches: int = 128
    #: measured vs estimated memory: model states within this relative error ...
    memory_states_rel_err: float = 0.1
    #: ... activations within this factor either way.
    memory_activation_factor: float = 2.0


def _default_start_method() -> str:
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() and (
        sys.platform.startswith("linux")
    ) else "spawn"


@dataclass(frozen=True)
class SmokeConfig:
    """Settings of a smoke run (toy scale: seconds on a CPU)."""

    steps: int = 60
    lr: float = 3e-3
    seed: int = 0
    precisions: tuple[Precision, ...] = ("bf16", "fp16")
    grad_accum: int = 2
    micro_batch: int = 4
    seq_len: int = 64
    device: str = "cpu"
    dp_world_size: int = 2
    #: How the data-parallel ranks start: "fork" reuses this process's imports (seconds
    #: faster; Linux), "spawn" starts clean interpreters (needs picklable model factory,
    #: data source and step).
    dp_start_method: str = field(default_factory=lambda: _default_start_method())
    #: The optimizer of the overfit and probe runs; None = AdamW(lr, no weight decay).
    optimizer: OptimizerFactory | None = None
    tolerances: Tolerances = field(default_factory=Tolerances)


@dataclass
class SmokeContext:
    factory: ModelFactory
    source: BatchSource
    step: TrainStep
    config: SmokeConfig
    vocab_size: int
    initial_state: dict[str, torch.Tensor]
    num_params: int = 0
    #: The model config's pad_token_id (HF models), for loaders that give no attention mask.
    pad_token_id: int | None = None
    _batches: list[Batch] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        factory: ModelFactory,
        source: BatchSource | None,
        step: TrainStep,
        config: SmokeConfig,
    ) -> SmokeContext:
        """Build the toy once; ``source=None`` means synthetic tokens over its vocabulary."""
        from sapper.smoke.step import logits_of

        model = factory.build(config.seed)
        state = copy.deepcopy(model.state_dict())
        probe = {"input_ids": torch.zeros(1, 2, dtype=torch.long)}
        probe["attention_mask"] = torch.ones_like(probe["input_ids"])
        with torch.no_grad():
            vocab = int(logits_of(model.eval(), probe).shape[-1])
        n_params = sum(p.numel() for p in model.parameters())  # tied weights once
        needed = getattr(source, "vocab_size", None)
        if isinstance(needed, int) and needed > vocab:
            raise InputError(
                f"the data holds {needed} distinct token ids but the model's vocabulary is "
                f"{vocab}",
                field="data",
                expected="a model whose vocabulary covers the data",
            )
        if source is None:
            source = SyntheticTokens(vocab, config.seq_len, config.micro_batch, seed=config.seed)
        pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        pad = pad if isinstance(pad, int) and not isinstance(pad, bool) else None
        return cls(factory, source, step, config, vocab, state, n_params, pad)

    @property
    def device(self) -> torch.device:
        return torch.device(self.config.device)

    def fresh_model(self, train: bool = True) -> nn.Module:
        """The toy model at its initial weights (every check starts from the same ones)."""
        model = self.factory.build(self.config.seed)
        model.load_state_dict(self.initial_state)
        model.to(self.device)
        return model.train(train)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        if self.config.optimizer is not None:
            return self.config.optimizer(model.parameters())
        return torch.optim.AdamW(model.parameters(), lr=self.config.lr, weight_decay=0.0)

    def batches(self, n: int) -> list[Batch]:
        """The first ``n`` micro-batches of rank 0 (read once, reused by every check)."""
        if len(self._batches) < n:
            self._batches = take(self.source, n)
        return self._batches[:n]


def verdict(
    rule: Rule,
    passed: bool,
    message: str,
    *,
    warn: bool = False,
    fix: str | None = None,
    **numbers: Any,
) -> Finding:
    """A finding for a check's outcome: info when it passed, a warning, or the rule's
    severity when it failed; ``data.status`` says which."""
    if passed and not warn:
        severity, status = Severity.INFO, "pass"
    elif passed:
        severity, status = Severity.WARNING, "warn"
    else:
        severity, status = rule.severity, "fail"
    return rule.finding(message, severity=severity, fix=fix, status=status, **numbers)
