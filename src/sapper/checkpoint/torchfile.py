"""torch checkpoint files (``.pt/.bin/.pth/.ckpt``) loaded without running their pickle.

A zip-format file (everything ``torch.save`` has written since torch 1.6) is read by
sapper itself (:mod:`sapper.checkpoint.torchzip`): its pickle goes through sapper's
restricted unpickler, which builds tensors, containers, numbers and the few named types
real checkpoints hold, and refuses every other global before anything runs, whatever
torch is installed. Its storages are memory-mapped, so tensors are paged in as they are
reduced. Before that, the archive's directory is read: an entry that would inflate (torch
writes none) is inflated here first, against a bound, so a few-MB archive cannot expand to
gigabytes. The legacy format (torch before 1.6) goes through
``torch.load(weights_only=True)``, only with torch 2.6 or newer: older releases' weights-
only unpickler could be made to run code (CVE-2025-32434).

After loading, :func:`sapper.checkpoint.plain.plain` copies what the pickle made into
plain data (a dict for an ``OrderedDict``, a tensor without attributes, a
:class:`PickledObject` for a framework object), expanding shared references against a
bound on total work: what the readers walk afterwards is a tree of bounded size, and
nothing in it behaves as the file says.
"""

from __future__ import annotations

import argparse
import io
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch

from sapper.checkpoint.plain import PickledObject, plain
from sapper.checkpoint.torchzip import load_torch_zip
from sapper.errors import InputError

__all__ = [
    "MAX_ARCHIVE_ENTRIES",
    "MAX_INFLATED_BYTES",
    "PickledObject",
    "iter_tensors",
    "load_torch_bytes",
    "load_torch_file",
    "mapped",
]

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


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
    return _load(path, str(path), path=path)


def load_torch_bytes(data: bytes, file: str) -> Any:
    """The object of a ``torch.save`` archive held in memory (a Distributed Checkpoint's
    storage piece), read as :func:`load_torch_file` reads a file."""
    return _load(io.BytesIO(data), file, data=data)


def _load(source: Path | io.BytesIO, file: str, path: Path | None = None,
          data: bytes | None = None) -> Any:  # fmt: skip
    try:
        if not zipfile.is_zipfile(source):
            if isinstance(source, io.BytesIO):
                source.seek(0)
            return plain(_load_legacy(source, file), file)
        with zipfile.ZipFile(source) as archive:
            _check_archive(archive, file)
            return plain(load_torch_zip(archive, file, path=path, data=data), file)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=file) from None
    except (zipfile.BadZipFile, ValueError, EOFError, RuntimeError) as exc:
        raise InputError(f"not a loadable torch file (damaged zip: {exc})", file=file) from None


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


def _load_legacy(source: Path | IO[bytes], file: str) -> Any:
    """A file of torch's pre-1.6 format, through torch's weights-only unpickler (numpy's
    RNG arrays and ``argparse.Namespace`` allowed besides tensors and containers)."""
    if _torch_version() < SAFE_TORCH:
        raise InputError(
            "sapper reads torch's legacy (pre-1.6) file format only with torch 2.6 or "
            "newer: the weights-only unpickler of older releases could be made to run "
            "code (CVE-2025-32434)",
            file=file,
            field="torch",
            value=torch.__version__,
            expected="torch>=2.6 installed beside sapper, or the file saved again",
        )
    import numpy

    allowed = [numpy.ndarray, numpy.dtype, argparse.Namespace]
    allowed += [numpy.dtypes.UInt32DType, numpy.dtypes.Float64DType, numpy.dtypes.Int64DType]
    core = getattr(numpy, "_core", None) or numpy.core
    allowed.append(core.multiarray._reconstruct)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refusal(file, _wanted(str(exc)), str(exc)) from None
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
    return InputError(
        "refused to unpickle: the file needs a global that could run code; "
        "nothing in it was executed",
        file=file,
        field="pickle",
        value=name,
        expected="tensors, containers, numbers and the allowlisted types",
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
