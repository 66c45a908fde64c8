"""The training step under test: forward, loss, gradient accumulation, precision, checkpointing.

The checks never re-implement the user's step; they call it. A step is any callable
``step(model, micro_batches, options) -> StepResult`` that leaves the gradient of one
optimizer step in ``param.grad`` (the optimizer step itself stays outside, with the check).
:class:`DefaultTrainStep` mirrors the common loop (Hugging Face Trainer since its 2024
accumulation fix, nanoGPT, torchtitan): the loss is the sum of token losses divided by the
target tokens of the whole step, summed over micro-batches and data-parallel ranks. Users
plug in their own step — or subclass this one and override one method — so the checks test
the code they actually run.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from sapper.smoke.batches import IGNORE_INDEX, Batch, target_tokens
from sapper.smoke.toy import find_blocks

__all__ = [
    "DTYPES",
    "DefaultTrainStep",
    "Precision",
    "StepOptions",
    "StepResult",
    "TrainStep",
    "autocast",
    "checkpointing",
    "logits_of",
]

Precision = Literal["fp32", "bf16", "fp16"]
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class StepOptions:
    """What a check varies between two runs of the same step."""

    precision: Precision = "fp32"
    checkpointing: bool = False
    #: Multiplier on the loss before backward (fp16 loss scaling); None = the step's default.
    loss_scale: float | None = None


@dataclass
class StepResult:
    """The loss of one optimizer step and how the gradients it left are scaled."""

    loss: float
    tokens: int
    #: ``param.grad`` holds this multiple of the true gradient (the fp16 loss scale).
    grad_scale: float = 1.0


class TrainStep(Protocol):
    """One optimizer step's forward and backward over ``micro_batches`` (accumulating into
    ``param.grad``; the caller zeroes gradients and runs the optimizer)."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult: ...


def logits_of(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Logits [B, T, V] of a Hugging Face model or of any module whose forward takes
    ``input_ids`` and returns logits (a tensor, a tuple starting with them, or ``.logits``)."""
    ids = batch["input_ids"]
    inner = getattr(model, "module", model)  # DDP wraps the model
    if hasattr(inner, "config") and hasattr(inner, "get_input_embeddings"):
        out = model(input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False)
    else:
        out = model(ids)
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, tuple | list):
        out = out[0]
    return out


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    """torch.autocast for bf16/fp16, nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


@contextlib.contextmanager
def checkpointing(
    model: nn.Module, kwargs: dict[str, Any] | None = None
) -> Iterator[None]:
    """Activation checkpointing on every transformer block while the context is open.

    Hugging Face models use their own switch (``activation_checkpointing_enable``, or
    ``gradient_checkpointing_enable`` on older transformers) with ``kwargs`` passed to
    ``torch.utils.checkpoint``; other models get each block of their longest ``ModuleList``
    wrapped in ``torch.utils.checkpoint.checkpoint(**kwargs)``."""
    kwargs = {"use_reentrant": False, **(kwargs or {})}
    inner = getattr(model, "module", model)
    enable = getattr(inner, "activation_checkpointing_enable", None)
    disable = getattr(inner, "activation_checkpointing_disable", None)
    if enable is None:
        enable = getattr(inner, "gradient_checkpointing_enable", None)
        disable = getattr(inner, "gradient_checkpointing_disable", None)
    if enable is not None and getattr(inner, "supports_gradient_checkpointing", False):
        enable(kwargs)
        try:
            yield
        finally:
            disable()
        return
    blocks = [m for _, m in find_blocks(inner)]
    for block in blocks:
        original = block.forward
        block.forward = functools.partial(_checkpointed, original, kwargs)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward  # the instance attribute shadowed the class method


def _checkpointed(forward: Callable[..., Any], kwargs: dict[str, Any], *a: Any, **k: Any) -> Any:
    if not torch.is_grad_enabled():
        return forward(*a, **k)
    return checkpoint(forward, *a, **kwargs, **k)


@dataclass
class DefaultTrainStep:
    """The common training step, one method per decision so a subclass can change one.

    - loss: cross-entropy of ``logits[:, :-1]`` against ``labels[:, 1:]`` (the one shift
      of a causal LM), summed over tokens, divided by the target tokens of the whole step —
      all micro-batches, all data-parallel ranks (DDP averages gradients, so the loss is
      multiplied by the world size);
    - accumulation: ``backward`` after each micro-batch; under DDP only the last one syncs;
    - precision: ``torch.autocast`` to bf16/fp16; fp16 multiplies the loss by a static
      ``loss_scale`` (``GradScaler``'s initial 2^16) and reports it in the result;
    - checkpointing: every block through ``torch.utils.checkpoint`` with
      ``checkpoint_kwargs`` (Hugging Face's ``gradient_checkpointing_kwargs``).
    """

    loss_scale: float = 2.0**16
    checkpoint_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"use_reentrant": False, "preserve_rng_state": True}
    )

    def token_loss_sum(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Sum of next-token cross-entropies over the batch's target tokens (fp32)."""
        shifted = logits[:, :-1].float()
        targets = batch["labels"][:, 1:]
        return nn.functional.cross_entropy(
            shifted.reshape(-1, shifted.shape[-1]),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )

    def count_tokens(self, micro_batches: Sequence[Batch], device: torch.device) -> int:
        """Target tokens of the whole step, over micro-batches and data-parallel ranks."""
        count = torch.tensor(sum(target_tokens(b) for b in micro_batches), device=device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(count)
        return int(count)

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        device = next(model.parameters()).device
        total = self.count_tokens(micro_batches, device)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        scale = (options.loss_scale or self.loss_scale) if options.precision == "fp16" else 1.0
        ckpt = (
            checkpointing(model, self.checkpoint_kwargs)
            if options.checkpointing
            else contextlib.nullcontext()
        )
        loss_sum = 0.0
        with ckpt:
            for i, batch in enumerate(micro_batches):
                batch = {k: v.to(device) for k, v in batch.items()}
                last = i == len(micro_batches) - 1
                sync = (
                    contextlib.nullcontext()
                    if last or not hasattr(model, "no_sync")
                    else model.no_sync()
                )
                with sync:
                    with autocast(device, options.precision):
                        logits = logits_of(model, batch)
                    summed = self.token_loss_sum(logits, batch)
                    loss = summed * (world / max(total, 1))
                    (loss * scale).backward()
                # note: a CPU-GPU sync point, once per micro-batch of a smoke step
                loss_sum += float(summed.detach())
        return StepResult(loss=loss_sum / max(total, 1), tokens=total, grad_scale=scale)
