"""Check g: measured memory and step time of the toy, next to the memory estimator's numbers.

The toy has the big model's architecture, so the estimator's arithmetic for it can be
checked against a real step of the real modelling code: parameters, gradients and
optimizer states are counted exactly from the live tensors; activations are the bytes
autograd saved for backward (unique storages, parameters excluded, through
``saved_tensors_hooks``); the peak of the whole step is read from the CUDA allocator or,
on CPU, from the profiler's allocation events on top of the bytes alive at the start.
The estimate is asked for the same toy, batch and optimizer with no runtime overheads
(context, NCCL, fragmentation), since the measurement counts tensor bytes only.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sapper.errors import SapperError
from sapper.rules.model import Finding
from sapper.smoke.batches import Batch
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.rules import MEASURED_VS_ESTIMATE
from sapper.smoke.step import StepOptions

__all__ = ["SavedTensorMeter", "estimate_toy", "measure_step", "run", "toy_plan"]

MIB = 2**20


class _Saved:
    """One tensor saved for backward; releases its bytes from the meter when autograd
    drops it (after the backward that used it)."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, meter: SavedTensorMeter, tensor: torch.Tensor) -> None:
        self.meter, self.tensor = meter, tensor
        storage = tensor.untyped_storage()
        self.key = (storage.data_ptr(), tensor.device.type)
        meter._acquire(self.key, storage.nbytes())

    def __del__(self) -> None:
        self.meter._release(self.key)


class SavedTensorMeter:
    """Live and peak bytes of the tensors autograd saves for backward while open.

    Storages shared by several saved tensors count once; parameters (saved by every
    matmul) are excluded when given, so the number is the activations alone. Regions
    under ``torch.utils.checkpoint`` register their own hooks and save almost nothing,
    which is exactly what checkpointing is meant to achieve."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._skip = {p.untyped_storage().data_ptr() for p in exclude}
        self._refs: dict[tuple[int, str], list[int]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> Any:
        if tensor.untyped_storage().data_ptr() in self._skip or tensor.device.type == "meta":
            return tensor
        return _Saved(self, tensor)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _acquire(self, key: tuple[int, str], nbytes: int) -> None:
        entry = self._refs.setdefault(key, [0, nbytes])
        if entry[0] == 0:
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[0] += 1

    def _release(self, key: tuple[int, str]) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._refs[key]

    def __enter__(self) -> SavedTensorMeter:
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(
        _bytes(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        for state in opt.state.values()
    )


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The profiler's C++ side prints start/stop lines straight to fd 2; keep them out of
    the report."""
    try:
        fd = os.dup(2)
    except OSError:
        yield
        return
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(fd, 2)
            os.close(fd)


def _cpu_step_peak(run: Any) -> int | None:
    """Peak of allocated minus freed bytes during ``run()`` (CPU allocator events); None
    when this torch build's profiler does not expose them."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        run()
    try:
        raw = p.profiler.kineto_results.events()
    except (AttributeError, RuntimeError):
        return None
    events = [e for e in raw if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def measure_step(
    ctx: SmokeContext, model: nn.Module, batch: Batch, repeats: int = 5
) -> dict[str, Any]:
    """Measured bytes per category, the step's peak, and the median step time."""
    opt = ctx.optimizer(model)
    device = ctx.device

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        ctx.step(model, [batch], StepOptions())
        opt.step()

    step()  # creates the optimizer states
    params = _bytes(model.parameters())
    states = _state_bytes(opt)
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        opt.zero_grad(set_to_none=True)
        ctx.step(model, [batch], StepOptions())
    grads = _bytes(p.grad for p in model.parameters() if p.grad is not None)
    opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        opt.zero_grad(set_to_none=True)
    else:
        start = params + states + _bytes(batch.values())
        rise = _cpu_step_peak(step)
        peak = None if rise is None else start + rise
        opt.zero_grad(set_to_none=True)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # note: a sync point, for timing only
        times.append(time.perf_counter() - t0)
    tokens = int(batch["attention_mask"].sum())
    seconds = statistics.median(times)
    return {
        "params": params,
        "grads": grads,
        "optimizer": states,
        "activations": meter.peak_bytes,
        "peak": peak,
        "step_time_s": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "tokens": tokens,
    }


def hf_config_of(model: nn.Module) -> dict[str, Any] | None:
    """The Hugging Face config of a model a user factory returned (``model.config``), or
    None for a model without one."""
    cfg = getattr(model, "config", None)
    if not hasattr(cfg, "to_dict") or not isinstance(getattr(cfg, "model_type", None), str):
        return None
    try:
        raw = cfg.to_dict()
    except Exception:  # a config object that cannot describe itself
        return None
    if not isinstance(raw, dict) or not raw.get("model_type"):
        return None
    raw.pop("dtype", None)
    raw.pop("torch_dtype", None)
    return raw


