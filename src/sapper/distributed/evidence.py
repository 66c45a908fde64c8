"""Per-rank evidence for X001, taken before the gradient all-reduce mixes the ranks.

Under DDP one rank's overflow becomes every rank's: after the all-reduce every rank holds
the same Inf gradient at the same step, so the gradient norm cannot say where it started.
What is still the rank's own is measured here, on the device and without a sync (read at
the exchange, with the other columns):

* ``output_absmax`` / ``output_nonfinite_step`` — the largest ``|output|`` of the model's
  training forwards in the window and the first step it was non-finite (a forward hook,
  folded once per window). Whether the output is finite is asked of every forward, by
  its sum (one cheap reduction: a non-finite element makes it non-finite); the largest
  ``|output|`` (a min/max reduction, several times the sum's cost on a CPU) is taken on
  every :attr:`OutputMax.MAGNITUDE_EVERY`-th forward, the same forwards on every rank. A
  growth toward overflow spans many steps, and the step an output goes non-finite is
  still found exactly;
* ``local_grad_norm`` / ``local_grad_nonfinite_step`` — the same for the norm of this
  rank's *local* gradient, per backward, on every backward (the one that names a rank's
  own spike must be there when it happens), computed in a DDP communication hook on each
  bucket just before it is all-reduced (wrapping DDP's default all-reduce hook: one
  sum-of-squares kernel per bucket, the square root taken at the fold).

The window's peak loss (``loss_peak``) comes from the losses the tracker already keeps.
FSDP's reduce-scatter has no public pre-reduce hook, so there only the loss and the
output speak; a DDP model that already has a communication hook keeps it (and sapper
goes without the local norm).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["LocalGradNorm", "OutputMax", "WindowPeak", "first_tensor"]


def first_tensor(out: Any) -> torch.Tensor | None:
    """The output's main tensor: itself, ``.logits`` (Hugging Face), or the first tensor
    of a tuple/list/dict."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    items = out.values() if isinstance(out, dict) else out if isinstance(out, list | tuple) else ()
    for item in items:
        if isinstance(item, torch.Tensor):
            return item
    return None


