"""torch Distributed Checkpoint folders (``.metadata`` + ``*.distcp``), read by sapper itself.

torch's ``FileSystemReader.read_metadata`` is a plain ``pickle.load``: a ``.metadata`` from
an untrusted place could run a command. sapper reads it with its own restricted unpickler
(:mod:`sapper.unpickle`): the few classes of
``torch.distributed.checkpoint.metadata`` become :class:`~sapper.unpickle.Record`
data, checked field by field into :class:`DcpTensor` entries before anything is opened.
Each storage piece a tensor names is a ``torch.save`` archive at ``[offset, offset+length)``
of a shard file, as DCP's ``FileSystemWriter`` writes it; it is loaded through
:func:`~sapper.checkpoint.torchfile.load_torch_bytes` (restricted, bounded) and placed at its
chunk's offsets. A piece's path must be a file inside the folder, regular, and hold the
byte range; the chunks of a tensor must tile it. No code of ``torch.distributed`` runs, so
what it raises (its ``CheckpointException`` is not an ``Exception``) never reaches sapper.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from sapper.checkpoint.layout import regular_file
from sapper.checkpoint.source import TensorInfo, TensorSource
from sapper.checkpoint.stats import flat_chunks
from sapper.checkpoint.torchfile import load_torch_bytes
from sapper.errors import InputError, quote
from sapper.unpickle import Record, Vocabulary, restricted_loads

__all__ = ["MAX_DCP_ENTRIES", "MAX_METADATA_BYTES", "DcpChunk", "DcpSource", "DcpTensor"]

#: A ``.metadata`` larger than this is refused (a 100k-tensor model's is a few tens of MB).
MAX_METADATA_BYTES = 256 << 20
#: Tensors, chunks and storage entries, each at most this many.
MAX_DCP_ENTRIES = 2_000_000
_MAX_DIM = 1 << 48
_M = "torch.distributed.checkpoint.metadata."
_STORAGE_INFO = "torch.distributed.checkpoint.filesystem._StorageInfo"


def _size(*args: Any) -> tuple[int, ...]:
    """``torch.Size(dims)`` as a tuple of non-negative ints (the only form sapper needs)."""
    if len(args) != 1 or not isinstance(args[0], (tuple, list)):
        raise ValueError("torch.Size takes one sequence")
    dims = args[0]
    if not all(type(d) is int and 0 <= d < _MAX_DIM for d in dims):
        raise ValueError(f"torch.Size of {quote(dims)}: dimensions must be ints in [0, 2**48)")
    return tuple(dims)


def _torch_name(kind: type) -> Any:
    def get(name: str) -> str:
        value = getattr(torch, name.removeprefix("torch."), None) if isinstance(name, str) else None
        if not isinstance(value, kind):
            raise ValueError(f"not a torch {kind.__name__}: {quote(name)}")
        return name.removeprefix("torch.")

    return get


def _enum_value(*args: Any) -> Any:
    """``_MEM_FORMAT_ENCODING(n)``: the number, which sapper does not need."""
    if len(args) != 1 or type(args[0]) is not int:
        raise ValueError("an enum member takes one int")
    return args[0]


def _path(*parts: Any) -> str:
    """A pickled ``pathlib`` path (the save's ``checkpoint_id``) as text."""
    if not all(isinstance(p, str) for p in parts):
        raise ValueError("path parts must be text")
    return "/".join(parts)


def _vocabulary() -> Vocabulary:
    functions: dict[str, Any] = {
        "torch.Size": _size,
        "torch.serialization._get_layout": _torch_name(torch.layout),
        f"{_M}_MEM_FORMAT_ENCODING": _enum_value,
        "collections.OrderedDict": dict,
        "pathlib.PosixPath": _path,
        "pathlib.PurePosixPath": _path,
        "pathlib.WindowsPath": _path,
        "pathlib.PureWindowsPath": _path,
    }
    # Older saves name dtypes, layouts and memory formats as torch globals directly.
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            functions[f"torch.{name}"] = value
        elif isinstance(value, (torch.layout, torch.memory_format)):
            functions[f"torch.{name}"] = name
    records = (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta",
    )  # fmt: skip
    return Vocabulary(
        records=(*(_M + r for r in records), _STORAGE_INFO),
        functions=functions,
    )


_VOCABULARY = _vocabulary()


@dataclass(frozen=True)
class DcpChunk:
    """One stored piece of a tensor: where it sits in the tensor and in which file."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    relative_path: str
    offset: int
    length: int


@dataclass(frozen=True)
class DcpTensor:
    key: str
    dtype: torch.dtype
    size: tuple[int, ...]
    chunks: tuple[DcpChunk, ...]


class _Fields:
    """A Record's dict state read with the field path named in every error."""

    def __init__(self, file: str, record: Any, where: str, qualname: str) -> None:
        if not isinstance(record, Record) or not record.qualname.endswith(f".{qualname}"):
            raise _bad(file, where, record, f"a {qualname}")
        self.file, self.where, self.state = file, where, record.state
        if not isinstance(self.state, dict):
            self.state = {}

    def get(self, name: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
        value = self.state.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise _bad(self.file, f"{self.where}.{name}", value, _kind_name(kind))
        return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _bad(file: str, where: str, value: Any, expected: str) -> InputError:
    return InputError(
        "Distributed Checkpoint metadata is not what torch writes",
        file=file,
        field=where,
        value=type(value).__name__ if isinstance(value, (Record, dict, list)) else value,
        expected=expected,
    )


def _dims(file: str, where: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(d) is int and 0 <= d < _MAX_DIM for d in value):
        raise _bad(file, where, value, "a torch.Size of ints in [0, 2**48)")
    return value


def _dtype(file: str, where: str, properties: Any) -> torch.dtype:
    """TensorProperties' dtype: its state is the tuple its ``__getstate__`` gives
    (dtype, layout, requires_grad, memory_format, pin_memory) or, from older saves, a dict."""
    if not isinstance(properties, Record) or not properties.qualname.endswith(".TensorProperties"):
        raise _bad(file, where, properties, "a TensorProperties")
    state = properties.state
    dtype = (
        state[0]
        if isinstance(state, tuple) and state
        else (state.get("dtype") if isinstance(state, dict) else None)
    )
    if not isinstance(dtype, torch.dtype):
        raise _bad(file, f"{where}.dtype", dtype, "a torch dtype")
    return dtype


def read_metadata(folder: Path) -> list[DcpTensor]:
    """The tensors a DCP folder's ``.metadata`` declares, checked, in its order."""
    path = regular_file(folder / ".metadata")
    file = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_METADATA_BYTES:
            raise InputError(
                "Distributed Checkpoint metadata too large",
                file=file,
                value=size,
                expected=f"at most {MAX_METADATA_BYTES} bytes",
            )
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=file) from None
    meta = _Fields(file, restricted_loads(data, _VOCABULARY, file), "metadata", "Metadata")
    entries = meta.get("state_dict_metadata", dict)
    storage = meta.get("storage_data", dict, optional=True) or {}
    for name, table in (("state_dict_metadata", entries), ("storage_data", storage)):
        if len(table) > MAX_DCP_ENTRIES:
            raise InputError(
                "Distributed Checkpoint metadata has too many entries",
                file=file,
                field=name,
                value=len(table),
                expected=f"at most {MAX_DCP_ENTRIES}",
            )
    places = _storage_places(file, storage)
    return [
        _tensor(file, str(key), value, places)
        for key, value in entries.items()
        if isinstance(value, Record) and value.qualname == _M + "TensorStorageMetadata"
    ]


_Place = tuple[str, int, int]


def _storage_places(file: str, storage: dict) -> dict[tuple[str, tuple[int, ...]], _Place]:
    """``storage_data`` by (fqn, chunk offsets): the file and byte range of each piece."""
    places = {}
    for index, info in storage.items():
        where = "storage_data"
        key = _Fields(file, index, where, "MetadataIndex")
        fqn = key.get("fqn", str)
        offsets = key.state.get("offset")
        offsets = () if offsets is None else _dims(file, f"{where}[{fqn}].offset", offsets)
        item = _Fields(file, info, f"{where}[{fqn}]", "_StorageInfo")
        if item.state.get("transform_descriptors"):
            raise _bad(
                file,
                f"{where}[{fqn}].transform_descriptors",
                item.state["transform_descriptors"],
                "none (sapper reads untransformed pieces only)",
            )
        places[(fqn, offsets)] = (
            _relative_path(file, f"{where}[{fqn}].relative_path", item.get("relative_path", str)),
            _count(file, f"{where}[{fqn}].offset", item.get("offset", int)),
            _count(file, f"{where}[{fqn}].length", item.get("length", int)),
        )
    return places


def _count(file: str, where: str, value: int) -> int:
    if not 0 <= value < 1 << 62:
        raise _bad(file, where, value, "an int in [0, 2**62)")
    return value


def _relative_path(file: str, where: str, name: str) -> str:
    """A piece's file: relative, inside the folder (no ``..``, no absolute path)."""
    parts = PurePosixPath(name).parts
    if (
        not parts
        or name.startswith(("/", "\\"))
        or "\x00" in name
        or any(p in ("..", ".") or "\\" in p or ":" in p for p in parts)
    ):
        raise _bad(file, where, name, "a file name inside the checkpoint folder")
    return name


def _tensor(file: str, key: str, value: Record, places: dict) -> DcpTensor:
    where = f"state_dict_metadata[{key}]"
    fields = _Fields(file, value, where, "TensorStorageMetadata")
    dtype = _dtype(file, f"{where}.properties", fields.state.get("properties"))
    size = _dims(file, f"{where}.size", fields.state.get("size"))
    raw_chunks = fields.get("chunks", list)
    if len(raw_chunks) > MAX_DCP_ENTRIES:
        raise _bad(file, f"{where}.chunks", len(raw_chunks), f"at most {MAX_DCP_ENTRIES} chunks")
    chunks, covered = [], 0
    for i, raw in enumerate(raw_chunks):
        chunk = _Fields(file, raw, f"{where}.chunks[{i}]", "ChunkStorageMetadata")
        offsets = _dims(file, f"{where}.chunks[{i}].offsets", chunk.state.get("offsets"))
        sizes = _dims(file, f"{where}.chunks[{i}].sizes", chunk.state.get("sizes"))
        if (
            len(offsets) != len(size)
            or len(sizes) != len(size)
            or any(o + s > d for o, s, d in zip(offsets, sizes, size, strict=True))
        ):
            raise _bad(file, f"{where}.chunks[{i}]", f"{offsets}+{sizes}", f"inside {size}")
        place = places.get((key, offsets))
        if place is None:
            raise _bad(file, f"storage_data[{key}, {offsets}]", "missing", "a stored piece")
        nbytes = math.prod(sizes) * dtype.itemsize
        if nbytes > place[2]:
            raise _bad(file, f"storage_data[{key}].length", place[2], f"at least {nbytes} bytes")
        covered += math.prod(sizes)
        chunks.append(DcpChunk(offsets, sizes, *place))
    if covered != math.prod(size):
        raise _bad(
            file, f"{where}.chunks", f"{covered} elements", f"{math.prod(size)} (the tensor's)"
        )
    return DcpTensor(key, dtype, size, tuple(chunks))


class DcpSource(TensorSource):
    """The tensors of a torch Distributed Checkpoint folder, each assembled from its pieces
    when it is read (no process group, no ``torch.distributed`` code)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._tensors = {t.key: t for t in read_metadata(folder)}
        self._files: dict[str, Path] = {}

    def keys(self) -> list[str]:
        return list(self._tensors)

    def info(self, key: str) -> TensorInfo:
        t = self._tensors[key]
        return TensorInfo(str(t.dtype).removeprefix("torch."), t.size, str(self._folder))

    def chunks(self, key: str) -> Iterator[torch.Tensor]:
        t = self._tensors[key]
        pieces = [(c, self._piece(key, t, c)) for c in t.chunks]
        if len(pieces) == 1:
            return flat_chunks(pieces[0][1])
        whole = torch.empty(t.size, dtype=t.dtype)
        for c, piece in pieces:
            view = whole
            for dim, (o, s) in enumerate(zip(c.offsets, c.sizes, strict=True)):
                view = view.narrow(dim, o, s)
            view.copy_(piece)
        return flat_chunks(whole)

    def _file(self, name: str) -> Path:
        """A piece's file, checked once: regular, and inside the folder once resolved."""
        if name not in self._files:
            path = regular_file(self._folder / name)
            try:
                inside = os.path.commonpath(
                    [os.path.realpath(self._folder), os.path.realpath(path)]
                ) == os.path.realpath(self._folder)
            except ValueError:
                inside = False
            if not inside:
                raise InputError(
                    "a Distributed Checkpoint piece lies outside its folder",
                    file=str(path),
                    expected=f"a file inside {self._folder}",
                )
            self._files[name] = path
        return self._files[name]

    def _piece(self, key: str, t: DcpTensor, c: DcpChunk) -> torch.Tensor:
        path = self._file(c.relative_path)
        try:
            with open(path, "rb") as fh:
                info = os.fstat(fh.fileno())
                if not stat.S_ISREG(info.st_mode) or c.offset + c.length > info.st_size:
                    raise InputError(
                        "a Distributed Checkpoint piece runs past the end of its file "
                        "(truncated, or the metadata lies)",
                        file=str(path),
                        field=key,
                        value=f"bytes {c.offset}..{c.offset + c.length}",
                        expected=f"within the file's {info.st_size} bytes",
                    )
                fh.seek(c.offset)
                data = fh.read(c.length)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
        piece = load_torch_bytes(data, f"{path}[{c.offset}:{c.offset + c.length}]")
        if (
            not isinstance(piece, torch.Tensor)
            or tuple(piece.shape) != c.sizes
            or piece.dtype != t.dtype
        ):
            raise InputError(
                "a Distributed Checkpoint piece is not the tensor its metadata declares",
                file=str(path),
                field=key,
                value=f"{getattr(piece, 'dtype', type(piece).__name__)} "
                f"{tuple(getattr(piece, 'shape', ()))}",
                expected=f"{t.dtype} {c.sizes}",
            )
        return piece
