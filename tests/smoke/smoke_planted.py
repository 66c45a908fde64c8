"""Planted bugs for the smoke checks: the mistakes users make, written as users write them.

Module-level so the data-parallel check can rebuild them in its worker processes and the
CLI can import them by ``module:name``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from sapper.smoke.batches import (
    IGNORE_INDEX,
    Batch,
    SyntheticTokens,
    pad_samples,
    target_tokens,
)
from sapper.smoke.step import DefaultTrainStep, StepOptions, StepResult, logits_of


class PerMicroBatchMean(DefaultTrainStep):
    """The pre-fix accumulation loop: each micro-batch's mean loss divided by k."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        k = len(micro_batches)
        total = 0.0
        for batch in micro_batches:
            logits = logits_of(model, batch)
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                batch["labels"][:, 1:].reshape(-1),
                ignore_index=IGNORE_INDEX,
            )
            (loss / k).backward()
            total += float(loss.detach()) / k
        return StepResult(loss=total, tokens=0)


class TargetsFromInputIds(DefaultTrainStep):
    """Builds its targets from input_ids (ignoring the labels' -100): padding is scored."""

    def token_loss_sum(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        shifted = logits[:, :-1].float()
        return nn.functional.cross_entropy(
            shifted.reshape(-1, shifted.shape[-1]),
            batch["input_ids"][:, 1:].reshape(-1),
            reduction="sum",
        )


class ZeroGradEachMicroBatch(DefaultTrainStep):
    """Zeroes the gradients before every micro-batch's backward: only the last one counts."""

    def token_loss_sum(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        for p in self.model.parameters():
            p.grad = None
        return super().token_loss_sum(logits, batch)

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        self.model = model
        return super().__call__(model, micro_batches, options)


class SharpenedLossInHalf(DefaultTrainStep):
    """A hand-written log-softmax with a temperature, in the logits' own dtype: fine in fp32
    and bf16, but exp(logits / 0.05) overflows fp16 in the loss, not in the model."""

    def token_loss_sum(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        z = logits[:, :-1] / 0.05
        log_probs = z - torch.log(torch.exp(z).sum(dim=-1, keepdim=True))
        targets = batch["labels"][:, 1:]
        picked = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return -(picked.float() * (targets != IGNORE_INDEX)).sum()


# ---- steps that break the TrainStep contract ----------------------------------------------
class ZeroesGradsItself(DefaultTrainStep):
    """Starts with model.zero_grad(): the caller's accumulation is lost."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        model.zero_grad(set_to_none=True)
        return super().__call__(model, micro_batches, options)


class StepsTheOptimizer(DefaultTrainStep):
    """Applies an SGD update inside the step (the caller's optimizer steps again)."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        res = super().__call__(model, micro_batches, options)
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(1e-3 * p.grad)
        return res


class ForwardThroughModule(DefaultTrainStep):
    """Unwraps DDP for the forward (model.module(...)): the all-reduce never happens."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        return super().__call__(getattr(model, "module", model), micro_batches, options)


class NoSyncEveryMicroBatch(DefaultTrainStep):
    """Runs every micro-batch under no_sync, the last one too."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        sync = model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()
        with sync:
            inner = _HideNoSync(model)
            return super().__call__(inner, micro_batches, options)


class _HideNoSync(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, *args: object, **kwargs: object) -> object:
        return self.inner(*args, **kwargs)


class ScaleNotReported(DefaultTrainStep):
    """Multiplies the fp16 loss by the scale but reports grad_scale=1."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        res = super().__call__(model, micro_batches, options)
        return StepResult(loss=res.loss, tokens=res.tokens, grad_scale=1.0)


class IgnoresPrecision(DefaultTrainStep):
    """Never opens autocast: bf16 and fp16 runs are fp32 runs."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        return super().__call__(model, micro_batches, StepOptions())


class NotShifted(DefaultTrainStep):
    """Scores the logits at position t against token t (the model sees it)."""

    def token_loss_sum(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            batch["labels"].reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )


class ShiftedTwice(DefaultTrainStep):
    """Labels shifted by the collator and again by the loss: t scored against t+2."""

    def token_loss_sum(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        shifted = logits[:, :-2].float()
        return nn.functional.cross_entropy(
            shifted.reshape(-1, shifted.shape[-1]),
            batch["labels"][:, 2:].reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )


class PerRankTokens(DefaultTrainStep):
    """Assumes every rank holds as many tokens as this one (per-rank mean under DDP)."""

    def count_tokens(self, micro_batches: Sequence[Batch], device: torch.device) -> int:
        local = sum(target_tokens(b) for b in micro_batches)
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        return local * world


class NoWorldSizeFactor(DefaultTrainStep):
    """Divides by the all-reduced token count but forgets that DDP averages the gradients."""

    def count_tokens(self, micro_batches: Sequence[Batch], device: torch.device) -> int:
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        return super().count_tokens(micro_batches, device) * world


class LocalTokenCount(DefaultTrainStep):
    """Divides by this rank's own token count (no all-reduce), times the world size."""

    def count_tokens(self, micro_batches: Sequence[Batch], device: torch.device) -> int:
        return sum(target_tokens(b) for b in micro_batches)


# ---- data: a dataset of variable-length sequences, loaded with and without a sampler ----
def _dataset(n: int = 64, vocab: int = 512) -> list[torch.Tensor]:
    source = SyntheticTokens(vocab, 32, 1, seed=3)
    return [source.sample(i) for i in range(n)]


def _collate(samples: list[torch.Tensor]) -> Batch:
    return pad_samples(samples)


def unsharded_loader(rank: int, world_size: int) -> DataLoader:
    """A DataLoader built the same way on every rank: no DistributedSampler."""
    return DataLoader(_dataset(), batch_size=4, shuffle=False, collate_fn=_collate)


def sharded_loader(rank: int, world_size: int) -> DataLoader:
    data = _dataset()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(data, batch_size=4, sampler=sampler, collate_fn=_collate)


def replicas_doubled_loader(rank: int, world_size: int) -> DataLoader:
    """num_replicas counted twice (GPUs per node × nodes, with nodes already in it): the
    ranks read disjoint samples, and half of the epoch is never read."""
    data = _dataset()
    sampler = DistributedSampler(data, num_replicas=2 * world_size, rank=rank, shuffle=False)
    return DataLoader(data, batch_size=4, sampler=sampler, collate_fn=_collate)


def rank_seeded_loader(rank: int, world_size: int) -> DataLoader:
    """The sampler's shuffle seeded with the rank (``seed=SEED + rank``): every rank
    takes its slice of a different permutation, so the shards overlap and leave samples
    out; with this data the first micro-batches of the two ranks happen not to collide."""
    data = _dataset()
    sampler = DistributedSampler(
        data, num_replicas=world_size, rank=rank, shuffle=True, seed=2 + rank
    )
    return DataLoader(data, batch_size=4, sampler=sampler, collate_fn=_collate)


# ---- collators: padding in the labels ---------------------------------------------------
def _pad_ids(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(int(x.numel()) for x in samples)
    ids = torch.zeros(len(samples), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, x in enumerate(samples):
        ids[i, : x.numel()] = x
        mask[i, : x.numel()] = 1
    return ids, mask


def _labels_are_input_ids(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The common slip: pad, then copy the ids into the labels (pad id 0 left as a target)."""
    ids, mask = _pad_ids(samples)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def _no_mask_labels_are_input_ids(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same slip in a collator that returns no attention mask at all."""
    ids, _ = _pad_ids(samples)
    return {"input_ids": ids, "labels": ids.clone()}


def unmasked_labels_loader(rank: int, world_size: int) -> DataLoader:
    data = _dataset()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(data, batch_size=4, sampler=sampler, collate_fn=_labels_are_input_ids)


def unmasked_labels_no_mask_loader(rank: int, world_size: int) -> DataLoader:
    data = [x.clamp(min=1) for x in _dataset()]  # token 0 only as padding
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(
        data, batch_size=4, sampler=sampler, collate_fn=_no_mask_labels_are_input_ids
    )


def _word_level_tokenizer(vocab: int = 512):
    """A real transformers tokenizer built in memory (nothing downloaded): token ``t<i>``
    has id i, ``t0`` is the pad token."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    backend = Tokenizer(models.WordLevel(words, unk_token="t1"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="t0", unk_token="t1")


def hf_collator_loader(rank: int, world_size: int) -> DataLoader:
    """The healthy twin: transformers' DataCollatorForLanguageModeling(mlm=False)."""
    from transformers import DataCollatorForLanguageModeling

    data = [{"input_ids": x.clamp(min=1).tolist()} for x in _dataset()]
    collator = DataCollatorForLanguageModeling(_word_level_tokenizer(), mlm=False)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(data, batch_size=4, sampler=sampler, collate_fn=collator)


class MasksByAttention(DefaultTrainStep):
    """A step that ignores padding itself: targets where the attention mask is 0 are dropped,
    whatever the collator put in the labels."""

    def token_loss_sum(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        labels = batch["labels"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        return super().token_loss_sum(logits, {**batch, "labels": labels})


# ---- user models (not Hugging Face) -------------------------------------------------------
class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, scale: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.drop = nn.Dropout(dropout)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=causal, need_weights=False)
        x = x + self.drop(a)
        return x + self.drop(self.mlp(self.ln2(x)) * self.scale)


class TinyLM(nn.Module):
    """A GPT-style model written by hand: forward(input_ids) -> logits."""

    def __init__(
        self, vocab: int = 128, width: int = 32, layers: int = 3, heads: int = 2,
        dropout: float = 0.1, scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(256, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout, scale) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class RunningCenter(nn.Module):
    """Subtracts a running mean of its input that it updates on every call, in eval mode
    too (a hand-written norm that forgot ``if self.training``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x - self.mean
        with torch.no_grad():
            self.mean.mul_(0.5).add_(0.5 * x.detach().mean(dim=(0, 1)))
        return out


class StatefulLM(TinyLM):
    def __init__(self) -> None:
        super().__init__(dropout=0.0)
        self.center = RunningCenter(32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        x = self.center(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def stateful_lm() -> nn.Module:
    return StatefulLM()


def hf_llama_lm() -> nn.Module:
    """A user factory that builds a Hugging Face model in code (no config.json given)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_cache=False,
    )
    return LlamaForCausalLM(config)


def partly_frozen_lm() -> nn.Module:
    """A hand-written model whose position embedding is frozen (requires_grad=False)."""
    model = TinyLM(dropout=0.0)
    model.pos.weight.requires_grad_(False)
    return model


def tiny_lm() -> nn.Module:
    return TinyLM()


def overflowing_lm() -> nn.Module:
    """An MLP branch multiplied by a constant that puts activations past fp16's 65504."""
    return TinyLM(dropout=0.0, scale=3e5)


class FailsOnRankOne(DefaultTrainStep):
    """A step that crashes on one rank only (the other is left inside a collective)."""

    def __call__(
        self, model: nn.Module, micro_batches: Sequence[Batch], options: StepOptions
    ) -> StepResult:
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            raise RuntimeError("shape mismatch on rank 1")
        return super().__call__(model, micro_batches, options)
