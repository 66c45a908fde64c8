"""What an optimizer keeps and moves per parameter: one table for memory and cost.

The memory model counts the state tensors an optimizer holds (momentum-like buffers, one
parameter-sized tensor each); the step-cost model counts the bytes one update reads and
writes per parameter. Both follow from the same number of state tensors, so they are
derived here from one table and cannot drift apart.
"""

from __future__ import annotations

__all__ = ["STATE_TENSORS", "state_tensors", "update_bytes_per_param"]

#: Optimizer -> full-size state tensors per parameter (momentum-like buffers).
STATE_TENSORS: dict[str, int] = {
    "adam": 2,
    "adamw": 2,
    "fusedadam": 2,
    "lamb": 2,
    "lion": 1,
    "adagrad": 1,
    "rmsprop": 1,
    "muon": 1,
    "sgd": 0,  # + one when momentum > 0
    "adafactor": 0,  # factored: rows + columns per matrix (see states.py)
}
#: An optimizer the table does not name is counted as Adam-like (the common case).
DEFAULT_STATES = 2

#: HBM bytes of one update per parameter besides the states: the fp32 master weight read
#: and written (8), the gradient read (4), the low-precision weight copy written (2).
_MASTER_RW, _GRAD_READ, _WEIGHT_WRITE = 8.0, 4.0, 2.0
#: Each fp32 state tensor is read and written once per update.
_STATE_RW = 8.0


def state_tensors(optimizer_type: str, momentum: float = 0.0) -> int:
    """Full-size state tensors of ``optimizer_type`` (``plan.optimizer.type``)."""
    kind = optimizer_type.replace("_", "").replace("-", "").lower()
    if kind == "sgd":
        return 1 if momentum > 0 else 0
    return STATE_TENSORS.get(kind, DEFAULT_STATES)


def update_bytes_per_param(optimizer_type: str, momentum: float = 0.0) -> float:
    """HBM bytes one optimizer update reads and writes per parameter: 30 for Adam (the
    master weight, both moments, the gradient, the low-precision copy)."""
    states = state_tensors(optimizer_type, momentum)
    return _MASTER_RW + _STATE_RW * states + _GRAD_READ + _WEIGHT_WRITE
