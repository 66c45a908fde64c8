"""Strict JSON text (RFC 8259) for everything sapper writes as JSON.

Python's ``json`` writes a NaN as ``NaN`` and an infinity as ``Infinity``: tokens that
JavaScript's ``JSON.parse``, Go's ``encoding/json``, ``jq`` and ``serde_json`` refuse, and
they appear exactly on the runs that matter (a loss that went NaN). sapper spells a
non-finite number as the string the run log has always used, ``"nan"``, ``"inf"`` or
``"-inf"``, which every reader of sapper's own files turns back into the float (pydantic's
float fields accept them too).
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["NON_FINITE", "dumps", "finite_safe"]

#: How a non-finite float is spelled in sapper's JSON.
NON_FINITE = ("nan", "inf", "-inf")


def finite_safe(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth of dicts, lists and tuples,
    replaced by its string (tuples become lists, as JSON has them)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_safe(v) for v in value]
    return value


def dumps(obj: Any, **options: Any) -> str:
    """``json.dumps`` that can only write strict JSON. The common case (nothing
    non-finite) goes straight to the C encoder; only a payload holding a NaN or an
    infinity takes the walk that spells them. Objects JSON has no type for are written
    as their ``str``."""
    options.setdefault("default", str)
    try:
        return json.dumps(obj, allow_nan=False, **options)
    except ValueError:  # a NaN or an infinity somewhere (or a str() of an object that held one)
        return json.dumps(finite_safe(obj), allow_nan=False, **options)
