"""Per-step slots and the one place where device values become host numbers.

While a step runs, the monitor's probes append *device* tensors to the step's
:class:`StepSlot` (the loss, the gradient norm, the loss scale, sample fingerprints...)
and host values (LR, times, flags) that cost nothing to read. Nothing is copied to the
host per step. :meth:`StepCollector.read` runs every ``log_every`` steps (or when asked):
it packs all pending device values into one tensor per device and dtype, copies each to
the host once, and turns every slot into a :class:`StepRecord`.

This is the seam for distributed runs: :meth:`StepCollector.reduce` receives the packed
tensors before the copy, so a subclass can all-reduce (or gather) them across ranks in
the same single transfer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sapper.monitor.dtensor import local_value
from sapper.monitor.fingerprint import finish_fingerprint
from sapper.runtime.records import StepRecord

__all__ = ["Decoder", "StepCollector", "StepSlot"]

#: Fills a record from a slot's host values: ``(slot, floats, ints, record)``.
Decoder = Callable[["StepSlot", dict[str, list[float]], dict[str, list[int]], StepRecord], None]


@dataclass
class StepSlot:
    """Everything observed during one optimizer step, device values not yet read."""

    step: int = -1
    #: Grad-enabled forward passes of the model (micro-batches) in this step.
    micro: int = 0
    step_time_s: float | None = None
    data_time_s: float = 0.0
    tokens: int = 0
    samples: int = 0
    lrs: list[float] = field(default_factory=list)
    clip_threshold: float | None = None
    skipped: bool | None = None
    time: float | None = None
    #: Device values by key (floats, ints); each entry is one or more tensors.
    dev_f: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    dev_i: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    #: Host-side numbers and flags that go to ``record.extra`` as they are.
    extra: dict[str, Any] = field(default_factory=dict)
    #: Host values the record fields take directly (memory, loss given as a float ...).
    host: dict[str, Any] = field(default_factory=dict)
    decoders: list[Decoder] = field(default_factory=list)

    def add_f(self, key: str, value: torch.Tensor) -> None:
        # local_value: a DTensor (FSDP2/TP) is stored as its local tensor, to pack and copy
        self.dev_f.setdefault(key, []).append(local_value(value.detach()))

    def add_i(self, key: str, value: torch.Tensor) -> None:
        self.dev_i.setdefault(key, []).append(local_value(value.detach()))

    def merge(self, other: StepSlot) -> None:
        """Fold a slot's device values and extras into this one (late arrivals)."""
        for key, vals in other.dev_f.items():
            self.dev_f.setdefault(key, []).extend(vals)
        for key, vals in other.dev_i.items():
            self.dev_i.setdefault(key, []).extend(vals)
        self.extra.update(other.extra)
        self.decoders.extend(other.decoders)


def _float_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


