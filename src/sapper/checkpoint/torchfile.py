"""torch checkpoint files (``.pt/.bin/.pth/.ckpt``) loaded without running their pickle.

Always ``torch.load(weights_only=True)``: torch's restricted unpickler builds tensors,
containers and numbers and refuses every other global, so a pickle whose ``__reduce__``
would run a command is refused (naming the global it wanted) and nothing in it runs.
Zip-format files are memory-mapped (``mmap=True``), so tensors are paged in as they are
reduced. The few non-tensor types real checkpoints pickle are allowed by fully qualified
name, and only those (:data:`SAFE_GLOBALS`).
"""

from __future__ import annotations

import importlib
import pickle
import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from sapper.errors import InputError

__all__ = ["SAFE_GLOBALS", "iter_tensors", "load_torch_file"]

#: Fully qualified names of the non-tensor globals that healthy checkpoints contain:
#: numpy's RNG state (``rng_state.pth`` of the HF Trainer, numpy 1.x and 2.x module paths),
#: and Lightning's hyper-parameter dict.
SAFE_GLOBALS: tuple[str, ...] = (
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.dtypes.UInt32DType",
    "numpy.dtypes.Float64DType",
    "numpy.dtypes.Int64DType",
    "lightning.fabric.utilities.data.AttributeDict",
    "pytorch_lightning.utilities.parsing.AttributeDict",
)

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _resolve(name: str) -> Callable[..., Any] | None:
    """The object a safe global names, or None where its package is not installed (a
    pickle needing it then fails as refused, which is right: it cannot be built)."""
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


def _allowlist() -> list[Any]:
    found = []
    for name in SAFE_GLOBALS:
        obj = _resolve(name)
        if obj is not None:
            found.append(obj)
    return found


def load_torch_file(path: Path) -> Any:
    """The object in a torch file, built by the restricted unpickler; InputError naming
    the file when it is not a torch file, is truncated, or needs an unsafe global."""
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    try:
        with torch.serialization.safe_globals(_allowlist()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        wanted = _GLOBAL.search(text)
        if wanted:
            raise InputError(
                "refused to unpickle: the file needs a global that could run code; "
                "nothing in it was executed",
                file=str(path),
                field="pickle",
                value=wanted.group(1),
                expected="tensors, containers, numbers and the allowlisted types "
                "(sapper.checkpoint.torchfile.SAFE_GLOBALS)",
            ) from None
        raise InputError(
            f"not a loadable torch file: {_first_line(text)}", file=str(path)
        ) from None
    except InputError:
        raise
    except (
        RuntimeError,
        EOFError,
        ValueError,
        OSError,
        zipfile.BadZipFile,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
        MemoryError,
        OverflowError,
    ) as exc:
        raise InputError(
            f"not a loadable torch file ({type(exc).__name__}: {_first_line(str(exc))})",
            file=str(path),
        ) from None


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:200]


def iter_tensors(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a loaded object with its dotted path (``state.3.exp_avg``)."""
    if depth > 64:
        return
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from iter_tensors(value, f"{prefix}.{key}" if prefix else str(key), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from iter_tensors(value, f"{prefix}.{i}" if prefix else str(i), depth + 1)
