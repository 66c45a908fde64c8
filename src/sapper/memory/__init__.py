"""Where every byte goes before launch (seed §3, checklist item 5).

``estimate(plan)`` is the analytic model: parameters, gradients and optimizer states
under ZeRO and offload, activations per block (attention kernel, MLP type, GQA, MoE,
dropout, checkpointing, TP/SP/CP), pipeline micro-batches in flight, the loss's logits
and the optimizer's temporaries, with the peak taken over the phases of a step. It is
pure arithmetic (no torch import) so a layout search can call it thousands of times.
"""

from sapper.memory.estimate import MemoryEstimate, MemoryOptions, StageMemory, estimate
from sapper.memory.units import GIB, fmt_bytes

__all__ = ["GIB", "MemoryEstimate", "MemoryOptions", "StageMemory", "estimate", "fmt_bytes"]
