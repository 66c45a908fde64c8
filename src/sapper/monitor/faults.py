"""Gradient statistics on sampled steps, and localisation of the first non-finite value.

Both run only on some steps. On a *sampled* step (every ``sample_every`` steps) the
optimizer pre-hook computes every parameter's gradient norm in one fused call
(``torch._foreach_norm``) and the count of exactly-zero gradient elements outside
embedding tables; the host later derives per-layer and per-group norms, all-zero (dead)
parameters and non-finite gradients from them. After a non-finite loss or gradient norm
has been read, :class:`Localiser` arms a forward hook on every module for one step and
records, in execution order, whether each module's output (and input) was finite, and,
through a tensor hook on each output, in backward order whether the gradient arriving
there was finite (an overflow in the backward pass); anomaly mode is never used. Sampled
steps arm the same hooks, so a fault that is present on a sampled step is named exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sapper.monitor.collect import StepSlot
from sapper.monitor.dtensor import Shards, shard_of
from sapper.monitor.structure import first_tensor
from sapper.runtime.records import StepRecord

__all__ = ["HUGE", "GradStats", "Localiser"]


#: A finite magnitude this large in a weight or a gradient is already a fault: nothing in
#: a healthy run comes near it, fp16 cannot hold it and its square overflows fp32.
#: It is reported as huge-but-finite (``extra["huge_params"]``/``["huge_grads"]``), not
#: as non-finite.
HUGE = 1e10


def _stats(
    shards: Shards, zero_for: list[bool] | None, collective: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-tensor L2 norms (float64), largest magnitudes (NaN where any element is NaN or
    Inf is there: finiteness is judged on the values, never on a norm that can overflow)
    and, when ``zero_for`` is given, exactly-zero element counts of the marked tensors.
    ``collective``: reduced across the mesh (one SUM and one MAX all-reduce per mesh), so
    sharded tensors are described whole; else each rank's shards."""
    squares = shards.norms().square()
    largest = shards.norms(math.inf).to(squares.dtype)
    rows = [squares]
    if zero_for is not None:
        zero = squares.new_zeros(())
        rows.append(
            torch.stack(
                [
                    (t == 0).sum().to(squares.dtype) if mark else zero
                    for t, mark in zip(shards.locals, zero_for, strict=True)
                ]
            )
        )
    if collective and shards.sharded:
        bad = (~torch.isfinite(largest)).to(squares.dtype)
        summed = shards.reduce(torch.stack([*rows, bad]))
        peak = shards.reduce(torch.where(bad > 0, 0.0, largest), "max")
        largest = torch.where(summed[-1] > 0, math.nan, peak)
        rows = list(summed[:-1])
    return rows[0].sqrt(), largest, rows[1] if zero_for is not None else None


class GradStats:
    """Per-parameter gradient norms and zero counts on sampled (or armed) steps."""

    def __init__(
        self,
        model: nn.Module,
        params: list[torch.nn.Parameter],
        block_prefix: str | None,
        groups: list[int] | None = None,
    ):
        names = {id(p): n for n, p in model.named_parameters()}
        self.params = params
        #: Optimizer parameter group of each parameter.
        self.groups = groups or [0] * len(params)
        self.names = [names.get(id(p), f"param{i}") for i, p in enumerate(params)]
        embed = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        self.counted = [id(p) not in embed for p in params]
        self.block_prefix = block_prefix + "." if block_prefix else None

    def measure(self, slot: StepSlot, values: bool = False, collective: bool = False) -> None:
        """Queue the device statistics of the current gradients (and, when ``values``,
        of the parameters themselves) into ``slot``. ``collective``: every rank measures
        this step (chosen by its number), so sharded (DTensor) statistics are reduced
        across the mesh; otherwise they are this rank's shards, and the record says so
        (``extra["grad_stats_local"]``)."""
        with_grad = [
            i for i, p in enumerate(self.params) if p.grad is not None and not p.grad.is_sparse
        ]
        if not with_grad:
            return
        grads = Shards([self.params[i].grad for i in with_grad], settle=collective)  # type: ignore[misc]
        zero_for = [self.counted[i] for i in with_grad]
        norms, largest, zeros = _stats(grads, zero_for if any(zero_for) else None, collective)
        slot.add_f("param_grad_norm", norms)
        slot.add_f("param_grad_max", largest)
        if zeros is not None:
            slot.add_f("grad_zero_count", zeros.sum())
        reduced = collective or not grads.sharded
        if reduced:
            numel = sum(self.params[i].numel() for i in with_grad if self.counted[i])
        else:
            numel = sum(t.numel() for t, m in zip(grads.locals, zero_for, strict=True) if m)
        if values:
            # Values are measured on armed steps, which a fault arms on one rank only:
            # never a collective (sharded weights: this rank's shards, and it says so).
            weights = Shards([self.params[i].detach() for i in with_grad])
            value_norms, value_max, _ = _stats(weights, None, collective=False)
            slot.add_f("param_value_norm", value_norms)
            slot.add_f("param_value_max", value_max)
            if weights.sharded:
                slot.extra["param_stats_local"] = True
        slot.extra["grad_sampled"] = True
        if not reduced:
            slot.extra["grad_stats_local"] = True
        slot.decoders.append(self._decoder(with_grad, numel, values))

    def _decoder(self, idx: list[int], numel: int, values: bool) -> Callable[..., None]:
        def decode(slot: StepSlot, f: dict, ints: dict, rec: StepRecord) -> None:
            norms = f.get("param_grad_norm", [])
            if len(norms) != len(idx):
                return
            names = [self.names[i] for i in idx]
            have = set(idx)
            missing = [
                self.names[i]
                for i, p in enumerate(self.params)
                if i not in have and p.requires_grad
            ]
            rec.extra["zero_grad_params"] = [
                n for n, v in zip(names, norms, strict=True) if v == 0
            ] + missing
            largest = f.get("param_grad_max", [])
            bad = [n for n, v in zip(names, largest, strict=False) if not math.isfinite(v)]
            if bad and (values or not rec.skipped):
                rec.extra["nonfinite_grads"] = bad
            huge = _huge(names, largest)
            if huge and (values or not rec.skipped):
                rec.extra["huge_grads"] = huge
            if f.get("grad_zero_count") and numel:
                rec.extra["grad_zero_share"] = f["grad_zero_count"][0] / numel
            finite = [v if math.isfinite(v) else math.inf for v in norms]
            rec.extra["grad_norm_layers"] = self._layers(names, finite)
            if max(self.groups, default=0) > 0:
                sums: dict[int, float] = {}
                for i, v in zip(idx, finite, strict=True):
                    sums[self.groups[i]] = sums.get(self.groups[i], 0.0) + v * v
                rec.extra["grad_norm_groups"] = [
                    math.sqrt(sums.get(g, 0.0)) for g in range(max(self.groups) + 1)
                ]
            if values and f.get("param_value_max"):
                vals = f["param_value_max"]
                bad_vals = [n for n, v in zip(names, vals, strict=False) if not math.isfinite(v)]
                if bad_vals:
                    rec.extra["nonfinite_params"] = bad_vals
                huge_vals = _huge(names, vals)
                if huge_vals:
                    rec.extra["huge_params"] = huge_vals

        return decode

    def _layers(self, names: list[str], norms: list[float]) -> dict[str, float]:
        if self.block_prefix is None:
            return {}
        sums: dict[str, float] = {}
        for name, v in zip(names, norms, strict=True):
            if not name.startswith(self.block_prefix):
                continue
            index = name[len(self.block_prefix) :].split(".", 1)[0]
            key = self.block_prefix + index
            sums[key] = sums.get(key, 0.0) + v * v
        return {k: math.sqrt(v) for k, v in sums.items()}


