"""What a checkpoint's pickle built, rebuilt as plain data that sapper made itself.

A restricted unpickler only limits which classes a file may name; what it builds from
them can still carry the file's intent. An ``OrderedDict`` or a Lightning ``AttributeDict``
has an instance ``__dict__`` the pickle can fill, so ``d.items`` could be an allowed
callable of the file's choosing; a tensor rebuilt with state can carry attributes; a few
KB of nested lists that name each other through the memo expand to 10^30 leaves for any
walk that follows them. :func:`plain` copies the loaded object into dicts, lists, tuples,
numbers, text, attribute-free tensors, numeric numpy arrays and :class:`PickledObject`
records, reading every container through its type's own methods, never the instance's.
Shared references are expanded into a tree against a bound on total work
(:data:`MAX_OBJECTS`) and on depth, so every walk after this one is bounded by the tree's
size; past a bound the file is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sapper.errors import InputError
from sapper.unpickle import Record

__all__ = ["MAX_DEPTH", "MAX_OBJECTS", "PickledObject", "plain"]

#: Objects visited in all, counting every path to a shared one (a 100k-tensor checkpoint
#: with its optimizer state is a few million).
MAX_OBJECTS = 5_000_000
#: Containers inside containers, at most (real checkpoints nest under ten deep).
MAX_DEPTH = 64

_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
          torch.layout, torch.memory_format)  # fmt: skip


@dataclass(frozen=True)
class PickledObject:
    """A framework object read back as data: the name it was saved under and the fields
    its pickle gave it. Built by sapper; nothing of the framework's class runs."""

    qualname: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.fields)


class _Walk:
    def __init__(self, file: str) -> None:
        self.file = file
        self.left = MAX_OBJECTS

    def refuse(self, problem: str, value: Any, expected: str) -> InputError:
        return InputError(problem, file=self.file, field="pickle", value=value, expected=expected)

    def copy(self, obj: Any, depth: int) -> Any:
        self.left -= 1
        if self.left < 0:
            raise self.refuse(
                "the pickle's objects expand past the bound (shared references nested "
                "inside each other)",
                MAX_OBJECTS,
                f"at most {MAX_OBJECTS} objects in all",
            )
        if depth > MAX_DEPTH:
            raise self.refuse(
                "the pickle nests containers too deep", depth, f"at most {MAX_DEPTH} levels"
            )
        kind = type(obj)
        if kind in _ATOMS:
            return obj
        if isinstance(obj, torch.Tensor):
            # A fresh tensor over the same storage: no attributes the pickle set.
            return torch.Tensor.detach(obj)
        if isinstance(obj, dict):
            return {self.key(k, depth): self.copy(v, depth + 1) for k, v in dict.items(obj)}
        if isinstance(obj, (list, tuple)):  # torch.Size and named tuples too
            items = [
                self.copy(v, depth + 1)
                for v in (list.__iter__ if isinstance(obj, list) else tuple.__iter__)(obj)
            ]
            return items if isinstance(obj, list) else tuple(items)
        if isinstance(obj, (set, frozenset)):
            return frozenset(self.key(v, depth) for v in frozenset.__iter__(frozenset(obj)))
        if isinstance(obj, Record):
            state = obj.state
            fields = (
                {str(self.key(k, depth)): self.copy(v, depth + 1) for k, v in dict.items(state)}
                if isinstance(state, dict)
                else {"state": self.copy(state, depth + 1)}
            )
            return PickledObject(type(obj).qualname, fields)
        if type(obj).__name__ == "Namespace" and type(obj).__module__ == "argparse":
            return self.copy(object.__getattribute__(obj, "__dict__"), depth)
        numpy = _numpy_value(obj)
        if numpy is not None:
            return numpy
        raise self.refuse(
            "the pickle holds an object sapper does not read",
            type(obj).__name__,
            "tensors, containers, numbers, text and the allowlisted types",
        )

    def key(self, key: Any, depth: int) -> Any:
        """A dict key or set member, plain and hashable."""
        key = self.copy(key, depth + 1)
        try:
            hash(key)
        except TypeError:
            raise self.refuse(
                "a dict key is not hashable", type(key).__name__, "text or numbers"
            ) from None
        return key


def _numpy_value(obj: Any) -> Any:
    """A numeric numpy array or scalar (numpy's types have no instance attributes)."""
    import sys

    np = sys.modules.get("numpy")
    if np is None:
        return None
    if isinstance(obj, np.ndarray) and type(obj) is np.ndarray and obj.dtype.kind in "biufc":
        return obj
    if isinstance(obj, np.generic) and obj.dtype.kind in "biufc":
        return obj
    if isinstance(obj, np.dtype):
        return obj
    return None


def plain(obj: Any, file: str) -> Any:
    """``obj`` copied into plain data (see the module's docstring); InputError naming
    ``file`` past a bound or for an object of another kind."""
    return _Walk(file).copy(obj, 0)
