"""Read an OLMo trainer YAML (allenai/OLMo v1: configs/official-*/*.yaml, configs/*.yaml)
into the Plan.

OLMo's ``scripts/train.py`` merges the file into its ``TrainConfig`` (OmegaConf) and runs
its own training loop over PyTorch FSDP (or DDP, or one device). Values keep their YAML key
as origin; ``${...}`` interpolations into the same file are resolved, one into anything
else (``${oc.env:...}``, OLMo's ``${path.choose:...}`` resolvers) leaves the field unknown
with C006.

Defaults are OLMo's dataclass defaults (olmo/config.py at allenai/OLMo commit 59a53e3f,
Sep 2025), cited per value: ``ModelConfig`` d_model 768, n_heads 12, n_layers 12,
mlp_ratio 4, SwiGLU (the MLP's projection is split in two, so the gated width is half of
``mlp_hidden_size`` or ``mlp_ratio`` × d_model: olmo/model.py ``ff_out``), learned
positions unless ``rope`` or ``alibi``, LayerNorm (``rms`` is RMSNorm), biases, tied
embeddings, dropout 0.1 everywhere, ``max_sequence_length`` 1024, ``embedding_size``
50304 (the table's rows; ``vocab_size`` when null), ``init_fn`` normal with
``init_std`` 0.02; ``OptimizerConfig`` LionW, lr 1e-4, weight_decay 0.01, betas
0.9/0.95, eps 1e-5 (AdamW only); ``SchedulerConfig`` cosine_with_warmup, units steps,
``t_warmup`` 100, ``alpha_f`` 0.1; ``TrainConfig`` global batch 512, micro-batch 16,
``max_duration`` 10000 steps, ``distributed_strategy`` fsdp with ``FSDPConfig``
FULL_SHARD (sapper's ZeRO 3) and precision ``pure``, no clipping (``max_grad_norm``
null), no activation checkpointing. ``precision`` has no usable default: the trainer
refuses a config without amp_bf16, amp_fp16 or fp32 (C006).

How OLMo runs it (olmo/train.py, scripts/train.py, olmo/model.py): each GPU's batch is
the global batch / GPUs, its accumulation that // micro-batch; every sequence is
``max_sequence_length`` tokens, so a batch is global × max_sequence_length tokens and
``units: tokens`` (and a ``max_duration`` of ``NT`` tokens) converts to steps exactly;
``Nep`` depends on the dataset's size (C006). Under FSDP the weights are gathered in the
autocast dtype from fp32 shards (``fsdp.precision`` pure or mixed; null keeps fp32
weights under autocast), gradients kept in fp32; DDP and one device use torch.autocast.
OLMo has no GradScaler: amp_fp16 trains without loss scaling. ``max_grad_norm`` clips
the global norm; ``max_grad_norm_ratio`` clips adaptively (C006). The ``init_fn``
``mitchell`` draws 1/√d_model and scales each block's output projections by
1/√(2(layer+1)), ``full_megatron`` ``init_std`` over √(2·n_layers) (counted as depth
scaling); ``normal`` scales nothing. ``norm_after`` (OLMo 2) normalizes each branch's
output instead of its input; the residual stream stays unnormalized, which sapper's
placements (pre, post, sandwich) do not name, so the placement is left undeclared.
"""

from __future__ import annotations

import math
from typing import Any

from sapper.errors import clip
from sapper.plan.readers.base import ConfigFormat, Sniff
from sapper.plan.readers.interpolation import Unresolved
from sapper.plan.readers.keyed import MISSING, Keyed
from sapper.plan.readers.olmo_keys import SECTIONS
from sapper.plan.readers.typed import bad_value
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_olmo_config"]

