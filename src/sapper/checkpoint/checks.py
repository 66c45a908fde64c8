"""The per-tensor findings of one checkpoint: non-finite values (K001), dead tensors
(K003), values at the dtype's limit (K011), one layer's scale against its peers (K002)
and tied weights that are no longer tied (K010).

Peers are the tensors of one role (``mlp.down_proj.weight``) across the layers; a scale
is an outlier when its log10 RMS lies far from the peers' median in units of their
median absolute deviation — robust to the outlier itself, and to a few layers that
differ legitimately (the first and last often do, by a small factor).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from sapper.checkpoint.naming import parse_name
from sapper.checkpoint.rules import (
    DEAD_TENSOR,
    DTYPE_VS_CONFIG,
    NONFINITE_TENSOR,
    SATURATED_TENSOR,
    SCALE_OUTLIER,
    TIED_UNTIED,
)
from sapper.checkpoint.source import SafetensorsSource, TensorSource
from sapper.checkpoint.tensorstats import TensorStats
from sapper.rules.model import Finding

__all__ = [
    "OUTLIER",
    "dtype_findings",
    "first_index",
    "outlier_findings",
    "tensor_findings",
    "tied_findings",
]

#: Outlier thresholds on log10(RMS): at least this many peers, a deviation of
#: ``mads`` robust standard deviations and at least ``min_factor`` times the median.
OUTLIER = {"min_peers": 4, "mads": 6.0, "min_factor": 4.0, "mad_floor": 0.05}

#: (head, embedding) key pairs that ``tie_word_embeddings`` makes one tensor.
_TIED_PAIRS = (
    ("lm_head.weight", "model.embed_tokens.weight"),
    ("lm_head.weight", "transformer.wte.weight"),
    ("lm_head.weight", "model.decoder.embed_tokens.weight"),
    ("output.weight", "tok_embeddings.weight"),
)


def first_index(flat: int | None, shape: tuple[int, ...]) -> list[int] | None:
    """The row-major multi-index of a flat index."""
    if flat is None:
        return None
    index = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return list(reversed(index))


def nonfinite_finding(s: TensorStats, what: str = "") -> Finding:
    at = first_index(s.first_nonfinite, s.shape)
    name = parse_name(s.key)
    layer = f"layer {name.layer}, " if name.layer is not None else ""
    return NONFINITE_TENSOR.finding(
        f"{what}{s.key} ({layer}{s.dtype} {list(s.shape)}): {s.nonfinite} of {s.numel} "
        f"values non-finite (NaN {s.nan}, +Inf {s.posinf}, -Inf {s.neginf}), first at {at}",
        value=float(s.nonfinite),
        source=s.file,
        tensor=s.key,
        first_index=at,
        nan=s.nan,
        posinf=s.posinf,
        neginf=s.neginf,
    )


def tensor_findings(stats: list[TensorStats], trained: bool, what: str = "") -> list[Finding]:
    """K001, K003 and K011 for each tensor. A constant 1-D tensor (a norm at 1, a bias at
    0) is what initialisation writes, so it is dead only once the checkpoint is known to
    have trained (``trained``). ``what`` names the kind of tensor in messages."""
    out: list[Finding] = []
    for s in stats:
        if s.nonfinite:
            out.append(nonfinite_finding(s, what))
        if s.floating and s.constant and (len(s.shape) >= 2 or trained):
            value = s.finite_min
            value_text = "all zero" if value == 0 else f"constant {value:g}"
            out.append(
                DEAD_TENSOR.finding(
                    f"{s.key} ({s.dtype} {list(s.shape)}) is {value_text} over {s.numel} values",
                    value=value,
                    source=s.file,
                    tensor=s.key,
                )
            )
        if s.saturated:
            out.append(
                SATURATED_TENSOR.finding(
                    f"{s.key} ({s.dtype}): {s.saturated} of {s.numel} values at the {s.dtype} "
                    f"limit (abs max {s.abs_max:g})",
                    value=float(s.saturated),
                    source=s.file,
                    tensor=s.key,
                )
            )
    return out


def outlier_findings(
    stats: list[TensorStats], what: str = "weight", power: float = 1.0
) -> list[Finding]:
    """K002: a tensor whose RMS is an outlier among the same role in other layers.
    ``power`` maps the RMS to the scale compared: 0.5 for Adam's ``exp_avg_sq``, a
    squared gradient, so its outliers are judged on the gradient's scale (a 3x gradient
    difference between depths is common, and 9x in ``exp_avg_sq``)."""
    peers: dict[str, list[tuple[int, TensorStats]]] = defaultdict(list)
    for s in stats:
        name = parse_name(s.key)
        if name.layer is not None and s.floating and s.numel > 1 and s.rms > 0:
            if math.isfinite(s.rms):
                peers[name.role].append((name.layer, s))
    out = []
    for role, group in sorted(peers.items()):
        if len(group) < OUTLIER["min_peers"]:
            continue
        logs = [power * math.log10(s.rms) for _, s in group]
        med = statistics.median(logs)
        mad = statistics.median(abs(x - med) for x in logs)
        spread = max(1.4826 * mad, OUTLIER["mad_floor"])
        for (layer, s), x in zip(group, logs, strict=True):
            dev = x - med
            factor = 10 ** abs(dev)
            if abs(dev) / spread >= OUTLIER["mads"] and factor >= OUTLIER["min_factor"]:
                way = "larger" if dev > 0 else "smaller"
                out.append(
                    SCALE_OUTLIER.finding(
                        f"layer {layer} {role}: {what} RMS {s.rms:.3g} is {factor:.1f}x {way} "
                        f"than the median of its {len(group)} peers ({10**med:.3g})",
                        value=s.rms,
                        threshold=10 ** (med / power),
                        source=s.file,
                        tensor=s.key,
                        layer=layer,
                        role=role,
                        factor=factor,
                    )
                )
    return out


def tied_findings(source: TensorSource, config: dict | None) -> list[Finding]:
    """K010: the config ties the head to the embedding, and both are stored, different."""
    if not config or not config.get("tie_word_embeddings", False):
        return []
    keys = set(source.keys())
    out = []
    for head, embed in _TIED_PAIRS:
        if head in keys and embed in keys:
            a, b = source.info(head), source.info(embed)
            if a.shape != b.shape:
                differ, detail = True, f"shapes {list(a.shape)} and {list(b.shape)}"
            else:
                worst = _max_difference(source, head, embed)
                differ, detail = worst > 0, f"max |difference| {worst:.3g}"
            if differ:
                out.append(
                    TIED_UNTIED.finding(
                        f"config.json sets tie_word_embeddings, but {head} and {embed} differ "
                        f"({detail})",
                        source=a.file,
                        tensor=head,
                        other=embed,
                    )
                )
    return out


def _max_difference(source: TensorSource, a: str, b: str) -> float:
    """The largest |difference| of two tensors of one shape, piece by piece (a NaN
    piece is passed over, as ``max`` passes over a NaN that comes second): with numpy
    for a safetensors checkpoint, else with torch."""
    worst = 0.0
    if isinstance(source, SafetensorsSource):
        import numpy as np

        pairs = zip(aligned_arrays(source, a), aligned_arrays(source, b), strict=True)
        for x, y in pairs:
            worst = max(worst, float(np.abs(x - y).max()))
        return worst
    for x, y in zip(aligned(source, a), aligned(source, b), strict=True):
        worst = max(worst, float((x.double() - y.double()).abs().max()))
    return worst


def aligned_arrays(source: SafetensorsSource, key: str, size: int = 1 << 22):
    """:func:`aligned` for a safetensors source, with numpy: the values as float64."""
    import numpy as np

    from sapper.checkpoint.arrays import widen

    dtype = source.stored_dtype(key)
    flats = (widen(chunk, dtype).astype(np.float64) for chunk in source.arrays(key))
    yield from _regrouped(flats, size, np.concatenate)


def aligned(source: TensorSource, key: str, size: int = 1 << 22):
    """The tensor's values as flat pieces of exactly ``size`` elements (the last shorter),
    whatever the source's own chunking: two tensors read this way pair up piece by piece."""
    import torch

    yield from _regrouped((chunk.reshape(-1) for chunk in source.chunks(key)), size, torch.cat)


