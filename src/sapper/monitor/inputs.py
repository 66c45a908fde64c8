"""What the model's forward pass tells the monitor: the batch and the loss.

Read from the arguments of the model's forward call (``input_ids``, ``labels``,
``position_ids``, ``num_items_in_batch``, or the first integer tensor passed
positionally, as nanoGPT-style ``model(x, y)`` loops do) and from its output (an HF
``ModelOutput.loss``, a ``{"loss": ...}`` dict, or a 0-d tensor in a returned tuple).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BatchView", "batch_from_user", "find_loss", "read_batch"]

_INT_TYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


@dataclass
class BatchView:
    ids: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    #: The caller passed the step's total token count (per-token normalisation).
    normalised: bool = False
    #: Sequence length from inputs_embeds when there are no ids.
    seq_len: int | None = None
    samples: int | None = None


def read_batch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> BatchView:
    view = BatchView()
    ids = kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        ids = next((a for a in args if isinstance(a, torch.Tensor) and a.dtype in _INT_TYPES), None)
    if isinstance(ids, torch.Tensor) and ids.dtype in _INT_TYPES and ids.dim() >= 1:
        view.ids = ids
        view.seq_len = ids.shape[-1]
        view.samples = ids.shape[0] if ids.dim() >= 2 else 1
    else:
        embeds = kwargs.get("inputs_embeds")
        if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
            view.seq_len, view.samples = embeds.shape[1], embeds.shape[0]
    labels = kwargs.get("labels")
    if isinstance(labels, torch.Tensor):
        view.labels = labels
    pos = kwargs.get("position_ids")
    if isinstance(pos, torch.Tensor) and pos.numel():
        view.position_ids = pos
    view.normalised = kwargs.get("num_items_in_batch") is not None
    return view


def batch_from_user(batch: Any) -> BatchView:
    """A batch handed to ``Monitor.step`` (dict, tensor, or tuple/list of tensors)."""
    if isinstance(batch, torch.Tensor):
        return read_batch((batch,), {})
    if isinstance(batch, dict):
        return read_batch((), dict(batch))
    if isinstance(batch, (list, tuple)):
        return read_batch(tuple(batch), {})
    data = getattr(batch, "data", None)
    if isinstance(data, dict):  # transformers BatchEncoding
        return read_batch((), dict(data))
    return BatchView()


def holds_tensors(batch: Any) -> bool:
    """Whether a batch handed to ``Monitor.step`` has a tensor where
    :func:`batch_from_user` looks (itself, a dict's values, a sequence's items)."""
    data = getattr(batch, "data", None)
    items = (
        (batch,) if isinstance(batch, torch.Tensor)
        else batch.values() if isinstance(batch, dict)
        else batch if isinstance(batch, (list, tuple))
        else data.values() if isinstance(data, dict)
        else ()
    )  # fmt: skip
    return any(isinstance(item, torch.Tensor) for item in items)


def find_loss(output: Any) -> torch.Tensor | None:
    """The scalar loss in a model's output, if it returns one."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, (tuple, list)):
        loss = next(
            (
                t
                for t in output
                if isinstance(t, torch.Tensor) and t.dim() == 0 and t.is_floating_point()
            ),
            None,
        )
    if loss is None and isinstance(output, torch.Tensor) and output.dim() == 0:
        loss = output
    if isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point():
        return loss
    return None
