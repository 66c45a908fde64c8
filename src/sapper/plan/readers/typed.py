"""Typed checks shared by the YAML/TOML launch-config readers (NeMo, torchtitan).

A value a reader passes to the Plan is first checked against what the framework takes
(an integer, a number, true/false, a string, within bounds), so a wrong one is reported
as the user's key with the value and what was expected, not as a Plan field later.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sapper.errors import InputError

__all__ = ["KIND_WORDS", "as_number", "bad_value", "check_kind"]

KIND_WORDS = {
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "str": "a string",
}

#: A float written as YAML 1.1 leaves it a string (``2e-4`` has no dot), which
#: OmegaConf's loader reads as a float; so does sapper. At most 40 characters.
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def as_number(value: Any) -> int | float | None:
    """``value`` as an int or finite float (``"2e-4"`` included), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str) and len(value) <= 40 and _FLOAT_TEXT.fullmatch(value.strip()):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def bad_value(file: str, key: str, value: Any, expected: str) -> InputError:
    return InputError(
        "invalid value", file=file, field=key, value=value, has_value=True, expected=expected
    )


def check_kind(
    file: str,
    key: str,
    value: Any,
    kind: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> Any:
    """``value`` as ``kind`` (int, number, bool, str) within the bounds, else an
    InputError naming ``key``. An integer-valued float passes as an int (``4.0``, as an
    interpolation's arithmetic may give)."""
    out: Any = None
    if kind == "int":
        number = as_number(value) if not isinstance(value, str) else None
        if isinstance(number, float) and number.is_integer() and abs(number) < 2**63:
            number = int(number)
        out = number if isinstance(number, int) else None
    elif kind == "number":
        out = as_number(value)
    elif kind == "bool":
        out = value if isinstance(value, bool) else None
    elif kind == "str":
        out = value if isinstance(value, str) else None
    ok = out is not None
    if ok and minimum is not None and out < minimum:
        ok = False
    if ok and maximum is not None and out > maximum:
        ok = False
    if not ok:
        words = KIND_WORDS[kind]
        bounds = [f"≥ {minimum:g}"] if minimum is not None else []
        bounds += [f"≤ {maximum:g}"] if maximum is not None else []
        if bounds:
            words += " " + ", ".join(bounds)
        raise bad_value(file, key, value, words)
    return out
