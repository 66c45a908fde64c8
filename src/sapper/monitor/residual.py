"""Norm placement read from the residual structure of one block, traced at run time.

The call order of a block's norms and weight layers says little: ``nn.MultiheadAttention``
never calls its ``out_proj`` (it hands the weights to ``F.multi_head_attention_forward``),
so a Post-LN block built from it ran "norm, norm" and looked like a sandwich. What
defines the placement is where the norm sits relative to the residual add, and that is
what :class:`ResidualTracer` records: a ``TorchFunctionMode`` that is active for the first
block's first training forward only and follows the data flow from the block input:

* the block input, and the result of every *residual add* (an add of a stream tensor and
  a branch computed from it), are the residual stream;
* a norm is any ``F.layer_norm`` / ``F.rms_norm`` / ``F.group_norm`` call, the output of a
  norm module (``nn.LayerNorm``, ``nn.RMSNorm``, HF ``*RMSNorm`` ...), or a hand-written
  one (``x * rsqrt(mean(x²) + eps)``, ``(x - mean) / sqrt(var + eps)``);
* a norm *on the residual path* (its input is the stream and its output is the stream
  again: the skip operand of a later add, or the block output) is Post-LN;
* a norm of the stream that only feeds a branch, while the add takes the un-normed
  stream, is Pre-LN (also the parallel residual ``x + attn(ln1(x)) + mlp(ln2(x))``);
* Pre-LN plus a norm on a branch's output just before the add is the sandwich (Gemma 2);
  the norm on the branch output alone (OLMo 2, Swin v2's res-post-norm) is ``res-post``:
  the residual path stays clean, so it is not Post-LN.

Tensors are told apart by object identity; a handful of value-preserving ops (casts,
views, dropout, scaling by a constant or a parameter) keep a tensor's identity. Tagging
never changes what an op computes; any error in it makes the result ``unknown``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["ResidualTracer", "classify"]

#: Functional norms, by ``__name__`` with underscores stripped.
_NORM_FUNCS = frozenset(
    {"layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "native_layer_norm"}
)
#: Ops that keep a tensor's identity for the structure (same values up to a cast, a view
#: or dropout).
_SAME_VALUE = frozenset(
    {
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "type",
        "type_as",
        "contiguous",
        "clone",
        "view",
        "view_as",
        "reshape",
        "dropout",
        "alpha_dropout",
        "feature_alpha_dropout",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        "requires_grad",
    }
)
#: Element-wise ops that keep identity when the other operand is a constant or a
#: parameter (a norm's affine weight, LayerScale, an eps, a residual scale).
_AFFINE = frozenset({"add", "sub", "mul", "div", "truediv", "rsub", "radd", "rmul", "iadd", "imul"})
_ADD = frozenset({"add", "radd", "iadd"})


@dataclass(frozen=True)
class _Tag:
    """What the tracer knows about one tensor."""

    #: The value's identity, kept by value-preserving ops.
    serial: int
    #: Stream and norm nodes this value was computed from (transitively).
    deps: frozenset[int]
    #: The node this value *is* (block input, residual add, norm output), if any.
    node: int | None = None
    # Hand-written norm patterns: serial of the tensor ``t`` for
    square_of: int | None = None  # t*t, t.pow(2), t.square()
    mean_of: int | None = None  # t.mean(...)
    centered_of: int | None = None  # t - t.mean(...)
    moment_of: int | None = None  # mean(t²), t.var()
    root_of: int | None = None  # sqrt(moment(t)), t.std()
    inv_root_of: int | None = None  # rsqrt(moment(t))


@dataclass
class _Node:
    kind: str  # "input" | "add" | "norm"
    #: Part of the residual stream (input, add result, norm of the stream).
    stream: bool
    deps: frozenset[int] = frozenset()


@dataclass
class _Add:
    skip: int  # the stream node taken by the add
    branch: _Tag  # the other operand


@dataclass
class _Trace:
    nodes: dict[int, _Node] = field(default_factory=dict)
    adds: list[_Add] = field(default_factory=list)
    output: _Tag | None = None
    failed: bool = False


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _name(func: Any) -> str:
    return getattr(func, "__name__", "").strip("_")


class ResidualTracer(TorchFunctionMode):
    """Records the data flow of one block forward; :meth:`placement` classifies it."""

    def __init__(self) -> None:
        super().__init__()
        self.trace = _Trace()
        self._tags: dict[int, tuple[torch.Tensor, _Tag]] = {}
        self._by_serial: dict[int, _Tag] = {}
        self._ids = itertools.count()

    # ---- tags ----------------------------------------------------------------------
    def tag_of(self, t: Any) -> _Tag | None:
        entry = self._tags.get(id(t))
        return entry[1] if entry is not None and entry[0] is t else None

    def _set(self, t: torch.Tensor, tag: _Tag) -> None:
        self._tags[id(t)] = (t, tag)  # a strong reference: ids are not reused meanwhile
        self._by_serial.setdefault(tag.serial, tag)

    def _node(self, kind: str, stream: bool, deps: frozenset[int]) -> tuple[int, frozenset[int]]:
        nid = next(self._ids)
        deps = deps | {nid}
        self.trace.nodes[nid] = _Node(kind, stream, deps)
        return nid, deps

    def _stream_node(self, tag: _Tag) -> int | None:
        if tag.node is None:
            return None
        node = self.trace.nodes.get(tag.node)
        return tag.node if node is not None and node.stream else None

    def seed(self, x: torch.Tensor) -> None:
        """The block input: the residual stream at the start of the block."""
        nid, deps = self._node("input", True, frozenset())
        self._set(x, _Tag(next(self._ids), deps, nid))

    def finish(self, output: Any) -> None:
        out = next((t for t in _tensors(output) if t.is_floating_point()), None)
        self.trace.output = self.tag_of(out) if out is not None else None

    def mark_norm(self, inp: Any, out: Any) -> None:
        """A norm module ran: ``out`` is the norm of ``inp`` (unless the functional call
        inside it was already seen)."""
        if self.trace.failed or not isinstance(out, torch.Tensor):
            return
        try:
            have = self.tag_of(out)
            if have is not None and have.node is not None:
                if self.trace.nodes[have.node].kind == "norm":
                    return
            src = self.tag_of(inp)
            if src is not None:
                self._set(out, self._norm_tag(src))
        except Exception:
            self.trace.failed = True

    def _norm_tag(self, src: _Tag) -> _Tag:
        nid, deps = self._node("norm", self._stream_node(src) is not None, src.deps)
        return _Tag(next(self._ids), deps, nid)

    # ---- the mode ------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.trace.failed:
            try:
                self._record(func, args, kwargs, out)
            except Exception:
                self.trace.failed = True
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        outs = [t for t in _tensors(out)]
        if not outs:
            return
        ins = [(t, tag) for t in _tensors((args, kwargs)) if (tag := self.tag_of(t)) is not None]
        if not ins:
            return
        name = _name(func)
        first = args[0] if args else None
        first_tag = self.tag_of(first)
        tag: _Tag | None = None
        distinct = {id(t) for t, _ in ins}
        if name in _NORM_FUNCS and first_tag is not None:
            tag = self._norm_tag(first_tag)
        elif len(ins) == 2 and len(distinct) == 1 and name == "mul":  # x * x
            sq = ins[0][1]
            base = sq.centered_of if sq.centered_of is not None else sq.serial
            tag = _Tag(next(self._ids), sq.deps, square_of=base)
        elif len(distinct) == 1 and first_tag is not None:
            tag = self._unary(name, first_tag, args, kwargs)
        elif len(distinct) == 1 and name in _AFFINE:  # constant op tensor: 2 * x
            tag = ins[0][1]
        elif len(ins) == 2 and name in _ADD | {"mul", "div", "truediv", "sub"}:
            tag = self._binary(name, ins[0][1], ins[1][1])
        if tag is None:
            deps = frozenset().union(*(t.deps for _, t in ins))
            for t in outs:
                self._set(t, _Tag(next(self._ids), deps))
            return
        for t in outs[:1]:
            self._set(t, tag)
        for t in outs[1:]:
            self._set(t, _Tag(next(self._ids), tag.deps))

    def _unary(self, name: str, src: _Tag, args: tuple, kwargs: dict) -> _Tag | None:
        """One traced operand (others constants/parameters)."""
        if name in _SAME_VALUE or name in _AFFINE:
            return src
        base = src.centered_of if src.centered_of is not None else src.serial
        fresh = _Tag(next(self._ids), src.deps)
        if name == "square" or (
            name == "pow" and len(args) > 1 and isinstance(args[1], (int, float)) and args[1] == 2
        ):
            return replace(fresh, square_of=base)
        if name == "mean":
            if src.square_of is not None:
                return replace(fresh, moment_of=src.square_of)
            return replace(fresh, mean_of=src.serial)
        if name == "var":
            return replace(fresh, moment_of=base)
        if name == "std":
            return replace(fresh, root_of=base)
        if name == "sqrt" and src.moment_of is not None:
            return replace(fresh, root_of=src.moment_of)
        if name == "rsqrt" and src.moment_of is not None:
            return replace(fresh, inv_root_of=src.moment_of)
        return None

    def _binary(self, name: str, a: _Tag, b: _Tag) -> _Tag | None:
        """Two traced operands: a residual add, or a step of a hand-written norm."""
        if name in _ADD:
            for skip, branch in ((a, b), (b, a)):
                node = self._stream_node(skip)
                if node is not None and node in branch.deps and branch.node != node:
                    nid, deps = self._node("add", True, a.deps | b.deps)
                    self.trace.adds.append(_Add(node, branch))
                    return _Tag(next(self._ids), deps, nid)
            return None
        if name == "sub" and b.mean_of is not None and b.mean_of == a.serial:
            return _Tag(next(self._ids), a.deps | b.deps, centered_of=a.serial)
        if name == "mul":
            if a.serial == b.serial:
                base = a.centered_of if a.centered_of is not None else a.serial
                return _Tag(next(self._ids), a.deps, square_of=base)
            for u, r in ((a, b), (b, a)):
                if r.inv_root_of is not None and r.inv_root_of in (u.serial, u.centered_of):
                    return self._normalised(r.inv_root_of)
        if name in ("div", "truediv") and b.root_of is not None:
            if b.root_of in (a.serial, a.centered_of):
                return self._normalised(b.root_of)
        return None

    def _normalised(self, base: int) -> _Tag | None:
        src = self._by_serial.get(base)
        return self._norm_tag(src) if src is not None else None

    def placement(self) -> str:
        return classify(self.trace)


def classify(trace: _Trace) -> str:
    """``pre`` / ``post`` / ``sandwich`` / ``res-post`` / ``none`` (no norm) / ``unknown``."""
    if trace.failed:
        return "unknown"
    nodes = trace.nodes
    norms = {i for i, n in nodes.items() if n.kind == "norm"}
    if not norms:
        return "none"
    if not trace.adds:
        return "unknown"
    on_stream = {i for i in norms if nodes[i].stream}
    out = trace.output.node if trace.output is not None else None
    # A norm on the residual path: the stream after it is normed (skip of an add, output).
    residual_path = out in on_stream or any(a.skip in on_stream for a in trace.adds)
    if residual_path:
        return "post"
    pre = any((on_stream & a.branch.deps) - nodes[a.skip].deps for a in trace.adds)
    branch_out = any(a.branch.node in norms and a.branch.node not in on_stream for a in trace.adds)
    if pre:
        return "sandwich" if branch_out else "pre"
    return "res-post" if branch_out else "unknown"
