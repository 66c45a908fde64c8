"""torch checkpoint files (``.pt/.bin/.pth/.ckpt``) loaded without running their pickle.

Always ``torch.load(weights_only=True)``: torch's restricted unpickler builds tensors,
containers and numbers and refuses every other global, so a pickle whose ``__reduce__``
would run a command is refused (naming the global it wanted) and nothing in it runs. torch
before 2.6 had a way around that unpickler (CVE-2025-32434), so sapper reads torch pickles
only with torch 2.6 or newer. The few non-tensor types real checkpoints pickle are allowed by
fully qualified name, and only those (:data:`SAFE_GLOBALS`); the framework objects
DeepSpeed pickles are rebuilt as stand-ins (:data:`STAND_INS`) whose state is kept apart
from their attributes, so they load where DeepSpeed is absent and no DeepSpeed code runs
where it is installed.

Before torch sees a zip file, its directory is read: an entry that would inflate (torch
writes none) is inflated here first, against a bound, so a few-MB archive cannot expand
to gigabytes. After loading, :func:`sapper.checkpoint.plain.plain` rebuilds what the pickle
made as plain data (a dict for an ``OrderedDict`` whose attributes the file may have set, a
tensor without attributes, a :class:`PickledObject` for a stand-in), expanding shared
references against a bound on total work: what the readers walk afterwards is a tree of
bounded size, and nothing in it behaves as the file says.
"""

from __future__ import annotations

import importlib
import io
import pickle
import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import torch

from sapper.checkpoint.plain import PickledObject, plain
from sapper.checkpoint.unpickle import record_type
from sapper.errors import InputError

__all__ = [
    "SAFE_GLOBALS",
    "STAND_INS",
    "PickledObject",
    "iter_tensors",
    "load_torch_bytes",
    "load_torch_file",
    "mapped",
]

#: Fully qualified names of the non-tensor globals that healthy checkpoints contain:
#: numpy's RNG state (``rng_state.pth`` of the HF Trainer, numpy 1.x and 2.x module paths),
#: the ``argparse.Namespace`` of Megatron-LM's ``args`` (an attribute bag), and Lightning's
#: hyper-parameter dict.
SAFE_GLOBALS: tuple[str, ...] = (
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.dtypes.UInt32DType",
    "numpy.dtypes.Float64DType",
    "numpy.dtypes.Int64DType",
    "argparse.Namespace",
    "lightning.fabric.utilities.data.AttributeDict",
    "pytorch_lightning.utilities.parsing.AttributeDict",
)

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _enum_value(value: Any) -> Any:
    """An ``int``-valued Enum member (DeepSpeed's ``ZeroStageEnum``) as its value."""
    return value


#: The non-tensor types DeepSpeed's ZeRO optimizer files pickle (its engine's
#: ``_save_zero_checkpoint``: the loss scaler object, the stage enum, and the per-parameter
#: ``fragment_address`` of ``param_slice_mappings``), each rebuilt as a stand-in.
STAND_INS: dict[str, Callable[..., Any]] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": record_type(
        "deepspeed.runtime.fp16.loss_scaler.LossScaler"
    ),
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": record_type(
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"
    ),
    "deepspeed.utils.tensor_fragment.fragment_address": record_type(
        "deepspeed.utils.tensor_fragment.fragment_address"
    ),
    "deepspeed.runtime.zero.config.ZeroStageEnum": _enum_value,
}
_STAND_IN_GLOBALS = [(obj, name) for name, obj in STAND_INS.items()]


def _resolve(name: str) -> Callable[..., Any] | None:
    """The object a safe global names, or None where its package is not installed (a
    pickle needing it then fails as refused, which is right: it cannot be built)."""
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


#: Allowed without a retry: numpy (imported by torch already, in every healthy rng_state)
#: and the standard library's argparse.
_EAGER = tuple(n for n in SAFE_GLOBALS if n.startswith(("numpy.", "argparse.")))


def _allowlist(names: tuple[str, ...]) -> list[Any]:
    return [obj for obj in map(_resolve, names) if obj is not None]


def mapped(path: Path) -> bool:
    """Whether :func:`load_torch_file` memory-maps ``path`` (zip-format files only; the
    legacy format is read into memory)."""
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def load_torch_file(path: Path) -> Any:
    """The object in a torch file, built by the restricted unpickler and copied into plain
    data; InputError naming the file when it is not a torch file, is truncated, would
    inflate past the bound, or needs an unsafe global."""
    try:
        is_zip = zipfile.is_zipfile(path)
        if is_zip:
            with zipfile.ZipFile(path) as archive:
                _check_archive(archive, str(path))
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    except (zipfile.BadZipFile, ValueError, EOFError, RuntimeError) as exc:
        raise InputError(
            f"not a loadable torch file (damaged zip: {exc})", file=str(path)
        ) from None
    return _load(path, str(path), mmap=is_zip)