def toy_plan(ctx: SmokeContext, batch: Batch, model: nn.Module | None = None) -> Any:
    """The Plan of the toy: its HF config read like any config.json (the scaled config, or
    ``model.config`` when a user factory returned a Hugging Face model), plus the smoke
    batch, fp32 and the optimizer the check runs. None when there is no config to read."""
    from sapper.plan.load import build_plan
    from sapper.plan.readers.hf_config import read_hf_config
    from sapper.plan.sources import PlanSource

    config = ctx.factory.hf_config
    if config is None and model is not None:
        config = hf_config_of(model)
    if config is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config, default=str))
        model_src = read_hf_config(path)
    model_src.name = "toy config"
    over = PlanSource(name="smoke")
    micro, seq = batch["input_ids"].shape
    over.set("batch.micro_batch_size", int(micro))
    over.set("batch.seq_len", int(seq))
    over.set("batch.gradient_accumulation_steps", 1)
    over.set("precision.dtype", "fp32")
    over.set("optimizer.type", "adamw")
    over.set("optimizer.lr", ctx.config.lr)
    over.set("model.num_params", ctx.num_params)
    return build_plan([model_src, over]).plan


def estimate_toy(
    ctx: SmokeContext, batch: Batch, model: nn.Module | None = None
) -> dict[str, Any] | None:
    """The memory estimator's numbers for the toy (tensor bytes only, CPU kernels when the
    toy runs on CPU)."""
    from sapper.memory import MemoryOptions, estimate

    plan = toy_plan(ctx, batch, model)
    if plan is None:
        return None
    device = "cuda" if ctx.device.type == "cuda" else "cpu"
    est = estimate(plan, MemoryOptions(context_bytes=0, nccl_bytes=0, fragmentation=0.0,
                                       device=device))
    stage = est.stages[est.peak_stage]
    forward = stage.phases.get("forward", {})
    return {
        "params": stage.breakdown.get("params", 0),
        "grads": max(ph.get("grads", 0) for ph in stage.phases.values()),
        "optimizer": max(ph.get("optimizer", 0) for ph in stage.phases.values()),
        "activations": forward.get("activations", 0),
        "peak": est.tensor_peak_bytes,
        "peak_phase": est.peak_phase,
    }


def _ratio(measured: float | None, estimated: float) -> float | None:
    if measured is None:
        return None
    return measured / estimated if estimated else float("inf")


def _mib(x: float | None) -> str:
    return "N/A" if x is None else f"{x / MIB:.2f}"


def run(ctx: SmokeContext) -> list[Finding]:
    tol = ctx.config.tolerances
    batch = ctx.batches(1)[0]
    model = ctx.fresh_model(train=True)
    measured = measure_step(ctx, model, batch)
    why_none = "the model has no Hugging Face config (model.config) for the estimator"
    try:
        est = estimate_toy(ctx, batch, model)
    except SapperError as exc:  # the estimator cannot read this architecture
        est, why_none = None, f"the estimator cannot read the toy ({exc})"
    numbers: dict[str, Any] = {"measured": measured, "estimated": est}
    speed = (
        f"step {measured['step_time_s'] * 1e3:.1f} ms, "
        f"{measured['tokens_per_s']:,.0f} tokens/s"
    )
    if est is None:
        return [
            verdict(
                MEASURED_VS_ESTIMATE,
                True,
                f"measured peak {_mib(measured['peak'])} MiB (activations "
                f"{measured['activations'] / MIB:.2f} MiB), {speed}; no estimate: {why_none}",
                **numbers,
            )
        ]
    off = []
    for cat in ("params", "grads", "optimizer"):
        r = _ratio(measured[cat], est[cat])
        numbers[f"{cat}_ratio"] = r
        if abs(r - 1.0) > tol.memory_states_rel_err:
            off.append(f"{cat} ×{r:.2f}")
    for cat in ("activations", "peak"):
        r = _ratio(measured[cat], est[cat])
        numbers[f"{cat}_ratio"] = r
        if r is not None and not (
            1 / tol.memory_activation_factor <= r <= tol.memory_activation_factor
        ):
            off.append(f"{cat} ×{r:.2f}")
    table = ", ".join(
        f"{cat} {_mib(measured[cat])}/{_mib(est[cat])}"
        for cat in ("params", "grads", "optimizer", "activations", "peak")
    )
    message = f"measured/estimated MiB: {table}; {speed}"
    if off:
        message = f"estimate off ({', '.join(off)}): " + message
    ratios = [numbers[f"{c}_ratio"] for c in ("params", "grads", "optimizer", "activations")]
    ratios += [numbers["peak_ratio"]] if numbers["peak_ratio"] is not None else []
    worst = max(ratios, key=lambda r: abs(r - 1.0))
    return [
        verdict(MEASURED_VS_ESTIMATE, not off, message, value=worst, **numbers)
    ]
