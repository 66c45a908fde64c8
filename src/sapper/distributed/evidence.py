"""Per-rank evidence for X001, taken before the gradient all-reduce mixes the ranks.

Under DDP one rank's overflow becomes every rank's: after the all-reduce every rank holds
the same Inf gradient at the same step, so the gradient norm cannot say where it started.
What is still the rank's own is measured here, on the device and without a sync (read at
the exchange, with the other columns):

* ``output_absmax`` / ``output_nonfinite_step`` — the largest ``|output|`` of the model's
  training forwards in the window and the first step it was non-finite (a forward hook:
  one reduction per forward);
* ``local_grad_norm`` / ``local_grad_nonfinite_step`` — the same for the norm of this
  rank's *local* gradient, per backward, computed in a DDP communication hook on each
  bucket just before it is all-reduced (wrapping DDP's default all-reduce hook: one norm
  kernel per bucket).

The window's peak loss (``loss_peak``) comes from the losses the tracker already keeps.
FSDP's reduce-scatter has no public pre-reduce hook, so there only the loss and the
output speak; a DDP model that already has a communication hook keeps it (and sapper
goes without the local norm).
"""

from __future__ import annotations

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
    """Device-side fold of one value per event (a forward, a backward): the largest value
    before the first non-finite one, and the index of that first non-finite event (-1:
    none). Values after it are left out: by then the all-reduce has spread it to every
    rank, and only "who was first" still tells the ranks apart."""

    def __init__(self) -> None:
        self.peak: torch.Tensor | None = None
        self.first_bad: torch.Tensor | None = None
        self.peak_at: torch.Tensor | None = None  # the event of the peak
        self.events = 0

    def add(self, v: torch.Tensor) -> None:
        v = v.detach().float().reshape(())
        k = float(self.events)  # a scalar argument: no host-to-device copy, no sync
        bad = ~torch.isfinite(v)
        if self.peak is None or self.first_bad is None or self.peak_at is None:
            self.first_bad = torch.where(bad, k, -1.0)
            self.peak = torch.where(bad, 0.0, v)
            self.peak_at = torch.zeros_like(self.peak)
        else:
            v = v.to(self.peak.device)
            self.first_bad = torch.where((self.first_bad < 0) & bad, k, self.first_bad)
            higher = (self.first_bad < 0) & (v > self.peak)
            self.peak_at = torch.where(higher, k, self.peak_at)
            self.peak = torch.where(higher, v, self.peak)
        self.events += 1

    def take(self, first_step: int, steps: int) -> dict[str, torch.Tensor]:
        """``{"peak", "peak_step", "nonfinite_step"}`` for the window (device scalars),
        event indices mapped to the window's steps (events per step > 1 under gradient
        accumulation); a new window."""
        out: dict[str, torch.Tensor] = {}
        if (
            self.peak is not None
            and self.first_bad is not None
            and self.peak_at is not None
            and self.events
        ):
            per = max(steps, 1) / self.events
            at = first_step + torch.floor(self.first_bad * per)
            out = {
                "peak": self.peak,
                "peak_step": first_step + torch.floor(self.peak_at * per),
                "nonfinite_step": torch.where(self.first_bad < 0, -1.0, at),
            }
        self.peak = self.first_bad = self.peak_at = None
        self.events = 0
        return out


class OutputMax(WindowPeak):
    """Max ``|output|`` of a module's training forwards, folded per window."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, _module: Any, _args: Any, out: Any) -> None:
        if not torch.is_grad_enabled():
            return  # evaluation forwards are not the training step's
        t = first_tensor(out)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        self.add(t.detach().abs().amax())

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
        self._sq: torch.Tensor | None = None
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
        sq = torch.linalg.vector_norm(bucket.buffer().detach(), dtype=torch.float32).square()
        state._sq = sq if state._sq is None else state._sq + sq.to(state._sq.device)
        if bucket.is_last():
            state.add(state._sq.sqrt())
            state._sq = None
        return state._allreduce(state.process_group, bucket)


# DDP checks a hook's annotations as objects; this module's are strings (postponed)
LocalGradNorm._hook.__annotations__ = {
    "state": object,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
