"""The Plan: one typed description of a training job, whatever file it came from.

YAML plan files, Hugging Face ``config.json``, DeepSpeed JSON and command-line values are
all merged into this one model (see :mod:`sapper.plan.load`). Every field is documented
with its unit next to it; values that follow from others (DP degree given as -1, global
batch, tokens per step) are derived here and shown, so a rule never re-derives them.

Only types and ranges are validated here. Logical consistency (TP·PP·CP·DP = GPUs,
global = micro × GA × DP ...) is reported by rules, with the arithmetic, as findings.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.fields import FieldInfo

from sapper.plan.hardware import GpuSpec, expected_gpu, find_gpu

__all__ = [
    "Activation",
    "AttentionImpl",
    "BatchSpec",
    "CheckpointingSpec",
    "ClippingSpec",
    "DataSpec",
    "DeepSpeedZeroSpec",
    "HardwareSpec",
    "InitSpec",
    "LossScalingSpec",
    "ModelSpec",
    "NormPlacement",
    "NormType",
    "OptimizerSpec",
    "ParallelSpec",
    "Plan",
    "PositionEncoding",
    "PrecisionSpec",
    "RopeScalingSpec",
    "ScheduleSpec",
    "bounds_text",
    "dropout_at",
    "field_info",
    "fmt_bound",
]

# ---- physical bounds ------------------------------------------------------------------
# Generous on purpose: 10-1000x anything built or announced. They exist so that a typo or
# a hostile value (2**64 GPUs, a micro batch of 10^12) is refused with the valid range
# instead of making the layout search, the memory model or a report run for ever.

#: GPUs in one job: the largest clusters have ~10^5.
MAX_GPUS = 10**6
#: GPUs in one node / scale-up domain: 8 in a DGX, 72 in an NVL72 rack, 576 announced.
MAX_GPUS_PER_NODE = 1024
#: Hidden, MLP and head widths (features): the largest models have ~3·10^4 hidden, ~10^5 MLP.
MAX_WIDTH = 10**6
#: Transformer blocks: the deepest trained models have a few hundred.
MAX_LAYERS = 10**4
#: Attention heads: the largest models have ~10^2.
MAX_HEADS = 10**5
#: Vocabulary (tokens): the largest are ~2.6·10^5.
MAX_VOCAB = 10**8
#: Sequence length and position tables (tokens): the longest contexts are ~10^7.
MAX_TOKENS = 10**9
#: MoE experts per layer: "a million experts" (PEER) is the most published.
MAX_EXPERTS = 10**7
#: Parameters: the largest models have ~2·10^12.
MAX_PARAMS = 10**16
#: Sequences per GPU per micro-batch, and micro-batches per optimizer step.
MAX_BATCH = 10**6
#: Sequences per optimizer step (all GPUs): ~10^4 in the largest runs.
MAX_GLOBAL_BATCH = 10**9
#: Optimizer steps in a run (warmup, total): ~10^6 in the longest runs.
MAX_STEPS = 10**12
#: Interleaved pipeline chunks per stage: each holds at least one block, usually 2-8.
MAX_VIRTUAL_STAGES = 1024
#: Elements in a ZeRO buffer: 10^18 is past any memory (DeepSpeed's own cap is 2^63 - 1).
MAX_BUCKET = 10**18
#: Dataset size (tokens or samples): the largest pre-training sets have ~1.5·10^13 tokens.
MAX_DATASET = 10**16
#: Characters in a string value (names, paths): a path is at most 4096 on Linux.
MAX_STR = 4096


class _Spec(BaseModel):
    """Strict: an unknown key is an error naming the field (catches typos)."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        use_enum_values=False,
        # NaN passes every comparison a rule makes (nan > 1 is False, so is nan < 1) and
        # inf overflows estimates: neither is ever a meaningful setting.
        allow_inf_nan=False,
        str_max_length=MAX_STR,
    )


