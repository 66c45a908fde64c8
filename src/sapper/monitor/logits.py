"""The weight a loss computed *outside* the model entered backward with, read from the
gradient that reaches the model's logits.

When the model returns its loss, the monitor reads that weight directly (a tensor hook
on the loss). A loop that computes ``F.cross_entropy(model(x).logits, y)`` itself hands
the model nothing but logits; their gradient still tells the weight, because a softmax
cross-entropy has a gradient of known shape: for each token row
``g = c · (softmax(z) - onehot(y))`` with ``c = w / N`` for a mean over ``N`` tokens
entering backward with weight ``w``. So:

* the target ``y`` is the row's only negative entry (``argmin g``);
* ``c`` is the least-squares scale of ``g`` on ``softmax(z) - onehot(y)``, and the
  residual says whether the row is a cross-entropy gradient at all (a KL to a teacher,
  an MSE or a loss on the hidden states are not: no estimate then);
* ``w = Σ_rows c``: rows that received no gradient (ignored labels, padding, the shifted
  last position) contribute 0, the others ``w / N`` each, so ``w`` is the number of rows
  with a gradient times the median ``c`` of a few sampled rows.

With gradient accumulation over ``k`` micro-batches and ``loss / k`` the weight is
``1/k``; a loop that forgot the division gives 1 (a per-token sum gives ``N``). The work
is one min/max pass over the logits' gradient and a softmax of at most
:data:`ROWS` rows, on the steps the monitor samples; nothing is copied to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ROWS", "ce_weight", "find_logits", "watch_logits"]

#: Token rows whose softmax is computed to fit the cross-entropy gradient.
ROWS = 64
#: A row fits a cross-entropy gradient when the relative residual of the fit is below
#: this (label smoothing of 0.1 leaves ~0.1 at initialisation).
FIT_RESIDUAL = 0.25
#: The share of sampled rows with a gradient that must fit, else no estimate.
FIT_SHARE = 0.8


def find_logits(output: Any) -> torch.Tensor | None:
    """The model output's logits (``.logits``, a ``"logits"`` key, or the first float
    tensor of 2+ dimensions), when they carry a gradient."""
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, dict):
        logits = output.get("logits")
    if logits is None:
        if isinstance(output, dict):
            pool: Any = output.values()
        elif isinstance(output, (tuple, list)):
            pool = output
        else:
            pool = (output,)
        logits = next(
            (t for t in pool if isinstance(t, torch.Tensor) and t.is_floating_point()), None
        )
    if (
        isinstance(logits, torch.Tensor)
        and logits.is_floating_point()
        and logits.dim() >= 2
        and logits.shape[-1] >= 2
        and logits.requires_grad
    ):
        return logits
    return None


def watch_logits(logits: torch.Tensor, record: Callable[[torch.Tensor], None]) -> None:
    """Keep the softmax of a few strided rows now and, when the gradient arrives, hand
    ``record`` the weight estimate (a 1-element device tensor, NaN when the gradient is
    not a cross-entropy's)."""
    flat = logits.detach().flatten(0, -2)
    n = flat.shape[0]
    if n == 0:
        return
    idx = torch.linspace(0, n - 1, min(n, ROWS), device=flat.device).round().long()
    probs = flat.index_select(0, idx).float().softmax(-1)
    logits.register_hook(lambda grad: record(ce_weight(grad, idx, probs)))


def ce_weight(grad: torch.Tensor, idx: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``w`` such that ``grad = w · ∂(mean cross-entropy)/∂logits`` (see the module
    docstring), from the sampled rows ``idx`` whose softmax is ``probs``."""
    g = grad.detach().flatten(0, -2)
    lo, hi = torch.aminmax(g, dim=-1)
    with_grad = ((hi > 0) | (lo < 0)).sum()
    rows = g.index_select(0, idx).float()
    target = rows.argmin(-1, keepdim=True)
    d = probs.scatter_add(-1, target, torch.full_like(target, -1, dtype=probs.dtype))
    c = (rows * d).sum(-1) / (d * d).sum(-1).clamp_min(1e-30)
    resid = (rows - c.unsqueeze(-1) * d).norm(dim=-1) / rows.norm(dim=-1).clamp_min(1e-30)
    live = rows.abs().amax(-1) > 0
    fit = live & (resid < FIT_RESIDUAL) & (c > 0)
    share = fit.sum() / live.sum().clamp_min(1)
    nan = torch.full_like(c, float("nan"))
    median = torch.where(fit, c, nan).nanmedian()
    weight = with_grad.to(median.dtype) * median
    return torch.where(share >= FIT_SHARE, weight, torch.full_like(weight, float("nan"))).reshape(1)
