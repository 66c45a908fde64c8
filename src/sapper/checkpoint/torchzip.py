"""torch's zip checkpoints (what ``torch.save`` has written since 1.6) read by sapper itself.

The archive's ``data.pkl`` goes through sapper's restricted unpickler
(:mod:`sapper.unpickle`) with the vocabulary a checkpoint needs, by fully
qualified name: torch's tensor rebuilders (sapper's own functions that check every
offset, size and stride against the storage before a tensor is made), storage types,
dtypes, ``torch.Size``, ``OrderedDict``, numpy's array reconstruction for RNG states,
``argparse.Namespace`` (Megatron's ``args``) and stand-ins for the framework objects
DeepSpeed pickles. Nothing else is built, whatever torch version is installed: a pickle
naming ``os.system`` is refused before anything runs. Storages are the archive's stored
records, memory-mapped from the file (``UntypedStorage.from_file``, as
``torch.load(mmap=True)`` does), so tensors are paged in as they are reduced.
Sparse, meta and quantized tensors have no flat values to stream; they are read as
:class:`OtherTensor` records and skipped by the tensor walk.
"""

from __future__ import annotations

import argparse
import importlib
import math
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sapper.errors import InputError
from sapper.unpickle import Record, Vocabulary, record_type, restricted_loads

__all__ = ["OTHER_TENSOR", "STAND_INS", "load_torch_zip"]

#: The framework objects DeepSpeed's ZeRO files pickle (its engine's
#: ``_save_zero_checkpoint``: the loss scaler, and the per-parameter ``fragment_address``
#: of ``param_slice_mappings``), read back as data-only records.
STAND_INS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
#: The qualname of the record a sparse, meta or quantized tensor is read as.
OTHER_TENSOR = "torch.Tensor (sparse, meta or quantized: not read)"
_OtherTensor = record_type(OTHER_TENSOR)
_MAX_DIMS = 64


@dataclass(frozen=True)
class _StorageType:
    """A pickled storage class (``torch.FloatStorage``): the dtype of its elements."""

    dtype: torch.dtype


class _StateDict(dict):
    """``OrderedDict`` and Lightning's ``AttributeDict``: the items only. The state a
    pickle gives the instance (``_metadata`` of a state dict) is dropped."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        pass


class _Archive:
    """The storages of one archive: each record's bytes, mapped from the file at ``path``
    or copied out of ``data`` in memory."""

    def __init__(self, archive: zipfile.ZipFile, prefix: str, file: str,
                 path: Path | None, data: bytes | None) -> None:  # fmt: skip
        self.archive, self.prefix, self.file = archive, prefix, file
        self.path, self.data = path, data
        # The archive's own open file (or stream) holds the local headers; its size once.
        self._fh = archive.fp
        self._size = len(data) if data is not None else self._fh.seek(0, 2)  # type: ignore[union-attr]
        self._whole: torch.UntypedStorage | None = None
        self._storages: dict[str, torch.UntypedStorage] = {}

    def storage(self, pid: Any) -> tuple[torch.UntypedStorage, torch.dtype]:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ValueError(f"persistent id is not a storage: {type(pid).__name__}")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str):
            raise ValueError("a storage's type or key is not one torch writes")
        if type(numel) is not int or numel < 0:
            raise ValueError("a storage's size is not a non-negative int")
        if key not in self._storages:
            self._storages[key] = self._read(key, numel * kind.dtype.itemsize)
        storage = self._storages[key]
        if storage.nbytes() != numel * kind.dtype.itemsize:
            raise ValueError(f"storage {key} is used with two sizes")
        return storage, kind.dtype

    def _read(self, key: str, nbytes: int) -> torch.UntypedStorage:
        name = f"{self.prefix}data/{key}"
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            raise ValueError(f"the archive has no record {name}") from None
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != nbytes:
            raise ValueError(
                f"record {name} holds {info.file_size} bytes "
                f"({'stored' if info.compress_type == zipfile.ZIP_STORED else 'compressed'}), "
                f"its tensors need {nbytes} stored"
            )
        start = self._data_offset(info)
        if self.data is not None:
            piece = bytearray(self.data[start : start + nbytes])
            if not piece:
                return torch.UntypedStorage(0)
            return torch.frombuffer(piece, dtype=torch.uint8).untyped_storage()
        if self._whole is None:
            self._whole = torch.UntypedStorage.from_file(str(self.path), False, self._size)
        return self._whole[start : start + nbytes]

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        """Where a stored record's bytes begin: after its local header (whose name and
        extra field lengths may differ from the central directory's)."""
        self._fh.seek(info.header_offset)  # type: ignore[union-attr]
        head = self._fh.read(30)  # type: ignore[union-attr]
        if len(head) < 30 or head[:4] != b"PK\x03\x04":
            raise ValueError(f"record {info.filename} has no local header")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        if start + info.file_size > self._size:
            raise ValueError(f"record {info.filename} runs past the end of the archive")
        return start


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or len(value) > _MAX_DIMS:
        raise ValueError(f"a tensor's {what} is not a tuple of at most {_MAX_DIMS} ints")
    if not all(type(v) is int and 0 <= v < 1 << 62 for v in value):
        raise ValueError(f"a tensor's {what} holds a value outside [0, 2**62)")
    return value


