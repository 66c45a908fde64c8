"""Activation memory of one transformer block for one micro-batch (seed §3.1, §3.2).

What a block keeps for backward depends on the code that runs it, so two profiles are
modelled tensor by tensor:

* ``megatron``: fused kernels (fused norm, GELU/SwiGLU, RoPE, core attention). This is the
  accounting of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", §4): ``sbh(34 + 5as/h)`` per layer with 16-bit activations,
  dropout on, MHA and a 4h GELU MLP, with the TP, TP+SP, selective and full-recompute
  variants falling out of which tensors are sharded or recomputed.
* ``transformers``: Hugging Face modules as they run under PyTorch eager. Norms, RoPE
  and some activations are composed of elementwise ops that each keep their inputs;
  under ``torch.autocast`` every projection keeps its own low-precision copy of its
  input, and the residual stream stays fp32.

Sizes are bytes per micro-batch on one GPU: tokens are divided by context parallelism,
heads and MLP width by tensor parallelism, and the tensors between the TP regions by TP
too when sequence parallelism is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sapper.memory.inputs import Shape

__all__ = [
    "BlockActivations",
    "attention_kernel",
    "block_activations",
    "embedding_saved",
    "tokens",
]


def _div(n: int, k: int) -> int:
    return -(-n // k)


@dataclass(frozen=True)
class BlockActivations:
    """One block, one micro-batch, one GPU (bytes)."""

    saved: int  # kept for backward without checkpointing
    selective: int  # kept with selective recompute (attention core recomputed)
    boundary: int  # kept with full checkpointing (the block's input)
    fwd_extra: int  # peak of the block's own bytes during its forward (saved + in flight)
    #: Moments of the block's backward: (bytes of this block alive then — what it still
    #: keeps plus the gradients of its intermediates in flight —, share of the block's
    #: weight gradients already produced). MLP core, norm 2, attention core, norm 1.
    moments: tuple[tuple[int, float], ...]
    #: The first norm keeps the block's input itself (so a checkpointed block's saved
    #: input and its recomputed tensors share it).
    input_in_saved: bool = True
    #: Alive while a checkpointed block runs its forward without saving (bytes).
    fwd_ckpt: int = 0
    #: Extra bytes at each of ``moments`` when the block was recomputed (checkpointed):
    #: tensors the recompute leaves alive into the block's backward. Empty: none.
    ckpt_extra: tuple[int, ...] = ()

    def kept(self, mode: str) -> int:
        return {"none": self.saved, "selective": self.selective, "full": self.boundary}[mode]


def tokens(sh: Shape) -> int:
    """Tokens of one micro-batch on one GPU (context parallelism splits the sequence)."""
    return sh.micro_batch * sh.seq // sh.cp


def _dims(sh: Shape) -> tuple[int, int, int, int, float]:
    t = sh.tp
    q = _div(sh.heads, t) * sh.head_dim
    kv = max(sh.kv_heads // t, 1) * sh.head_dim
    heads = _div(sh.heads, t)
    rep = 1 / t if sh.sp else 1.0  # tensors outside the TP regions (SP shards them)
    return q, kv, heads, _div(sh.ffn if not sh.moe else sh.expert_ffn, t), rep


def _mask_bytes(sh: Shape, site: str, device: str, compute: int) -> int:
    """Bytes per element of the dropout mask at ``site`` (0 without dropout there): CUDA
    keeps a bool mask; the CPU kernel keeps a scaled noise tensor."""
    if sh.dropout_at(site) <= 0:
        return 0
    return 1 if device == "cuda" else compute


def _act_extra(act: str) -> int:
    """Width-sized tensors an activation keeps beyond its input and output."""
    # 0.5*x*(1+tanh(√(2/π)(x+0.044715x³))) as separate ops keeps tanh(.), 0.5x and 1+tanh(.)
    return 3 if act == "gelu_tanh_python" else 0


def _weight_shares(sh: Shape) -> tuple[float, float, float]:
    """Shares of a block's weights in the MLP's output projection, the whole MLP, and
    the MLP plus the attention's output projection (gradients appear in that order)."""
    h, f = sh.hidden, sh.expert_ffn if sh.moe else sh.ffn
    q, kv = sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim
    n_in = 2 if sh.gated else 1
    experts = sh.experts if sh.moe else 1
    mlp = experts * (n_in + 1) * h * f
    attn = h * (q + 2 * kv) + q * h
    total = mlp + attn
    return experts * f * h / total, mlp / total, (mlp + q * h) / total