def load_torch_bytes(data: bytes, file: str) -> Any:
    """The object of a ``torch.save`` archive held in memory (a Distributed Checkpoint's
    storage piece), read as :func:`load_torch_file` reads a file."""
    stream = io.BytesIO(data)
    try:
        if zipfile.is_zipfile(stream):
            with zipfile.ZipFile(stream) as archive:
                _check_archive(archive, file)
    except (zipfile.BadZipFile, ValueError, EOFError, RuntimeError, OSError) as exc:
        raise InputError(f"not a loadable torch file (damaged zip: {exc})", file=file) from None
    stream.seek(0)
    return _load(stream, file, mmap=False)


#: An archive entry torch would inflate (it writes none: every record is stored) is
#: inflated here first, and refused past this many bytes.
MAX_INFLATED_BYTES = 64 << 20
#: Entries of one archive, at most (one per storage: a 100k-tensor state dict has 100k).
MAX_ARCHIVE_ENTRIES = 2_000_000


def _check_archive(archive: zipfile.ZipFile, file: str) -> None:
    """Refuse an archive that would inflate past the bound, from its directory first
    (the sizes it declares), then by inflating each compressed entry with a bound."""
    entries = archive.infolist()
    if len(entries) > MAX_ARCHIVE_ENTRIES:
        raise InputError(
            "torch archive has too many entries",
            file=file,
            value=len(entries),
            expected=f"at most {MAX_ARCHIVE_ENTRIES}",
        )
    packed = [e for e in entries if e.compress_type != zipfile.ZIP_STORED]
    for entry in packed:
        if entry.file_size > MAX_INFLATED_BYTES:
            raise _bomb(file, entry.filename, entry.file_size)
    for entry in packed:
        inflated = 0
        with archive.open(entry) as fh:
            while chunk := fh.read(1 << 20):
                inflated += len(chunk)
                if inflated > MAX_INFLATED_BYTES:
                    raise _bomb(file, entry.filename, inflated)


def _bomb(file: str, name: str, size: int) -> InputError:
    return InputError(
        "torch archive entry inflates past the bound (a compression bomb?)",
        file=file,
        field=name,
        value=size,
        expected=f"at most {MAX_INFLATED_BYTES} bytes once inflated (torch stores its "
        "records uncompressed)",
    )


#: The first torch whose weights-only unpickler has no known way around it.
SAFE_TORCH = (2, 6)


def _torch_version() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _load(source: Path | IO[bytes], file: str, mmap: bool) -> Any:
    if _torch_version() < SAFE_TORCH:
        raise InputError(
            "sapper reads torch pickles only with torch 2.6 or newer: the weights-only "
            "unpickler of older releases could be made to run code (CVE-2025-32434)",
            file=file,
            field="torch",
            value=torch.__version__,
            expected="torch>=2.6 installed beside sapper",
        )
    allowed = _EAGER
    while True:
        try:
            with torch.serialization.safe_globals(_allowlist(allowed) + _STAND_IN_GLOBALS):
                loaded = torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
            return plain(loaded, file)
        except pickle.UnpicklingError as exc:
            name = _wanted(str(exc))
            # A known safe type outside numpy (Lightning's AttributeDict) is imported only
            # when a file needs it: importing its package costs seconds.
            if name in SAFE_GLOBALS and name not in allowed and _resolve(name) is not None:
                allowed = (*allowed, name)
                if not isinstance(source, Path):
                    source.seek(0)
                continue
            raise _refusal(file, name, str(exc)) from None
        except _LOAD_ERRORS as exc:
            raise InputError(
                f"not a loadable torch file ({type(exc).__name__}: {_first_line(str(exc))})",
                file=file,
            ) from None


#: What torch.load raises on a damaged file (a truncated zip, a pickle cut short, a
#: storage whose size lies).
_LOAD_ERRORS = (
    RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError, IndexError,
    TypeError, AttributeError, MemoryError, OverflowError, UnicodeDecodeError,
)  # fmt: skip


def _wanted(text: str) -> str | None:
    match = _GLOBAL.search(text)
    return match.group(1) if match else None


def _refusal(file: str, name: str | None, text: str) -> InputError:
    if name is None:
        return InputError(f"not a loadable torch file: {_first_line(text)}", file=file)
    if name in SAFE_GLOBALS:
        return InputError(
            "the file pickles a type sapper allows, but its package is not installed here",
            file=file,
            field="pickle",
            value=name,
            expected=f"the package of {name} installed",
        )
    return InputError(
        "refused to unpickle: the file needs a global that could run code; "
        "nothing in it was executed",
        file=file,
        field="pickle",
        value=name,
        expected="tensors, containers, numbers and the allowlisted types "
        "(sapper.checkpoint.torchfile.SAFE_GLOBALS)",
    )


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:200]


def iter_tensors(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a loaded object with its dotted path (``state.3.exp_avg``)."""
    if depth > 64:
        return
    if isinstance(obj, torch.Tensor):
        # Dense CPU tensors only: a sparse, quantized or meta tensor has no flat values to
        # stream (and its memory is not the file's mapping).
        if obj.layout == torch.strided and obj.device.type == "cpu" and not obj.is_quantized:
            yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from iter_tensors(value, f"{prefix}.{key}" if prefix else str(key), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from iter_tensors(value, f"{prefix}.{i}" if prefix else str(i), depth + 1)