def fmt_bound(value: float) -> str:
    """A bound as people read it: 10^6 rather than 1000000."""
    if isinstance(value, int) and value >= 10_000 and str(value).rstrip("0") == "1":
        return f"10^{len(str(value)) - 1}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def bounds_text(info: FieldInfo) -> str:
    """A field's range as ``> 0, ≤ 10^6`` (empty when unbounded), for docs and errors."""
    words = []
    for meta in info.metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            bound = getattr(meta, attr, None)
            if bound is not None:
                words.append(f"{sign} {fmt_bound(bound)}")
    return ", ".join(words)


def field_info(loc: tuple[int | str, ...]) -> FieldInfo | None:
    """The field a validation error's ``loc`` points at (None when it is not a field)."""
    model: type[BaseModel] | None = Plan
    info = None
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = _nested(info.annotation)
    return info


def _nested(annotation: object) -> type[BaseModel] | None:
    import typing

    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


class PositionEncoding(str, enum.Enum):
    LEARNED = "learned"
    ROPE = "rope"
    ALIBI = "alibi"
    SINUSOIDAL = "sinusoidal"
    NONE = "none"


class NormType(str, enum.Enum):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class NormPlacement(str, enum.Enum):
    PRE = "pre"
    POST = "post"
    SANDWICH = "sandwich"


class Activation(str, enum.Enum):
    GELU = "gelu"
    RELU = "relu"
    SILU = "silu"
    SWIGLU = "swiglu"
    GEGLU = "geglu"

    @property
    def gated(self) -> bool:
        return self in (Activation.SWIGLU, Activation.GEGLU)


class AttentionImpl(str, enum.Enum):
    EAGER = "eager"
    SDPA = "sdpa"
    FLASH = "flash"


def dropout_at(model: Any, site: str) -> float:
    """The dropout probability at ``site`` (attention, hidden, embedding, activation) of
    anything with ``dropout`` and ``<site>_dropout`` (a ModelSpec, the memory model's
    Shape): its own value, else ``dropout`` (activation: else none, few models have it)."""
    own = getattr(model, f"{site}_dropout")
    if own is not None:
        return float(own)
    return 0.0 if site == "activation" else float(model.dropout)


class RopeScalingSpec(_Spec):
    type: str = Field(description="Scaling method: linear, dynamic, yarn, llama3, longrope ...")
    factor: float = Field(gt=0, description="Context extension factor (dimensionless).")
    original_max_position_embeddings: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description="Context length the model was trained at (tokens).",
    )