def _moments(
    sh: Shape,
    n: int,
    *,
    s_attn: float,
    s_mlp: float,
    norm_saved: float,
    norm_bwd: float,
    resid: float,
    mlp_grads: float,
    core_freed: float,
    core_grads: float,
) -> tuple[tuple[int, float], ...]:
    """The four moments of a block's backward, per token then scaled by ``n`` tokens."""
    down, mlp_all, mlp_o = _weight_shares(sh)
    m1 = s_attn + s_mlp + mlp_grads + resid  # MLP core: its gradients in flight
    m2 = s_attn + norm_saved + norm_bwd + resid  # second norm (MLP tensors freed)
    m3 = s_attn - core_freed + core_grads + resid  # attention core
    m4 = norm_saved + norm_bwd + resid  # first norm
    return (
        (int(m1 * n), down),
        (int(m2 * n), mlp_all),
        (int(m3 * n), mlp_o),
        (int(m4 * n), 1.0),
    )


def _rms_kept(width: int, dtype: int) -> int:
    """Per token, what a Hugging Face RMSNorm over ``width`` features in ``dtype`` keeps:
    its fp32 input (the input itself when it is fp32), rsqrt, the normalized fp32 product
    (fp32) or its cast back (lower precision)."""
    return 8 * width + 4 if dtype == 4 else 6 * width + 4


def _latent_attention(sh: Shape, c: int, math: bool) -> float:
    """Per token, what DeepSeek's multi-head latent attention keeps (Hugging Face
    ``DeepseekV3Attention``): the query latent's norm and the norm's output (the up
    projection's input); the compressed key/value latent's norm (in fp32 its input is a
    view that keeps the rotary key's columns alive too) and output; the up projection's
    output, which the values are a view of; the attention output. A fused SDPA kernel
    keeps the assembled queries and keys and a log-sum-exp; the composed math path
    (``math``) keeps scaled fp32 copies of queries and keys instead, and of the values
    too when they are not fp32 (its probabilities are counted with the scores)."""
    heads = _div(sh.heads, sh.tp)
    qk, v = heads * sh.head_dim, heads * sh.value_dim
    kv_up = heads * (sh.head_dim - sh.rope_dim + sh.value_dim)
    kept = 0.0
    if sh.q_lora:
        kept += _rms_kept(sh.q_lora, c) + c * sh.q_lora
    kept += _rms_kept(sh.kv_lora, c) + c * sh.kv_lora
    if c == 4:
        kept += 4 * sh.rope_dim
    if math:
        core = 4 * 2 * qk + (4 * v if c != 4 else 0)
    else:
        core = c * 2 * qk + 4 * heads
    return kept + core + c * kv_up + c * v


def _shared_experts(sh: Shape, c: int, act_mask: int, casts: float) -> float:
    """Per token, what the shared experts keep: a dense MLP over every token beside the
    routed ones, in the compute dtype (plain modules, not grouped experts), plus the
    input casts autocast makes for its projections (``casts``) and, when a sigmoid gate
    scales its output (Qwen-MoE), that output and the gate."""
    if not sh.shared_ffn:
        return 0.0
    fs = _div(sh.shared_ffn, sh.tp)
    width = (2 * fs if sh.gated else fs) + fs + (fs if sh.gated else 0)
    kept = c * width + _act_extra(sh.act) * c * fs + act_mask * fs + casts
    if sh.shared_gate:
        kept += c * sh.hidden + c
    return kept


