"""Layer and role of a state-dict key, across the naming schemes of the frameworks.

Findings speak of "layer 17 `mlp.down_proj.weight`", so peers (the same role in every
layer) can be compared. Wrapper prefixes that torch.compile, FSDP, activation
checkpointing and DDP add (``_orig_mod.``, ``_fsdp_wrapped_module.``,
``_checkpoint_wrapped_module.``, a leading ``module.``) are removed first, so a key
saved from a wrapped model names the same layer as the plain one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TensorName", "parse_name", "strip_wrappers"]

_WRAPPERS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
#: Block containers of the common schemes: HF ``model.layers.N.``, GPT-2 ``transformer.h.N.``,
#: Megatron ``decoder.layers.N.``, BERT ``encoder.layer.N.``, timm/others ``blocks.N.``.
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks|block)\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class TensorName:
    """A key, its wrapper-free form, and the layer/role it belongs to."""

    key: str
    clean: str
    layer: int | None
    #: The key within its block (``self_attn.q_proj.weight``) for a layer's tensor, else
    #: the clean key itself; tensors of one role are peers.
    role: str

    def describe(self) -> str:
        return f"layer {self.layer} {self.role}" if self.layer is not None else self.clean


def strip_wrappers(key: str) -> str:
    """``key`` without the prefixes wrappers add (anywhere in the path for FSDP/compile,
    at the start for DDP's ``module.``)."""
    clean = key
    for wrapper in _WRAPPERS:
        clean = clean.replace(wrapper, "")
    while clean.startswith("module."):
        clean = clean[len("module.") :]
    return clean


def parse_name(key: str) -> TensorName:
    clean = strip_wrappers(key)
    match = _LAYER.search(clean)
    if match is None:
        return TensorName(key, clean, None, clean)
    return TensorName(key, clean, int(match.group(1)), match.group(2))