class ModelSpec(_Spec):
    """Architecture of a decoder-only transformer."""

    family: str | None = Field(default=None, description="HF model_type, e.g. 'llama', 'gpt2'.")
    hidden_size: int = Field(
        gt=0, le=MAX_WIDTH, description="Model width h (features; the largest models: ~3·10^4)."
    )
    num_layers: int = Field(
        gt=0, le=MAX_LAYERS, description="Transformer blocks L (the deepest models: hundreds)."
    )
    num_heads: int = Field(gt=0, le=MAX_HEADS, description="Attention (query) heads a.")
    num_kv_heads: int | None = Field(
        default=None,
        gt=0,
        le=MAX_HEADS,
        description="Key/value heads (GQA/MQA); defaults to num_heads.",
    )
    head_dim: int | None = Field(
        default=None, gt=0, le=MAX_WIDTH, description="Per-head width; h / a."
    )
    ffn_hidden_size: int | None = Field(
        default=None, gt=0, le=MAX_WIDTH, description="MLP inner width (features); defaults to 4h."
    )
    activation: Activation = Field(default=Activation.GELU, description="MLP activation.")
    vocab_size: int = Field(
        gt=0, le=MAX_VOCAB, description="Vocabulary size V (tokens; the largest: ~2.6·10^5)."
    )
    max_position_embeddings: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description="Longest sequence the position scheme supports (tokens).",
    )
    position_encoding: PositionEncoding = Field(
        default=PositionEncoding.LEARNED, description="learned / rope / alibi / sinusoidal / none."
    )
    rope_theta: float | None = Field(default=None, gt=0, description="RoPE base frequency.")
    rope_scaling: RopeScalingSpec | None = Field(default=None, description="RoPE extension.")
    norm_type: NormType = Field(default=NormType.LAYERNORM, description="layernorm / rmsnorm.")
    norm_placement: NormPlacement = Field(
        default=NormPlacement.PRE, description="pre (stable), post (needs warmup), sandwich."
    )
    tied_embeddings: bool = Field(default=False, description="Output head shares embeddings.")
    num_experts: int = Field(
        default=1, ge=1, le=MAX_EXPERTS, description="MoE experts per layer (1 = dense)."
    )
    experts_top_k: int = Field(
        default=1, ge=1, le=MAX_EXPERTS, description="Experts each token is routed to."
    )
    moe_ffn_hidden_size: int | None = Field(
        default=None,
        gt=0,
        le=MAX_WIDTH,
        description="Inner width of one expert; defaults to ffn_hidden_size.",
    )
    shared_expert_ffn_hidden_size: int | None = Field(
        default=None,
        gt=0,
        le=MAX_WIDTH,
        description="Inner width of the MLP every token passes through beside its routed "
        "experts (all shared experts together: DeepSeek's n_shared_experts × "
        "moe_intermediate_size, Qwen-MoE's shared_expert_intermediate_size); unset: none.",
    )
    first_dense_layers: int = Field(
        default=0,
        ge=0,
        le=MAX_LAYERS,
        description="Leading blocks of a MoE model with a dense MLP of ffn_hidden_size "
        "instead of experts (DeepSeek's first_k_dense_replace).",
    )
    kv_lora_rank: int | None = Field(
        default=None,
        gt=0,
        le=MAX_WIDTH,
        description="Multi-head latent attention: width keys and values are compressed to "
        "(DeepSeek-V2/V3); head_dim is then the query/key width per head (nope + rope "
        "parts). Unset: plain multi-head attention.",
    )
    q_lora_rank: int | None = Field(
        default=None,
        gt=0,
        le=MAX_WIDTH,
        description="Multi-head latent attention: width queries are compressed to; unset: "
        "queries projected directly.",
    )
    qk_rope_head_dim: int | None = Field(
        default=None,
        gt=0,
        le=MAX_WIDTH,
        description="Multi-head latent attention: the rotary part of head_dim, projected "
        "once for all heads beside the compressed keys and values.",
    )
    v_head_dim: int | None = Field(
        default=None,
        gt=0,
        le=MAX_WIDTH,
        description="Per-head width of the values when it differs from head_dim (MLA).",
    )
    attention_bias: bool = Field(default=False, description="Biases on q/k/v/o projections.")
    mlp_bias: bool = Field(default=False, description="Biases on MLP projections.")
    parallel_residual: bool = Field(
        default=False, description="Attention and MLP read the same input (GPT-J/NeoX style)."
    )
    attention_impl: AttentionImpl = Field(
        default=AttentionImpl.SDPA, description="eager keeps s×s scores; sdpa/flash do not."
    )
    dropout: float = Field(
        default=0.0, ge=0, lt=1,
        description="Dropout probability; each site below falls back to it when unset.",
    )
    attention_dropout: float | None = Field(
        default=None, ge=0, lt=1,
        description="Dropout on the attention probabilities (HF attention_dropout, attn_pdrop).",
    )
    hidden_dropout: float | None = Field(
        default=None, ge=0, lt=1,
        description="Dropout on the attention and MLP outputs before the residual add (HF "
        "hidden_dropout, resid_pdrop; OPT's dropout).",
    )
    embedding_dropout: float | None = Field(
        default=None, ge=0, lt=1, description="Dropout on the embeddings (HF embd_pdrop)."
    )
    activation_dropout: float | None = Field(
        default=None, ge=0, lt=1,
        description="Dropout inside the MLP, after the activation (OPT, BART); unset: none.",
    )
    hidden_act: str | None = Field(
        default=None,
        description="The activation's name in the source (HF hidden_act, e.g. 'gelu_new', "
        "'gelu_pytorch_tanh', 'silu'): which kernel runs, and so what it keeps for backward.",
    )
    implementation: Literal["transformers", "megatron"] = Field(
        default="transformers",
        description="Code that runs the model, for the memory model: 'transformers' (Hugging "
        "Face modules: unfused norms, RoPE and loss) or 'megatron' (fused kernels, the "
        "activation accounting of Korthikanti et al. 2022).",
    )
    num_params: int | None = Field(
        default=None,
        gt=0,
        le=MAX_PARAMS,
        description="Exact parameter count when a loader knows it (the largest: ~2·10^12).",
    )

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def trained_context(self) -> int | None:
        """Context the positions were trained at (before any RoPE extension)."""
        if self.rope_scaling and self.rope_scaling.original_max_position_embeddings:
            return self.rope_scaling.original_max_position_embeddings
        return self.max_position_embeddings

    def dropout_at(self, site: str) -> float:
        return dropout_at(self, site)


