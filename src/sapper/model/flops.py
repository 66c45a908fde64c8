"""What one token costs the model in FLOPs: its weight GEMMs and its attention core.

FLOPs count multiply-adds as 2; forward counts are per token per layer, and training runs
the forward once and the backward as two forwards' worth (gradients w.r.t. inputs and
weights), so training = 3 x forward. Recomputation adds forward work on top.

Two attention counts are kept apart on purpose. The *reported* count is the convention
of Megatron-LM (Narayanan et al. 2021; ``num_floating_point_operations`` in Megatron-Core),
of PaLM's MFU (6N + 12·L·h·s per token) and, as far as the Llama 3 paper lets one tell, of
its BF16 MFU: QK^T and attention-times-V over the *full* s x s square, 4·s·a·d per token
per layer forward. Causal masking does **not** halve it in the reported count. The
*executed* count is what the kernel really does: FlashAttention-style kernels (flash, and
PyTorch SDPA on GPU) skip the masked half of a causal square, eager attention computes
all of it. MFU (model FLOPs) and HFU (hardware FLOPs: model FLOPs plus the recomputed
forward, Narayanan et al.'s "with recomputation" count) both use the reported count.

The layer's weight GEMMs are listed with their shapes (:class:`Gemm`), so a cost model
can price each at its own efficiency: a GEMM's speed depends on its ``M x N x K``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from sapper.model.architecture import Architecture

__all__ = [
    "VOCAB_PAD_MULTIPLE",
    "Gemm",
    "attention_executed_fraction",
    "attention_flops",
    "gemm_flops",
    "layer_gemms",
    "model_flops_per_token",
    "padded_vocab",
    "recompute_flops_per_token",
]

#: Megatron pads the vocabulary to a multiple of this x TP so the embedding splits evenly.
VOCAB_PAD_MULTIPLE = 128

_N = TypeVar("_N")  # an int, or a numpy array of degrees (numpy is not imported here)


def padded_vocab(vocab: int, tp: _N) -> _N:
    """Vocabulary rows after padding to a multiple of 128 x TP (Megatron's rule); ``tp``
    may be an array of degrees."""
    unit = VOCAB_PAD_MULTIPLE * tp  # type: ignore[operator]
    return -(-vocab // unit) * unit  # type: ignore[operator,no-any-return]


@dataclass(frozen=True)
class Gemm:
    """One weight GEMM of a layer: ``n`` output features from ``k`` input features per
    token, split ``n``-wise (column parallel: QKV, MLP up) or ``k``-wise (row parallel:
    attention output, MLP down) by TP, or not at all (``"none"``: the MoE router)."""

    name: str
    n: int
    k: int
    split: str
    #: Routed-expert GEMM: each token passes through ``top_k`` of the experts.
    expert: bool = False
    #: Share of the blocks that run it (a MoE model's leading dense blocks run a dense
    #: MLP, the others their experts): a per-layer mean.
    share: float = 1.0

    def flops(self, top_k: int) -> float:
        """Forward FLOPs per token, a mean over the blocks."""
        return 2.0 * self.n * self.k * (top_k if self.expert else 1) * self.share


def _attention_gemms(arch: Architecture) -> list[Gemm]:
    h, a, d = arch.hidden, arch.heads, arch.head_dim
    proj = Gemm("proj", h, a * arch.value_dim, "k")
    if not arch.mla:
        return [Gemm("qkv", a * d + arch.kv_heads * (d + arch.value_dim), h, "n"), proj]
    gemms = [
        Gemm("kv_down", arch.kv_lora + arch.rope_dim, h, "none"),
        Gemm("kv_up", a * (d - arch.rope_dim + arch.value_dim), arch.kv_lora, "n"),
    ]
    if arch.q_lora:
        gemms += [Gemm("q_down", arch.q_lora, h, "none"), Gemm("q_up", a * d, arch.q_lora, "n")]
    else:
        gemms.append(Gemm("q", a * d, h, "n"))
    return [*gemms, proj]


def layer_gemms(arch: Architecture) -> tuple[Gemm, ...]:
    """The weight GEMMs one token passes through in one block (a mean block: the share of
    each says how many blocks run it)."""
    h = arch.hidden
    up = 2 if arch.gated else 1
    gemms = _attention_gemms(arch)
    if not arch.moe:
        return (*gemms, Gemm("mlp_up", up * arch.ffn, h, "n"), Gemm("mlp_down", h, arch.ffn, "k"))
    moe = arch.moe_layers / arch.layers
    if arch.first_dense:
        dense = arch.first_dense / arch.layers
        gemms += [Gemm("mlp_up", up * arch.ffn, h, "n", share=dense),
                  Gemm("mlp_down", h, arch.ffn, "k", share=dense)]
    gemms += [
        Gemm("router", arch.experts, h, "none", share=moe),
        Gemm("expert_up", up * arch.expert_ffn, h, "n", expert=True, share=moe),
        Gemm("expert_down", h, arch.expert_ffn, "k", expert=True, share=moe),
    ]
    if arch.shared_ffn:
        gemms += [Gemm("shared_up", up * arch.shared_ffn, h, "n", share=moe),
                  Gemm("shared_down", h, arch.shared_ffn, "k", share=moe)]
    return tuple(gemms)


def gemm_flops(arch: Architecture) -> float:
    """Forward GEMM FLOPs per token per layer, without the attention core (the attention
    projections, the MLP or the routed experts, router and shared experts)."""
    return float(sum(g.flops(arch.top_k) for g in layer_gemms(arch)))


def attention_flops(arch: Architecture, seq_len: int) -> float:
    """Forward attention-core FLOPs per token per layer, reported convention: Q·Kᵀ and
    P·V over the full square, 2·s·a·(d_qk + d_v) (4·s·a·d when both widths are d)."""
    return float(2 * seq_len * arch.heads * (arch.head_dim + arch.value_dim))


def attention_executed_fraction(arch: Architecture) -> float:
    """Executed share of :func:`attention_flops`: 0.5 for causal flash/SDPA, 1 for eager."""
    return 1.0 if arch.attn_impl == "eager" else 0.5


def model_flops_per_token(arch: Architecture, seq_len: int) -> float:
    """Training FLOPs per token in the reported convention (3 x forward, full-square
    attention, unpadded vocabulary): the numerator of MFU, ``6N + 12·L·a·d·s`` with N the
    parameters a token's matmuls touch."""
    per_layer = gemm_flops(arch) + attention_flops(arch, seq_len)
    return 3.0 * (arch.layers * per_layer + 2.0 * arch.hidden * arch.vocab)


def recompute_flops_per_token(arch: Architecture, seq_len: int, checkpointing: str) -> float:
    """Extra forward FLOPs per token that activation recomputation adds (reported
    convention): full recomputes every layer's forward, selective the attention core."""
    if checkpointing == "full":
        return arch.layers * (gemm_flops(arch) + attention_flops(arch, seq_len))
    if checkpointing == "selective":
        return arch.layers * attention_flops(arch, seq_len)
    return 0.0