class WindowPeak:
    """Fold of one value per event (a forward, a backward): the largest value before the
    first non-finite one, and the index of that first non-finite event (-1: none).
    Values after it are left out: by then the all-reduce has spread it to every rank,
    and only "who was first" still tells the ranks apart.

    An event only keeps its value (no kernel): the fold runs at :meth:`take`, once per
    window, over the stacked values, so the per-step host cost is one list append
    whatever the fold does. At most :attr:`KEEP` values wait; beyond that they are
    folded into a carried result (a long window under heavy accumulation).

    Values on an accelerator are folded with tensor ops (no sync: read with the row at
    the exchange). Values on the CPU are already host numbers: one stack and one
    ``tolist`` bring the window's few dozen floats to Python, where the fold costs less
    than the dozen small tensor ops it replaces (each some microseconds of dispatch);
    both folds give the same numbers (float32 values, float32 results)."""

    #: Values kept before folding them into the carried result.
    KEEP = 1024
    #: Fold CPU values as Python floats (the tensor fold is kept for other devices).
    HOST_FOLD = True

    def __init__(self) -> None:
        #: The carried result: device scalars (tensor fold) or floats (host fold).
        self.peak: Any = None
        self.first_bad: Any = None
        self.peak_at: Any = None  # the event of the peak
        self.events = 0
        self._values: list[Any] = []
        self._folded = 0  # events already in the carried peak / first_bad / peak_at

    def add(self, v: Any) -> None:
        self._values.append(v)
        self.events += 1
        if len(self._values) >= self.KEEP:
            self._fold()

    def _fold(self) -> None:
        """Fold the kept values into the carried result (no sync)."""
        values, self._values = self._values, []
        if not values:
            return
        got = self._fold_host(values) if self.HOST_FOLD else None
        if got is None:
            got = self._fold_tensors(values)
        peak, peak_at, first_bad = got
        if self.peak is None or self.first_bad is None or self.peak_at is None:
            self.peak, self.peak_at, self.first_bad = peak, peak_at, first_bad
        elif isinstance(self.peak, float) and isinstance(peak, float):
            if self.first_bad < 0:  # the carried events were all finite
                if peak > self.peak:
                    self.peak, self.peak_at = peak, peak_at
                self.first_bad = first_bad
        else:
            dev = next(t.device for t in (self.peak, peak) if isinstance(t, torch.Tensor))
            carried = [_as_tensor(t, dev) for t in (self.peak, self.peak_at, self.first_bad)]
            peak, peak_at, first_bad = (_as_tensor(t, dev) for t in (peak, peak_at, first_bad))
            open_ = carried[2] < 0  # the carried events were all finite
            higher = open_ & (peak > carried[0])
            self.peak_at = torch.where(higher, peak_at, carried[1])
            self.peak = torch.where(higher, peak, carried[0])
            self.first_bad = torch.where(open_, first_bad, carried[2])
        self._folded += len(values)

    def _fold_tensors(self, values: list[Any]) -> tuple[torch.Tensor, ...]:
        """Peak, its event and the first non-finite event (-1: none) of ``values``, as
        device scalars, event indices counted over the window."""
        vals = self._scalars(values)
        dev = vals.device
        n = vals.numel()
        idx = torch.arange(n, device=dev, dtype=torch.float32)
        bad = ~torch.isfinite(vals)
        # the first non-finite event of this batch of values (n: none)
        first = torch.where(bad, idx, float(n)).amin()
        before = torch.where(idx < first, vals, 0.0)
        peak = before.amax()
        peak_at = before.argmax().to(torch.float32) + self._folded
        first_bad = torch.where(first < n, first + self._folded, -1.0)
        return peak, peak_at, first_bad

    def _fold_host(self, values: list[Any]) -> tuple[float, float, float] | None:
        """:meth:`_fold_tensors` in Python floats for values held on the CPU; None for
        values on another device (or on several)."""
        if _leaf(values[0]).device.type != "cpu":
            return None
        try:
            vals = self._host_scalars(values)
        except RuntimeError:  # values on several devices: the tensor fold moves them
            return None
        n = len(vals)
        first = next((i for i, v in enumerate(vals) if not math.isfinite(v)), n)
        # as the tensor fold: the events from the first non-finite one on count as 0
        before = vals[:first] + [0.0] * (n - first)
        peak = max(before)
        peak_at = float(before.index(peak) + self._folded)
        first_bad = float(first + self._folded) if first < n else -1.0
        return peak, peak_at, first_bad

    def _scalars(self, values: list[Any]) -> torch.Tensor:
        """The kept values as one float vector on the first value's device."""
        return _vector(values)

    def _host_scalars(self, values: list[Any]) -> list[float]:
        """The kept CPU values as float32 numbers in Python floats (one stack)."""
        return _vector(values).tolist()

    def take(self, first_step: int, steps: int) -> dict[str, Any]:
        """``{"peak", "peak_step", "nonfinite_step"}`` for the window (device scalars, or
        floats for values held on the CPU), event indices mapped to the window's steps
        (events per step > 1 under gradient accumulation: event ``e`` of ``n`` is step
        ``e * steps // n``, in integers, so no rounding moves it); a new window."""
        self._fold()
        out: dict[str, Any] = {}
        if (
            self.peak is not None
            and self.first_bad is not None
            and self.peak_at is not None
            and self.events
        ):
            steps, events = max(steps, 1), self.events
            if isinstance(self.peak, float):
                bad = int(self.first_bad)
                at = float(first_step + bad * steps // events)
                out = {
                    "peak": self.peak,
                    "peak_step": float(first_step + int(self.peak_at) * steps // events),
                    "nonfinite_step": -1.0 if bad < 0 else at,
                }
            else:
                at = first_step + _event_step(self.first_bad, steps, events)
                out = {
                    "peak": self.peak,
                    "peak_step": first_step + _event_step(self.peak_at, steps, events),
                    "nonfinite_step": torch.where(self.first_bad < 0, -1.0, at),
                }
        self.peak = self.first_bad = self.peak_at = None
        self.events = 0
        self._folded = 0
        return out


def _event_step(event: torch.Tensor, steps: int, events: int) -> torch.Tensor:
    """The window step (from 0) of an event index held as a float32 device scalar: the
    integer ``event * steps // events`` (a float product can land one step early)."""
    e = event.clamp(min=0).to(torch.int64)
    return torch.div(e * steps, events, rounding_mode="floor").to(torch.float32)


def _leaf(v: Any) -> torch.Tensor:
    """The first tensor of a kept value (a tensor, or a tuple/list of them)."""
    return v if isinstance(v, torch.Tensor) else v[0]


def _as_tensor(v: Any, device: torch.device) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float32, device=device)


def _f32(x: float) -> float:
    """``x`` rounded to float32 (what a float32 tensor would hold)."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:  # beyond float32's range: a float32 sum would be infinite
        return math.copysign(math.inf, x)


def _vector(values: list[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """0-dim tensors as one float32 vector on ``device`` (the first one's by default):
    one stack when they share a device and dtype (the usual case), else one by one."""
    dev = values[0].device if device is None else device
    first = values[0]
    if all(v.device == dev and v.dtype == first.dtype and v.dim() == 0 for v in values):
        return torch.stack(values).float()
    return torch.stack([v.to(dev).float().reshape(()) for v in values])


class OutputMax(WindowPeak):
    """Max ``|output|`` of a module's training forwards, folded per window: every forward
    is checked for non-finite values (its sum), every :attr:`MAGNITUDE_EVERY`-th one also
    gives its largest ``|output|``."""

    #: Forwards between two largest-``|output|`` readings (counted over the run, so the
    #: same forwards on every rank; the first forward is one).
    MAGNITUDE_EVERY = 8

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self._forwards = 0
        self._measured = 0  # forwards of this window with a magnitude
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, _module: Any, _args: Any, out: Any) -> None:
        if not torch.is_grad_enabled():
            return  # evaluation forwards are not the training step's
        t = first_tensor(out)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        t = t.detach()
        # the sum is non-finite when an element is (a sum past float32's range too:
        # outputs that large are an overflow in all but name); half types sum in float32
        total = t.sum(dtype=torch.float32) if t.element_size() < 4 else t.sum()
        n, self._forwards = self._forwards, self._forwards + 1
        if n % self.MAGNITUDE_EVERY:
            self.add(total)
            return
        # one pass, no |output|-sized temporary: max |x| is max(max, -min), taken at the fold
        lo, hi = torch.aminmax(t)
        self._measured += 1
        self.add((lo, hi, total))

    def _scalars(self, values: list[Any]) -> torch.Tensor:
        """Per forward: 0 (NaN when its sum was not finite), plus its largest ``|x|``
        where that was taken."""
        sums = _vector([v[2] if isinstance(v, tuple) else v for v in values])
        vals = sums * 0.0  # inf * 0 and NaN * 0 are NaN
        at = [i for i, v in enumerate(values) if isinstance(v, tuple)]
        if at:
            lows = _vector([values[i][0] for i in at], sums.device)
            highs = _vector([values[i][1] for i in at], sums.device)
            index = torch.tensor(at, device=sums.device)
            vals = vals.index_add(0, index, torch.maximum(highs, lows.neg()))
        return vals

    def _host_scalars(self, values: list[Any]) -> list[float]:
        """:meth:`_scalars` as floats: every kept number in one stack (float32, as the
        tensor fold reads them), then per forward 0 or NaN, or its largest ``|x|``. A
        finite sum means finite elements, so their min and max are finite too."""
        flat: list[torch.Tensor] = []
        for v in values:
            if isinstance(v, tuple):
                flat.extend(v)
            else:
                flat.append(v)
        nums = torch.stack(flat).float().tolist()
        out: list[float] = []
        i = 0
        for v in values:
            if isinstance(v, tuple):
                lo, hi, total = nums[i], nums[i + 1], nums[i + 2]
                i += 3
                out.append(max(hi, -lo) if math.isfinite(total) else math.nan)
            else:
                out.append(0.0 if math.isfinite(nums[i]) else math.nan)
                i += 1
        return out

    def take(self, first_step: int, steps: int) -> dict[str, Any]:
        """As :meth:`WindowPeak.take`; without ``peak`` / ``peak_step`` when no forward
        of the window had its magnitude taken (a window shorter than the cadence)."""
        measured, self._measured = self._measured, 0
        out = super().take(first_step, steps)
        if not measured:
            out.pop("peak", None)
            out.pop("peak_step", None)
        return out

    def remove(self) -> None:
        self._handle.remove()


class LocalGradNorm(WindowPeak):
    """This rank's gradient norm before DDP's all-reduce, one per backward, folded per
    window."""

    def __init__(self, ddp: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        super().__init__()
        self._allreduce = allreduce_hook
        self.process_group = getattr(ddp, "process_group", None)
        self._buckets: list[torch.Tensor] = []  # this backward's bucket Σx² so far
        ddp.register_comm_hook(self, LocalGradNorm._hook)

    @classmethod
    def attach(cls, model: Any) -> LocalGradNorm | None:
        """On a DDP model without a communication hook of its own; else None."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel) or not dist.is_initialized():
            return None
        try:
            return cls(model)
        except Exception:  # a hook of the user's own is registered already
            return None

    @staticmethod
    def _hook(state: LocalGradNorm, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        squares = state._buckets
        squares.append(_square_sum(bucket.buffer().detach()))
        if bucket.is_last():
            # the backward's bucket squares are kept as they are: their sum is taken at
            # the fold, for the whole window at once (no per-step stack and sum)
            state.add(squares[0] if len(squares) == 1 else squares)
            state._buckets = []
        return state._allreduce(state.process_group, bucket)

    def _scalars(self, values: list[Any]) -> torch.Tensor:
        """Per backward the sum of its buckets' squares (float32)."""
        counts = [len(v) if isinstance(v, list) else 1 for v in values]
        flat = _vector([q for v in values for q in (v if isinstance(v, list) else (v,))])
        if max(counts) == 1:
            return flat
        if min(counts) == max(counts):  # the usual case: the same buckets every backward
            return flat.reshape(len(values), counts[0]).sum(1)
        event = torch.repeat_interleave(torch.arange(len(values)), torch.tensor(counts))
        return torch.zeros(len(values), device=flat.device).index_add(
            0, event.to(flat.device), flat
        )

    def _host_scalars(self, values: list[Any]) -> list[float]:
        """:meth:`_scalars` as floats: one stack of every bucket square, each backward's
        sum rounded to float32 (as a float32 sum of two buckets gives it exactly)."""
        flat = [q for v in values for q in (v if isinstance(v, list) else (v,))]
        nums = torch.stack(flat).float().tolist()
        out: list[float] = []
        i = 0
        for v in values:
            if isinstance(v, list):
                k = len(v)
                out.append(_f32(math.fsum(nums[i : i + k])))
                i += k
            else:
                out.append(nums[i])
                i += 1
        return out

    def take(self, first_step: int, steps: int) -> dict[str, Any]:
        """As :meth:`WindowPeak.take`, the peak a norm (the events are its squares: the
        largest square is the largest norm's, a non-finite one a non-finite norm's)."""
        out = super().take(first_step, steps)
        if "peak" in out:
            peak = out["peak"]
            out["peak"] = _f32(math.sqrt(peak)) if isinstance(peak, float) else peak.sqrt()
        return out


def _square_sum(buf: torch.Tensor) -> torch.Tensor:
    """``Σ x²`` of a gradient bucket in float32: a dot product of the flat float32 buffer
    with itself (the quickest reduction on a CPU), else through ``vector_norm``."""
    if buf.dtype == torch.float32 and buf.dim() == 1:
        return torch.dot(buf, buf)
    return torch.linalg.vector_norm(buf, dtype=torch.float32).square()


# DDP checks a hook's annotations as objects; this module's are strings (postponed)
LocalGradNorm._hook.__annotations__ = {
    "state": object,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