class LossScalingSpec(_Spec):
    """Loss scaling for fp16 (seed §2.2): none, a static value, or dynamic."""

    mode: Literal["none", "static", "dynamic"] = Field(
        default="none", description="none / static / dynamic."
    )
    static_scale: float | None = Field(default=None, description="The fixed scale (static).")
    initial_scale: float = Field(default=2.0**16, gt=0, description="Start value (dynamic).")
    growth_interval: int = Field(
        default=2000, ge=1, le=MAX_STEPS, description="Clean steps before the scale grows (steps)."
    )
    growth_factor: float = Field(default=2.0, description="Multiplier on growth.")
    backoff_factor: float = Field(default=0.5, description="Multiplier on overflow.")
    hysteresis: int = Field(
        default=1, ge=1, le=MAX_STEPS, description="Overflows tolerated before backoff."
    )
    min_scale: float = Field(default=1.0, ge=0, description="Floor of the dynamic scale.")


class PrecisionSpec(_Spec):
    """Mixed precision (seed §2.1)."""

    dtype: Literal["fp32", "tf32", "fp16", "bf16", "fp8"] = Field(
        default="fp32", description="Compute dtype of forward/backward."
    )
    master_weights: Literal["fp32", "fp16", "bf16"] = Field(
        default="fp32", description="Dtype of the weights the optimizer updates."
    )
    optimizer_states: Literal["fp32", "fp16", "bf16", "int8"] = Field(
        default="fp32", description="Dtype of optimizer moments (int8 = 8-bit optimizers)."
    )
    loss_scaling: LossScalingSpec = Field(default_factory=LossScalingSpec)
    autocast: bool = Field(
        default=False,
        description="Mixed precision by torch.autocast over fp32 weights (PyTorch AMP, HF "
        "Trainer without DeepSpeed): weights and gradients stay fp32 and each matmul keeps a "
        "compute-dtype copy of its weight until backward. False: weights in the compute dtype "
        "with an fp32 master copy in the optimizer (DeepSpeed, Megatron; 16 bytes/param).",
    )
    grad_dtype: Literal["fp32", "fp16", "bf16"] | None = Field(
        default=None,
        description="Dtype gradients are kept and accumulated in; default: the weights' dtype "
        "(Megatron's fp32 main grads: fp32).",
    )