def _megatron(sh: Shape, device: str) -> BlockActivations:
    c = sh.recipe.compute
    h, s = sh.hidden, sh.seq // sh.cp
    q, kv, heads, f, rep = _dims(sh)
    mask = _mask_bytes(sh, "attention", device, c)
    out_mask = _mask_bytes(sh, "hidden", device, c)
    act_mask = _mask_bytes(sh, "activation", device, c)
    stats = 8 if sh.norm == "layernorm" else 4  # fp32 mean + rstd per token
    ln = (c * h + stats) * rep
    flash = sh.attn_impl != "eager"
    if flash:
        core = c * q + 4 * heads  # output (= out-proj input) and log-sum-exp
        scores = 0
    else:
        scores = (c + (mask + c if mask else 0)) * heads * s  # softmax, dropout mask and output
        core = c * q  # context = out-proj input
    attn = ln + c * h * rep + c * (q + 2 * kv) + core + out_mask * h * rep
    width = (2 * f if sh.gated else f) + f  # fc1 output(s) and activation output
    mlp_one = c * width + _act_extra(sh.act) * c * f + act_mask * f
    if sh.moe:
        k = sh.top_k
        mlp = c * h * rep + 8 * sh.experts + k * (c * h + mlp_one) + k * c * h
    else:
        mlp = c * h * rep + mlp_one
    mlp += ln + out_mask * h * rep
    per_token = attn + scores + mlp
    n = tokens(sh)
    saved = int(per_token * n)
    selective = int((per_token - scores) * n)
    boundary = int(c * h * rep * n)
    soft = c * heads * s
    fwd_extra = int(n * max(attn + scores + (2 * soft if scores else 0), per_token + c * f))
    fwd_ckpt = int(n * (2 * c * h * rep + max(c * (q + 2 * kv) + 2 * soft * (not flash),
                                              3 * c * f)))
    moments = _moments(
        sh,
        n,
        s_attn=attn + scores,
        s_mlp=mlp,
        norm_saved=ln,
        norm_bwd=c * h * rep,
        resid=c * h * rep,
        mlp_grads=(2 * c * f if sh.gated else c * f),
        core_freed=(scores - soft) if scores else 0,
        core_grads=(2 * soft if scores else c * (q + 2 * kv)),
    )
    return BlockActivations(saved, selective, boundary, fwd_extra, moments, True, fwd_ckpt)


