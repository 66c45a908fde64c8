"""What an optimizer keeps and moves per parameter: one table for memory and cost.

The memory model counts the state tensors an optimizer holds (momentum-like buffers, one
parameter-sized tensor each); the step-cost model counts the bytes one update reads and
writes per parameter. Both follow from the same number of state tensors, so they are
derived here from one table and cannot drift apart. How the step runs
(``optimizer.impl``) decides its temporaries and, for 8-bit Adam, the bytes of a state.
"""

from __future__ import annotations

from sapper.model.dtypes import DTYPE_BYTES

__all__ = [
    "IMPL_KIND",
    "STATE_TENSORS",
    "state_bytes_per_param",
    "state_tensors",
    "step_kind",
    "update_bytes_per_param",
]

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


#: ``optimizer.impl`` -> (foreach, fused): whether the step's temporaries span every
#: parameter at once (multi-tensor), one tensor at a time (torch's per-tensor loop), or
#: none (a fused kernel; CPUAdam and bitsandbytes run fused kernels too).
IMPL_KIND: dict[str, tuple[bool, bool]] = {
    "for_loop": (False, False),
    "foreach": (True, False),
    "fused": (False, True),
    "deepspeed_fused": (False, True),
    "deepspeed_cpu": (False, True),
    "apex": (False, True),
    "bnb_8bit": (False, True),
}


def step_kind(impl: str, fused: bool = False) -> tuple[bool, bool]:
    """(foreach, fused) of ``optimizer.impl``; "auto" follows ``optimizer.fused`` until
    the estimate, which knows the device, picks torch's default for it."""
    return IMPL_KIND.get(impl, (not fused, fused))


#: bitsandbytes' block-wise 8-bit states: one byte per value plus an fp32 scale per block.
_BNB_BLOCK = 256


def state_bytes_per_param(
    optimizer_type: str,
    momentum: float = 0.0,
    states_dtype: str = "fp32",
    *,
    eight_bit: bool = False,
) -> float:
    """Bytes of optimizer state per parameter, all moments together (Adafactor's factored
    moments are counted per matrix by the memory model instead)."""
    n = state_tensors(optimizer_type, momentum)
    if eight_bit or states_dtype == "int8":
        return n * (1 + 4 / _BNB_BLOCK)
    return float(n * DTYPE_BYTES[states_dtype])