class OptimizerSpec(_Spec):
    type: str = Field(default="adamw", description="adamw / adam / sgd / adafactor / lion ...")
    lr: float | None = Field(default=None, gt=0, description="Peak learning rate.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="Adam betas.")
    eps: float = Field(default=1e-8, gt=0, description="Adam epsilon.")
    weight_decay: float = Field(default=0.0, ge=0, description="Decoupled weight decay.")
    momentum: float = Field(default=0.0, ge=0, description="SGD momentum.")
    eight_bit: bool = Field(default=False, description="8-bit optimizer states (bitsandbytes).")
    fused: bool = Field(default=False, description="A fused optimizer step (no temporaries).")
    impl: Literal[
        "auto", "for_loop", "foreach", "fused", "deepspeed_fused", "deepspeed_cpu", "apex",
        "bnb_8bit",
    ] = Field(
        default="auto",
        description="How the step runs, which decides its temporaries: for_loop (torch's "
        "per-tensor loop: its CPU default, foreach=False), foreach (multi-tensor: torch's "
        "CUDA default), fused (torch fused=True), deepspeed_fused (FusedAdam), "
        "deepspeed_cpu (CPUAdam: the step on the host), apex (FusedAdam), bnb_8bit "
        "(bitsandbytes 8-bit states); auto: fused when `fused`, else torch's default.",
    )

    @field_validator("type")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.lower()


class ScheduleSpec(_Spec):
    type: str = Field(default="constant", description="constant / linear / cosine / wsd ...")
    warmup_steps: int = Field(
        default=0, ge=0, le=MAX_STEPS, description="Linear warmup length (steps)."
    )
    total_steps: int | None = Field(
        default=None, gt=0, le=MAX_STEPS, description="Training length (steps)."
    )
    min_lr: float = Field(default=0.0, ge=0, description="Floor of the decay.")


class ClippingSpec(_Spec):
    """Gradient clipping (seed §2.3)."""

    max_norm: float | None = Field(
        default=None,
        ge=0,
        description="Threshold; null/0 = off (a negative one would flip the clipped "
        "gradients in clip_grad_norm_).",
    )
    mode: Literal["global", "per_group"] = Field(default="global", description="Norm scope.")
    applied: Literal["after_unscale", "before_unscale"] = Field(
        default="after_unscale", description="Relative to GradScaler.unscale_ (fp16)."
    )


class InitSpec(_Spec):
    """Initialization (seed §2.4)."""

    std: float | None = Field(default=None, gt=0, description="Normal init std of weights.")
    residual_scaling: Literal["none", "depth", "custom"] = Field(
        default="none", description="Scaling of residual output projections."
    )
    residual_scale: float | None = Field(
        default=None, gt=0, description="Factor on residual projections' std (custom)."
    )
    from_pretrained: bool = Field(
        default=False,
        description="Weights are loaded from a checkpoint (fine-tuning, continued "
        "pre-training), so the init scheme never runs and init checks are skipped.",
    )


class BatchSpec(_Spec):
    micro_batch_size: int | None = Field(
        default=None, gt=0, le=MAX_BATCH, description="Sequences per GPU (usually 1-64)."
    )
    gradient_accumulation_steps: int | None = Field(
        default=None, gt=0, le=MAX_BATCH, description="Micro-batches per optimizer step."
    )
    global_batch_size: int | None = Field(
        default=None,
        gt=0,
        le=MAX_GLOBAL_BATCH,
        description="Sequences per optimizer step (the largest runs: ~10^4).",
    )
    seq_len: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description="Tokens per sequence (the longest contexts: ~10^7).",
    )
    reference_global_batch: int | None = Field(
        default=None,
        gt=0,
        le=MAX_GLOBAL_BATCH,
        description="Global batch the LR was tuned at (sequences).",
    )
    reference_lr: float | None = Field(default=None, gt=0, description="LR tuned at that batch.")


class CheckpointingSpec(_Spec):
    """Activation checkpointing (seed §3.2)."""

    granularity: Literal["none", "selective", "full"] = Field(
        default="none", description="none / selective (attention) / full (whole blocks)."
    )
    every_k_layers: int = Field(
        default=1, ge=1, le=MAX_LAYERS, description="Checkpoint one block in k."
    )
    partition_activations: bool = Field(
        default=False, description="Checkpoints sharded across tensor-parallel ranks."
    )
    cpu_offload: bool = Field(default=False, description="Checkpoints kept in host memory.")


