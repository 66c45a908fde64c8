"""Two checkpoints of one run: how far each tensor moved, which layer moved far more than
its peers (K020), which tensors became non-finite between them (K021), which stood still
among moving peers (K022) and which moved though nothing trains them (K023).

The relative change ``||B - A|| / ||A||`` is computed piece by piece over tensors read in
aligned chunks from both checkpoints (any two formats), so two models never sit in
memory; only tensors present in both with the same shape are compared.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sapper.checkpoint.checks import aligned
from sapper.checkpoint.expected import Expected
from sapper.checkpoint.naming import parse_name
from sapper.checkpoint.optim import trained_keys
from sapper.checkpoint.rules import (
    CHANGED_WHILE_FROZEN,
    LAYER_FROZEN,
    LAYER_MOVED,
    NONFINITE_APPEARED,
)
from sapper.checkpoint.scan import Scan
from sapper.rules.model import Finding

__all__ = ["MOVED", "TensorChange", "diff_scans"]

#: A layer "moved far more" when its relative change is at least ``factor`` times the
#: median of its role's peers (at least ``min_peers`` of them) and ``mads`` robust
#: deviations from it on log scale.
MOVED = {"factor": 5.0, "mads": 6.0, "min_peers": 4, "mad_floor": 0.05}
#: Buffers no training step writes, by the names the model families give them: rotary
#: tables, position ids, the causal masks GPT-2-style attention keeps.
_CONSTANT_BUFFER = re.compile(
    r"(?:^|\.)(?:inv_freq|original_inv_freq|position_ids|masked_bias|_?cos_cached|_?sin_cached)$"
    r"|(?:^|\.)attn(?:\.attention)?\.bias$"
)


@dataclass
class TensorChange:
    key: str
    norm_a: float
    norm_diff: float
    nonfinite_a: int
    nonfinite_b: int

    @property
    def relative(self) -> float:
        if self.norm_a > 0:
            return self.norm_diff / self.norm_a
        return math.inf if self.norm_diff > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.key,
            "relative_change": self.relative,
            "norm_a": self.norm_a,
            "norm_diff": self.norm_diff,
            "nonfinite_a": self.nonfinite_a,
            "nonfinite_b": self.nonfinite_b,
        }


def _change(a: Scan, b: Scan, key: str) -> TensorChange:
    import torch

    sq_a = sq_d = 0.0
    bad_a = bad_b = 0
    for x, y in zip(aligned(a.weights, key), aligned(b.weights, key), strict=True):
        xf, yf = x.double(), y.double()
        fa, fb = torch.isfinite(xf), torch.isfinite(yf)
        bad_a += int((~fa).sum())
        bad_b += int((~fb).sum())
        both = fa & fb
        xf = torch.where(both, xf, torch.zeros(()))
        yf = torch.where(both, yf, torch.zeros(()))
        sq_a += float((xf * xf).sum())
        d = yf - xf
        sq_d += float((d * d).sum())
    return TensorChange(key, math.sqrt(sq_a), math.sqrt(sq_d), bad_a, bad_b)


def diff_scans(
    a: Scan, b: Scan, expected: Expected | None = None
) -> tuple[list[Finding], list[TensorChange], dict[str, Any]]:
    keys_b = set(b.weights.keys())
    common = [
        k
        for k in a.weights.keys()
        if k in keys_b and a.weights.info(k).shape == b.weights.info(k).shape
    ]
    changes = [_change(a, b, k) for k in common]
    findings: list[Finding] = []
    appeared = [c for c in changes if c.nonfinite_a == 0 and c.nonfinite_b > 0]
    appeared.sort(key=lambda c: (parse_name(c.key).layer is None, parse_name(c.key).layer or 0))
    for c in appeared:
        findings.append(
            NONFINITE_APPEARED.finding(
                f"{c.key} ({parse_name(c.key).describe()}): finite in the first checkpoint, "
                f"{c.nonfinite_b} non-finite values in the second",
                value=float(c.nonfinite_b),
                source=b.weights_file,
                tensor=c.key,
            )
        )
    findings += _moved(changes, b.weights_file)
    findings += _frozen(changes, b.weights_file)
    findings += _changed_frozen(a, b, changes, expected)
    summary = {
        "compared": len(changes),
        "only_in_first": sorted(set(a.weights.keys()) - keys_b)[:50],
        "only_in_second": sorted(keys_b - set(a.weights.keys()))[:50],
        "largest_changes": [
            c.to_json()
            for c in sorted(
                changes, key=lambda c: -c.relative if math.isfinite(c.relative) else -1e300
            )[:20]
        ],
    }
    return findings, changes, summary


def _moved(changes: list[TensorChange], file: str) -> list[Finding]:
    peers: dict[str, list[tuple[int, TensorChange]]] = defaultdict(list)
    for c in changes:
        name = parse_name(c.key)
        if name.layer is not None and c.relative > 0 and math.isfinite(c.relative):
            if c.nonfinite_b == 0:
                peers[name.role].append((name.layer, c))
    out = []
    for role, group in sorted(peers.items()):
        if len(group) < MOVED["min_peers"]:
            continue
        logs = [math.log10(c.relative) for _, c in group]
        med = statistics.median(logs)
        spread = max(1.4826 * statistics.median(abs(x - med) for x in logs), MOVED["mad_floor"])
        for (layer, c), x in zip(group, logs, strict=True):
            factor = 10 ** (x - med)
            if factor >= MOVED["factor"] and (x - med) / spread >= MOVED["mads"]:
                out.append(
                    LAYER_MOVED.finding(
                        f"layer {layer} {role} moved {c.relative:.3g} (||dW||/||W||), "
                        f"{factor:.1f}x the median of its {len(group)} peers ({10**med:.3g})",
                        value=c.relative,
                        threshold=10**med,
                        source=file,
                        tensor=c.key,
                        layer=layer,
                        role=role,
                        factor=factor,
                    )
                )
    return out


def _frozen(changes: list[TensorChange], file: str) -> list[Finding]:
    """K022: bit-identical while at least ``min_peers`` tensors of its role (others)
    moved — a frozen tensor among trained ones, not a run saved twice at one step."""
    peers: dict[str, list[tuple[int, TensorChange]]] = defaultdict(list)
    for c in changes:
        name = parse_name(c.key)
        if name.layer is not None and c.nonfinite_a == c.nonfinite_b == 0 and c.norm_a > 0:
            peers[name.role].append((name.layer, c))
    out = []
    for role, group in sorted(peers.items()):
        moved = [c for _, c in group if c.norm_diff > 0]
        if len(moved) < MOVED["min_peers"] - 1:
            continue
        for layer, c in group:
            if c.norm_diff == 0:
                median = statistics.median(m.relative for m in moved)
                out.append(
                    LAYER_FROZEN.finding(
                        f"layer {layer} {role} is identical in both checkpoints while "
                        f"{len(moved)} of its {len(group) - 1} peers moved (median {median:.3g})",
                        source=file,
                        tensor=c.key,
                        layer=layer,
                        role=role,
                    )
                )
    return out


def _changed_frozen(
    a: Scan, b: Scan, changes: list[TensorChange], expected: Expected | None
) -> list[Finding]:
    """K023: a tensor that moved though it is a constant buffer (by its name, or by the
    config's model) or a weight no optimizer of either checkpoint trains."""
    moved = [c for c in changes if c.norm_diff > 0]
    if not moved:
        return []
    model_key = expected.resolve([c.key for c in moved]) if expected is not None else {}
    trained_a, trained_b = trained_keys(a), trained_keys(b)
    trained = trained_a | trained_b if trained_a is not None and trained_b is not None else None
    # A weight tied to a trained one (a head stored beside its embedding) moves with it,
    # value for value: the same norms before and after.
    twins = {(c.norm_a, c.norm_diff) for c in moved if trained is not None and c.key in trained}
    out = []
    for c in moved:
        name = model_key.get(c.key)
        if _CONSTANT_BUFFER.search(c.key) or (
            expected is not None and name is not None and expected.constant(name)
        ):
            why = "a buffer no training step writes"
        elif trained is not None and c.key not in trained and (c.norm_a, c.norm_diff) not in twins:
            why = "in no param group of the optimizers"
        else:
            continue
        out.append(
            CHANGED_WHILE_FROZEN.finding(
                f"{c.key} ({parse_name(c.key).describe()}) is {why}, yet changed by "
                f"{c.relative:.3g} (||dW||/||W||) between the checkpoints",
                value=c.relative,
                source=b.weights_file,
                tensor=c.key,
            )
        )
    return out