def _huge(names: list[str], largest: list[float]) -> dict[str, float]:
    """Parameters whose largest finite magnitude reaches :data:`HUGE` (name -> it)."""
    return {n: v for n, v in zip(names, largest, strict=False) if math.isfinite(v) and v >= HUGE}


class Localiser:
    """Forward hooks on every module for one step, recording finiteness in call order."""

    def __init__(self, model: nn.Module, guard: Callable[..., Any]) -> None:
        self.model = model
        self.guard = guard
        self.modules = [(n, m) for n, m in model.named_modules() if m is not model]
        self.names: list[str] = []
        self.grad_names: list[str] = []
        self._handles: list[Any] = []
        self.slot: StepSlot | None = None
        self.armed_runs = 0

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        if self._handles:
            return
        self.armed_runs += 1
        for name, mod in self.modules:
            self._handles.append(mod.register_forward_hook(self._hook(name)))

    def disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def bind(self, slot: StepSlot) -> None:
        """Record into ``slot`` (the step being run)."""
        if self.slot is not slot:
            self.slot = slot
            self.names = names = []
            self.grad_names = grad_names = []
            slot.decoders.append(lambda s, f, i, rec: self._decode(names, grad_names, f, rec))

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self.guard("localise", self._record, name, args, output)

        return hook

    def _record(self, name: str, args: Any, output: Any) -> None:
        raw = first_tensor(output)
        slot = self.slot
        if raw is None or slot is None:
            return
        out = shard_of(raw)  # a DTensor: this rank's part (no collective)
        inp = first_tensor(args)
        inp = shard_of(inp) if inp is not None else None
        with torch.no_grad():
            slot.add_f("mod_out_bad", (~torch.isfinite(out.detach())).any().float())
            if inp is not None:
                bad_in = (~torch.isfinite(inp.detach())).any().float()
            else:
                bad_in = out.new_zeros((), dtype=torch.float32)
            slot.add_f("mod_in_bad", bad_in)
        self.names.append(name)
        if raw.requires_grad:
            grad_names = self.grad_names
            raw.register_hook(
                lambda g: self.guard("localise", self._grad, slot, grad_names, name, g)
            )

    @staticmethod
    def _grad(slot: StepSlot, names: list[str], name: str, grad: torch.Tensor) -> None:
        """Backward reaches ``name``'s output: is the gradient there still finite?"""
        with torch.no_grad():
            grad = shard_of(grad.detach())
            slot.add_f("mod_grad_bad", (~torch.isfinite(grad)).any().float())
        names.append(name)

    @staticmethod
    def _decode(names: list[str], grad_names: list[str], f: dict, rec: StepRecord) -> None:
        outs, ins = f.get("mod_out_bad", []), f.get("mod_in_bad", [])
        for name, o, i in zip(names, outs, ins, strict=False):
            if o:
                rec.extra["nonfinite_module"] = name
                rec.extra["nonfinite_module_input_finite"] = not i
                break
        for name, g in zip(grad_names, f.get("mod_grad_bad", []), strict=False):
            if g:
                rec.extra["nonfinite_grad_module"] = name
                break