class DeepSpeedZeroSpec(_Spec):
    """ZeRO's buffer sizes in elements, as a DeepSpeed config's ``zero_optimization`` gives
    them; null means DeepSpeed's default (runtime/zero/config.py) or, when the field is
    listed in ``unresolved`` ("auto"), what the HF Trainer fills in from the hidden size."""

    reduce_bucket_size: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BUCKET,
        description="Gradient elements reduced at a time: ZeRO allocates a buffer this "
        "size (two with overlap_comm at stages 1-2). DeepSpeed default 5·10^8.",
    )
    allgather_bucket_size: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BUCKET,
        description="Elements all-gathered at a time after a ZeRO-1/2 step (in place into "
        "the flat 16-bit buffer: no buffer of its own). DeepSpeed default 5·10^8.",
    )
    prefetch_bucket_size: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BUCKET,
        description="ZeRO-3 parameters fetched ahead of use (stage3_prefetch_bucket_size). "
        "DeepSpeed default 5·10^7.",
    )
    max_live_parameters: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BUCKET,
        description="ZeRO-3 cap on gathered parameters held at once "
        "(stage3_max_live_parameters). DeepSpeed default 10^9.",
    )
    max_reuse_distance: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BUCKET,
        description="ZeRO-3 keeps a gathered parameter reused within this many elements "
        "(stage3_max_reuse_distance; still under max_live_parameters). DeepSpeed default "
        "10^9.",
    )
    param_persistence_threshold: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BUCKET,
        description="ZeRO-3 keeps tensors of at most this many elements whole on every GPU, "
        "even with parameter offload (stage3_param_persistence_threshold). DeepSpeed "
        "default 10^5.",
    )
    sub_group_size: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BUCKET,
        description="ZeRO-3 steps the optimizer over sub-groups of this many elements; each "
        "casts its gradients to fp32 first. DeepSpeed default 10^9.",
    )
    contiguous_gradients: bool | None = Field(
        default=None,
        description="ZeRO copies gradients into its preallocated reduce buffer (DeepSpeed "
        "default true); false flattens each bucket into a new tensor instead.",
    )


