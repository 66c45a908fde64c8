"""Named tensors of a checkpoint's weights, readable one at a time in bounded chunks.

One interface over the formats, so the per-tensor checks and the diff of two checkpoints
never care where a tensor lives: safetensors files (single or sharded, read through
``safe_open``), a torch state dict (memory-mapped by ``torch.load(mmap=True)``) and a
torch Distributed Checkpoint (:mod:`sapper.checkpoint.dcp`, one tensor at a time).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sapper.checkpoint.safefile import SafetensorsFile, TensorEntry
from sapper.checkpoint.tensorstats import CHUNK_ELEMENTS, TensorStats
from sapper.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["SafetensorsSource", "TensorInfo", "TensorSource", "TorchSource"]


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    file: str


class TensorSource(abc.ABC):
    """Tensors by key: ``keys``, ``info``, ``chunks`` and their ``stats``."""

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """The tensors' keys, in the order the format stores them."""

    @abc.abstractmethod
    def info(self, key: str) -> TensorInfo:
        """dtype, shape and file of one tensor, without reading its values."""

    @abc.abstractmethod
    def chunks(self, key: str) -> Iterator[torch.Tensor]:
        """The tensor's values, flat, in row-major pieces of bounded size."""

    def stats(self, key: str) -> TensorStats:
        from sapper.checkpoint.stats import stats_of

        info = self.info(key)
        try:
            return stats_of(key, self.chunks(key), info.dtype, info.shape, info.file)
        except (RuntimeError, TypeError, ValueError) as exc:  # a tensor torch cannot reduce
            raise InputError(
                f"cannot reduce tensor ({type(exc).__name__}: {str(exc)[:200]})",
                file=info.file,
                field=key,
            ) from None

    def close(self) -> None:  # noqa: B027 - optional: only the mapped sources hold anything
        """Release mappings (a no-op where nothing is held)."""


_ST_DTYPE = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip


class SafetensorsSource(TensorSource):
    """Every tensor of one or more safetensors files (the shards of one model)."""

    def __init__(self, paths: list[Path]) -> None:
        self._files: list[SafetensorsFile] = []
        self._where: dict[str, tuple[SafetensorsFile, TensorEntry]] = {}
        for path in paths:
            handle = SafetensorsFile(path)
            self._files.append(handle)
            for entry in handle.entries:
                self._where.setdefault(entry.name, (handle, entry))

    def keys(self) -> list[str]:
        return list(self._where)

    def info(self, key: str) -> TensorInfo:
        handle, entry = self._where[key]
        return TensorInfo(_ST_DTYPE.get(entry.dtype, entry.dtype), entry.shape, str(handle.path))

    def chunks(self, key: str) -> Iterator[torch.Tensor]:
        handle, entry = self._where[key]
        return handle.chunks(entry)

    def stats(self, key: str) -> TensorStats:
        """Reduced by numpy from the stored bits (:mod:`sapper.checkpoint.arrays`): the
        statistics torch would give, without importing torch."""
        from sapper.checkpoint.arrays import array_stats

        handle, entry = self._where[key]
        info = self.info(key)
        try:
            return array_stats(
                key, handle.arrays(entry), entry.dtype, info.dtype, info.shape, info.file
            )
        except (TypeError, ValueError) as exc:  # bits numpy cannot read as the dtype
            raise InputError(
                f"cannot reduce tensor ({type(exc).__name__}: {str(exc)[:200]})",
                file=info.file,
                field=key,
            ) from None

    def arrays(self, key: str) -> Iterator[np.ndarray]:
        """The tensor's stored bits in flat numpy pieces (see :meth:`SafetensorsFile.arrays`)."""
        handle, entry = self._where[key]
        return handle.arrays(entry)

    def stored_dtype(self, key: str) -> str:
        """The safetensors name of the tensor's dtype (``BF16``, ``F8_E4M3``, ...)."""
        return self._where[key][1].dtype

    def metadata(self) -> dict[str, str]:
        return self._files[0].metadata if self._files else {}

    def close(self) -> None:
        for handle in self._files:
            handle.close()


class TorchSource(TensorSource):
    """Tensors of a loaded torch state dict (memory-mapped storages, paged on read)."""

    def __init__(self, tensors: dict[str, torch.Tensor], file: str, mapped: bool = False) -> None:
        self._tensors = tensors
        self._file = file
        #: Loaded with ``mmap=True``: each tensor's pages are dropped once it is read.
        self._mapped = mapped

    def keys(self) -> list[str]:
        return list(self._tensors)

    def info(self, key: str) -> TensorInfo:
        t = self._tensors[key]
        return TensorInfo(str(t.dtype).removeprefix("torch."), tuple(t.shape), self._file)

    def chunks(self, key: str) -> Iterator[torch.Tensor]:
        from sapper.checkpoint.pages import streamed

        return streamed(self._tensors[key], CHUNK_ELEMENTS, self._mapped)