def _tensor(archive: _Archive, pid_storage: Any, offset: Any, size: Any, stride: Any,
            dtype: torch.dtype | None = None) -> torch.Tensor:  # fmt: skip
    storage, stored_dtype = pid_storage
    dtype = dtype or stored_dtype
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if len(size) != len(stride) or type(offset) is not int or offset < 0:
        raise ValueError("a tensor's size, stride and offset do not agree")
    elements = storage.nbytes() // dtype.itemsize
    if (
        math.prod(size)
        and offset + sum((s - 1) * st for s, st in zip(size, stride, strict=True)) >= elements
    ):
        raise ValueError("a tensor reaches past the end of its storage")
    return torch.empty((0,), dtype=dtype).set_(storage, offset, size, stride)


def _vocabulary(archive: _Archive) -> Vocabulary:
    def v2(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> torch.Tensor:
        return _tensor(archive, storage, offset, size, stride)

    def v3(storage: Any, offset: Any, size: Any, stride: Any, _grad: Any, _hooks: Any,
           dtype: Any, *_rest: Any) -> torch.Tensor:  # fmt: skip
        if not isinstance(dtype, torch.dtype):
            raise ValueError("a tensor's dtype is not a torch dtype")
        return _tensor(archive, storage, offset, size, stride, dtype)

    def parameter(data: Any, *_rest: Any) -> Any:
        return data

    def from_type(func: Any, _new_type: Any, args: Any, _state: Any) -> Any:
        # Only the rebuilders of this table may be called (the pickle names ``func``).
        if func not in (v2, v3, parameter) or not isinstance(args, tuple):
            raise ValueError("a tensor subclass rebuilt by something other than a rebuilder")
        return func(*args)

    def other_tensor(*_args: Any) -> Record:
        return _OtherTensor()

    def encode(text: Any, encoding: Any = "latin1") -> bytes:
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
            raise ValueError("_codecs.encode other than latin1 text")
        return text.encode("latin1")

    def device(*args: Any) -> str:
        if not all(isinstance(a, (str, int)) and not isinstance(a, bool) for a in args):
            raise ValueError("a torch.device of other than text and an index")
        return ":".join(map(str, args))

    functions: dict[str, Callable[..., Any] | Any] = {
        "torch._utils._rebuild_tensor_v2": v2,
        "torch._utils._rebuild_tensor_v3": v3,
        "torch._utils._rebuild_parameter": parameter,
        "torch._utils._rebuild_parameter_with_state": parameter,
        "torch._tensor._rebuild_from_type_v2": from_type,
        "torch.Tensor": "torch.Tensor",
        "torch.nn.parameter.Parameter": "torch.nn.parameter.Parameter",
        "torch.Size": lambda dims=(): tuple(_ints(tuple(dims), "torch.Size")),
        "torch.device": device,
        "torch.serialization._get_layout": lambda name: str(name).removeprefix("torch."),
        "torch.storage.UntypedStorage": _StorageType(torch.uint8),
        "collections.OrderedDict": _StateDict,
        "lightning.fabric.utilities.data.AttributeDict": _StateDict,
        "pytorch_lightning.utilities.parsing.AttributeDict": _StateDict,
        "argparse.Namespace": argparse.Namespace,
        "_codecs.encode": encode,
        "builtins.set": set,
        "builtins.frozenset": frozenset,
        "__builtin__.set": set,
        "__builtin__.frozenset": frozenset,
    }
    for name in (
        "_rebuild_sparse_tensor", "_rebuild_meta_tensor_no_storage", "_rebuild_qtensor",
        "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
        "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor",
    ):  # fmt: skip
        functions[f"torch._utils.{name}"] = other_tensor
    for storage_name, dtype in _storage_types().items():
        functions[f"torch.{storage_name}"] = _StorageType(dtype)
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            functions[f"torch.{name}"] = value
        elif isinstance(value, (torch.layout, torch.memory_format, torch.qscheme)):
            functions[f"torch.{name}"] = name
    functions.update(_numpy_globals())
    functions.update({name: record_type(name) for name in STAND_INS})
    functions["deepspeed.runtime.zero.config.ZeroStageEnum"] = _enum_value
    return Vocabulary(functions=functions)


def _enum_value(value: Any) -> Any:
    """An ``int``-valued Enum member (DeepSpeed's ``ZeroStageEnum``) as its value."""
    return value


#: numpy's array reconstruction, as ``rng_state.pth`` pickles numpy's RNG state (1.x and
#: 2.x module paths): it builds arrays of plain numbers from bytes.
_NUMPY = (
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct",
    "numpy.ndarray", "numpy.dtype", "numpy.dtypes.UInt32DType", "numpy.dtypes.Float64DType",
    "numpy.dtypes.Int64DType",
)  # fmt: skip


def _numpy_globals() -> dict[str, Any]:
    """The numpy globals of :data:`_NUMPY` that this numpy has (classes are passed as
    arguments to ``_reconstruct``, so they must be the real ones)."""
    found = {}
    for name in _NUMPY:
        module, _, attr = name.rpartition(".")
        try:
            found[name] = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    return found


def _storage_types() -> dict[str, torch.dtype]:
    """``FloatStorage`` → float32 and the rest, from torch's own table."""
    try:
        table = torch.storage._dtype_to_storage_type_map()
    except AttributeError:  # pragma: no cover - every torch sapper supports has it
        table = {}
    return {name: dtype for dtype, name in table.items()}


def load_torch_zip(archive: zipfile.ZipFile, file: str, path: Path | None = None,
                   data: bytes | None = None) -> Any:  # fmt: skip
    """The object of a torch zip archive (a file at ``path``, or ``data`` in memory)."""
    pickles = [n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") <= 1]
    if len(pickles) != 1:
        raise InputError(
            "not a loadable torch file: no single data.pkl record",
            file=file,
            value=len(pickles),
            expected="one <name>/data.pkl",
        )
    prefix = pickles[0][: -len("data.pkl")]
    byteorder = f"{prefix}byteorder"
    if byteorder in archive.namelist() and archive.read(byteorder).strip() not in (b"", b"little"):
        raise InputError(
            "torch file written on a big-endian machine",
            file=file,
            field="byteorder",
            value=archive.read(byteorder)[:16].decode("ascii", "replace"),
            expected="little",
        )
    store = _Archive(archive, prefix, file, path, data)
    return restricted_loads(
        archive.read(pickles[0]), _vocabulary(store), file, persistent_load=store.storage
    )
