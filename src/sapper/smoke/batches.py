"""Where the smoke checks get their batches: the user's loader, a token file, or synthetic tokens.

A batch follows the Hugging Face convention so a user's loader plugs in unchanged:
``input_ids`` [B, T] (int64), ``attention_mask`` [B, T] (1 = token, 0 = padding, right
padded) and ``labels`` [B, T] aligned with ``input_ids`` (the training step shifts them),
``-100`` where no loss is taken. A source yields micro-batches for one data-parallel rank, so
the data-parallel check can ask every rank for its share and see whether they overlap.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from sapper.errors import InputError
from sapper.smoke.userref import import_callable

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "BatchSource",
    "LoaderFactory",
    "SyntheticTokens",
    "TokenFile",
    "concat_batches",
    "fingerprints",
    "load_loader_factory",
    "normalize_batch",
    "pad_samples",
    "recut_variable_length",
    "take",
    "target_tokens",
]

IGNORE_INDEX = -100
Batch = dict[str, torch.Tensor]


@runtime_checkable
class BatchSource(Protocol):
    """Micro-batches for one data-parallel rank (``rank`` of ``world_size``)."""

    def batches(self, rank: int = 0, world_size: int = 1) -> Iterator[Batch]: ...


def pad_samples(samples: Sequence[torch.Tensor], length: int | None = None) -> Batch:
    """Right-pad 1-D token tensors into one batch; padding is masked and ignored by the loss."""
    length = length or max(int(s.numel()) for s in samples)
    ids = torch.zeros(len(samples), length, dtype=torch.long)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : s.numel()] = s
        mask[i, : s.numel()] = 1
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def normalize_batch(item: Any) -> Batch:
    """Accept what loaders commonly yield: a mapping with ``input_ids`` (``attention_mask``
    and ``labels`` optional; transformers' collators give a ``BatchEncoding``, a mapping but
    not a dict) or a bare [B, T] tensor of token ids."""
    if isinstance(item, torch.Tensor):
        item = {"input_ids": item}
    if isinstance(item, Mapping):
        item = dict(item)
    if not isinstance(item, dict) or "input_ids" not in item:
        raise InputError(
            "the data loader yielded something that is not a batch",
            field="batch",
            value=type(item).__name__,
            expected="a dict with 'input_ids' [batch, seq] (and optionally 'attention_mask', "
            "'labels') or a [batch, seq] tensor of token ids",
        )
    ids = torch.as_tensor(item["input_ids"]).long()
    if ids.dim() != 2:
        raise InputError(
            "input_ids must be two-dimensional",
            field="batch.input_ids",
            value=list(ids.shape),
            expected="shape [batch, seq]",
        )
    mask = item.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask).long()
    labels = item.get("labels")
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX) if labels is None else labels.long()
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """One batch holding all sequences of ``batches``, padded to the longest."""
    length = max(b["input_ids"].shape[1] for b in batches)
    pads = {"input_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX}
    out: Batch = {}
    for key, pad in pads.items():
        parts = [
            torch.nn.functional.pad(b[key], (0, length - b[key].shape[1]), value=pad)
            for b in batches
        ]
        out[key] = torch.cat(parts)
    return out


def target_tokens(batch: Batch) -> int:
    """Tokens that carry a loss after the one-position shift of a causal LM."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def fingerprints(batch: Batch) -> list[str]:
    """A short hash of each sequence's tokens (padding excluded): sample identity across ranks."""
    out = []
    for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
        tokens = ids[mask.bool()].to(torch.int64).numpy().tobytes()
        out.append(hashlib.sha1(tokens).hexdigest()[:16])
    return out


def take(source: BatchSource, n: int, rank: int = 0, world_size: int = 1) -> list[Batch]:
    """The first ``n`` micro-batches of a rank, normalised; too few is an input error."""
    got = [normalize_batch(b) for b in islice(source.batches(rank, world_size), n)]
    if len(got) < n:
        raise InputError(
            f"the data source gave only {len(got)} micro-batch(es) for rank {rank} of "
            f"{world_size}",
            field="data",
            expected=f"at least {n} micro-batches (more samples or a smaller --micro-batch)",
        )
    return got


