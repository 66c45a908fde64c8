"""A partial plan read from one place (a file or the command line), before merging.

Each loader turns what users already have into a :class:`PlanSource`: a nested dict in
the Plan's own shape, plus findings about the source itself (unknown keys, ``"auto"``
values). :func:`sapper.plan.load.build_plan` merges sources in order, later ones winning,
and remembers which source supplied each field so a validation error can name the file.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

try:
    from yaml._yaml import CParser as _CParser  # libyaml's scanner and parser
except ImportError:  # pragma: no cover - PyYAML without libyaml
    _CParser = None

from sapper.errors import InputError, clip
from sapper.rules.model import Finding

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "MAX_VALUES",
    "PlanSource",
    "leaves",
    "parse_json_text",
    "parse_toml_text",
    "parse_yaml_text",
    "read_json_file",
    "read_json_object",
    "read_text_file",
    "read_yaml_file",
    "set_path",
    "special_kind",
]

#: Largest config file sapper reads (plan YAML, config.json, DeepSpeed JSON). Real ones are
#: a few KB; the limit keeps /dev/zero, a checkpoint given by mistake or a hostile file
#: from filling memory.
MAX_CONFIG_BYTES = 8 << 20
#: Deepest nesting of mappings and lists in a config. Real ones use 3–5 levels; much
#: deeper ones would overflow Python's recursion in the parser or in sapper.
MAX_NESTING = 100
#: Values in one config once YAML aliases are expanded (a plan holds a few hundred, a
#: config.json with a large label map tens of thousands); bounds a "billion laughs".
MAX_VALUES = 100_000
#: Longest integer literal read (2**256 has 78 digits). Python's ``int()`` takes time
#: quadratic in the length, and refuses more than 4300 digits with a ValueError.
MAX_INT_DIGITS = 100


@dataclass
class PlanSource:
    """Values for the Plan from one place."""

    name: str
    data: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    #: Plan field path -> the key in the source file that supplied it (for messages).
    origin: dict[str, str] = field(default_factory=dict)
    #: Files this one points at, to be read before it (its own keys win over theirs):
    #: ``hf_config`` -> a model's config.json, ``deepspeed`` -> a DeepSpeed JSON. Paths are
    #: already resolved against the referencing file's folder.
    refs: dict[str, Path] = field(default_factory=dict)
    #: The framework whose launch config this is (``megatron``, ``nemo`` ...), for messages.
    format: str | None = None

    def set(self, path: str, value: Any, origin: str | None = None) -> None:
        """Set a dotted Plan field path (``precision.loss_scaling.mode``)."""
        set_path(self.data, path, value)
        if origin:
            self.origin[path] = origin


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested dict by its dotted path (``batch.micro_batch_size``)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(leaves(value, path + "."))
        else:
            out[path] = value
    return out


def set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    node = tree
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def special_kind(mode: int) -> str | None:
    """What a file that is not a regular one is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _check_file(info: os.stat_result, name: str) -> None:
    kind = special_kind(info.st_mode)
    if kind is not None:
        raise InputError(f"is {kind}, not a regular file", file=name, expected="a config file")
    if info.st_size > MAX_CONFIG_BYTES:
        raise _too_big(info.st_size, name)


def _too_big(size: int | None, name: str) -> InputError:
    """``size`` None: the file said less than it held (a /proc file), so only the limit is
    known to be passed."""
    limit = f"the {MAX_CONFIG_BYTES >> 20} MiB limit for a config file"
    problem = (
        f"file is {size / (1 << 20):.1f} MiB, over {limit}"
        if size is not None
        else f"file holds more than {limit}"
    )
    return InputError(
        problem,
        file=name,
        expected="a plan YAML, config.json or DeepSpeed JSON (a few KB)",
    )


