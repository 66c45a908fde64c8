"""torch Distributed Checkpoint folders written piece by piece, the way DCP's
``FileSystemWriter`` lays them out (a ``torch.save`` archive per piece, at an offset of a
``__R_0.distcp`` file; ``.metadata`` a pickle of torch's own metadata classes), so a test
can split a tensor over several files and ranks, or plant any value in the metadata."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

__all__ = ["write_dcp"]


def write_dcp(
    folder: Path,
    tensors: dict[str, torch.Tensor],
    pieces: int = 2,
    edit: Callable[[Metadata], Any] | None = None,
) -> Metadata:
    """Each tensor split into ``pieces`` along dim 0, piece ``r`` in ``__r_0.distcp``;
    ``edit`` may change the metadata before it is pickled."""
    folder.mkdir(parents=True)
    files: dict[str, io.BytesIO] = {}
    entries: dict[str, Any] = {"step": BytesStorageMetadata()}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    for key, tensor in tensors.items():
        chunks = []
        parts = torch.tensor_split(tensor, pieces, dim=0)
        for rank, part in enumerate(parts):
            start_row = sum(p.shape[0] for p in parts[:rank])
            offsets = torch.Size([start_row] + [0] * (tensor.dim() - 1))
            name = f"__{rank}_0.distcp"
            stream = files.setdefault(name, io.BytesIO())
            start = stream.tell()
            torch.save(part.clone(), stream)
            chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=part.shape))
            storage[MetadataIndex(key, offsets)] = _StorageInfo(name, start, stream.tell() - start)
        entries[key] = TensorStorageMetadata(
            properties=TensorProperties(dtype=tensor.dtype), size=tensor.shape, chunks=chunks
        )
    for name, stream in files.items():
        (folder / name).write_bytes(stream.getvalue())
    meta = Metadata(state_dict_metadata=entries, storage_data=storage)
    if edit is not None:
        edit(meta)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    return meta
