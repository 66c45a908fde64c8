"""Two checkpoints of one run: how far each tensor moved, which layer moved far more than
its peers (K020), and which tensors became non-finite between them (K021).

The relative change ``||B - A|| / ||A||`` is computed piece by piece over tensors read in
aligned chunks from both checkpoints (any two formats), so two models never sit in
memory; only tensors present in both with the same shape are compared.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sapper.checkpoint.checks import aligned
from sapper.checkpoint.naming import parse_name
from sapper.checkpoint.rules import LAYER_FROZEN, LAYER_MOVED, NONFINITE_APPEARED
from sapper.checkpoint.scan import Scan
from sapper.rules.model import Finding

__all__ = ["MOVED", "TensorChange", "diff_scans"]

#: A layer "moved far more" when its relative change is at least ``factor`` times the
#: median of its role's peers (at least ``min_peers`` of them) and ``mads`` robust
#: deviations from it on log scale.
MOVED = {"factor": 5.0, "mads": 6.0, "min_peers": 4, "mad_floor": 0.05}


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


def diff_scans(a: Scan, b: Scan) -> tuple[list[Finding], list[TensorChange], dict[str, Any]]:
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