def read_text_file(path: str | Path) -> str:
    """The file's text, read only if it is a regular file of at most MAX_CONFIG_BYTES.

    ``os.stat`` comes first so a FIFO or a device is refused before anything opens it
    (opening a FIFO blocks until a writer appears; /dev/zero never ends). The file is
    opened non-blocking and checked again on the open descriptor, in case it was swapped
    between the two calls, and at most one byte past the limit is read, because files
    such as those under /proc report a size of 0 whatever they hold.
    """
    name = str(path)
    try:
        _check_file(os.stat(path), name)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError("file not found", file=name) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise InputError(f"cannot read file ({_reason(exc)})", file=name) from None
    try:
        with os.fdopen(fd, "rb") as fh:
            _check_file(os.fstat(fh.fileno()), name)
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read file ({_reason(exc)})", file=name) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise _too_big(None, name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"not UTF-8 text (byte {exc.start}: {exc.reason})",
            file=name,
            expected="a text file in UTF-8",
        ) from None


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc)


class _OverLimit(ComposerError):
    """A YAML document that is well-formed but beyond sapper's limits."""


if _CParser is not None:

    class _SafeBase(Composer, _CParser, SafeConstructor, Resolver):  # type: ignore[misc]
        """``yaml.CSafeLoader`` with PyYAML's own composer in front of libyaml's, so the
        limits below apply while composing; scanning and parsing stay in C (an 8 MiB file
        in well under a second, where pure Python takes half a minute)."""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

else:  # PyYAML built without libyaml
    _SafeBase = yaml.SafeLoader  # type: ignore[misc,assignment]


class _BoundedLoader(_SafeBase):
    """A safe YAML loader with limits, so a hostile plan fails fast with a short message.

    PyYAML composes an alias as a reference to its anchor, so nine nested aliases of nine
    items each (a "billion laughs") compose in microseconds but expand to 10^9 values in
    anything that walks them. The composed graph is therefore measured, memoized per node,
    before anything is constructed: more than MAX_VALUES values once expanded, or an alias
    inside its own anchor, is refused. Nodes and nesting are counted while composing, so
    neither a huge flat list nor deep nesting costs more than the limits (Python's
    recursion limit is never reached), and integers longer than MAX_INT_DIGITS are
    refused before ``int()`` spends quadratic time on them.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        self._composed += 1
        try:
            if self._depth > MAX_NESTING or self._composed > MAX_VALUES:
                what = (
                    f"nested deeper than {MAX_NESTING} levels"
                    if self._depth > MAX_NESTING
                    else f"more than {MAX_VALUES} values"
                )
                raise _OverLimit(None, None, what, self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node)
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # e.g. a timestamp with month 13
            raise ConstructorError(
                None, None, f"cannot read this value ({clip(str(exc))})", node.start_mark
            ) from None

    def construct_yaml_int(self, node: Node) -> int:
        if isinstance(node, ScalarNode) and len(node.value) > MAX_INT_DIGITS:
            raise _OverLimit(
                None,
                None,
                f"an integer of {len(node.value)} characters; sapper reads at most "
                f"{MAX_INT_DIGITS} digits",
                node.start_mark,
            )
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _expanded_size(root: Node) -> int:
    """Values in the document once every alias is expanded (each node counted as often as
    it is reachable), computed in time linear in the composed nodes. An alias can also
    stack nesting on nesting, so the expanded depth is checked here too."""
    sizes: dict[int, tuple[int, int]] = {}  # id -> (values, depth) once expanded
    open_nodes: set[int] = set()  # on the current path: an alias to one is a cycle
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        children = _children(node)
        if closing:
            open_nodes.discard(key)
            below = [sizes[id(c)] for c in children]
            size = 1 + sum(n for n, _ in below)
            depth = 1 + max((d for _, d in below), default=0)
            if size > MAX_VALUES or depth > MAX_NESTING:
                what = (
                    f"more than {MAX_VALUES} values"
                    if size > MAX_VALUES
                    else f"nested deeper than {MAX_NESTING} levels"
                )
                raise _OverLimit(None, None, f"{what} once aliases are expanded", node.start_mark)
            sizes[key] = (size, depth)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise _OverLimit(None, None, "an alias inside its own anchor", node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)][0]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def read_yaml_file(path: str | Path) -> Any:
    """Safe-load a YAML file within the limits of :class:`_BoundedLoader`."""
    return parse_yaml_text(read_text_file(path), str(path))


def parse_yaml_text(text: str, name: str) -> Any:
    """Safe-load YAML text within the limits of :class:`_BoundedLoader`; syntax errors
    name the line and column of file ``name``."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        problem = getattr(exc, "problem", None) or str(exc)
        what = "YAML beyond sapper's limits" if isinstance(exc, _OverLimit) else "malformed YAML"
        raise InputError(f"{what} at {where}: {problem}", file=name) from None
    finally:
        loader.dispose()