class ParallelSpec(_Spec):
    """Layout (seed §3.3, §4). ``dp = -1`` means GPUs / (tp·pp·cp)."""

    tp: int = Field(default=1, ge=1, le=MAX_GPUS, description="Tensor-parallel degree.")
    pp: int = Field(default=1, ge=1, le=MAX_GPUS, description="Pipeline-parallel degree.")
    dp: int = Field(default=-1, le=MAX_GPUS, description="Data-parallel degree; -1 = infer.")
    cp: int = Field(default=1, ge=1, le=MAX_GPUS, description="Context-parallel degree.")
    ep: int = Field(
        default=1, ge=1, le=MAX_GPUS, description="Expert-parallel degree (within DP)."
    )
    sequence_parallel: bool = Field(default=False, description="Megatron sequence parallel.")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=0, description="ZeRO / FSDP sharding stage.")
    offload_optimizer: Literal["none", "cpu", "nvme"] = Field(
        default="none", description="Where optimizer states live (ZeRO-Offload / Infinity)."
    )
    offload_params: Literal["none", "cpu", "nvme"] = Field(
        default="none", description="Where parameters live between uses (ZeRO-3 offload)."
    )
    optimizer_partitioned: bool = Field(
        default=False,
        description="Master weights and optimizer states are partitioned over the "
        "data-parallel group although zero_stage is 0 or 1 says otherwise: DeepSpeed's "
        "BF16_Optimizer does this for bf16 without ZeRO (set by the DeepSpeed reader).",
    )
    checkpointing: CheckpointingSpec = Field(default_factory=CheckpointingSpec)
    deepspeed: DeepSpeedZeroSpec = Field(default_factory=DeepSpeedZeroSpec)
    virtual_pipeline_stages: int = Field(
        default=1,
        ge=1,
        le=MAX_VIRTUAL_STAGES,
        description="Interleaved chunks v per stage (each at least one block; usually 2-8).",
    )
    pipeline_schedule: Literal["1f1b", "interleaved", "gpipe"] = Field(
        default="1f1b", description="Order of micro-batch forward/backward passes per stage."
    )
    rank_order: str = Field(
        default="tp-cp-ep-dp-pp",
        description="Megatron order, fastest-varying first: TP neighbours share a node.",
    )
    first_stage_layers: int | None = Field(
        default=None,
        gt=0,
        le=MAX_LAYERS,
        description="Layers on the first pipeline stage (Megatron "
        "--decoder-first-pipeline-num-layers; it also holds the embedding and the most "
        "micro-batches in flight); default: an even split.",
    )
    last_stage_layers: int | None = Field(
        default=None,
        gt=0,
        le=MAX_LAYERS,
        description="Layers on the last pipeline stage (--decoder-last-pipeline-num-layers; "
        "it also runs the output head and loss); default: an even split.",
    )
    overlap_dp_comm: bool = Field(
        default=True,
        description="Data-parallel gradient reduction (all-reduce, or ZeRO's reduce-scatter) "
        "overlaps the backward: on by default in PyTorch DDP and FSDP; Megatron needs "
        "--overlap-grad-reduce and DeepSpeed overlap_comm (both off by default), so set "
        "false for them without the flag.",
    )
    overlap_param_gather: bool = Field(
        default=True,
        description="ZeRO/FSDP parameter all-gathers overlap compute: FSDP and ZeRO-3 "
        "prefetch the next layer's parameters by default; ZeRO-1/2 gather the updated "
        "parameters during the next step's first forward with Megatron's "
        "--overlap-param-gather (off by default: set false without it).",
    )
    pipeline_scatter_gather: bool = Field(
        default=True,
        description="Each pipeline send carries 1/TP of the activation, the TP ranks of the "
        "next stage all-gathering it (Megatron's default scatter/gather; implied by "
        "sequence parallelism). False: every TP rank sends the whole activation (DeepSpeed's "
        "pipeline engine, Megatron --no-scatter-gather-tensors-in-pipeline).",
    )
    tp_comm_overlap: bool = Field(
        default=False,
        description="Tensor-parallel all-gathers and reduce-scatters run in chunks "
        "pipelined with the GEMMs that consume or produce them (Megatron --tp-comm-overlap, "
        "Transformer Engine userbuffers; needs sequence parallelism). Off by default, as "
        "in Megatron.",
    )

    @field_validator("dp")
    @classmethod
    def _dp(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError("must be a positive degree or -1 (infer from the GPU count)")
        return v

    @model_validator(mode="after")
    def _world(self) -> ParallelSpec:
        """Each degree is bounded, but their product is the world size."""
        world = self.tp * self.pp * self.cp * max(self.dp, 1)
        if world > MAX_GPUS:
            raise ValueError(
                f"degrees whose product tp·pp·cp·dp is at most {fmt_bound(MAX_GPUS)} GPUs "
                f"(it is {world})"
            )
        return self


class HardwareSpec(_Spec):
    gpu: str | None = Field(default=None, description="GPU model from the built-in table.")
    num_gpus: int | None = Field(
        default=None,
        gt=0,
        le=MAX_GPUS,
        description="GPUs in the job (the largest clusters: ~10^5).",
    )
    gpus_per_node: int = Field(
        default=8,
        gt=0,
        le=MAX_GPUS_PER_NODE,
        description="GPUs in one node (8 in a DGX, 72 in an NVL72 rack).",
    )
    nodes: int | None = Field(
        default=None,
        gt=0,
        le=MAX_GPUS,
        description="Nodes in the job (nodes × gpus_per_node at most 10^6 GPUs).",
    )
    host_memory_gib: float | None = Field(default=None, gt=0, description="CPU RAM per node.")
    internode_gbps: float | None = Field(
        default=None, gt=0, description="Override: network GB/s per GPU per direction."
    )

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | None) -> str | None:
        if v is None:
            return v
        spec = find_gpu(v)
        if spec is None:
            # the loader turns this into an InputError (exit 2) naming hardware.gpu
            raise ValueError(expected_gpu(v))
        return spec.name

    @model_validator(mode="after")
    def _cluster(self) -> HardwareSpec:
        if self.nodes is not None and self.nodes * self.gpus_per_node > MAX_GPUS:
            raise ValueError(
                f"nodes × gpus_per_node at most {fmt_bound(MAX_GPUS)} GPUs "
                f"(it is {self.nodes * self.gpus_per_node})"
            )
        return self

    @property
    def spec(self) -> GpuSpec | None:
        return find_gpu(self.gpu) if self.gpu else None

    @property
    def total_gpus(self) -> int | None:
        if self.num_gpus is not None:
            return self.num_gpus
        if self.nodes is not None:
            return self.nodes * self.gpus_per_node
        return None


