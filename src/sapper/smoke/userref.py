"""Resolving ``module:function`` references to the user's own code (model, data, step).

A reference is ``package.module:name`` (imported like any module: from the current
directory, which the CLI puts first on ``sys.path``, or the installed packages) or
``path/to/file.py:name``: the file's folder goes on ``sys.path`` and the file is imported
by its stem, so the data-parallel ranks (fork or spawn) import the same module by name.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from sapper.errors import InputError

__all__ = ["import_callable"]


def _import_file(path_text: str, option: str, spec: str) -> ModuleType:
    path = Path(path_text)
    if not path.is_file():
        raise InputError(
            "file not found" if not path.exists() else "not a regular file",
            file=path_text,
            field=option,
            expected="a Python file, as path/to/file.py:name",
        )
    path = path.resolve()
    name = path.stem
    if not name.isidentifier():
        raise InputError(
            "the file name is not a Python module name",
            file=path_text,
            field=option,
            value=name,
            expected="a file named like a module (letters, digits, _)",
        )
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() != path:
        raise InputError(
            f"a different module named {name!r} is already imported "
            f"({getattr(loaded, '__file__', None) or 'built in'})",
            file=path_text,
            field=option,
            value=spec,
            expected="a file whose name does not shadow another module",
        )
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    except Exception as exc:  # the user's file failed while importing
        raise InputError(
            f"cannot import {path_text} ({type(exc).__name__}: {exc})", field=option, value=spec
        ) from None


def import_callable(spec: str, option: str) -> Callable[..., Any]:
    """Resolve ``module:function`` or ``file.py:function`` (the user's code) with an input
    error when it is wrong."""
    module_name, _, attr = spec.rpartition(":") if spec.count(":") > 1 else spec.partition(":")
    if not module_name or not attr:
        raise InputError(
            "not a module:function reference", field=option, value=spec,
            expected="e.g. mypkg.models:build_model or path/to/model.py:build_model",
        )
    if module_name.endswith(".py"):
        module = _import_file(module_name, option, spec)
        return _attribute(module, module_name, attr, option, spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(
            f"cannot import module {module_name!r} ({exc})", field=option, value=spec,
            expected="a module importable from the current directory or the installed "
            "packages, or a file as path/to/file.py:name",
        ) from None
    except Exception as exc:  # the user's module failed while importing
        raise InputError(
            f"cannot import module {module_name!r} ({type(exc).__name__}: {exc})",
            field=option,
            value=spec,
        ) from None
    return _attribute(module, module_name, attr, option, spec)


def _attribute(
    module: ModuleType, module_name: str, attr: str, option: str, spec: str
) -> Callable[..., Any]:
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise InputError(
                f"module {module_name!r} has no attribute {attr!r}", field=option, value=spec
            )
    if not callable(fn):
        raise InputError("not callable", field=option, value=spec, expected="a function")
    return fn
