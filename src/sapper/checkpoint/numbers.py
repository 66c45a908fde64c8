"""Numbers read from a checkpoint's metadata, checked before anything computes with them.

A pickle holds Python ints of any size (``2**2000`` loads fine) and JSON numbers past the
float range parse to ``inf``; a loss scale, a step count or a learning rate read from a
file is only used once it is known to be a number sapper can compute with. Every such
value goes through :func:`checked_number` (counts, rates, scales), a tensor's shape
through :func:`checked_shape`, and a size or offset through :func:`checked_int`: one
InputError line naming the file, the field, the value (shortened) and the valid range
otherwise.

What is not a number at all (a string, a list, ``None``, a bool) is no value for these
fields: ``checked_number`` returns None and the checks that need it are skipped, as for
a field the file does not have.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from sapper.errors import InputError, quote

__all__ = [
    "MAX_COUNT",
    "MAX_DIM",
    "MAX_FLOAT",
    "MAX_NUMEL",
    "checked_int",
    "checked_number",
    "checked_shape",
]

#: The largest finite float: a number beyond it cannot be computed with.
MAX_FLOAT = sys.float_info.max
#: Steps, iterations and other counts: what a signed 64-bit counter holds.
MAX_COUNT = 2**63 - 1
#: One dimension of a tensor's shape, below this (as safetensors headers are checked).
MAX_DIM = 1 << 48
#: Elements of one tensor, at most (torch's own bound).
MAX_NUMEL = 2**63 - 1


def _plain(value: Any) -> Any:
    """A numpy scalar, a one-element numpy array or a one-element dense CPU tensor as the
    Python number it holds (None for one of several elements); any other value unchanged.
    Modules the caller never imported cannot have built the value: neither is imported."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if (
            value.numel() != 1
            or value.layout != torch.strided
            or value.device.type != "cpu"
            or value.is_quantized
        ):
            return None
        try:
            return value.reshape(()).item()
        except (RuntimeError, TypeError, ValueError):
            return None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, (np.generic, np.ndarray)):
        if value.size != 1:
            return None
        item = value.reshape(()).item() if isinstance(value, np.ndarray) else value
        if not isinstance(item, np.generic):  # .item() gave a Python number already
            return item
        if isinstance(item, np.floating) and item.dtype.itemsize > 8 and np.isfinite(item):
            if abs(item) > np.longdouble(MAX_FLOAT):  # past the float range: refused as one
                return int(item)
        return item.item()
    return value


def _span(low: float, high: float) -> str:
    def show(x: float) -> str:
        if x == MAX_COUNT:
            return "2^63-1"
        if abs(x) == MAX_FLOAT:
            return f"{'-' if x < 0 else ''}1.8e308"
        return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"

    return f"{show(low)} … {show(high)}"


def checked_number(
    value: Any,
    *,
    file: str,
    field: str,
    low: float = -MAX_FLOAT,
    high: float = MAX_FLOAT,
    integer: bool = False,
) -> float | None:
    """``value`` as a float, or None when it is no number (absent, text, a container, a
    bool, a tensor of several elements).

    ``integer``: a count (a step, an iteration): an integer in ``low … high``; a float
    that is integral counts (torch keeps Adam's step in a float tensor), NaN, ±inf and a
    fraction do not. Otherwise a real number: a finite one must lie in ``low … high``
    (by default: fit a float); NaN and ±inf floats pass as the file holds them, for the
    rules to report (a loss scale of inf is a finding, not a damaged file).

    InputError naming ``file``, ``field``, the value and the range for anything else: an
    integer too large for a float, a complex number, a count that is not one."""
    number = _plain(value)
    if isinstance(number, bool) or not isinstance(number, (int, float, complex)):
        return None
    if integer:
        expected = f"an integer in {_span(low, high)}"
    elif (low, high) == (-MAX_FLOAT, MAX_FLOAT):
        expected = "a number that fits a float (magnitude at most 1.8e308)"
    else:
        expected = f"a number in {_span(low, high)}"

    def refuse(problem: str) -> InputError:
        return InputError(problem, file=file, field=field, value=number, expected=expected)

    if isinstance(number, complex):
        raise refuse("not a real number")
    if isinstance(number, int):
        # exact: Python compares an int with a float without converting it
        if abs(number) > MAX_FLOAT:
            raise refuse("count out of range" if integer else "number too large for a float")
        if not low <= number <= high:
            raise refuse("count out of range" if integer else "number out of range")
        return float(number)
    if integer and not (math.isfinite(number) and number.is_integer()):
        raise refuse("not an integer count")
    if math.isfinite(number) and not low <= number <= high:
        raise refuse("count out of range" if integer else "number out of range")
    return number


def checked_int(value: Any, *, file: str, field: str, low: int, high: int) -> int:
    """``value`` when it is a Python int (not a bool) in ``low … high``; InputError
    naming the range otherwise (sizes and offsets: no float or text stands in)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(
            "not a size in range" if isinstance(value, int) else "not an integer",
            file=file,
            field=field,
            value=value,
            expected=f"an integer in {_span(low, high)}",
        )
    return value


def checked_shape(value: Any, *, file: str, field: str) -> tuple[int, ...]:
    """A tensor shape: a list, tuple or ``torch.Size`` of ints in ``0 … 2^48-1`` whose
    product is at most ``2^63-1`` elements; InputError naming the range otherwise."""
    if not isinstance(value, (list, tuple)) or len(value) > 64:  # torch.Size is a tuple
        raise InputError(
            "not a tensor shape",
            file=file,
            field=field,
            value=value,
            expected="a list of at most 64 sizes",
        )
    dims = tuple(value)
    for i, d in enumerate(dims):
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < MAX_DIM:
            raise InputError(
                "not a tensor size",
                file=file,
                field=f"{field}.{i}",
                value=d,
                expected=f"an integer in 0 … 2^48-1 (the shape {_shape_text(dims)})",
            )
    if math.prod(dims) > MAX_NUMEL:
        raise InputError(
            "tensor shape holds more elements than a tensor can",
            file=file,
            field=field,
            value=list(dims),
            expected="at most 2^63-1 elements",
        )
    return dims


def _shape_text(dims: tuple[Any, ...]) -> str:
    return quote(list(dims), 80)