class DataSpec(_Spec):
    path: str | None = Field(default=None, description="Tokenized dataset (file or folder).")
    format: str | None = Field(
        default=None, description="npy / bin (uint16/uint32 tokens) / jsonl / megatron ..."
    )
    token_dtype: str | None = Field(default=None, description="uint16 / uint32 / int32 ...")
    loader_tokens_per_sec: float | None = Field(
        default=None, gt=0, description="Measured loader throughput per GPU (tokens/s)."
    )
    loader_samples_per_sec: float | None = Field(
        default=None, gt=0, description="Measured loader throughput per GPU (samples/s)."
    )
    num_samples: int | None = Field(
        default=None,
        gt=0,
        le=MAX_DATASET,
        description="Samples (sequences) in one epoch of the dataset, all ranks together.",
    )
    num_tokens: int | None = Field(
        default=None,
        gt=0,
        le=MAX_DATASET,
        description="Tokens in one epoch of the dataset (samples = tokens / batch.seq_len).",
    )


class Plan(_Spec):
    """A training job before it starts."""

    name: str | None = Field(default=None, description="A label for reports.")
    framework: (
        Literal[
            "deepspeed", "megatron", "nemo", "transformers", "accelerate", "lightning",
            "torchtitan", "composer", "torch",
        ]
        | None
    ) = Field(
        default=None,
        description="What runs the training step; it decides what the plan leaves unsaid "
        "(DeepSpeed fills in the batch triple and defaults fp16 to dynamic loss scaling). "
        "Each launch-config reader sets it (transformers: the HF Trainer, Axolotl; composer: "
        "MosaicML Composer's Trainer, which llm-foundry runs, where each GPU's share of the "
        "global batch caps the micro-batch; torch: a hand-written loop); null: not known.",
    )
    model: ModelSpec | None = None
    precision: PrecisionSpec = Field(default_factory=PrecisionSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    clipping: ClippingSpec = Field(default_factory=ClippingSpec)
    init: InitSpec = Field(default_factory=InitSpec)
    batch: BatchSpec = Field(default_factory=BatchSpec)
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    hardware: HardwareSpec = Field(default_factory=HardwareSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    unresolved: list[str] = Field(
        default_factory=list, description="Fields a source left as 'auto' (never guessed)."
    )

    # ---- derived values -------------------------------------------------------------
    @property
    def gpu(self) -> GpuSpec | None:
        return self.hardware.spec

    @property
    def model_parallel_size(self) -> int:
        p = self.parallel
        return p.tp * p.pp * p.cp

    @property
    def dp_degree(self) -> int | None:
        """DP as given, or GPUs / (tp·pp·cp) when -1 and it divides."""
        if self.parallel.dp != -1:
            return self.parallel.dp
        gpus = self.hardware.total_gpus
        if gpus is None:
            return 1 if self.model_parallel_size == 1 and self.hardware.num_gpus is None else None
        if gpus % self.model_parallel_size:
            return None
        return gpus // self.model_parallel_size

    @property
    def world_size(self) -> int | None:
        dp = self.dp_degree
        return None if dp is None else dp * self.model_parallel_size

    @property
    def global_batch(self) -> int | None:
        """Sequences per optimizer step: as given, else micro × GA × DP."""
        b = self.batch
        if b.global_batch_size is not None:
            return b.global_batch_size
        dp = self.dp_degree
        if b.micro_batch_size is None or dp is None:
            return None
        return b.micro_batch_size * (b.gradient_accumulation_steps or 1) * dp

    @property
    def grad_accum(self) -> int | None:
        """GA as given, else global / (micro × DP) when that divides."""
        b = self.batch
        if b.gradient_accumulation_steps is not None:
            return b.gradient_accumulation_steps
        dp = self.dp_degree
        if b.global_batch_size and b.micro_batch_size and dp:
            q, r = divmod(b.global_batch_size, b.micro_batch_size * dp)
            return q if r == 0 and q > 0 else None
        if b.global_batch_size and dp is None:
            return None  # global / (micro × DP) with DP unknown: not 1
        return 1 if b.micro_batch_size else None

    @property
    def tokens_per_step(self) -> int | None:
        g, s = self.global_batch, self.batch.seq_len
        return None if g is None or s is None else g * s