_FIX = (
    "write the value into the file, or give it as a plan option (--micro-batch, --seq-len "
    "...) or in a sapper plan given after this file; sapper reads neither the environment "
    "nor OLMo's command-line overrides"
)
_MODEL = "OLMo ModelConfig default"
_TRAIN = "OLMo TrainConfig default"
_OPT = "OLMo OptimizerConfig default"
_SCHED = "OLMo SchedulerConfig default"
_SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "HYBRID_SHARD": 3, "_HYBRID_SHARD_ZERO2": 2,
             "NO_SHARD": 0}
#: ActivationCheckpointingStrategy -> (granularity, one block in k).
_CHECKPOINTING = {
    "whole_layer": ("full", 1), "one_in_two": ("full", 2), "one_in_three": ("full", 3),
    "one_in_four": ("full", 4), "one_in_eight": ("full", 8), "fine_grained": ("selective", 1),
}
_PARTIAL = ("two_in_three", "three_in_four")
_PRECISIONS = {"amp_bf16": "bf16", "amp_fp16": "fp16", "fp32": "fp32"}
_SCHEDULES = {
    "cosine_with_warmup": "cosine", "linear_with_warmup": "linear",
    "inverse_sqrt_with_warmup": "inverse_sqrt", "constant": "constant",
    "constant_with_warmup": "constant", "cosine_linear_envelope": "cosine_linear_envelope",
    "max_scheduler": "max(cosine, inverse_sqrt)",
}
_NORMS = {"default": "layernorm", "low_precision": "layernorm", "rms": "rmsnorm"}
_ACTIVATIONS = {"swiglu": "swiglu", "gelu": "gelu", "relu": "relu"}


def read_olmo_config(sniff: Sniff) -> PlanSource:
    """A Plan source from an OLMo trainer YAML, with C005/C006 findings."""
    doc = sniff.yaml
    if not isinstance(doc, dict):
        raise bad_value(sniff.name, "(the whole file)", type(doc).__name__,
                        "a mapping with model:, optimizer:, scheduler: and data:")
    k = Keyed(doc, PlanSource(name=sniff.name), fix=_FIX)
    k.set("framework", "torch", "(an OLMo config: OLMo's trainer over PyTorch)")
    for section, known in SECTIONS.items():
        k.unknown_keys(section, known, framework=f"OLMo {_CONFIG_CLASS[section]}",
                       effect="(OmegaConf refuses a key the structured config does not "
                       "have: OLMo stops at start)")
    _model(k)
    _batch(k)
    fsdp = _parallel(k)
    _precision(k, fsdp)
    _optimizer(k)
    _schedule(k)
    _clipping(k)
    if k.has("load_path"):
        # The trainer restores the checkpoint's weights before the first step.
        k.set("init.from_pretrained", True, "load_path")
    k.src.unresolved = [u for u in k.src.unresolved if not _known(k.src.data, u)]
    return k.src


_CONFIG_CLASS = {
    "": "TrainConfig", "model": "ModelConfig", "optimizer": "OptimizerConfig",
    "scheduler": "SchedulerConfig", "data": "DataConfig", "fsdp": "FSDPConfig",
    "ddp": "DDPConfig", "tokenizer": "TokenizerConfig", "wandb": "WandbConfig",
    "speed_monitor": "SpeedMonitorConfig", "compile": "CompilerConfig",
    "single": "SingleGPUConfig",
}