def recut_variable_length(batches: Sequence[Batch], k: int) -> list[Batch]:
    """``k`` micro-batches cut from the sequences of ``batches`` with deliberately different
    lengths (so different target-token counts per micro-batch), right padded.

    Real data is often packed to a fixed length, where per-micro-batch averaging happens to
    give the right answer; cutting the same tokens to uneven lengths makes the normalisation
    of the loss visible."""
    rows = [
        ids[mask.bool()]
        for b in batches
        for ids, mask in zip(b["input_ids"], b["attention_mask"], strict=True)
    ]
    per = max(1, len(rows) // k)
    out = []
    for i in range(k):
        chunk = rows[i * per : (i + 1) * per]
        # micro-batch i keeps a fraction rising with i; within it, lengths fall with j
        scale = 0.25 + 0.75 * i / max(1, k - 1)
        samples = [
            r[: max(3, round(r.numel() * scale * (1.0 - 0.4 * j / max(1, len(chunk)))))]
            for j, r in enumerate(chunk)
        ]
        out.append(pad_samples(samples))
    return out


@dataclass(frozen=True)
class SyntheticTokens:
    """Uniformly random token sequences, sharded like a ``DistributedSampler`` without
    shuffling (rank r reads samples r, r + world, ...). With ``variable_length`` each
    sequence has a random length in [``min_fraction`` × seq_len, seq_len], right padded."""

    vocab_size: int
    seq_len: int
    micro_batch: int
    variable_length: bool = True
    min_fraction: float = 0.25
    seed: int = 0

    def sample(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        length = self.seq_len
        if self.variable_length:
            low = max(2, int(self.seq_len * self.min_fraction))
            length = int(torch.randint(low, self.seq_len + 1, (1,), generator=gen))
        return torch.randint(0, self.vocab_size, (length,), generator=gen)

    def batches(self, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        index = rank
        while True:
            samples = []
            for _ in range(self.micro_batch):
                samples.append(self.sample(index))
                index += world_size
            yield pad_samples(samples, self.seq_len)


@dataclass
class TokenFile:
    """Fixed-length windows from a tokenized file: ``.npy`` (1-D stream or 2-D [N, T]) or a
    flat ``.bin`` of ``token_dtype`` tokens (nanoGPT / Megatron style).

    The smoke model is trained from scratch, so token ids are relabelled to 0..U-1 (U
    distinct ids in the windows used): a bijection that keeps every sequence's structure
    while letting a small toy vocabulary hold real data."""

    path: Path
    seq_len: int
    micro_batch: int
    token_dtype: str = "uint16"
    max_windows: int = 512
    _windows: np.ndarray = field(init=False, repr=False)
    vocab_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        tokens = self._read()
        if tokens.ndim == 2:
            windows = tokens[: self.max_windows, : self.seq_len]
        else:
            n = min(self.max_windows, tokens.size // self.seq_len)
            windows = tokens[: n * self.seq_len].reshape(n, self.seq_len)
        if windows.shape[0] == 0 or windows.shape[1] < 2:
            raise InputError(
                "too few tokens for one sequence",
                file=str(self.path),
                value=int(tokens.size),
                expected=f"at least {self.seq_len} tokens (--seq-len)",
            )
        uniq, relabelled = np.unique(np.asarray(windows, dtype=np.int64), return_inverse=True)
        self._windows = relabelled.reshape(windows.shape)
        self.vocab_size = int(uniq.size)

    def _read(self) -> np.ndarray:
        if not self.path.is_file():  # a FIFO or a device is refused, never opened
            problem = "not a regular file" if self.path.exists() else "file not found"
            raise InputError(problem, file=str(self.path))
        suffix = self.path.suffix.lower()
        try:
            if suffix == ".npy":
                arr = np.load(self.path, mmap_mode="r", allow_pickle=False)
            elif suffix == ".bin":
                arr = np.memmap(self.path, dtype=np.dtype(self.token_dtype), mode="r")
            else:
                raise InputError(
                    "unknown token file format",
                    file=str(self.path),
                    value=suffix,
                    expected=".npy (token ids) or .bin (flat tokens, see --token-dtype)",
                )
        except (ValueError, TypeError, OSError) as exc:
            raise InputError(f"cannot read tokens ({exc})", file=str(self.path)) from None
        if arr.ndim not in (1, 2) or not np.issubdtype(arr.dtype, np.integer):
            raise InputError(
                "not a token array",
                file=str(self.path),
                value=f"{arr.dtype} array of shape {list(arr.shape)}",
                expected="integer token ids, 1-D stream or 2-D [samples, seq]",
            )
        return arr

    def batches(self, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        rows = self._windows[rank::world_size]
        for start in range(0, rows.shape[0] - self.micro_batch + 1, self.micro_batch):
            ids = torch.from_numpy(np.ascontiguousarray(rows[start : start + self.micro_batch]))
            yield pad_samples(list(ids))


@dataclass(frozen=True)
class LoaderFactory:
    """The user's own data loader: ``fn(rank, world_size)`` returns an iterable of batches
    (a ``DataLoader`` with its sampler built for that rank). Must be a module-level function
    so the data-parallel check can rebuild it in each process."""

    fn: Callable[[int, int], Iterable[Any]]

    def batches(self, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        for item in self.fn(rank, world_size):
            yield normalize_batch(item)

    def dataset_size(self) -> int | None:
        """Samples in the dataset behind the loader (``len(loader.dataset)``), None when the
        loader has no sized dataset (an iterable dataset, a generator)."""
        try:
            return len(self.fn(0, 1).dataset)  # type: ignore[attr-defined]
        except (AttributeError, TypeError, NotImplementedError):
            return None


def load_loader_factory(spec: str) -> LoaderFactory:
    """``module:function`` naming a loader factory ``(rank, world_size) -> iterable``."""
    return LoaderFactory(import_callable(spec, "--loader"))