class StepCollector:
    """Holds closed slots until the next read; turns them into records."""

    def __init__(self) -> None:
        self.ready: list[StepSlot] = []
        #: Host copies done so far (each is one host–device sync on an accelerator).
        self.transfers = 0

    def add(self, slot: StepSlot) -> None:
        self.ready.append(slot)

    def __len__(self) -> int:
        return len(self.ready)

    def reduce(self, packed: dict[tuple[str, str], torch.Tensor]) -> dict[tuple[str, str], Any]:
        """Hook for cross-rank reduction of the packed values before the host copy
        (identity on one process)."""
        return packed

    def read(self) -> list[StepRecord]:
        """Copy every pending device value to the host at once and build the records."""
        slots, self.ready = self.ready, []
        if not slots:
            return []
        # Pack: (device, kind) -> one flat tensor, remembering where each value lands.
        # Values are binned by device, kind and dtype; a bin's 0-d values (most of them:
        # losses, norms, scales) are stacked in one op rather than flattened one by one,
        # its vectors are concatenated after them, and each bin is converted once: a
        # handful of kernels per read, however many values. The packed tensors are
        # always fresh copies (a reduction may work on them in place).
        bins: dict[tuple[torch.device, str, torch.dtype], tuple[list, list]] = {}
        vec_size: dict[tuple[torch.device, str, torch.dtype], int] = {}
        # (slot, kind, key, bin, scalar?, start, end); a vector's start is after the scalars
        where: list[tuple[int, str, str, tuple[torch.device, str, torch.dtype], bool, int, int]]
        where = []
        for i, slot in enumerate(slots):
            for kind, table in (("f", slot.dev_f), ("i", slot.dev_i)):
                for key, tensors in table.items():
                    for t in tensors:
                        bk = (t.device, kind, t.dtype)
                        held = bins.get(bk)
                        if held is None:
                            held = bins[bk] = ([], [])
                        if t.dim() == 0:
                            where.append((i, kind, key, bk, True, len(held[0]), 0))
                            held[0].append(t)
                            continue
                        flat = t if t.dim() == 1 else t.reshape(-1)
                        a = vec_size.get(bk, 0)
                        vec_size[bk] = a + flat.numel()
                        where.append((i, kind, key, bk, False, a, a + flat.numel()))
                        held[1].append(flat)
        grouped: dict[tuple[str, str], list[torch.Tensor]] = {}
        #: where each bin starts in its group's packed tensor (vectors: after its scalars)
        base: dict[tuple[torch.device, str, torch.dtype], tuple[tuple[str, str], int, int]] = {}
        sizes: dict[tuple[str, str], int] = {}
        for bk, (scalars, vectors) in bins.items():
            device, kind, _ = bk
            group = (str(device), kind)
            parts = ([torch.stack(scalars)] if scalars else []) + vectors
            flat = torch.cat(parts) if len(parts) > 1 or not scalars else parts[0]
            target = _float_dtype(device) if kind == "f" else torch.int64
            offset = sizes.get(group, 0)
            base[bk] = (group, offset, offset + len(scalars))
            sizes[group] = offset + flat.numel()
            grouped.setdefault(group, []).append(flat.to(target))
        packed: dict[tuple[str, str], torch.Tensor] = {
            g: ts[0] if len(ts) == 1 else torch.cat(ts) for g, ts in grouped.items()
        }
        packed = self.reduce(packed)
        host: dict[tuple[str, str], list[Any]] = {}
        for g, t in packed.items():
            # note: this is a CPU-GPU sync point (one per device and dtype, every log_every steps)
            host[g] = t.tolist() if isinstance(t, torch.Tensor) else list(t)
            self.transfers += 1
        floats: list[dict[str, list[float]]] = [{} for _ in slots]
        ints: list[dict[str, list[int]]] = [{} for _ in slots]
        for i, kind, key, bk, scalar, a, b in where:
            target = floats[i] if kind == "f" else ints[i]
            g, scalars_at, vectors_at = base[bk]
            if scalar:
                target.setdefault(key, []).append(host[g][scalars_at + a])
            else:
                target.setdefault(key, []).extend(host[g][vectors_at + a : vectors_at + b])
        return [self._record(s, floats[i], ints[i]) for i, s in enumerate(slots)]

    def _record(
        self, slot: StepSlot, f: dict[str, list[float]], ints: dict[str, list[int]]
    ) -> StepRecord:
        rec = StepRecord(step=slot.step)
        losses = f.get("user_loss") or f.get("model_loss")
        if losses is None and "loss" in slot.host:
            losses = [slot.host["loss"]]
        if losses:
            if "user_loss" not in f and slot.extra.get("loss_normalised"):
                rec.loss = math.fsum(
                    losses
                )  # each micro-batch already divided by the step's tokens
            else:
                rec.loss = math.fsum(losses) / len(losses)
        if f.get("grad_norm"):
            rec.grad_norm = f["grad_norm"][-1]
        rec.clip_threshold = slot.clip_threshold
        if rec.grad_norm and rec.clip_threshold and math.isfinite(rec.grad_norm):
            # The factor clipping multiplied the gradients by (1.0: not engaged).
            rec.extra["clip_coef"] = min(1.0, rec.clip_threshold / rec.grad_norm)
        if slot.lrs:
            rec.lr = slot.lrs[0]
            rec.lrs = list(slot.lrs) if len(slot.lrs) > 1 else None
        elif f.get("lr"):
            rec.lr = f["lr"][0]
            rec.lrs = f["lr"] if len(f["lr"]) > 1 else None
        if f.get("loss_scale"):
            rec.loss_scale = f["loss_scale"][0]
        rec.skipped = slot.skipped
        rec.step_time_s = slot.step_time_s
        if slot.micro:
            rec.data_time_s = slot.data_time_s
        if slot.tokens:
            rec.tokens = slot.tokens
        if slot.samples:
            rec.samples = slot.samples
        if slot.step_time_s and slot.tokens:
            rec.tokens_per_s = slot.tokens / slot.step_time_s
        if slot.step_time_s and slot.samples:
            rec.samples_per_s = slot.samples / slot.step_time_s
        rec.time = slot.time
        for key, value in slot.host.items():
            if key != "loss" and not key.startswith("_") and hasattr(rec, key):
                setattr(rec, key, value)
        rec.extra.update(slot.extra)
        if slot.micro:
            rec.extra["grad_accum"] = slot.micro
        grads = f.get("loss_grad")
        if not grads and f.get("logits_weight"):
            # A loss computed outside the model, weighed at the logits (NaN: the
            # gradient there was not a cross-entropy's).
            grads = [w for w in f["logits_weight"] if math.isfinite(w)]
            if grads:
                rec.extra["loss_weight_from"] = "logits"
        scale = rec.loss_scale or 1.0
        if grads and scale:
            weights = [g / scale for g in grads]
            rec.extra["loss_weight"] = math.fsum(weights) / len(weights)
        if ints.get("sample_hash"):
            lengths = slot.host.get("_hash_lengths") or []
            hashes, raw = [], ints["sample_hash"]
            for n, length in lengths:
                hashes.extend(
                    finish_fingerprint(h, length) for h in raw[len(hashes) : len(hashes) + n]
                )
            rec.extra["sample_hashes"] = hashes
        if ints.get("position_max"):
            pos = max(ints["position_max"])
            rec.extra["max_position"] = max(pos, rec.extra.get("max_position", -1))
        if ints.get("micro_tokens"):
            rec.extra["micro_tokens"] = ints["micro_tokens"]
        for decode in slot.decoders:
            decode(slot, f, ints, rec)
        return rec
