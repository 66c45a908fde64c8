"""torch checkpoint files (``.pt/.bin/.pth/.ckpt``) loaded without running their pickle.

Always ``torch.load(weights_only=True)``: torch's restricted unpickler builds tensors,
containers and numbers and refuses every other global, so a pickle whose ``__reduce__``
would run a command is refused (naming the global it wanted) and nothing in it runs.
Zip-format files are memory-mapped (``mmap=True``), so tensors are paged in as they are
reduced. The few non-tensor types real checkpoints pickle are allowed by fully qualified
name, and only those (:data:`SAFE_GLOBALS`); the framework objects DeepSpeed pickles are
rebuilt as plain stand-ins (:data:`STAND_INS`), so they load where DeepSpeed is absent and
no DeepSpeed code runs where it is installed.
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

__all__ = [
    "SAFE_GLOBALS",
    "STAND_INS",
    "PickledObject",
    "iter_tensors",
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


class PickledObject:
    """A framework object read back as plain data: the attributes its pickle set, and the
    name it was saved under (``qualname``). Nothing of the framework's class runs."""

    qualname = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _stand_in(name: str) -> type[PickledObject]:
    return type(name.rpartition(".")[2], (PickledObject,), {"qualname": name})


def _enum_value(value: Any) -> Any:
    """An ``int``-valued Enum member (DeepSpeed's ``ZeroStageEnum``) as its value."""
    return value


#: The non-tensor types DeepSpeed's ZeRO optimizer files pickle (its engine's
#: ``_save_zero_checkpoint``: the loss scaler object, the stage enum, and the per-parameter
#: ``fragment_address`` of ``param_slice_mappings``), each rebuilt as a stand-in.
STAND_INS: dict[str, Callable[..., Any]] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": _stand_in(
        "deepspeed.runtime.fp16.loss_scaler.LossScaler"
    ),
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": _stand_in(
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"
    ),
    "deepspeed.utils.tensor_fragment.fragment_address": _stand_in(
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
    """The object in a torch file, built by the restricted unpickler; InputError naming
    the file when it is not a torch file, is truncated, or needs an unsafe global."""
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    allowed = _EAGER
    while True:
        try:
            with torch.serialization.safe_globals(_allowlist(allowed) + _STAND_IN_GLOBALS):
                return torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
        except pickle.UnpicklingError as exc:
            name = _wanted(str(exc))
            # A known safe type outside numpy (Lightning's AttributeDict) is imported only
            # when a file needs it: importing its package costs seconds.
            if name in SAFE_GLOBALS and name not in allowed and _resolve(name) is not None:
                allowed = (*allowed, name)
                continue
            raise _refusal(path, name, str(exc)) from None
        except _LOAD_ERRORS as exc:
            raise InputError(
                f"not a loadable torch file ({type(exc).__name__}: {_first_line(str(exc))})",
                file=str(path),
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


def _refusal(path: Path, name: str | None, text: str) -> InputError:
    if name is None:
        return InputError(f"not a loadable torch file: {_first_line(text)}", file=str(path))
    if name in SAFE_GLOBALS:
        return InputError(
            "the file pickles a type sapper allows, but its package is not installed here",
            file=str(path),
            field="pickle",
            value=name,
            expected=f"the package of {name} installed",
        )
    return InputError(
        "refused to unpickle: the file needs a global that could run code; "
        "nothing in it was executed",
        file=str(path),
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
