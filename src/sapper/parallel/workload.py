"""What one token costs a transformer layer beyond its FLOPs: memory traffic and kernels.

:class:`Workload` is the model's :class:`~sapper.model.architecture.Architecture` at one
sequence length and dtype, with what the step-cost model prices: the GEMMs and attention
FLOPs of :mod:`sapper.model.flops` (reported vs executed), the parameter split of
:mod:`sapper.model.params`, the optimizer traffic of :mod:`sapper.model.optimizers`, and
the element-wise passes, kernel counts and loss bytes that depend on the code that runs
(fused Megatron kernels or Hugging Face's eager modules). The layout (how the work is
split) is applied in :mod:`sapper.parallel.cost`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapper.errors import InputError
from sapper.model import flops
from sapper.model.architecture import Architecture, architecture_fields, architecture_from_plan
from sapper.model.flops import Gemm, padded_vocab
from sapper.model.optimizers import update_bytes_per_param
from sapper.model.params import model_params
from sapper.plan.schema import Plan

__all__ = ["Gemm", "Workload", "padded_vocab"]


#: Element passes (reads + writes, in activation-sized units) of one normalization:
#: a fused kernel reads x and writes y; Hugging Face's RMSNorm runs ~5 kernels with an
#: fp32 upcast (cast, square, mean, scale, weight multiply), ~8 passes.
_NORM_PASSES = {"fused": 2.0, "unfused_rms": 8.0}
#: MLP activation, per element of the inner width: fused GELU-with-bias reads and writes
#: once (2); fused SwiGLU reads gate and up and writes once (3); eager SiLU(gate)·up runs
#: two kernels (5); eager GELU one (2).
_ACT_PASSES = {(False, True): 2.0, (True, True): 3.0, (False, False): 2.0, (True, False): 5.0}
#: RoPE per query/key element: fused in-place (2); eager q·cos + rotate_half(q)·sin runs a
#: concatenation, two multiplies and an add (~10).
_ROPE_PASSES = {True: 2.0, False: 10.0}


#: Element-wise kernels per layer forward (norms, residual and dropout adds, activation,
#: RoPE), fused (Megatron, Transformer Engine) or Hugging Face eager modules; the backward
#: launches about twice as many. Each costs a fixed launch/tail overhead on top of its bytes.
_ELEM_KERNELS = {"fused": 6.0, "transformers": 18.0}

#: HBM bytes per logit of the loss, forward and backward. Megatron's vocab-parallel cross
#: entropy (unfused, 2021-2024): upcast to fp32 (read 2, write 4), max (4), subtract in
#: place (8), exp in place (8), sum (4), normalize in place (8); backward: softmax minus
#: the one-hot target times the incoming gradient (16), cast to bf16 for the output
#: layer's backward (6): ~60. Hugging Face: ``logits.float()`` (6), log-softmax (8), its
#: backward (12), the cast back (6) and the loss's reductions: ~36.
_CE_BYTES = {"fused": 60.0, "transformers": 36.0}


@dataclass(frozen=True, kw_only=True)
class Workload(Architecture):
    """Per-token costs of one model at one sequence length and dtype."""

    seq_len: int
    #: Forward GEMM FLOPs per token per layer, without the attention core (QKV, output
    #: projection, MLP or the routed experts and router).
    gemm_flops: float
    #: Forward attention-core FLOPs per token per layer, reported convention (4·s·a·d).
    attn_flops: float
    #: Executed fraction of ``attn_flops``: 0.5 for causal flash/SDPA, 1.0 for eager.
    attn_exec: float
    #: Forward element passes (reads + writes) per token per layer that every TP rank
    #: repeats unless sequence parallelism splits them: two norms, two residual adds
    #: (read two, write one), dropout masks. Counts follow ``model.implementation``:
    #: fused kernels (Megatron) or Hugging Face's eager modules.
    elem_replicated: float
    #: Forward element passes per token per layer split by TP: MLP activation, RoPE.
    elem_split: float
    #: Forward element passes per token per layer over the s x s scores (eager only:
    #: QK^T write, softmax read/write, dropout, AV read); split by TP (heads).
    elem_scores: float
    #: Bytes of one activation element (2 for fp16/bf16/fp8 training, 4 for fp32/tf32).
    act_bytes: int
    #: Bytes of one gradient element in the data-parallel reduction: ``precision.grad_dtype``
    #: when given; else the weights' dtype (2 bytes for fp16/bf16/fp8 weights; 4 for fp32
    #: training and for fp32 weights under autocast), as the memory model assumes.
    grad_bytes: int
    #: Parameters of one layer outside the experts (attention, norms, dense MLP, router),
    #: of all experts of one layer (0 for dense models), of the embeddings (with a learned
    #: position table) and of the final norm with the untied output head; the four add up
    #: to the count ``check`` and ``memory`` print (:mod:`sapper.model.params`).
    layer_params: float
    expert_params: float
    embed_params: float
    head_params: float
    #: Optimizer HBM bytes per parameter per update.
    optimizer_bytes: float
    #: The layer's weight GEMMs, with their shapes.
    gemms: tuple[Gemm, ...] = ()
    #: Element-wise kernels per layer forward (for the per-kernel overhead).
    elem_kernels: float = 6.0
    #: HBM bytes per logit of the cross entropy, forward and backward.
    ce_bytes: float = 60.0

    @property
    def implementation(self) -> str:
        """``model.implementation``, for the calibration's coverage
        (:mod:`sapper.parallel.confidence`)."""
        return self.impl

    @property
    def attention(self) -> str:
        """The attention kernel's kind: ``eager``, or ``flash`` for flash and SDPA."""
        return "eager" if self.attn_impl == "eager" else "flash"

    @property
    def params(self) -> float:
        """Parameters of the whole model (experts included, embeddings unpadded)."""
        layer = self.layer_params + self.expert_params
        return self.layers * layer + self.embed_params + self.head_params

    @classmethod
    def from_plan(cls, plan: Plan) -> Workload:
        """The workload of ``plan``'s model; needs the model and the sequence length."""
        if plan.model is None:
            raise InputError("no model in the plan", field="model", expected="a model section")
        s = plan.batch.seq_len
        if s is None:
            raise InputError(
                "no sequence length in the plan", field="batch.seq_len", expected="tokens"
            )
        arch = architecture_from_plan(plan)
        h, a, kv, d = arch.hidden, arch.heads, arch.kv_heads, arch.head_dim
        mlp_width = float(arch.ffn)
        if arch.moe:  # the mean block: leading dense ones, then routed (and shared) experts
            moe = arch.moe_layers / arch.layers
            routed = arch.top_k * arch.expert_ffn + arch.shared_ffn
            mlp_width = moe * routed + (1 - moe) * arch.ffn
        dropout = arch.dropout > 0
        fused = arch.impl != "transformers"
        rms = arch.norm == "rmsnorm"
        norm = _NORM_PASSES["fused" if fused or not rms else "unfused_rms"]
        elem_rep = 2 * norm + 6.0 + (1.0 if dropout else 0.0)
        elem_split = _ACT_PASSES[(arch.gated, fused)] * mlp_width / h
        if arch.rope:
            elem_split += _ROPE_PASSES[fused] * (a + kv) * d / h
        eager = arch.attn_impl == "eager"
        scores = (4.0 + (2.5 if dropout else 0.0)) * a * s / h if eager else 0.0
        dtype = plan.precision.dtype
        low = dtype not in ("fp32", "tf32") and not plan.precision.autocast
        grad_dtype = plan.precision.grad_dtype
        counts = model_params(arch)
        return cls(
            **architecture_fields(arch),  # type: ignore[arg-type]
            seq_len=s,
            gemm_flops=flops.gemm_flops(arch),
            attn_flops=flops.attention_flops(arch, s),
            attn_exec=flops.attention_executed_fraction(arch),
            elem_replicated=elem_rep * h,
            elem_split=elem_split * h,
            elem_scores=scores * h,
            act_bytes=4 if dtype in ("fp32", "tf32") else 2,
            grad_bytes=4 if grad_dtype == "fp32" else 2 if grad_dtype or low else 4,
            layer_params=counts.layer,
            expert_params=counts.expert,
            embed_params=counts.embedding,
            head_params=counts.head,
            optimizer_bytes=update_bytes_per_param(
                plan.optimizer.type, plan.optimizer.momentum
            ),
            gemms=flops.layer_gemms(arch),
            elem_kernels=_ELEM_KERNELS["fused" if fused else "transformers"],
            ce_bytes=_CE_BYTES["fused" if fused else "transformers"],
        )

    def logits_flops(self, tp: int) -> float:
        """Forward FLOPs per token of the output head over the padded vocabulary."""
        return 2.0 * self.hidden * padded_vocab(self.vocab, tp)

    def model_flops_per_token(self) -> float:
        """Training FLOPs per token in the reported convention: the numerator of MFU."""
        return flops.model_flops_per_token(self, self.seq_len)

    def recompute_flops_per_token(self, checkpointing: str) -> float:
        """Extra forward FLOPs per token that activation recomputation adds."""
        return flops.recompute_flops_per_token(self, self.seq_len, checkpointing)