def _known(data: dict[str, Any], field: str) -> bool:
    node: Any = data
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# ---- model -----------------------------------------------------------------------------
def _model(k: Keyed) -> None:
    m = "model"
    k.section(m)
    d = k.take_or(f"{m}.d_model", "model.hidden_size", "int", 768, _MODEL, minimum=1)
    heads = k.take_or(f"{m}.n_heads", "model.num_heads", "int", 12, _MODEL, minimum=1)
    layers = k.take_or(f"{m}.n_layers", "model.num_layers", "int", 12, _MODEL, minimum=1)
    k.set("model.family", "olmo", "(an OLMo config)")
    _kv_heads(k, heads)
    act, origin = k.word(f"{m}.activation_type", "model.activation", _ACTIVATIONS, "swiglu",
                         _MODEL)
    if act is not None:
        k.set("model.activation", _ACTIVATIONS[act], origin)
    width, w_origin = _mlp_width(k, d)
    if width is not None and act is not None:
        if act == "swiglu":
            if width % 2:
                raise k.error(w_origin.split(" ")[0], width, "an even width (SwiGLU halves it)")
            # ff_proj gives both halves; ff_out takes output_multiplier (0.5) × the width.
            k.set("model.ffn_hidden_size", width // 2, f"{w_origin} / 2 (SwiGLU)")
        else:
            k.set("model.ffn_hidden_size", width, w_origin)
    block, origin = k.word(f"{m}.block_type", "model", ("sequential", "llama"), "sequential",
                           _MODEL)
    del block, origin  # both run attention then the MLP on the residual stream
    embedding = k.raw(f"{m}.embedding_size")
    if embedding is MISSING:
        k.take_or(f"{m}.embedding_size", "model.vocab_size", "int", 50304, _MODEL, minimum=1)
    elif embedding is None:
        k.take_or(f"{m}.vocab_size", "model.vocab_size", "int", 50257,
                  f"{_MODEL}; embedding_size null", minimum=1)
    else:
        k.take(f"{m}.embedding_size", "model.vocab_size", "int", minimum=1)
    seq = k.take_or(f"{m}.max_sequence_length", "model.max_position_embeddings", "int", 1024,
                    _MODEL, minimum=1)
    del seq
    _positions(k)
    norm, origin = k.word(f"{m}.layer_norm_type", "model.norm_type", _NORMS, "default",
                          _MODEL)
    if norm is not None:
        k.set("model.norm_type", _NORMS[norm], origin)
    after, origin = k.pick(f"{m}.norm_after", "model.norm_placement", "bool", False, _MODEL)
    if after is False:
        k.set("model.norm_placement", "pre", origin)
    bias, origin = k.pick(f"{m}.include_bias", "model.attention_bias", "bool", True, _MODEL)
    if bias is not None:
        k.set("model.attention_bias", bias, origin)
        k.set("model.mlp_bias", bias, origin)
    k.take_or(f"{m}.weight_tying", "model.tied_embeddings", "bool", True, _MODEL)
    flash, origin = k.pick(f"{m}.flash_attention", "model.attention_impl", "bool", False,
                           _MODEL)
    if flash is not None:
        # Without flash-attn OLMo calls F.scaled_dot_product_attention.
        k.set("model.attention_impl", "flash" if flash else "sdpa", origin)
    for key, field in (("attention_dropout", "model.attention_dropout"),
                       ("residual_dropout", "model.hidden_dropout"),
                       ("embedding_dropout", "model.embedding_dropout")):
        k.take_or(f"{m}.{key}", field, "number", 0.1, _MODEL, minimum=0, maximum=0.999)
    if d is not None and layers is not None:
        _init(k, d)


def _kv_heads(k: Keyed, heads: int | None) -> None:
    """ModelConfig.effective_n_kv_heads: n_kv_heads, else 1 with multi_query_attention,
    else n_heads; both set and disagreeing is refused."""
    m = "model"
    kv = k.value(f"{m}.n_kv_heads", "model.num_kv_heads", "int", minimum=1)
    mqa = k.value(f"{m}.multi_query_attention", "model.num_kv_heads", "bool")
    if kv is not None:
        if mqa is not None and kv != (1 if mqa else heads):
            raise k.error(f"{m}.n_kv_heads", kv, "n_kv_heads or multi_query_attention, not both "
                          "(OLMo refuses them when they disagree)")
        k.set("model.num_kv_heads", kv, f"{m}.n_kv_heads")
    elif mqa:
        k.set("model.num_kv_heads", 1, f"{m}.multi_query_attention")
    elif heads is not None:
        k.set("model.num_kv_heads", heads, f"{m}.n_kv_heads ({_MODEL}: n_heads)")


def _mlp_width(k: Keyed, d: int | None) -> tuple[int | None, str]:
    m = "model"
    width = k.value(f"{m}.mlp_hidden_size", "model.ffn_hidden_size", "int", minimum=1)
    if width is not None:
        return width, f"{m}.mlp_hidden_size"
    ratio, origin = k.pick(f"{m}.mlp_ratio", "model.ffn_hidden_size", "int", 4, _MODEL,
                           minimum=1)
    if ratio is None or d is None:
        return None, origin
    return ratio * d, f"{origin} × d_model"


def _positions(k: Keyed) -> None:
    m = "model"
    rope = k.value(f"{m}.rope", "model.position_encoding", "bool")
    alibi = k.value(f"{m}.alibi", "model.position_encoding", "bool")
    if rope and alibi:
        raise k.error(f"{m}.rope", True, "rope or alibi, not both (OLMo refuses both)")
    if rope:
        k.set("model.position_encoding", "rope", f"{m}.rope")
        k.take_or(f"{m}.rope_theta", "model.rope_theta", "number", 10000.0, _MODEL, minimum=1)
    elif alibi:
        k.set("model.position_encoding", "alibi", f"{m}.alibi")
    elif rope is not None or alibi is not None or not (k.given(f"{m}.rope") or
                                                        k.given(f"{m}.alibi")):
        # OLMo adds a learned position table (wpe) when neither is on.
        k.set("model.position_encoding", "learned", f"{m}.rope, {m}.alibi (off: learned "
              "positions)")


def _init(k: Keyed, d: int) -> None:
    m = "model"
    fn, origin = k.word(f"{m}.init_fn", "init.std",
                        ("normal", "mitchell", "full_megatron", "kaiming_normal", "fan_in"),
                        "normal", _MODEL)
    if fn is None:
        return
    if fn in ("kaiming_normal", "fan_in"):
        raise k.error(f"{m}.init_fn", fn, "normal / mitchell / full_megatron (OLMo's blocks "
                      "raise NotImplementedError for the others)")
    if fn == "mitchell":
        k.set("init.std", 1 / math.sqrt(d), f"{origin}: 1/√d_model")
        k.set("init.residual_scaling", "depth", f"{origin}: 1/√(2·d_model·(layer+1))")
        return
    k.take_or(f"{m}.init_std", "init.std", "number", 0.02, _MODEL, minimum=0)
    if fn == "full_megatron":
        k.set("init.residual_scaling", "depth", f"{origin}: init_std/√(2·n_layers)")
    else:
        k.set("init.residual_scaling", "none", f"{origin}: one std for every weight")


# ---- batch and parallelism --------------------------------------------------------------
def _batch(k: Keyed) -> None:
    k.take_or("global_train_batch_size", "batch.global_batch_size", "int", 512, _TRAIN,
              minimum=1)
    k.take_or("device_train_microbatch_size", "batch.micro_batch_size", "int", 16, _TRAIN,
              minimum=1)
    # The data loader cuts every instance to max_sequence_length tokens.
    seq = k.src.data.get("model", {}).get("max_position_embeddings")
    if seq is not None:
        k.set("batch.seq_len", seq, k.src.origin["model.max_position_embeddings"])


def _parallel(k: Keyed) -> bool:
    """Sharding and checkpointing; True when FSDP gathers low-precision weights."""
    strategy, origin = k.word("distributed_strategy", "parallel.zero_stage",
                              ("fsdp", "ddp", "single"), "fsdp", _TRAIN)
    key, field = "activation_checkpointing", "parallel.checkpointing.granularity"
    raw = k.raw(key)
    if raw is MISSING or raw is None or raw is False:
        k.set(field, "none", key if raw is not MISSING else f"{key} ({_TRAIN}: none)")
    else:
        # TrainConfig.update_legacy_settings: true is whole_layer.
        ckpt, c_origin = ("whole_layer", key) if raw is True else k.word(
            key, field, [*_CHECKPOINTING, *_PARTIAL])
        if ckpt in _CHECKPOINTING:
            granularity, every = _CHECKPOINTING[ckpt]
            k.set(field, granularity, c_origin)
            if every > 1:
                k.set("parallel.checkpointing.every_k_layers", every, c_origin)
        elif ckpt is not None:
            k.unresolved(key, field,
                         f"{ckpt} checkpoints several blocks in each group, which sapper's "
                         "checkpointing (one block in k) does not describe",
                         "set parallel.checkpointing in a sapper plan given after this file")
    if strategy != "fsdp":
        if strategy is not None:
            k.set("parallel.zero_stage", 0, origin)
        return False
    if k.given("fsdp") and k.raw("fsdp") is None:
        raise k.error("fsdp", None, "FSDP settings (OLMo asserts them for distributed_strategy "
                      "fsdp)")
    k.section("fsdp")
    word, s_origin = k.word("fsdp.sharding_strategy", "parallel.zero_stage", _SHARDING,
                            "FULL_SHARD", "OLMo FSDPConfig default")
    if word is not None:
        k.set("parallel.zero_stage", _SHARDING[word], s_origin)
    precision = k.raw("fsdp.precision")
    if precision is MISSING:
        return True  # FSDPConfig default: pure
    if precision is None:
        return False  # no MixedPrecision: fp32 weights under autocast
    word, _ = k.word("fsdp.precision", "precision.dtype", ("pure", "mixed"))
    return word is not None


def _precision(k: Keyed, fsdp_low: bool) -> None:
    if not k.has("precision"):
        k.unresolved("precision", "precision.dtype",
                     "not given: OLMo's trainer refuses to start without it",
                     "set precision (amp_bf16, amp_fp16 or fp32)")
        return
    word, origin = k.word("precision", "precision.dtype", _PRECISIONS)
    if word is None:
        return
    dtype = _PRECISIONS[word]
    k.set("precision.dtype", dtype, origin)
    if dtype == "fp32":
        return
    # olmo/train.py: torch.autocast and no GradScaler, whatever the dtype.
    k.set("precision.loss_scaling.mode", "none", f"{origin} (OLMo's trainer has no "
          "GradScaler)" if dtype == "fp16" else origin)
    if fsdp_low:
        where = "fsdp.precision" if k.given("fsdp.precision") else \
            "fsdp.precision (OLMo FSDPConfig default pure)"
        k.set("precision.autocast", False, where)
        k.set("precision.grad_dtype", "fp32", f"{where} (FSDP keeps fp32 gradient shards)")
    else:
        k.set("precision.autocast", True, f"{origin} (torch.autocast over fp32 weights)")


# ---- optimizer, schedule, clipping -----------------------------------------------------
def _optimizer(k: Keyed) -> None:
    o = "optimizer"
    k.section(o)
    name, origin = k.word(f"{o}.name", "optimizer.type", ("lionw", "adamw", "decoupled_lionw"),
                          "lionw", _OPT)
    if name is None:
        return
    lion = name in ("lionw", "decoupled_lionw")  # update_legacy_settings: decoupled_lionw
    k.set("optimizer.type", "lion" if lion else "adamw", origin)
    k.take_or(f"{o}.learning_rate", "optimizer.lr", "number", 1e-4, _OPT, minimum=0)
    k.take_or(f"{o}.weight_decay", "optimizer.weight_decay", "number", 0.01, _OPT, minimum=0)
    if not lion:
        k.take_or(f"{o}.eps", "optimizer.eps", "number", 1e-5, _OPT, minimum=0)
    raw = k.raw(f"{o}.betas")
    if raw is MISSING or raw is None:
        k.set("optimizer.betas", [0.9, 0.95], f"{o}.betas ({_OPT})")
    else:
        if not isinstance(raw, list) or len(raw) != 2:
            raise k.error(f"{o}.betas", raw, "two numbers, e.g. [0.9, 0.95]")
        pair = [k.value(f"{o}.betas.{i}", "optimizer.betas", "number", minimum=0, maximum=1)
                for i in range(2)]
        if None not in pair:
            k.set("optimizer.betas", [float(b) for b in pair], f"{o}.betas")  # type: ignore[arg-type]


def _tokens_per_step(k: Keyed) -> int | None:
    batch = k.src.data.get("batch", {})
    g, s = batch.get("global_batch_size"), batch.get("seq_len")
    return g * s if g and s else None


def _schedule(k: Keyed) -> None:
    s = "scheduler"
    k.section(s)
    name, origin = k.word(f"{s}.name", "schedule.type", _SCHEDULES, "cosine_with_warmup",
                          _SCHED)
    if name is not None:
        k.set("schedule.type", _SCHEDULES[name], origin)
    units, u_origin = k.word(f"{s}.units", "schedule.warmup_steps", ("steps", "tokens"),
                             "steps", _SCHED)
    tpb = _tokens_per_step(k)
    total = _max_steps(k, tpb)
    if k.has(f"{s}.t_max"):
        length = _in_steps(k, f"{s}.t_max", "schedule.total_steps", units, tpb)
        if length is not None:
            k.set("schedule.total_steps", max(length, 1), f"{s}.t_max ({u_origin})")
    elif total is not None:
        k.set("schedule.total_steps", max(total[0], 1), total[1])
    if name == "constant":
        k.set("schedule.warmup_steps", 0, f"{origin} (no warmup)")
    elif name is not None:
        if k.has(f"{s}.t_warmup"):
            warm = _in_steps(k, f"{s}.t_warmup", "schedule.warmup_steps", units, tpb)
            if warm is not None:
                k.set("schedule.warmup_steps", warm, f"{s}.t_warmup ({u_origin})")
        elif units == "steps":
            k.set("schedule.warmup_steps", 100, f"{s}.t_warmup ({_SCHED})")
        elif tpb:
            k.set("schedule.warmup_steps", math.ceil(100 / tpb), f"{s}.t_warmup ({_SCHED}: "
                  "100 tokens)")
    lr = k.src.data.get("optimizer", {}).get("lr")
    if name in ("cosine_with_warmup", "linear_with_warmup", "cosine_linear_envelope") and \
            isinstance(lr, (int, float)):
        factor, f_origin = k.pick(f"{s}.alpha_f", "schedule.min_lr", "number", 0.1, _SCHED,
                                  minimum=0, maximum=1)
        if factor is not None:
            k.set("schedule.min_lr", factor * lr, f"{f_origin} × optimizer.learning_rate")


def _in_steps(k: Keyed, key: str, field: str, units: str | None, tpb: int | None
              ) -> int | None:
    """A scheduler length in steps: as given for ``units: steps``, tokens / tokens per
    step (rounded up: the step that reaches it) for ``units: tokens``."""
    value = k.value(key, field, "number", minimum=0, maximum=1e18)
    if value is None or units is None:
        return None
    if units == "steps":
        return int(value)  # build_scheduler: int(t_warmup), int(t_max)
    if not tpb:
        k.unresolved(key, field, "a count of tokens, and the tokens per step are not known",
                     "set global_train_batch_size and model.max_sequence_length")
        return None
    return math.ceil(int(value) / tpb)


def _max_steps(k: Keyed, tpb: int | None) -> tuple[int, str] | None:
    """Trainer.max_steps: an int is steps, ``NT`` tokens, ``Nep`` epochs (unknown), any
    other string a number of steps."""
    key = "max_duration"
    raw = k.raw(key)
    if raw is MISSING or raw is None:
        return 10000, f"{key} ({_TRAIN})"
    if isinstance(raw, Unresolved):
        k.value(key, "schedule.total_steps", "str")  # C006 with the reason
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise k.error(key, raw, 'steps (an integer), "NT" tokens or "Nep" epochs')
    if isinstance(raw, int):
        if raw < 0 or raw > 10**12:
            raise k.error(key, raw, "a number of steps in 0 … 10^12")
        return raw, key
    text = raw.strip()
    number = _number(text[:-1] if text.endswith("T") else text[:-2] if text.endswith("ep")
                     else text)
    if number is None or number < 0 or number > 1e18:
        raise k.error(key, raw, 'steps (an integer), "NT" tokens or "Nep" epochs')
    if text.endswith("ep"):
        k.unresolved(key, "schedule.total_steps",
                     f"{clip(text, 40)} is epochs: the step count depends on the dataset's size",
                     "give max_duration in steps, or in tokens (e.g. 2e12T)")
        return None
    if text.endswith("T"):
        if not tpb:
            k.unresolved(key, "schedule.total_steps",
                         "a count of tokens, and the tokens per step are not known",
                         "set global_train_batch_size and model.max_sequence_length")
            return None
        return math.ceil(int(number) / tpb), f"{key} / (global batch × sequence length)"
    return int(number), key


def _number(text: str) -> float | None:
    if len(text) > 40:
        return None
    try:
        value = float(text.strip().replace("_", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _clipping(k: Keyed) -> None:
    if k.has("max_grad_norm_ratio"):
        k.value("max_grad_norm_ratio", "clipping.max_norm", "number", minimum=0)
        k.unresolved("max_grad_norm_ratio", "clipping.max_norm",
                     "clips each parameter's gradient against a running average of its norm "
                     "(adaptive), which sapper's plan does not describe",
                     "set clipping.max_norm in a sapper plan given after this file")
        return
    norm, origin = k.pick("max_grad_norm", "clipping.max_norm", "number", None,
                          f"{_TRAIN}: no clipping", minimum=0)
    k.set("clipping.max_norm", norm or None, origin)


# ---- recognition -----------------------------------------------------------------------
#: ModelConfig keys only OLMo's model section has (llm-foundry's MPT says n_heads and
#: d_model too, but names its model and has none of these).
_MODEL_SIGNATURE = frozenset({"block_type", "layer_norm_type", "mlp_ratio", "mlp_hidden_size",
                              "include_bias", "weight_tying", "max_sequence_length",
                              "embedding_size", "init_fn", "activation_type",
                              "residual_dropout", "attention_layer_norm", "norm_after"})


def _recognise(sniff: Sniff) -> float:
    """A YAML mapping with OLMo's ``model:`` (``d_model`` beside ``block_type``,
    ``layer_norm_type``, ``mlp_ratio`` ...) and no ``name`` in it; most top-level keys
    TrainConfig's (``data``, ``max_duration``, ``global_train_batch_size`` ...)."""
    doc = sniff.yaml
    if not isinstance(doc, dict) or not doc or sniff.json is not None:
        return 0.0
    model = doc.get("model")
    if not isinstance(model, dict) or "d_model" not in model or "name" in model:
        return 0.0
    if sum(str(key) in _MODEL_SIGNATURE for key in model) < 2:
        return 0.0
    keys = {str(key) for key in doc}
    share = len(keys & SECTIONS[""]) / len(keys)
    if share < 0.6:
        return 0.0
    data = doc.get("data")
    anchor = isinstance(data, dict) and ("paths" in data or "datasets" in data or
                                         "custom_dataset" in data)
    return (0.7 if anchor else 0.55) + 0.25 * share


FORMAT = ConfigFormat(
    name="olmo",
    title="an OLMo trainer config (YAML)",
    looks_for="model: with d_model, block_type, layer_norm_type, mlp_ratio; data: paths; "
    "global_train_batch_size, max_duration, fsdp:",
    recognise=_recognise,
    read=read_olmo_config,
)
