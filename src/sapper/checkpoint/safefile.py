"""safetensors files read tensor by tensor through ``safe_open`` (memory-mapped).

The header is validated here first, against the file's real size (the length prefix,
the JSON, every dtype, shape and offset range), so a truncated file or a header that
lies becomes one :class:`~sapper.errors.InputError` line rather than a library error or
a read past the end. ``get_tensor`` gives views of the mapping; they are reduced in pieces
of :data:`~sapper.checkpoint.stats.CHUNK_ELEMENTS` elements, each paged in at once and
given back after (:func:`sapper.checkpoint.pages.streamed`). Where the kernel cannot drop
pages (off Linux), re-opening the file after every :data:`REMAP_BYTES` read closes the
old mapping, so the resident pages stay near that plus the largest tensor.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.checkpoint.tensorstats import CHUNK_ELEMENTS
from sapper.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["MAX_HEADER_BYTES", "REMAP_BYTES", "SafetensorsFile", "TensorEntry", "read_header"]

#: A header larger than this is refused; the largest real ones (100k tensors) are ~10 MB.
MAX_HEADER_BYTES = 32 << 20
#: Bytes read through one mapping before it is closed and re-opened.
REMAP_BYTES = 128 << 20

ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _bad(path: Path, problem: str, **kw: Any) -> InputError:
    return InputError(problem, file=str(path), **kw)


def read_header(path: Path) -> tuple[list[TensorEntry], dict[str, str]]:
    """The tensors a safetensors file declares, each checked against the file's size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise _bad(
                    path,
                    "truncated safetensors file: no 8-byte header length",
                    value=len(prefix),
                    expected="at least 8 bytes",
                )
            length = int.from_bytes(prefix, "little")
            if length > MAX_HEADER_BYTES:
                raise _bad(
                    path,
                    "safetensors header too large",
                    field="header length",
                    value=length,
                    expected=f"at most {MAX_HEADER_BYTES} bytes",
                )
            if 8 + length > size:
                raise _bad(
                    path,
                    "safetensors header runs past the end of the file",
                    field="header length",
                    value=length,
                    expected=f"at most {max(size - 8, 0)} (the file is {size} bytes)",
                )
            raw = fh.read(length)
    except OSError as exc:
        raise _bad(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _bad(path, "safetensors header is not JSON", field="header") from None
    if not isinstance(header, dict):
        raise _bad(
            path,
            "safetensors header is not a JSON object",
            field="header",
            value=type(header).__name__,
        )
    data_size = size - 8 - length
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        metadata = {}
    entries = [_entry(path, name, info, data_size) for name, info in header.items()]
    entries.sort(key=lambda e: e.start)
    return entries, {str(k): str(v) for k, v in metadata.items()}


def _entry(path: Path, name: str, info: Any, data_size: int) -> TensorEntry:
    if not isinstance(info, dict):
        raise _bad(path, "tensor entry is not an object", field=name, value=info)
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise _bad(
            path, "unknown dtype", field=f"{name}.dtype", value=dtype, expected=", ".join(ITEMSIZE)
        )
    if not (
        isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 48 for d in shape)
    ):
        raise _bad(
            path,
            "bad shape",
            field=f"{name}.shape",
            value=shape,
            expected="a list of non-negative integers",
        )
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise _bad(
            path,
            "bad data_offsets",
            field=f"{name}.data_offsets",
            value=offsets,
            expected="[start, end]",
        )
    start, end = offsets
    if not 0 <= start <= end <= data_size:
        raise _bad(
            path,
            "tensor data lies outside the file (truncated, or the header lies)",
            field=f"{name}.data_offsets",
            value=offsets,
            expected=f"within the {data_size} data bytes",
        )
    want = math.prod(shape) * ITEMSIZE[dtype]
    if end - start != want:
        raise _bad(
            path,
            "tensor byte size does not match its shape and dtype",
            field=f"{name}.data_offsets",
            value=end - start,
            expected=f"{want} bytes for {dtype} {shape}",
        )
    return TensorEntry(name, dtype, tuple(shape), start, end)


class SafetensorsFile:
    """One safetensors file: its validated entries and a reader of their chunks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries, self.metadata = read_header(path)
        self._handle: Any = None
        self._read_since_open = 0
        self._mapping: Any = None
        self._read_since_map = 0

    def _open(self) -> Any:
        from safetensors import SafetensorError, safe_open

        if self._handle is None or self._read_since_open > REMAP_BYTES:
            self._handle = None
            try:
                self._handle = safe_open(str(self.path), framework="pt")
            except (SafetensorError, OSError, ValueError) as exc:
                raise _bad(self.path, f"safetensors cannot open it: {exc}") from None
            self._read_since_open = 0
        return self._handle

    def close(self) -> None:
        self._handle = None
        self._mapping = None

    def _map(self) -> Any:
        """The file's tensor bytes mapped read-only (numpy), once safetensors itself has
        accepted the file (its checks of the header, with no torch), re-mapped after
        every :data:`REMAP_BYTES` read."""
        import numpy as np
        from safetensors import SafetensorError, safe_open

        if self._mapping is None or self._read_since_map > REMAP_BYTES:
            self._mapping = None
            try:
                with safe_open(str(self.path), framework="numpy"):
                    pass
                with open(self.path, "rb") as fh:
                    start = 8 + int.from_bytes(fh.read(8), "little")
                size = self.path.stat().st_size
                self._mapping = (
                    np.memmap(self.path, dtype=np.uint8, mode="r", offset=start)
                    if size > start
                    else np.zeros(0, dtype=np.uint8)
                )
            except (SafetensorError, OSError, ValueError) as exc:
                raise _bad(self.path, f"safetensors cannot open it: {exc}") from None
            self._read_since_map = 0
        return self._mapping

    def arrays(self, entry: TensorEntry) -> Iterator[np.ndarray]:
        """The tensor's stored bits (numpy; bfloat16 and float8 as unsigned integers, see
        :mod:`sapper.checkpoint.arrays`) in row-major pieces of at most CHUNK_ELEMENTS
        elements, each paged in at once and its pages given back after it is reduced, as
        :meth:`chunks` does for torch."""
        import numpy as np

        from sapper.checkpoint.arrays import STORED, flat_pieces
        from sapper.checkpoint.pages import drop_range, populate_range

        if math.prod(entry.shape) == 0:
            return
        mapping = self._map()
        self._read_since_map += entry.nbytes
        dtype = np.dtype(STORED[entry.dtype]).newbyteorder("<")
        raw = mapping[entry.start : entry.end].view(dtype)
        for piece in flat_pieces(raw, CHUNK_ELEMENTS):
            address = piece.ctypes.data
            populate_range(address, piece.nbytes)
            yield piece
            drop_range(address, piece.nbytes)

    def chunks(self, entry: TensorEntry) -> Iterator[torch.Tensor]:
        """The tensor's values in row-major pieces of at most CHUNK_ELEMENTS elements.
        ``get_tensor`` gives a view of the mapping (no copy); each piece is paged in at
        once and its pages given back after it is reduced (:mod:`sapper.checkpoint.pages`),
        so what stays resident is about one piece, whatever the tensor's size."""
        from sapper.checkpoint.pages import streamed

        if math.prod(entry.shape) == 0:
            return
        try:
            handle = self._open()
            self._read_since_open += entry.nbytes
            tensor = handle.get_tensor(entry.name)
        except InputError:
            raise
        except Exception as exc:  # the Rust reader's errors are not one class
            raise _bad(self.path, f"cannot read tensor: {exc}", field=entry.name) from None
        yield from streamed(tensor, CHUNK_ELEMENTS, mapped=True)
