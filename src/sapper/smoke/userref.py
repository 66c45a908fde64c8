"""Resolving ``module:function`` references to the user's own code (model, data, step)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from sapper.errors import InputError

__all__ = ["import_callable"]


def import_callable(spec: str, option: str) -> Callable[..., Any]:
    """Resolve ``module:function`` (the user's code) with an input error when it is wrong."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(
            "not a module:function reference", field=option, value=spec,
            expected="e.g. mypkg.models:build_model",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(
            f"cannot import module {module_name!r} ({exc})", field=option, value=spec,
            expected="an importable module (is it on PYTHONPATH?)",
        ) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise InputError(
                f"module {module_name!r} has no attribute {attr!r}", field=option, value=spec
            )
    if not callable(fn):
        raise InputError("not callable", field=option, value=spec, expected="a function")
    return fn
