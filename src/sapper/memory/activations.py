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

from sapper.memory.inputs import Shape

__all__ = ["BlockActivations", "block_activations", "embedding_saved", "tokens"]


def _div(n: int, k: int) -> int:
    return -(-n // k)


@dataclass(frozen=True)
class BlockActivations:
    """One block, one micro-batch, one GPU (bytes)."""

    saved: int  # kept for backward without checkpointing
    selective: int  # kept with selective recompute (attention core recomputed)
    boundary: int  # kept with full checkpointing (the block's input)
    fwd_extra: int  # momentary extra during the block's forward
    bwd_extra: int  # gradients of intermediates in flight during its backward

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


def _mask_bytes(sh: Shape, device: str, compute: int) -> int:
    """A dropout mask: CUDA keeps a bool mask; the CPU kernel keeps a scaled noise tensor."""
    if sh.dropout <= 0:
        return 0
    return 1 if device == "cuda" else compute


def _act_extra(act: str) -> int:
    """Width-sized tensors an activation keeps beyond its input and output."""
    # 0.5*x*(1+tanh(√(2/π)(x+0.044715x³))) as separate ops keeps tanh(.), 0.5x and 1+tanh(.)
    return 3 if act == "gelu_tanh_python" else 0


def _megatron(sh: Shape, device: str) -> BlockActivations:
    c = sh.recipe.compute
    h, s = sh.hidden, sh.seq // sh.cp
    q, kv, heads, f, rep = _dims(sh)
    mask = _mask_bytes(sh, device, c)
    stats = 8 if sh.norm == "layernorm" else 4  # fp32 mean + rstd per token
    ln = (c * h + stats) * rep
    flash = sh.attn_impl != "eager"
    if flash:
        core = c * q + 4 * heads  # output (= out-proj input) and log-sum-exp
        scores = 0
    else:
        scores = (c + (mask + c if mask else 0)) * heads * s  # softmax, dropout mask and output
        core = c * q  # context = out-proj input
    attn = ln + c * h * rep + c * (q + 2 * kv) + core + mask * h * rep
    width = (2 * f if sh.gated else f) + f  # fc1 output(s) and activation output
    mlp_one = c * width + _act_extra(sh.act) * c * f
    if sh.moe:
        k = sh.top_k
        mlp = c * h * rep + 8 * sh.experts + k * (c * h + mlp_one) + k * c * h
    else:
        mlp = c * h * rep + mlp_one
    mlp += ln + mask * h * rep
    per_token = attn + scores + mlp
    n = tokens(sh)
    saved = int(per_token * n)
    selective = int((per_token - scores) * n)
    boundary = int(c * h * rep * n)
    fwd_extra = int(n * max(2 * scores, c * 2 * f))
    bwd_extra = int(n * (2 * c * h * rep + max(2 * scores, 2 * c * width)))
    return BlockActivations(saved, selective, boundary, fwd_extra, bwd_extra)


def _transformers(sh: Shape, device: str) -> BlockActivations:
    rc = sh.recipe
    c, r, ac = rc.compute, rc.residual, rc.autocast
    h, s = sh.hidden, sh.seq // sh.cp
    q, kv, heads, f, rep = _dims(sh)
    mask = _mask_bytes(sh, device, c)
    # norms: what a norm keeps of its input x (the residual stream) and its output
    if sh.norm == "layernorm":
        norm = r * h + 8  # input, fp32 mean and rstd
    elif r == 4:
        norm = 8 * h + 4  # x (fp32), x·rsqrt (fp32), rsqrt
    else:
        norm = 6 * h + 4  # fp32 copy of x, rsqrt, normalized x cast back
    separate_qkv = sh.rope or sh.kv_heads != sh.heads

    def proj_in(n_proj: int) -> int:
        # autocast casts a fp32 input once per projection; otherwise all share it
        return n_proj * c * h if ac and r != c else r * h

    n_rep = sh.heads // sh.kv_heads
    attn = norm + proj_in(3 if separate_qkv else 1)
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
        attn += c * q  # attention output made contiguous for the out-projection
    else:
        attn += c * (q + 2 * kv) + c * q + 4 * heads  # q, k, v, output (shared), lse
    attn += mask * h
    width = (2 * f if sh.gated else f) + f + (f if sh.gated else 0)
    mlp_one = c * width + _act_extra(sh.act) * c * f
    n_mlp_proj = 2 if sh.gated else 1
    if sh.moe:
        k = sh.top_k
        mlp = proj_in(1) + 8 * sh.experts + k * (c * h + mlp_one)
    else:
        mlp = proj_in(n_mlp_proj) + mlp_one
    mlp += norm + mask * h
    per_token = attn + scores + mlp
    n = sh.micro_batch * s
    saved = int(per_token * n)
    selective = saved  # Hugging Face modules have no selective recompute
    boundary = int(r * h * n)
    fwd_extra = int(n * max(2 * c * heads * s if sh.attn_impl == "eager" else 0, 2 * c * f))
    grad_width = max(scores * 2, 2 * c * width)
    bwd_extra = int(n * (2 * r * h + grad_width))
    del rep
    return BlockActivations(saved, selective, boundary, fwd_extra, bwd_extra)


def block_activations(sh: Shape, device: str = "cuda") -> BlockActivations:
    """Activation bytes of one block for one micro-batch on one GPU."""
    if sh.impl == "megatron":
        return _megatron(sh, device)
    return _transformers(sh, device)


def embedding_saved(sh: Shape) -> int:
    """What the embedding keeps for backward: the token ids (int64)."""
    return 8 * tokens(sh)