def _regrouped(flats: Iterable[Any], size: int, cat: Callable[[list[Any]], Any]):
    """Flat 1-D pieces (numpy arrays or torch tensors) cut and joined into pieces of
    exactly ``size`` elements, the last shorter; ``cat`` joins a list of them."""
    pending: list[Any] = []
    held = 0
    for flat in flats:
        while len(flat):
            take = min(size - held, len(flat))
            pending.append(flat[:take])
            held += take
            flat = flat[take:]
            if held == size:
                yield cat(pending) if len(pending) > 1 else pending[0]
                pending, held = [], 0
    if pending:
        yield cat(pending) if len(pending) > 1 else pending[0]


def dtype_findings(stats: list[TensorStats], config: dict | None) -> list[Finding]:
    """K012: the floating dtype holding most of the values differs from config.json's."""
    wanted = (config or {}).get("dtype") or (config or {}).get("torch_dtype")
    if not isinstance(wanted, str):
        return []
    wanted = wanted.removeprefix("torch.")
    by_dtype: dict[str, int] = defaultdict(int)
    for s in stats:
        if s.floating:
            by_dtype[s.dtype] += s.numel
    if not by_dtype:
        return []
    stored = max(by_dtype, key=by_dtype.__getitem__)
    if stored == wanted:
        return []
    share = by_dtype[stored] / sum(by_dtype.values())
    return [
        DTYPE_VS_CONFIG.finding(
            f"config.json says dtype {wanted}, but {share:.0%} of the stored values are {stored}",
            source="config.json",
            stored=stored,
            config_dtype=wanted,
        )
    ]
