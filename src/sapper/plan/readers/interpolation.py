"""OmegaConf ``${...}`` interpolations, resolved within one file and nowhere else.

NeMo's Hydra configs point values at each other: ``max_position_embeddings:
${.encoder_seq_length}``, ``seq_length: ${model.encoder_seq_length}``, ``ffn_hidden_size:
${multiply:4, ${.hidden_size}}``. Those are resolved here the way OmegaConf does
(absolute paths from the root; a leading dot is the node holding the key, each further
dot one level up; ``a[0]`` and ``a.0`` index lists; text around an interpolation makes a
string), with the two resolvers NeMo itself registers, ``multiply`` and ``sum``
(nemo/core/config/hydra_runner.py: ``lambda x, y: x * y`` and ``lambda x, y: x + y``).

Anything that needs the world outside the file is :class:`Unresolved` with the reason,
never guessed: ``${oc.env:VAR}`` and other resolvers, a key the file does not have (a
launcher's ``${data_dir}``, a value composed from another file), OmegaConf's mandatory
``???``. A hostile file cannot hang the resolver: references and nesting are followed at
most :data:`MAX_DEPTH` levels deep, a cycle is reported as one, every path is resolved once
(memoized), results are bounded in length and so is the text read to evaluate them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from sapper.errors import clip

__all__ = ["MAX_DEPTH", "MISSING", "Resolver", "Unresolved"]

#: Levels of references and nested ``${`` followed from one value, together (NeMo's
#: deepest chains are 3-4 levels).
MAX_DEPTH = 64
#: Longest string an interpolation may build (real ones are paths, well under this).
MAX_RESULT_CHARS = 4096
#: Interpolations evaluated per file, memoized per path; bounds pathological files.
MAX_STEPS = 20_000
#: Characters of interpolated text read per file, all levels together: each level of
#: ``${multiply:2,${...}}`` reads its text again, so a value nested deep and long costs
#: depth x length. Real configs read a few kilobytes.
MAX_SCANNED_CHARS = 1 << 22

MISSING: Any = object()
_RESOLVERS = ("multiply", "sum")
_RESOLVER_CALL = re.compile(r"\s*([A-Za-z_][\w.]*)\s*:(.*)", re.DOTALL)
_INDEX = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class Unresolved:
    """A value that cannot be known from the file, and why (for C006)."""

    why: str


class _Stop(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Resolver:
    """Reads dotted keys of one parsed document, resolving interpolations."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self._memo: dict[tuple[str, ...], Any] = {}
        self._open: set[tuple[str, ...]] = set()
        self._steps = 0
        self._scanned = 0

    # -- public -------------------------------------------------------------------
    def get(self, key: str) -> Any:
        """The value at dotted ``key`` (resolved), :data:`MISSING` when absent, or an
        :class:`Unresolved`."""
        try:
            return self._at(tuple(key.split(".")), 0)
        except _Stop as stop:
            return Unresolved(stop.why)
        except _Absent:
            return MISSING

    # -- paths --------------------------------------------------------------------
    def _at(self, path: tuple[str, ...], depth: int) -> Any:
        node: Any = self.root
        for i, part in enumerate(path):
            node = self._child(node, part)
            node = self._value(node, path[: i + 1], depth)
        return node

    @staticmethod
    def _child(node: Any, part: str) -> Any:
        if isinstance(node, dict):
            if part in node:
                return node[part]
            raise _Absent
        if isinstance(node, list) and part.isdigit() and len(part) < 10:
            index = int(part)
            if index < len(node):
                return node[index]
        raise _Absent

    def _value(self, value: Any, path: tuple[str, ...], depth: int) -> Any:
        """``value`` (found at ``path``) with its interpolations resolved."""
        if isinstance(value, str) and value.strip() == "???":
            raise _Stop(f"{'.'.join(path)} is ??? (OmegaConf's mandatory value, given at "
                        "launch)")
        if not isinstance(value, str) or "${" not in value:
            return value
        if path in self._memo:
            return self._memo[path]
        if path in self._open:
            raise _Stop(f"the interpolations around {'.'.join(path)} refer to each other "
                        "in a cycle")
        if depth > MAX_DEPTH:
            raise _Stop(f"interpolations nested deeper than {MAX_DEPTH} levels")
        self._open.add(path)
        try:
            result = self._text(value, path[:-1], depth + 1)
        finally:
            self._open.discard(path)
        self._memo[path] = result
        return result

    # -- the grammar ----------------------------------------------------------------
    def _text(self, text: str, parent: tuple[str, ...], depth: int) -> Any:
        """A string holding interpolations: one alone keeps its type, text around them
        makes a string (OmegaConf's string interpolation)."""
        self._steps += 1
        if depth > MAX_DEPTH:
            raise _Stop(f"interpolations nested deeper than {MAX_DEPTH} levels")
        if self._steps > MAX_STEPS:
            raise _Stop(f"more than {MAX_STEPS} interpolations to evaluate")
        self._scanned += len(text)
        if self._scanned > MAX_SCANNED_CHARS:
            raise _Stop(f"the file's interpolations are longer than {MAX_SCANNED_CHARS} "
                        "characters in all (nested and read level by level), more than "
                        "sapper evaluates")
        pieces: list[Any] = []
        i = 0
        while i < len(text):
            if text.startswith("\\${", i):
                pieces.append("${")
                i += 3
                continue
            if text.startswith("${", i):
                end = _closing(text, i + 2)
                if end < 0:
                    raise _Stop(f"unbalanced interpolation {clip(text, 60)!r}")
                pieces.append(self._interpolation(text[i + 2 : end], parent, depth))
                i = end + 1
                continue
            j = text.find("$", i + 1)
            j = len(text) if j < 0 else j
            pieces.append(text[i:j])
            i = j
        if len(pieces) == 1:
            return pieces[0]
        out = "".join(_as_text(p) for p in pieces)
        if len(out) > MAX_RESULT_CHARS:
            raise _Stop(f"an interpolation builds a string over {MAX_RESULT_CHARS} characters")
        return out

    def _interpolation(self, inner: str, parent: tuple[str, ...], depth: int) -> Any:
        call = _RESOLVER_CALL.fullmatch(inner)
        if call is not None and "${" not in call.group(1):
            name = call.group(1)
            if name not in _RESOLVERS:
                raise _Stop(f"${{{clip(name, 40)}:...}} is resolved at launch (by "
                            f"{'OmegaConf' if name.startswith('oc.') else 'a registered resolver'}"
                            "), outside the file")
            args = [self._argument(a, parent, depth + 1) for a in _split_args(call.group(2))]
            return _apply(name, args)
        key = inner.strip()
        if "${" in key:  # a key built from other values: ${foo.${bar}}
            key = _as_text(self._text(key, parent, depth + 1))
        return self._reference(key, parent, depth)

    def _argument(self, text: str, parent: tuple[str, ...], depth: int) -> Any:
        text = text.strip()
        if "${" in text:
            return self._text(text, parent, depth)
        return _literal(text)

    def _reference(self, key: str, parent: tuple[str, ...], depth: int) -> Any:
        dots = len(key) - len(key.lstrip("."))
        rest = _INDEX.sub(r".\1", key[dots:])
        if dots:
            if dots - 1 > len(parent):
                raise _Stop(f"${{{clip(key, 60)}}} climbs above the top of the file")
            base = parent[: len(parent) - (dots - 1)]
        else:
            base = ()
        parts = tuple(p for p in rest.split(".") if p) if rest else ()
        target = base + parts
        if not target:
            raise _Stop(f"${{{clip(key, 60)}}} refers to a whole section")
        try:
            return self._at(target, depth)
        except _Absent:
            raise _Stop(f"${{{clip(key, 60)}}} refers to {clip('.'.join(target), 60)}, which "
                        "this file does not have (set by the launcher or another file)") from None


