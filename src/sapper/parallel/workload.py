"""What one token costs a transformer layer: FLOPs, memory traffic and parameters.

Everything here depends on the model, the sequence length and the dtype only; the layout
(how the work is split) is applied in :mod:`sapper.parallel.cost`. FLOPs count
multiply-adds as 2; forward counts are per token per layer, and training runs the
forward once and the backward as two forwards' worth (gradients w.r.t. inputs and
weights), so training = 3 x forward. Recomputation adds forward work on top.

Two attention counts are kept apart on purpose. The *reported* count is the convention
of Megatron-LM (Narayanan et al. 2021; ``num_floating_point_operations`` in Megatron-Core),
of PaLM's MFU (6N + 12·L·h·s per token) and, as far as the Llama 3 paper lets one tell, of
its BF16 MFU: QK^T and attention-times-V over the *full* s x s square, 4·s·a·d per token
per layer forward. Causal masking does **not** halve it in the reported count. The
*executed* count is what the kernel really does: FlashAttention-style kernels (flash, and
PyTorch SDPA on GPU) skip the masked half of a causal square (and their backward
recomputes the scores, see :mod:`sapper.parallel.efficiency`), eager attention computes
all of it. MFU (model FLOPs) and HFU (hardware FLOPs: model FLOPs plus the recomputed
forward, Narayanan et al.'s "with recomputation" count) both use the reported count.

The layer's weight GEMMs are listed with their shapes (:class:`Gemm`), so the cost model
can price each at its own efficiency: a GEMM's speed depends on its ``M x N x K``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapper.errors import InputError
from sapper.memory.optimizers import update_bytes_per_param
from sapper.plan.schema import AttentionImpl, Plan, PositionEncoding

__all__ = ["Gemm", "Workload", "padded_vocab"]

#: Megatron pads the vocabulary to a multiple of this x TP so the embedding splits evenly.
VOCAB_PAD_MULTIPLE = 128


def padded_vocab(vocab: int, tp: int) -> int:
    """Vocabulary rows after padding to a multiple of 128 x TP (Megatron's rule)."""
    unit = VOCAB_PAD_MULTIPLE * tp
    return -(-vocab // unit) * unit


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


@dataclass(frozen=True)
class Workload:
    """Per-token costs of one model at one sequence length and dtype."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    seq_len: int
    experts: int
    top_k: int
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
    #: Parameters of one layer outside the experts (attention, norms, dense MLP, router).
    layer_params: float
    #: Parameters of all experts of one layer (0 for dense models).
    expert_params: float
    #: Parameters of the embedding table (unpadded), and of the untied output head.
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
    #: ``model.implementation``, and the attention kernel's kind (``eager``, or ``flash``
    #: for flash and SDPA), for the calibration's coverage (:mod:`sapper.parallel.confidence`).
    implementation: str = "megatron"
    attention: str = "flash"

    @property
    def params(self) -> float:
        """Parameters of the whole model (experts included, embeddings unpadded)."""
        layer = self.layer_params + self.expert_params
        return self.layers * layer + self.embed_params + self.head_params

    @classmethod
    def from_plan(cls, plan: Plan) -> Workload:
        """The workload of ``plan``'s model; needs the model and the sequence length."""
        m = plan.model
        if m is None:
            raise InputError("no model in the plan", field="model", expected="a model section")
        s = plan.batch.seq_len
        if s is None:
            raise InputError(
                "no sequence length in the plan", field="batch.seq_len", expected="tokens"
            )
        h, a, kv, d = m.hidden_size, m.num_heads, m.kv_heads, m.head_size
        ffn = m.ffn_size
        mats = 3 if m.activation.gated else 2
        expert_ffn = m.moe_ffn_hidden_size or ffn
        qkv = 2 * h * (a + 2 * kv) * d
        proj = 2 * a * d * h
        if m.is_moe:
            mlp = 2 * m.experts_top_k * mats * h * expert_ffn + 2 * h * m.num_experts
            mlp_width = m.experts_top_k * expert_ffn
        else:
            mlp = 2 * mats * h * ffn
            mlp_width = ffn
        dropout = m.dropout > 0
        fused = m.implementation != "transformers"
        rms = m.norm_type.value == "rmsnorm"
        norm = _NORM_PASSES["fused" if fused or not rms else "unfused_rms"]
        elem_rep = 2 * norm + 6.0 + (1.0 if dropout else 0.0)
        act_per_mlp = _ACT_PASSES[(m.activation.gated, fused)]
        elem_split = act_per_mlp * mlp_width / h
        if m.position_encoding == PositionEncoding.ROPE:
            elem_split += _ROPE_PASSES[fused] * (a + kv) * d / h
        eager = m.attention_impl == AttentionImpl.EAGER
        scores = (4.0 + (2.5 if dropout else 0.0)) * a * s / h if eager else 0.0
        attn_params = h * (a + 2 * kv) * d + a * d * h
        norm_params = 2 * h * (2 if m.norm_type.value == "layernorm" else 1)
        dense_mlp = 0 if m.is_moe else mats * h * ffn
        router = h * m.num_experts if m.is_moe else 0
        expert_params = m.num_experts * mats * h * expert_ffn if m.is_moe else 0
        up = 2 if m.activation.gated else 1
        gemms: list[Gemm] = [
            Gemm("qkv", (a + 2 * kv) * d, h, "n"),
            Gemm("proj", h, a * d, "k"),
        ]
        if m.is_moe:
            gemms += [
                Gemm("router", m.num_experts, h, "none"),
                Gemm("expert_up", up * expert_ffn, h, "n", expert=True),
                Gemm("expert_down", h, expert_ffn, "k", expert=True),
            ]
        else:
            gemms += [Gemm("mlp_up", up * ffn, h, "n"), Gemm("mlp_down", h, ffn, "k")]
        kernels = _ELEM_KERNELS["fused" if fused else "transformers"]
        dtype = plan.precision.dtype
        act_bytes = 4 if dtype in ("fp32", "tf32") else 2
        low = dtype not in ("fp32", "tf32") and not plan.precision.autocast
        grad_dtype = plan.precision.grad_dtype
        grad_bytes = 4 if grad_dtype == "fp32" else 2 if grad_dtype or low else 4
        opt = plan.optimizer.type
        layer_params = float(attn_params + norm_params + dense_mlp + router)
        embed_params = float(m.vocab_size * h)
        head_params = 0.0 if m.tied_embeddings else float(m.vocab_size * h)
        if m.num_params:
            # A loader knew the exact count: keep the split, scale to the exact total
            # (as the memory model does), so check, memory and plan say one number.
            total = m.num_layers * (layer_params + expert_params) + embed_params + head_params
            f = m.num_params / total if total else 1.0
            layer_params, expert_params = layer_params * f, expert_params * f
            embed_params, head_params = embed_params * f, head_params * f
        return cls(
            hidden=h,
            layers=m.num_layers,
            heads=a,
            kv_heads=kv,
            head_dim=d,
            ffn=ffn,
            vocab=m.vocab_size,
            seq_len=s,
            experts=m.num_experts,
            top_k=m.experts_top_k,
            gemm_flops=float(qkv + proj + mlp),
            attn_flops=float(4 * s * a * d),
            attn_exec=1.0 if eager else 0.5,
            elem_replicated=elem_rep * h,
            elem_split=elem_split * h,
            elem_scores=scores * h,
            act_bytes=act_bytes,
            grad_bytes=grad_bytes,
            layer_params=layer_params,
            expert_params=float(expert_params),
            embed_params=embed_params,
            head_params=head_params,
            optimizer_bytes=update_bytes_per_param(opt, plan.optimizer.momentum),
            gemms=tuple(gemms),
            elem_kernels=kernels,
            ce_bytes=_CE_BYTES["fused" if fused else "transformers"],
            implementation=m.implementation,
            attention="eager" if eager else "flash",
        )

    def logits_flops(self, tp: int) -> float:
        """Forward FLOPs per token of the output head over the padded vocabulary."""
        return 2.0 * self.hidden * padded_vocab(self.vocab, tp)

    def model_flops_per_token(self) -> float:
        """Training FLOPs per token in the reported convention (3 x forward, full-square
        attention, unpadded vocabulary): the numerator of MFU."""
        fwd = self.layers * (self.gemm_flops + self.attn_flops) + 2.0 * self.hidden * self.vocab
        return 3.0 * fwd

    def recompute_flops_per_token(self, checkpointing: str) -> float:
        """Extra forward FLOPs per token that activation recomputation adds (reported
        convention): full recomputes every layer's forward, selective the attention core."""
        if checkpointing == "full":
            return self.layers * (self.gemm_flops + self.attn_flops)
        if checkpointing == "selective":
            return self.layers * self.attn_flops
        return 0.0