def _transformers(sh: Shape, device: str) -> BlockActivations:
    rc = sh.recipe
    c, r, ac = rc.compute, rc.residual, rc.autocast
    h, s = sh.hidden, sh.seq // sh.cp
    q, kv, heads, f, rep = _dims(sh)
    mask = _mask_bytes(sh, "attention", device, c)
    out_mask = _mask_bytes(sh, "hidden", device, c)
    act_mask = _mask_bytes(sh, "activation", device, c)
    # norms: what a norm keeps of its input x (the residual stream) and its output;
    # sequence parallelism shards them, like everything outside the TP regions
    if sh.norm == "layernorm":
        norm = (r * h + 8) * rep  # input, fp32 mean and rstd
    elif r == 4:
        norm = (8 * h + 4) * rep  # x (fp32), x·rsqrt (fp32), rsqrt
    else:
        norm = (6 * h + 4) * rep  # fp32 copy of x, rsqrt, normalized x cast back
    separate_qkv = (sh.rope or sh.kv_heads != sh.heads) and not sh.fused_qkv

    def proj_in(n_proj: int) -> float:
        # autocast casts a fp32 input once per projection; otherwise all share it
        return (n_proj * c * h if ac and r != c else r * h) * rep

    n_rep = sh.heads // sh.kv_heads
    attn = norm + proj_in(3 if separate_qkv else 1)
    if sh.qk_norm:
        # a norm per query and key head: its fp32 input (the projection's output, or its
        # fp32 copy), rsqrt per head, the normalized output in the projection's dtype
        kv_heads = max(sh.kv_heads // sh.tp, 1)
        attn += (4 + c) * (q + kv) + 4 * (heads + kv_heads)
    scores = 0
    if sh.attn_impl == "eager":
        # q and k as the score matmul sees them, v (repeated for GQA), softmax probabilities
        attn += c * (q + kv * n_rep) + c * kv * n_rep
        soft = 4 if (ac or c == 4) else 2
        scores = soft * heads * s
        if soft != c:
            scores += c * heads * s  # the cast the value matmul keeps
        if mask:
            scores += (mask + c) * heads * s
        if sh.attn_softcap:
            scores += c * heads * s  # tanh(scores / cap), kept by tanh's backward
        attn += c * q  # attention output made contiguous for the out-projection
    elif sh.mla:
        math = _sdpa_math(sh, device)
        attn = norm + proj_in(2) + _latent_attention(sh, c, math)
        if math:  # the composed math path computes in fp32: its probabilities
            scores = 4 * heads * s
    else:
        attn += c * (q + 2 * kv) + c * q + 4 * heads  # q, k, v, output (shared), lse
    if sh.fused_qkv and sh.rope:
        attn += c * (q + kv)  # rotated q and k next to the fused output v keeps alive
    attn += out_mask * h * rep
    width = (2 * f if sh.gated else f) + f + (f if sh.gated else 0)
    mlp_one = c * width + _act_extra(sh.act) * c * f + act_mask * f
    n_mlp_proj = 2 if sh.gated else 1
    ce = rc.weight if sh.moe else c  # grouped experts compute in the weights' dtype
    if sh.moe:
        k = sh.top_k
        # router: fp32 probabilities over the experts, the chosen indices (int64) and
        # weights (fp32) and their sum (renormalized top-k);
        # per routed copy of a token (grouped matmul, in the weights' dtype): its gathered
        # input, the expert's MLP, the expert's output (kept for the multiply by its
        # routing weight), that weight (fp32) and the int64 indices that sort, gather and
        # restore it
        expert_one = ce * width + _act_extra(sh.act) * ce * f + act_mask * f
        router = 4 * sh.experts + 12 * k + 4
        mlp = proj_in(1) + router + k * (2 * ce * h + expert_one + 4 + 24)
        mlp += _shared_experts(sh, c, act_mask, proj_in(n_mlp_proj) - proj_in(1))
    else:
        mlp = proj_in(n_mlp_proj) + mlp_one
    shares_input = sh.norm == "layernorm" or r == 4
    if sh.parallel_residual == "shared":
        # the MLP reads the attention's normed input: no norm of its own, and its
        # projection input is shared unless autocast casts a copy per projection
        mlp -= proj_in(n_mlp_proj if not sh.moe else 1)
        mlp += proj_in(n_mlp_proj if not sh.moe else 1) if (ac and r != c) else 0
    elif sh.parallel_residual:
        # a second norm of the same block input: the input itself is already kept
        mlp += norm - (r * h * rep if shares_input else 0)
    else:
        mlp += norm
    mlp += out_mask * h * rep
    # sandwich placement: each sub-layer's output goes through its own norm as well
    post_norms = (sh.block_norms - 2) * norm
    mlp += post_norms
    per_token = attn + scores + mlp
    n = tokens(sh)
    saved = int(per_token * n)
    selective = saved  # Hugging Face modules have no selective recompute
    boundary = int(r * h * n * rep)
    eager = sh.attn_impl == "eager"
    # forward: scores before softmax (matmul output, scaled copy) while the attention
    # part is kept; then the MLP's output projection output on top of everything
    fwd_extra = int(n * max(attn + scores + (2 * c * heads * s if eager else 0),
                            per_token + c * h))
    fwd_ckpt = int(n * (2 * r * h * rep + max(
        c * (q + 2 * kv) + (2 * 4 * heads * s if eager else 0),
        (3 if (sh.gated or _act_extra(sh.act)) else 2) * c * f,
    )))
    down_in = ce * f  # the MLP's output projection input, freed first
    python_act = _act_extra(sh.act) > 0
    mlp_grads = (3 if (sh.gated or python_act) else 2) * ce * f - down_in
    if sh.moe:
        # per routed copy; the weighting multiply's backward has already freed the
        # experts' outputs it kept
        mlp_grads = sh.top_k * (mlp_grads - ce * h)
    if sh.attn_impl == "eager":
        soft = (4 if (ac or c == 4 or sh.family != "gpt2") else 2) * heads * s
        # the value matmul frees its inputs (probabilities as it saw them, v) and the
        # out-projection its input; softmax backward then holds probabilities, their
        # gradient and the gradient of the scores, next to the gradient of v
        core_freed = c * q + c * kv * n_rep + (scores - soft)
        core_grads = 3 * soft - soft + c * kv * n_rep
    elif scores:  # latent attention on the math path: softmax's backward
        core_freed = 0
        core_grads = 2 * scores
    else:
        core_freed = 0
        core_grads = c * (q + 2 * kv)
    norm_bwd = (r * h if sh.norm == "layernorm" else 16 * h) * rep
    moments = _moments(
        sh,
        n,
        s_attn=attn + scores,
        s_mlp=mlp,
        norm_saved=norm,
        norm_bwd=norm_bwd,
        resid=r * h * rep,
        mlp_grads=mlp_grads,
        core_freed=core_freed,
        core_grads=core_grads,
    )
    ckpt_extra: tuple[int, ...] = ()
    if sh.moe:
        k = sh.top_k
        # the routed outputs' backward comes first: the restoring gather's backward
        # allocates zeros and the scattered gradient, k copies of the hidden size each
        s_attn_mlp = attn + scores + mlp
        moments = ((int((s_attn_mlp + 2 * k * ce * h + r * h * rep) * n), 0.0), *moments)
        # a recomputed MoE block still holds its routed outputs (the recompute stops past
        # them) when the routed outputs' backward starts
        ckpt_extra = (int(k * ce * h * n),) + (0,) * (len(moments) - 1)
        # its forward without saving: the gathered input, the gate-up output, the
        # activation and its product with the up half, per routed copy
        fwd_ckpt = max(fwd_ckpt, int(n * (2 * r * h * rep + k * ce * (h + 4 * f))))
    return BlockActivations(
        saved, selective, boundary, fwd_extra, moments, shares_input, fwd_ckpt, ckpt_extra
    )


def _sdpa_math(sh: Shape, device: str) -> bool:
    """Whether PyTorch's CPU ``scaled_dot_product_attention`` takes the composed math
    path for want of a fused kernel: the CPU flash kernel needs queries, keys and values
    of one head width, which latent attention's values do not have (CUDA's memory-
    efficient kernel takes them)."""
    return device != "cuda" and sh.attn_impl == "sdpa" and sh.value_dim != sh.head_dim


def attention_kernel(sh: Shape, device: str) -> str:
    """The attention code that actually runs: PyTorch's CPU ``scaled_dot_product_attention``
    has no fused kernel with dropout, so in training with attention dropout it falls back
    to the composed math path, which keeps what eager attention keeps (scores,
    probabilities, the dropout mask). CUDA's fused kernels handle dropout themselves."""
    if sh.impl == "transformers" and sh.attn_impl == "sdpa" and device != "cuda" and (
        sh.dropout_at("attention") > 0
    ):
        return "eager"
    return sh.attn_impl


@lru_cache(maxsize=512)
def block_activations(sh: Shape, device: str = "cuda") -> BlockActivations:
    """Activation bytes of one block for one micro-batch on one GPU."""
    if sh.impl == "megatron":
        return _megatron(sh, device)
    kernel = attention_kernel(sh, device)
    return _transformers(sh if kernel == sh.attn_impl else sh.replace(attn_impl=kernel), device)


def embedding_saved(sh: Shape, device: str = "cuda") -> int:
    """What the embedding keeps for backward: the token ids (int64), and the embedding
    dropout's mask when dropout is on (Hugging Face models drop the summed embeddings)."""
    mask = (
        _mask_bytes(sh, "embedding", device, sh.recipe.compute)
        if sh.impl == "transformers" else 0
    )
    return 8 * tokens(sh) + int(mask * sh.hidden * tokens(sh) / (sh.tp if sh.sp else 1))
