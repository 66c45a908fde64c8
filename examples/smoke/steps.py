"""Two training steps written out against sapper's TrainStep contract (docs/train-step.md).

``ZLossStep`` is a custom loss (next-token cross-entropy plus PaLM's z-loss) for any model
whose forward gives logits; ``HFLossStep`` lets a Hugging Face causal LM compute its own
loss with ``num_items_in_batch``. Both are complete: nothing is inherited from sapper's
default step, so every clause of the contract is visible in the code. Try them with::

    sapper smoke --model examples/smoke/llama-toy.json --step steps:HFLossStep
    sapper smoke --model examples/smoke/llama-toy.json --step examples/smoke/steps.py:ZLossStep
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from sapper.smoke import StepOptions, StepResult
from sapper.smoke.step import checkpointing

IGNORE_INDEX = -100
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _step_tokens(micro_batches: Sequence[dict], device: torch.device) -> int:
    """(2) Target tokens of the whole optimizer step: every micro-batch, every rank."""
    count = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in micro_batches)
    total = torch.tensor(count, device=device)
    if _world() > 1:
        dist.all_reduce(total)  # every rank divides by the same number
    return int(total)


def _checkpointing(model: nn.Module, options: StepOptions) -> contextlib.AbstractContextManager:
    """options.checkpointing: every block checkpointed when the check asks for it."""
    return checkpointing(model) if options.checkpointing else contextlib.nullcontext()


def _autocast(device: torch.device, options: StepOptions) -> contextlib.AbstractContextManager:
    """(5) The precision the check asks for."""
    if options.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[options.precision])


class ZLossStep:
    """Cross-entropy summed over target tokens plus ``z_weight`` × logsumexp(logits)²,
    divided by the target tokens of the whole step. The model's forward takes ``input_ids``
    and returns logits (or, like Hugging Face models, an object with ``.logits``)."""

    def __init__(self, z_weight: float = 1e-4, loss_scale: float = 2.0**16) -> None:
        self.z_weight = z_weight
        self.loss_scale = loss_scale

    def loss_sum(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = logits[:, :-1].float()  # (6) the loss in fp32, whatever autocast did
        targets = labels[:, 1:]
        ce = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        z = torch.logsumexp(logits, dim=-1)[targets != IGNORE_INDEX]
        return ce + self.z_weight * z.pow(2).sum()

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[dict], options: StepOptions
    ) -> StepResult:
        device = next(model.parameters()).device
        total = _step_tokens(micro_batches, device)
        # (3) DDP averages gradients over ranks: × world size turns that into a sum, so the
        # loss is the sum over all ranks' tokens divided by all ranks' tokens
        norm = _world() / max(total, 1)
        # (7) fp16 multiplies the loss by a scale and reports it; bf16/fp32 need none
        scale = (options.loss_scale or self.loss_scale) if options.precision == "fp16" else 1.0
        with _checkpointing(model, options):
            summed = self._accumulate(model, micro_batches, options, device, norm, scale)
        return StepResult(loss=summed / max(total, 1), tokens=total, grad_scale=scale)

    def _accumulate(
        self,
        model: nn.Module,
        micro_batches: Sequence[dict],
        options: StepOptions,
        device: torch.device,
        norm: float,
        scale: float,
    ) -> float:
        summed = 0.0
        for i, batch in enumerate(micro_batches):
            batch = {k: v.to(device) for k, v in batch.items()}
            last = i == len(micro_batches) - 1
            # (4) all but the last micro-batch skip DDP's all-reduce
            sync = (
                contextlib.nullcontext()
                if last or not hasattr(model, "no_sync")
                else model.no_sync()
            )
            with sync:
                with _autocast(device, options):
                    out = model(batch["input_ids"])  # (1) the wrapper, not model.module
                logits = getattr(out, "logits", out)  # an HF output object, or the logits
                loss_sum = self.loss_sum(logits, batch["labels"])
                (loss_sum * norm * scale).backward()  # (8) accumulate; never zero_grad here
            summed += float(loss_sum.detach())  # note: a sync point, once per micro-batch
        return summed


class HFLossStep:
    """A Hugging Face causal LM computes its own loss: it shifts ``labels`` itself and, given
    ``num_items_in_batch``, divides the summed token losses by it instead of averaging per
    micro-batch."""

    def __init__(self, loss_scale: float = 2.0**16) -> None:
        self.loss_scale = loss_scale

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[dict], options: StepOptions
    ) -> StepResult:
        device = next(model.parameters()).device
        total = _step_tokens(micro_batches, device)
        scale = (options.loss_scale or self.loss_scale) if options.precision == "fp16" else 1.0
        summed = 0.0
        with _checkpointing(model, options):
            for i, batch in enumerate(micro_batches):
                summed += self._micro_batch(
                    model, batch, options, device, total, scale, last=i == len(micro_batches) - 1
                )
        return StepResult(loss=summed / max(total, 1), tokens=total, grad_scale=scale)

    def _micro_batch(
        self,
        model: nn.Module,
        batch: dict,
        options: StepOptions,
        device: torch.device,
        total: int,
        scale: float,
        *,
        last: bool,
    ) -> float:
        """One micro-batch's forward and backward; its summed token loss."""
        batch = {k: v.to(device) for k, v in batch.items()}
        sync = (
            contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        )
        with sync:
            with _autocast(device, options):
                out = model(  # labels unshifted: the model shifts them once
                    input_ids=batch["input_ids"],
                    attention_mask=batch["attention_mask"],
                    labels=batch["labels"],
                    num_items_in_batch=torch.tensor(total, device=device),
                    use_cache=False,
                )
            ((out.loss * _world()) * scale).backward()
        return float(out.loss.detach()) * total