class _Absent(Exception):
    """A path the document does not have."""


def _closing(text: str, start: int) -> int:
    """Index of the ``}`` closing the interpolation whose body starts at ``start``."""
    level = 1
    i = start
    while i < len(text):
        if text.startswith("${", i):
            level += 1
            i += 2
            continue
        if text[i] == "}":
            level -= 1
            if level == 0:
                return i
        i += 1
    return -1


def _split_args(text: str) -> list[str]:
    """Resolver arguments, split at commas outside nested interpolations and quotes."""
    args: list[str] = []
    level, quote, start = 0, "", 0
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif text.startswith("${", i):
            level += 1
            i += 1
        elif ch == "}":
            level -= 1
        elif ch == "," and level == 0:
            args.append(text[start:i])
            start = i + 1
        i += 1
    args.append(text[start:])
    return args


def _literal(text: str) -> Any:
    """A resolver argument written in place: a number, bool, null or string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~", ""):
        return None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if len(text) <= 40:
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return text
        return number if math.isfinite(number) else text
    return text


def _apply(name: str, args: list[Any]) -> Any:
    """NeMo's ``multiply`` / ``sum`` on two numbers (what else they are given fails at
    launch too: the lambdas take exactly two arguments)."""
    numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if len(args) != 2 or len(numbers) != 2:
        raise _Stop(f"${{{name}:...}} needs two numbers, got {clip(repr(args), 60)}")
    x, y = numbers
    if max(abs(x), abs(y)) > 1e18:
        raise _Stop(f"${{{name}:...}} of numbers beyond any training config")
    result = x * y if name == "multiply" else x + y
    if isinstance(result, float) and not math.isfinite(result):
        raise _Stop(f"${{{name}:...}} is not a finite number")
    return result


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "None"
    if isinstance(value, (dict, list)):
        raise _Stop("an interpolation puts a whole section into a string")
    return str(value)
