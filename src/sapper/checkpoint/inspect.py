"""``inspect_paths``: one or two checkpoints in, findings and a summary out.

The library entry of ``sapper inspect`` (and of any command that wants a checkpoint's
findings, such as a post-mortem): every tensor is read once, in bounded chunks; the
result holds only statistics.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapper.checkpoint.checks import (
    dtype_findings,
    outlier_findings,
    tensor_findings,
    tied_findings,
)
from sapper.checkpoint.diff import TensorChange, diff_scans
from sapper.checkpoint.expected import Expected, expected_model, model_findings
from sapper.checkpoint.naming import parse_name
from sapper.checkpoint.optim import ParamUpdate, optimizer_findings
from sapper.checkpoint.resume import resume_findings, steps_of
from sapper.checkpoint.rules import DEAD_TENSOR
from sapper.checkpoint.scan import Scan, load_scan
from sapper.checkpoint.tensorstats import TensorStats
from sapper.errors import InputError
from sapper.rules.model import Finding, Severity

__all__ = ["CheckpointReport", "InspectResult", "inspect_checkpoint", "inspect_paths"]


@dataclass
class CheckpointReport:
    """What one checkpoint holds: per-tensor stats, optimizer updates, steps, findings."""

    path: str
    kind: str
    weights: list[TensorStats]
    moments: list[TensorStats]
    updates: list[ParamUpdate]
    steps: dict[str, float]
    findings: list[Finding]
    pieces: dict[str, bool]

    def layers(self) -> list[dict[str, Any]]:
        """Per layer, rolled up over its tensors: values, non-finite count, abs-max, RMS,
        the largest implied Adam update and the findings that name it; worst first."""
        rows: dict[int, dict[str, Any]] = {}
        sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for t in self.weights:
            layer = parse_name(t.key).layer
            if layer is None:
                continue
            row = rows.setdefault(
                layer,
                {
                    "layer": layer,
                    "tensors": 0,
                    "values": 0,
                    "nonfinite": 0,
                    "abs_max": 0.0,
                    "max_update": None,
                    "findings": 0,
                },
            )
            row["tensors"] += 1
            row["values"] += t.numel
            row["nonfinite"] += t.nonfinite
            row["abs_max"] = max(row["abs_max"], t.abs_max)
            sums[layer][0] += t.sum_sq
            sums[layer][1] += t.finite
        for u in self.updates:
            layer = parse_name(u.name).layer
            if layer in rows:
                prev = rows[layer]["max_update"]
                rows[layer]["max_update"] = u.ratio_max if prev is None else max(prev, u.ratio_max)
        for f in self.findings:
            tensor = f.data.get("tensor")
            layer = parse_name(tensor).layer if isinstance(tensor, str) else None
            if layer in rows:
                rows[layer]["findings"] += 1
        for layer, row in rows.items():
            total, count = sums[layer]
            row["rms"] = math.sqrt(total / count) if count else math.nan
        return sorted(
            rows.values(),
            key=lambda r: (-r["findings"], -r["nonfinite"], -(r["max_update"] or 0.0), r["layer"]),
        )

    def roles(self) -> list[dict[str, Any]]:
        """Per role (``self_attn.q_proj.weight``) across the layers: how many, and the
        median, smallest and largest RMS with the layers that hold the extremes."""
        by_role: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for t in self.weights:
            name = parse_name(t.key)
            if name.layer is not None and math.isfinite(t.rms):
                by_role[name.role].append((name.layer, t.rms))
        out = []
        for role, items in sorted(by_role.items()):
            lo, hi = min(items, key=lambda i: i[1]), max(items, key=lambda i: i[1])
            out.append(
                {
                    "role": role,
                    "layers": len(items),
                    "median_rms": statistics.median(r for _, r in items),
                    "min_rms": lo[1],
                    "min_layer": lo[0],
                    "max_rms": hi[1],
                    "max_layer": hi[0],
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        total = sum(s.numel for s in self.weights)
        worst = sorted(self.weights, key=lambda s: (-s.nonfinite, -s.abs_max))[:10]
        return {
            "path": self.path,
            "format": self.kind,
            "tensors": len(self.weights),
            "parameters": total,
            "bytes_read": sum(s.numel * _itemsize(s.dtype) for s in self.weights + self.moments),
            "nonfinite_tensors": sum(1 for s in self.weights + self.moments if s.nonfinite),
            "steps": self.steps,
            "pieces": self.pieces,
            "layers": self.layers(),
            "roles": self.roles(),
            "largest_abs_max": [s.to_json() for s in worst],
            "worst_updates": [
                u.to_json() for u in sorted(self.updates, key=lambda u: -u.ratio_max)[:10]
            ],
        }


def _itemsize(dtype: str) -> int:
    for size, names in (
        (8, ("float64", "int64", "uint64")),
        (4, ("float32", "int32", "uint32")),
        (2, ("float16", "bfloat16", "int16", "uint16")),
    ):
        if dtype in names:
            return size
    return 1


@dataclass
class InspectResult:
    """The findings of ``sapper inspect`` over one checkpoint or a pair."""

    checkpoints: list[CheckpointReport]
    findings: list[Finding]
    changes: list[TensorChange] = field(default_factory=list)
    diff: dict[str, Any] | None = None

    def exit_code(self) -> int:
        return 1 if any(f.severity == Severity.ERROR for f in self.findings) else 0

    def to_json(self) -> dict[str, Any]:
        findings = []
        for f in self.findings:
            item = f.to_json()
            tensor = item.get("data", {}).pop("tensor", None)
            if tensor is not None:
                item["tensor"] = tensor
            findings.append(item)
        summary: dict[str, Any] = {
            "checkpoints": [c.summary() for c in self.checkpoints],
            "errors": sum(1 for f in self.findings if f.severity == Severity.ERROR),
            "warnings": sum(1 for f in self.findings if f.severity == Severity.WARNING),
        }
        if self.diff is not None:
            summary["diff"] = self.diff
        return {"findings": findings, "summary": summary}


def _pieces(scan: Scan) -> dict[str, bool]:
    return {
        "weights": bool(scan.weights.keys()),
        "optimizer": bool(scan.optimizers),
        "scheduler": bool(scan.schedulers),
        "scaler": scan.scaler is not None,
        "trainer_state": scan.trainer_state is not None or scan.lightning is not None,
        "rng": scan.rng,
    }


def _report(
    scan: Scan, jobs: int = 1, threads: int = 1, expected: Expected | None = None
) -> CheckpointReport:
    if expected is not None:  # the given config speaks for the model, not the folder's own
        scan.config = expected.config
    # The numbers of the training state (steps, learning rates, the loss scale) are read
    # and checked first: a file that holds no usable one is refused before any tensor.
    steps = steps_of(scan)
    resume = resume_findings(scan)
    shards = scan.layout.weights
    if jobs > 1 and scan.layout.weights_format == "safetensors" and len(shards) > 1:
        from sapper.checkpoint.workers import shard_stats

        weights = shard_stats(shards, min(jobs, len(shards)), threads)
    else:
        weights = [scan.weights.stats(k) for k in scan.weights.keys()]
    trained = any(v > 0 for v in steps.values())
    # Where fp32 masters are kept apart (DeepSpeed ZeRO 1/2), they are what trains: a
    # 16-bit norm still at 1.0 after a few small steps is rounding, not a dead tensor.
    masters = [scan.masters.stats(k) for k in scan.masters.keys()] if scan.masters else []
    mastered = {s.key for s in masters}
    findings = [
        f
        for f in tensor_findings(weights, trained)
        if not (f.code == DEAD_TENSOR.code and f.data.get("tensor") in mastered)
    ]
    findings += tensor_findings(masters, trained, "fp32 master weight ")
    findings += outlier_findings(weights)
    opt_findings, updates, moments = optimizer_findings(scan)
    moments = masters + moments
    findings += opt_findings
    findings += outlier_findings(
        [
            s
            for s in moments
            if s.key.endswith(".exp_avg_sq") and parse_name(s.key).layer is not None
        ],
        "exp_avg_sq",
        power=0.5,
    )
    findings += tied_findings(scan.weights, scan.config)
    if not scan.weights_are_masters:
        findings += dtype_findings(weights, scan.config)
    findings += resume
    if expected is not None:
        findings += model_findings(
            expected, weights, scan.weights_file, untrained=bool(steps) and not trained
        )
    return CheckpointReport(
        str(scan.layout.path), scan.kind, weights, moments, updates, steps, findings, _pieces(scan)
    )


def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-f.severity.rank, f.code))


def inspect_checkpoint(path: Path) -> CheckpointReport:
    scan = load_scan(Path(path))
    try:
        return _report(scan)
    finally:
        scan.close()


def inspect_paths(
    paths: Sequence[Path | str],
    threads: int = 1,
    jobs: int = 1,
    config: Path | str | None = None,
) -> InspectResult:
    """Inspect one checkpoint, or two of one run (the second later); InputError (exit 2)
    naming the file when one cannot be read. ``config`` (an HF config.json, or a folder
    holding one) is the model the checkpoints should fit: its tensors, its dtype and
    ties, its planned init (:mod:`sapper.checkpoint.expected`).

    The reductions run on ``threads`` intra-op threads (restored after). One by default:
    the work is a few passes over 4 MB pieces, bound by memory bandwidth (~4 GB/s on one
    core), and thousands of short parallel regions stall whenever another process holds a
    core — on a shared 2-core machine two threads measured 0.17-8 s for 1 GB, one thread
    0.23-0.27 s. ``jobs`` > 1 reduces the shards of a sharded safetensors checkpoint in
    that many worker processes (:mod:`sapper.checkpoint.workers`)."""
    if not 1 <= len(paths) <= 2:
        raise InputError(
            "inspect takes one or two checkpoints",
            field="PATH",
            value=len(paths),
            expected="1 or 2 paths",
        )
    scans: list[Scan] = []
    torch: Any = None
    before = 0
    try:
        expected = expected_model(Path(config)) if config is not None else None
        scans = [load_scan(Path(p)) for p in paths]
        # torch reduces a torch checkpoint (reading one imported it) and the difference
        # of two; one safetensors checkpoint is reduced by numpy, with no torch at all
        if len(scans) == 2 or "torch" in sys.modules:
            import torch

            before = torch.get_num_threads()
            torch.set_num_threads(max(1, threads))
        reports = [_report(s, jobs, threads, expected) for s in scans]
        findings = [f for r in reports for f in r.findings]
        changes: list[TensorChange] = []
        diff = None
        if len(scans) == 2:
            diff_found, changes, diff = diff_scans(scans[0], scans[1], expected)
            findings += diff_found
        return InspectResult(reports, _sorted(findings), changes, diff)
    finally:
        for s in scans:
            s.close()
        if torch is not None:
            torch.set_num_threads(before)