def parse_toml_text(text: str, name: str) -> dict[str, Any]:
    """A TOML document (torchtitan's job configs) as a dict, within the same limits as
    JSON: tomllib bounds integer literals itself (Python's 4300-digit limit), deep inline
    nesting is caught as the RecursionError it raises, and the tree is then checked for
    size, depth and non-finite numbers (TOML allows ``inf`` and ``nan``)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"malformed TOML: {clip(str(exc))}", file=name) from None
    except (RecursionError, ValueError) as exc:
        raise InputError(f"TOML beyond sapper's limits ({clip(str(exc))})", file=name) from None
    _check_tree(data, name)
    return data


class _LongInteger(ValueError):
    """An integer literal longer than MAX_INT_DIGITS in a JSON file."""


def _json_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise _LongInteger(len(text))
    return int(text)


def read_json_file(path: str | Path) -> Any:
    """Load JSON; syntax errors name the line and column.

    Python's json reads ``NaN``, ``Infinity`` and ``1e999`` as non-finite floats, which
    JSON itself does not allow and no config means; they are refused with their key path,
    and so is nesting deeper than MAX_NESTING or more than MAX_VALUES values.
    """
    return parse_json_text(read_text_file(path), str(path))


def parse_json_text(text: str, file: str) -> Any:
    """JSON text within the limits of :func:`read_json_file`."""
    try:
        data = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", file=file
        ) from None
    except _LongInteger as exc:
        raise InputError(
            f"an integer of {exc.args[0]} digits; sapper reads at most {MAX_INT_DIGITS}",
            file=file,
        ) from None
    except RecursionError:
        raise InputError(f"nested deeper than {MAX_NESTING} levels", file=file) from None
    _check_tree(data, file)
    return data


def _check_tree(tree: Any, file: str) -> None:
    """Refuse non-finite numbers, deep nesting and too many values, naming the key path."""
    stack: list[tuple[Any, str, int]] = [(tree, "", 0)]
    count = 0
    while stack:
        node, where, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise InputError(f"more than {MAX_VALUES} values", file=file)
        if depth > MAX_NESTING:
            raise InputError(f"nested deeper than {MAX_NESTING} levels", file=file, field=where)
        if isinstance(node, float) and not math.isfinite(node):
            raise InputError(
                "invalid value",
                file=file,
                field=where or "(the whole file)",
                value=node,
                expected="a finite number (JSON has no NaN or Infinity)",
            )
        if isinstance(node, dict):
            items = [(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(v, f"{where}[{i}]") for i, v in enumerate(node)]
        else:
            continue
        stack.extend((v, p, depth + 1) for v, p in reversed(items))


def read_json_object(path: str | Path, what: str, expected: str) -> dict[str, Any]:
    """Load a JSON file that must hold one object (a config), else an InputError saying
    ``what`` it should be and ``expected`` keys."""
    raw = read_json_file(path)
    if not isinstance(raw, dict):
        raise InputError(
            f"{what} must be a JSON object",
            file=str(path),
            value=type(raw).__name__,
            expected=expected,
        )
    return raw
