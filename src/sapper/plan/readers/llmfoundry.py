"""Read an llm-foundry training YAML (scripts/train/yamls/pretrain/*.yaml, finetune/*.yaml)
into the Plan.

llm-foundry's ``train.py`` reads the file with OmegaConf into its ``TrainConfig`` and runs
Composer's Trainer over PyTorch (FSDP when ``fsdp_config`` is given). Values keep their
YAML key as origin; ``${variables.max_seq_len}``-style interpolations into the same file
are resolved (:mod:`sapper.plan.readers.interpolation`), one into anything else (the
environment, a value given on the command line) leaves the field unknown with C006.

Defaults, cited from the sources (mosaicml/llm-foundry commit 8c8dd48f, Jul 2025, and the
Composer it pins, v0.32.1):

* ``TrainConfig`` (llmfoundry/utils/config_utils.py): ``precision`` amp_bf16,
  ``device_train_microbatch_size`` "auto" (Composer searches for the largest micro-batch
  that fits at run time: unknown, C006); each GPU's batch is
  ``global_train_batch_size`` / GPUs and the accumulation ceil(that / micro-batch)
  (``calculate_batch_size_info``).
* ``MPTConfig`` (llmfoundry/models/mpt/configuration_mpt.py) and its tables
  (models/utils/config_defaults.py, models/layers/ffn.py): d_model 2048, n_heads 16,
  n_layers 24, expansion_ratio 4, max_seq_len 2048, vocab_size 50368, learned positions,
  ``low_precision_layernorm``, biases (``no_bias: false``), tied embeddings, dropout 0,
  ``attn_type`` multihead_attention, ``attn_impl`` flash, ``ffn_type`` mptmlp with GELU
  (mptglu: a gated FFN over the same activation), ``rope_theta`` 10000; init
  ``kaiming_normal_`` (fan_in, relu, gain 0: std √(2/d_model)) with residual projections
  divided by √(2·n_layers) (``init_div_is_residual: true``; models/utils/
  param_init_fns.py).
* Composer's ``FSDPConfig`` (composer/utils/parallelism.py): ``sharding_strategy``
  FULL_SHARD (sapper's ZeRO 3; SHARD_GRAD_OP is 2, NO_SHARD 0), ``mixed_precision``
  DEFAULT, activation checkpointing and offloads off. ``get_mixed_precision``
  (composer/distributed/mosaic_parallelism.py): DEFAULT and PURE gather the weights in the
  precision's dtype from fp32 shards (PURE also reduces gradients in it), FULL keeps fp32
  weights under autocast; gradients are kept in fp32 unless ``keep_low_precision_grads``.
* Optimizers (llmfoundry/optim/__init__.py): ``decoupled_adamw`` is Composer's
  DecoupledAdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight_decay 1e-5, a decay that is
  not scaled by the learning rate), ``decoupled_lionw`` (lr 1e-4, betas 0.9/0.99,
  weight_decay 0). Schedulers: cosine_with_warmup (``alpha_f`` 0), linear_decay_with_warmup
  (``alpha_f`` 0), constant_with_warmup, inv_sqrt_with_warmup; ``t_warmup`` is required.
* Gradient clipping only with ``algorithms.gradient_clipping`` (Composer clips nothing
  otherwise); amp_fp16's GradScaler unscales before the clipping event (composer/trainer/
  trainer.py), and scales dynamically.

Composer's time strings (composer/core/time.py) become optimizer steps: ``100ba`` is 100
batches; ``Nsp`` samples are N / global batch; ``Ntok`` tokens are N / (global batch ×
seq len) when the train loader is ``text`` (concatenated, every sequence full; a
fine-tuning loader's padding makes it unknown); ``Xdur`` is X × max_duration; ``ep`` and
``iter`` depend on the dataset's size (C006), as does an integer ``max_duration``
(Composer reads it as epochs).

``hf_causal_lm`` names a model by ``pretrained_model_name_or_path``: a local folder with a
config.json is read as ``refs["hf_config"]``, a hub id leaves the model unknown (C006),
never downloaded; ``config_overrides`` of its shape are not applied (C006), nor can a
``peft_config`` adapter or ``disable_grad`` be expressed (``model.trainable_parameters``
unresolved). ``tp_config`` (llm-foundry's tensor parallelism of the FFN layers only) has
no counterpart in sapper's layout (C006). With one GPU llm-foundry drops FSDP (DDP): the
file does not know the count.
With ``FSDP_VERSION=2`` in the environment Composer takes the FSDP2 path; sapper reads the
FSDP1 one, the default.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from sapper.errors import clip
from sapper.plan.readers.base import ConfigFormat, Sniff, local_model_config
from sapper.plan.readers.keyed import MISSING, Keyed
from sapper.plan.readers.llmfoundry_keys import (
    ATTN_CONFIG,
    FFN_CONFIG,
    FSDP_CONFIG,
    HF_MODEL,
    INIT_CONFIG,
    MPT_MODEL,
    OPTIMIZERS,
    SCHEDULERS,
    TOP_LEVEL,
    TP_CONFIG,
)
from sapper.plan.readers.typed import bad_value
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_llmfoundry_config"]

_FIX = (
    "write the value into the file, or give it as a plan option (--micro-batch, --seq-len "
    "...) or in a sapper plan given after this file; sapper reads neither the environment "
    "nor values given on the command line"
)
_TRAIN = "llm-foundry TrainConfig default"
_MPT = "MPTConfig default"
_FSDP = "Composer FSDPConfig default"
#: Trainable parameters: unknown when only part of the model trains.
TRAINABLE = "model.trainable_parameters"

_SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "HYBRID_SHARD": 3, "_HYBRID_SHARD_ZERO2": 2,
             "NO_SHARD": 0}
_PRECISIONS = {"fp32": "fp32", "amp_fp16": "fp16", "amp_bf16": "bf16", "amp_fp8": "fp8"}
_TORCH_DTYPES = {
    "float32": "fp32", "torch.float32": "fp32", "fp32": "fp32",
    "float16": "fp16", "torch.float16": "fp16", "half": "fp16", "fp16": "fp16", "amp": "fp16",
    "amp_fp16": "fp16", "bfloat16": "bf16", "bfloat": "bf16", "torch.bfloat16": "bf16",
    "bf16": "bf16", "amp_bf16": "bf16", "float8": "bf16", "fp8": "bf16", "amp_fp8": "bf16",
}
_OPTIMIZER_TYPES = {"decoupled_adamw": "adamw", "decoupled_lionw": "lion", "clip_lion": "lion",
                    "adalr_lion": "lion"}
#: Optimizer defaults: (lr, betas, eps, weight_decay), from their constructors.
_OPTIMIZER_DEFAULTS: dict[str, tuple[float, tuple[float, float], float | None, float]] = {
    "decoupled_adamw": (1e-3, (0.9, 0.95), 1e-8, 1e-5),
    "decoupled_lionw": (1e-4, (0.9, 0.99), None, 0.0),
    "clip_lion": (1e-4, (0.9, 0.99), None, 0.0),
    "adalr_lion": (1e-4, (0.9, 0.99), None, 0.0),
}
_SCHEDULE_TYPES = {"cosine_with_warmup": "cosine", "linear_decay_with_warmup": "linear",
                   "constant_with_warmup": "constant", "inv_sqrt_with_warmup": "inverse_sqrt"}
#: The final-LR multiplier of each schedule and its default.
_FLOOR = {"cosine_with_warmup": ("alpha_f", 0.0), "linear_decay_with_warmup": ("alpha_f", 0.0),
          "inv_sqrt_with_warmup": ("alpha_f_cooldown", 0.0)}
_NORMS = {"layernorm": "layernorm", "low_precision_layernorm": "layernorm",
          "rmsnorm": "rmsnorm", "low_precision_rmsnorm": "rmsnorm", "triton_rmsnorm": "rmsnorm"}
#: A config.json key that changes the model's shape when given in ``config_overrides``.
_SHAPE_KEYS = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "d_model",
    "n_heads", "n_layers", "expansion_ratio", "ffn_dim", "num_layers", "num_heads",
    "head_dim", "tie_word_embeddings", "num_local_experts", "num_experts",
    "num_experts_per_tok", "moe_intermediate_size", "ffn_config", "attn_config",
    "max_position_embeddings", "max_seq_len", "n_positions", "rope_scaling",
})
_TIME = re.compile(r"^(.+?)(iter|ep|ba|sp|tok|dur|sec)$", re.IGNORECASE)


def read_llmfoundry_config(sniff: Sniff) -> PlanSource:
    """A Plan source from an llm-foundry training YAML, with C005/C006 findings."""
    doc = sniff.yaml
    if not isinstance(doc, dict):
        raise bad_value(sniff.name, "(the whole file)", type(doc).__name__,
                        "a mapping with model:, optimizer:, scheduler: and train_loader:")
    k = Keyed(doc, PlanSource(name=sniff.name), fix=_FIX)
    k.set("framework", "composer", "(an llm-foundry config: Composer's Trainer)")
    _check_keys(k)
    _batch(k)
    fsdp = _fsdp(k)
    _precision(k, fsdp)
    _model(k, sniff.path.parent)
    _optimizer(k)
    _schedule(k)
    _clipping(k)
    if k.has("load_path"):
        # Composer loads the checkpoint's weights before the first step: no init runs.
        k.set("init.from_pretrained", True, "load_path")
    settled = set(_leaves(k.src.data))
    k.src.unresolved = [u for u in k.src.unresolved if u not in settled]
    return k.src


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


# ---- keys ------------------------------------------------------------------------------
def _check_keys(k: Keyed) -> None:
    k.unknown_keys("", TOP_LEVEL, framework="TrainConfig (llm-foundry)",
                   effect="(TrainConfig refuses it at start: \"Unused parameters\"; put "
                   "values for interpolation under variables:)")
    name = k.raw("model.name")
    if name == "mpt_causal_lm":
        k.unknown_keys("model", MPT_MODEL, framework="ComposerMPTCausalLM",
                       effect="(MPTConfig keeps it as an attribute nothing reads: no effect)")
        k.unknown_keys("model.attn_config", ATTN_CONFIG, framework="ComposerMPTCausalLM attention",
                       effect="(MPT's attention layer refuses an unexpected keyword at start)")
        k.unknown_keys("model.init_config", INIT_CONFIG, framework="ComposerMPTCausalLM init",
                       effect="(the init functions take **kwargs and ignore it: no effect)")
        if k.raw("model.ffn_config.ffn_type") in (MISSING, None, "mptmlp", "mptglu",
                                                  "te_ln_mlp"):
            k.unknown_keys("model.ffn_config", FFN_CONFIG, framework="ComposerMPTCausalLM FFN",
                           effect="(the FFN builder refuses an unexpected keyword at start)")
    elif name == "hf_causal_lm":
        k.unknown_keys("model", HF_MODEL, framework="ComposerHFCausalLM",
                       effect="(ComposerHFCausalLM refuses an unexpected keyword at start)")
    k.unknown_keys("fsdp_config", FSDP_CONFIG, framework="Composer FSDPConfig",
                   effect="(Composer's FSDPConfig stores it unused: no effect)")
    k.unknown_keys("tp_config", TP_CONFIG, framework="Composer TPConfig",
                   effect="(TPConfig refuses an unexpected keyword at start)")
    for section, table, what in (("optimizer", OPTIMIZERS, "optimizer"),
                                 ("scheduler", SCHEDULERS, "scheduler")):
        name = k.raw(f"{section}.name")
        known = table.get(name) if isinstance(name, str) else None
        if known is not None:
            k.unknown_keys(section, known, framework=f"{name} {what}",
                           effect=f"(the {what}'s constructor refuses it at start)")
    k.unknown_keys("algorithms.gradient_clipping", ("clipping_type", "clipping_threshold"),
                   framework="GradientClipping",
                   effect="(Composer's GradientClipping refuses it at start)")


# ---- batch -----------------------------------------------------------------------------
def _batch(k: Keyed) -> None:
    if not k.given("global_train_batch_size"):
        k.unresolved("global_train_batch_size", "batch.global_batch_size",
                     "not given: llm-foundry divides it over the GPUs to size each one's "
                     "batch, and refuses to start without it",
                     "set global_train_batch_size (sequences per optimizer step)")
    k.take("global_train_batch_size", "batch.global_batch_size", "int", minimum=1)
    key = "device_train_microbatch_size"
    raw = k.raw(key)
    if raw is MISSING or (isinstance(raw, str) and raw.strip().lower() == "auto"):
        origin = key if raw is not MISSING else f"{key} ({_TRAIN} auto)"
        k.unresolved(origin, "batch.micro_batch_size",
                     '"auto": Composer searches for the largest micro-batch that fits, at run '
                     "time, halving it after each out-of-memory error",
                     "set device_train_microbatch_size to an integer, or pass --micro-batch N")
    else:
        value = k.value(key, "batch.micro_batch_size", "number", minimum=0)
        if value == 0:
            raise k.error(key, raw, 'a positive number of sequences, or "auto"')
        if value is not None and float(value).is_integer() and value >= 1:
            k.set("batch.micro_batch_size", int(value), key)
        elif value is not None:
            k.unresolved(key, "batch.micro_batch_size",
                         f"{value:g} is a fraction of a sequence per micro-batch (sequence "
                         "parallelism), which sapper's plan does not describe",
                         "give an integer micro-batch (--micro-batch N)")
    seq_key = "train_loader.dataset.max_seq_len"
    if not k.given(seq_key):
        seq_key = "max_seq_len"
        if not k.given(seq_key):
            k.unresolved(seq_key, "batch.seq_len",
                         "not given: llm-foundry refuses to start without max_seq_len",
                         "set max_seq_len (tokens per sequence)")
    k.take(seq_key, "batch.seq_len", "int", minimum=1)


# ---- FSDP ------------------------------------------------------------------------------
def _fsdp(k: Keyed) -> dict[str, Any] | None:
    """Sharding, offload and activation checkpointing from ``fsdp_config``; what the
    precision needs to know about it (None: no FSDP, DDP)."""
    if k.has("tp_config"):
        k.section("tp_config")
        k.value("tp_config.tensor_parallel_degree", "parallel.tp", "int", minimum=1)
        k.unresolved("tp_config", "parallel.tp",
                     "llm-foundry's tensor parallelism (strategy ffn) splits only the FFN "
                     "layers over the TP group; sapper's splits attention too, so neither the "
                     "layout nor the memory would be this job's",
                     "check the job without tp_config, as an upper bound on its memory")
    raw = k.raw("fsdp_config")
    if raw is MISSING or raw is None:
        k.set("parallel.zero_stage", 0, "fsdp_config (absent: DDP, every GPU holds it all)")
        k.set("parallel.checkpointing.granularity", "none",
              "fsdp_config (absent: no activation checkpointing)")
        return None
    k.section("fsdp_config")
    f = "fsdp_config"
    word, origin = k.word(f"{f}.sharding_strategy", "parallel.zero_stage", _SHARDING,
                          "FULL_SHARD", _FSDP)
    if word is not None:
        k.set("parallel.zero_stage", _SHARDING[word], origin)
    if k.value(f"{f}.cpu_offload", "parallel.offload_params", "bool"):
        # FSDP's CPUOffload: parameters and gradients on the CPU, the step there too.
        k.set("parallel.offload_params", "cpu", f"{f}.cpu_offload")
        k.set("parallel.offload_optimizer", "cpu", f"{f}.cpu_offload")
    ckpt, origin = k.pick(f"{f}.activation_checkpointing", "parallel.checkpointing.granularity",
                          "bool", False, _FSDP)
    ckpt_field = "parallel.checkpointing.granularity"
    if ckpt and k.has("model.activation_checkpointing_target"):
        k.unresolved("model.activation_checkpointing_target", ckpt_field,
                     "checkpoints the modules and blocks it names, not every block",
                     "set parallel.checkpointing in a sapper plan given after this file")
    elif ckpt is not None:
        k.set(ckpt_field, "full" if ckpt else "none", origin)
    offload = k.value(f"{f}.activation_cpu_offload", "parallel.checkpointing.cpu_offload",
                      "bool")
    if offload and ckpt:
        k.set("parallel.checkpointing.cpu_offload", True, f"{f}.activation_cpu_offload")
    elif offload:
        k.unresolved(f"{f}.activation_cpu_offload", "parallel.checkpointing.cpu_offload",
                     "moves every block's saved activations to host memory, which a sapper "
                     "plan describes only for checkpoints: the activation estimate counts "
                     "them on the GPU (an upper bound)",
                     "turn activation_checkpointing on with it, or read `sapper memory` as an "
                     "upper bound")
    mixed = k.raw(f"{f}.mixed_precision")
    low_grads = k.value(f"{f}.keep_low_precision_grads", "precision.grad_dtype", "bool")
    info: dict[str, Any] = {"low_grads": bool(low_grads)}
    if mixed is MISSING or mixed is None:
        info["params"], info["origin"] = "low", f"{f}.mixed_precision ({_FSDP} DEFAULT)"
    elif isinstance(mixed, dict):
        info["origin"] = key = f"{f}.mixed_precision.param_dtype"
        param = k.raw(key)
        if param is MISSING or param is None:
            info["params"] = "full"
        else:
            word = k.value(key, "precision.dtype", "str")
            if word is not None and word not in _TORCH_DTYPES:
                raise k.error(key, param, "bf16 / fp16 / fp32 (or null)")
            info["params"] = "full" if word is None or _TORCH_DTYPES[word] == "fp32" else "low"
    else:
        word, origin = k.word(f"{f}.mixed_precision", "precision.dtype",
                              ("DEFAULT", "PURE", "FULL"))
        info["params"] = "full" if word == "FULL" else "low"
        info["origin"] = origin
    return info


# ---- precision -------------------------------------------------------------------------
def _precision(k: Keyed, fsdp: dict[str, Any] | None) -> None:
    word, origin = k.word("precision", "precision.dtype", _PRECISIONS, "amp_bf16", _TRAIN)
    if word is None:
        return
    dtype = _PRECISIONS[word]
    k.set("precision.dtype", dtype, origin)
    key, weights = "model.master_weights_dtype", None
    if k.has(key):
        name = k.value(key, "precision.master_weights", "str")
        if name is not None:
            weights = {"bf16": "bf16", "bfloat16": "bf16", "f16": "fp16",
                       "float16": "fp16"}.get(name)
            if weights is None:
                raise k.error(key, name, "bf16 / bfloat16 / f16 / float16")
            # build_composer_model casts the model itself: the optimizer updates 16-bit
            # weights, their gradients and moments in the same dtype.
            for field in ("precision.master_weights", "precision.optimizer_states",
                          "precision.grad_dtype"):
                k.set(field, weights, key)
            k.set("precision.autocast", False, key)
    if dtype == "fp32":
        return
    if dtype == "fp16":
        k.set("precision.loss_scaling.mode", "dynamic", f"{origin} (Composer's GradScaler)")
    else:
        k.set("precision.loss_scaling.mode", "none", origin)
    if k.has(key):
        return  # 16-bit weights, or unknown ones (C006)
    if fsdp is not None and fsdp["params"] != "full":
        # FSDP gathers low-precision weights from fp32 shards (MixedPrecision param_dtype);
        # gradients are upcast to the fp32 shard after the reduction.
        k.set("precision.autocast", False, fsdp["origin"])
        k.set("precision.grad_dtype",
              ("bf16" if dtype == "fp8" else dtype) if fsdp["low_grads"] else "fp32",
              "fsdp_config.keep_low_precision_grads" if fsdp["low_grads"] else fsdp["origin"])
    else:
        k.set("precision.autocast", True, f"{origin} (torch.autocast over fp32 weights)")


# ---- model -----------------------------------------------------------------------------
def _model(k: Keyed, base: Path) -> None:
    if not isinstance(k.raw("model"), dict):
        k.unresolved("model", "model", "not given: llm-foundry requires a model section",
                     "pass --model config.json")
        return
    name = k.value("model.name", "model", "str")
    if name == "mpt_causal_lm":
        _mpt(k)
    elif name == "hf_causal_lm":
        _hf(k, base)
    elif name is not None:
        k.unresolved("model.name", "model",
                     f"{clip(name, 60)!r} is built from llm-foundry's model registry; sapper "
                     "reads mpt_causal_lm and hf_causal_lm (decoder-only) models",
                     "pass --model config.json (the model's Hugging Face config)")
    elif k.given("model.name"):
        return
    else:
        k.unresolved("model.name", "model", "not given: llm-foundry requires it",
                     "set model.name (mpt_causal_lm or hf_causal_lm)")


def _mpt(k: Keyed) -> None:
    m, a = "model", "model.attn_config"
    for key in (f"{m}.attn_config", f"{m}.ffn_config", f"{m}.init_config"):
        k.section(key)
    if k.has(f"{m}.block_overrides"):
        k.unresolved(f"{m}.block_overrides", "model",
                     "per-layer overrides give some blocks other attention (sliding windows, "
                     "shared key/value caches); sapper counts every block alike",
                     "describe the model in a sapper plan given after this file")
        return
    ffn_type, ffn_origin = k.word(f"{m}.ffn_config.ffn_type", "model",
                                  ("mptmlp", "mptglu", "te_ln_mlp", "torch_dmoe", "mb_moe",
                                   "mb_dmoe"), "mptmlp", _MPT)
    if ffn_type not in ("mptmlp", "mptglu", "te_ln_mlp"):
        if ffn_type is not None:
            k.unresolved(ffn_origin.split(" ")[0], "model",
                         f"{ffn_type} is a mixture-of-experts FFN, which sapper does not count "
                         "for MPT models",
                         "describe the model in a sapper plan (model.num_experts ...) given "
                         "after this file")
        return
    k.set("model.family", "mpt", f"{m}.name")
    d = k.take_or(f"{m}.d_model", "model.hidden_size", "int", 2048, _MPT, minimum=1)
    heads = k.take_or(f"{m}.n_heads", "model.num_heads", "int", 16, _MPT, minimum=1)
    layers = k.take_or(f"{m}.n_layers", "model.num_layers", "int", 24, _MPT, minimum=1)
    k.take(f"{m}.head_dim", "model.head_dim", "int", minimum=1)
    k.take_or(f"{m}.vocab_size", "model.vocab_size", "int", 50368, _MPT, minimum=1)
    k.take_or(f"{m}.max_seq_len", "model.max_position_embeddings", "int", 2048, _MPT,
              minimum=1)
    _mpt_ffn(k, d, ffn_type)
    # Attention: heads of keys and values by attn_type (models/layers/attention.py).
    kind, origin = k.word(f"{a}.attn_type", "model.num_kv_heads",
                          ("multihead_attention", "multiquery_attention",
                           "grouped_query_attention"), "multihead_attention", _MPT)
    if kind == "multihead_attention" and heads is not None:
        k.set("model.num_kv_heads", heads, origin)
    elif kind == "multiquery_attention":
        k.set("model.num_kv_heads", 1, origin)
    elif kind == "grouped_query_attention":
        if not k.take(f"{a}.kv_n_heads", "model.num_kv_heads", "int", minimum=1):
            k.unresolved(f"{a}.kv_n_heads", "model.num_kv_heads",
                         "grouped_query_attention needs kv_n_heads; MPT refuses without it",
                         f"set {a}.kv_n_heads")
    impl, origin = k.word(f"{a}.attn_impl", "model.attention_impl", ("flash", "torch"),
                          "flash", _MPT)
    if impl is not None:
        # torch: scaled_multihead_dot_product_attention keeps the s×s scores.
        k.set("model.attention_impl", "flash" if impl == "flash" else "eager", origin)
    k.take_or(f"{a}.attn_pdrop", "model.attention_dropout", "number", 0.0, _MPT, minimum=0,
              maximum=0.999)
    k.take_or(f"{m}.resid_pdrop", "model.hidden_dropout", "number", 0.0, _MPT, minimum=0,
              maximum=0.999)
    k.take_or(f"{m}.emb_pdrop", "model.embedding_dropout", "number", 0.0, _MPT, minimum=0,
              maximum=0.999)
    _mpt_positions(k)
    norm, origin = k.pick(f"{m}.norm_type", "model.norm_type", "str",
                          "low_precision_layernorm", _MPT)
    if norm is not None and norm.lower() in _NORMS:
        k.set("model.norm_type", _NORMS[norm.lower()], origin)
    elif norm is not None:
        k.unresolved(f"{m}.norm_type", "model.norm_type",
                     f"{clip(norm, 40)!r} is a norm from llm-foundry's registry sapper has no "
                     "counterpart for", "set model.norm_type in a sapper plan")
    no_bias, origin = k.pick(f"{m}.no_bias", "model.mlp_bias", "bool", False, _MPT)
    if no_bias is not None:
        k.set("model.mlp_bias", not no_bias, origin)
        bias, b_origin = k.pick(f"{m}.attention_bias", "model.attention_bias", "bool",
                                not no_bias, f"{_MPT}: not no_bias")
        if bias is not None:
            k.set("model.attention_bias", bias, b_origin)
    k.take_or(f"{m}.tie_word_embeddings", "model.tied_embeddings", "bool", True, _MPT)
    if layers is not None and d is not None:
        _mpt_init(k, d, layers)


def _mpt_ffn(k: Keyed, d: int | None, ffn_type: str) -> None:
    f = "model.ffn_config"
    width = k.take(f"{f}.ffn_hidden_size", "model.ffn_hidden_size", "int", minimum=1)
    if width is None and not k.given(f"{f}.ffn_hidden_size"):
        ratio, origin = k.pick("model.expansion_ratio", "model.ffn_hidden_size", "number", 4,
                               _MPT, minimum=0)
        if ratio is not None and d is not None:
            if int(d * ratio) < 1:
                raise k.error("model.expansion_ratio", ratio, "a ratio giving an FFN width ≥ 1")
            # resolve_ffn_hidden_size: int(d_model × expansion_ratio).
            k.set("model.ffn_hidden_size", int(d * ratio), f"{origin} × model.d_model")
    act, origin = k.pick(f"{f}.ffn_act_fn.name", "model.activation", "str", "gelu",
                         "llm-foundry's FFN default")
    if act is None:
        return
    table = ({"gelu": "geglu", "silu": "swiglu"} if ffn_type == "mptglu" else
             {"gelu": "gelu", "relu": "relu", "silu": "silu"})
    if act in table:
        k.set("model.activation", table[act], origin)
        k.set("model.hidden_act", act, origin)
    else:
        k.unresolved(f"{f}.ffn_act_fn.name", "model.activation",
                     f"{ffn_type} with {clip(act, 40)!r} has no counterpart in sapper's model",
                     "set model.activation in a sapper plan")


def _mpt_positions(k: Keyed) -> None:
    a = "model.attn_config"
    alibi = k.value(f"{a}.alibi", "model.position_encoding", "bool")
    rope = k.value(f"{a}.rope", "model.position_encoding", "bool")
    if alibi:
        k.set("model.position_encoding", "alibi", f"{a}.alibi")
    elif rope:
        k.set("model.position_encoding", "rope", f"{a}.rope")
        k.take_or(f"{a}.rope_theta", "model.rope_theta", "number", 10000.0, _MPT, minimum=1)
    else:
        # MPTConfig: learned positions unless alibi or rope replaces them.
        learned, origin = k.pick("model.learned_pos_emb", "model.position_encoding", "bool",
                                 True, _MPT)
        if learned is not None:
            k.set("model.position_encoding", "learned" if learned else "none", origin)


def _mpt_init(k: Keyed, d: int, layers: int) -> None:
    """The init scheme's std for a fan-in d_model matrix, and the residual scaling
    (param_init_fns.py: generic_param_init_fn_ divides residual projections by
    init_div_is_residual, √(2·n_layers) when true; neox_init_ by n_layers/√10)."""
    i = "model.init_config"
    name, origin = k.pick(f"{i}.name", "init.std", "str", "kaiming_normal_", _MPT)
    if name is None:
        return
    std: float | None = None
    if name == "baseline_":
        std = k.value(f"{i}.init_std", "init.std", "number", minimum=0)
        if std is None:
            k.unresolved(f"{i}.init_std", "init.std",
                         "baseline_ needs init_std; llm-foundry refuses without it",
                         f"set {i}.init_std")
        origin = f"{i}.init_std"
    elif name in ("small_init_", "neox_init_"):
        std = math.sqrt(2 / (5 * d))  # "Transformers without Tears"
        origin = f"{origin}: √(2/(5·d_model))"
    elif name in ("kaiming_normal_", "kaiming_uniform_"):
        std, origin = _kaiming(k, d, origin)
    elif name == "default_":
        std = 1 / math.sqrt(3 * d)  # nn.Linear's reset_parameters: kaiming_uniform(a=√5)
        origin = f"{origin}: torch's Linear default, 1/√(3·d_model)"
    else:
        k.unresolved(f"{i}.name", "init.std",
                     f"{clip(name, 40)!r} draws weights with a spread sapper does not derive",
                     "set init.std in a sapper plan given after this file")
    if std is not None:
        if std <= 0:
            raise k.error(f"{i}.init_std", std, "a positive std")
        k.set("init.std", std, origin)
    if name == "default_":
        k.set("init.residual_scaling", "none", f"{i}.name (torch's default init)")
        return
    if name == "neox_init_":
        k.set("init.residual_scaling", "custom", f"{i}.name (n_layers/√10)")
        k.set("init.residual_scale", math.sqrt(10) / layers, f"{i}.name: √10/n_layers")
        return
    key = f"{i}.init_div_is_residual"
    div = k.raw(key)
    origin = key
    if div is MISSING or div is None:
        div, origin = True, f"{key} ({_MPT})"
    elif not isinstance(div, bool):
        div = k.value(key, "init.residual_scaling", "str" if isinstance(div, str) else "number")
    if div is True:
        k.set("init.residual_scaling", "depth", origin)
    elif div is False:
        k.set("init.residual_scaling", "none", origin)
    elif div is not None:
        value = _float(div)
        if value is None or value <= 0:
            raise k.error(key, div, "true / false or a positive number")
        k.set("init.residual_scaling", "custom", origin)
        k.set("init.residual_scale", 1 / value, f"1 / {origin}")


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    if isinstance(value, str) and value.strip().replace(".", "", 1).isdigit():
        return float(value)
    return None


def _kaiming(k: Keyed, d: int, origin: str) -> tuple[float | None, str]:
    """torch's kaiming_normal_/kaiming_uniform_ std, gain/√fan_in (both draw with it),
    for a fan-in d_model matrix; other fan modes or nonlinearities are unresolved."""
    i = "model.init_config"
    mode, _ = k.pick(f"{i}.fan_mode", "init.std", "str", "fan_in", _MPT)
    nonlinearity, n_origin = k.pick(f"{i}.init_nonlinearity", "init.std", "str", "relu", _MPT)
    a, _ = k.pick(f"{i}.init_gain", "init.std", "number", 0.0, _MPT)
    if mode is None or nonlinearity is None or a is None:
        return None, origin
    gains = {"relu": math.sqrt(2.0), "leaky_relu": math.sqrt(2.0 / (1 + a * a)),
             "linear": 1.0}
    if mode != "fan_in" or nonlinearity not in gains:
        k.unresolved(f"{i}.fan_mode" if mode != "fan_in" else f"{i}.init_nonlinearity",
                     "init.std", f"kaiming init with {mode}, {nonlinearity}: sapper derives the "
                     "std for fan_in with relu, leaky_relu or linear",
                     "set init.std in a sapper plan given after this file")
        return None, origin
    return gains[nonlinearity] / math.sqrt(d), f"{origin}, {n_origin}: gain/√d_model"


def _hf(k: Keyed, base: Path) -> None:
    m = "model"
    value = k.value(f"{m}.pretrained_model_name_or_path", "model", "str")
    local = local_model_config(value, base) if value else None
    if local is not None:
        k.src.refs["hf_config"] = local
        shaped = [str(key) for key in k.section(f"{m}.config_overrides") if key in _SHAPE_KEYS]
        if shaped:
            k.unresolved(f"{m}.config_overrides", "model",
                         f"overrides {', '.join(shaped[:4])} of {local.name}; sapper reads the "
                         "config.json as saved",
                         "pass --model with a config.json that has the overrides written in")
    elif value is not None:
        k.unresolved(f"{m}.pretrained_model_name_or_path", "model",
                     f"{clip(value, 80)!r} is a hub model id; its config.json is not on this "
                     "machine", "pass --model config.json (the model's config from the hub)")
    elif not k.given(f"{m}.pretrained_model_name_or_path"):
        k.unresolved(f"{m}.pretrained_model_name_or_path", "model",
                     "not given: hf_causal_lm requires it", "pass --model config.json")
    pretrained, origin = k.pick(f"{m}.pretrained", "init.from_pretrained", "bool", True,
                                "ComposerHFCausalLM default")
    if pretrained:
        k.set("init.from_pretrained", True, origin)
    what = []
    if k.has(f"{m}.peft_config"):
        what.append("peft_config trains adapter weights over a frozen base")
    if k.value(f"{m}.load_in_8bit", TRAINABLE, "bool"):
        what.append("load_in_8bit keeps the base weights in 8 bits")
    if what:
        key = f"{m}.peft_config" if k.has(f"{m}.peft_config") else f"{m}.load_in_8bit"
        k.unresolved(key, TRAINABLE,
                     f"{'; '.join(what)}: a sapper plan describes full training of every "
                     "parameter, so the memory verdict is left unknown",
                     "estimate the adapter run's memory with `sapper smoke`, or read "
                     "`sapper memory` as an upper bound (full fine-tuning)")


# ---- optimizer and schedule ------------------------------------------------------------
def _optimizer(k: Keyed) -> None:
    o = "optimizer"
    k.section(o)
    name = k.value(f"{o}.name", "optimizer.type", "str")
    if name is None:
        if not k.given(f"{o}.name"):
            k.unresolved(f"{o}.name", "optimizer.type", "not given: llm-foundry requires it",
                         "set optimizer.name (decoupled_adamw, decoupled_lionw ...)")
        return
    if name not in _OPTIMIZER_TYPES:
        k.unresolved(f"{o}.name", "optimizer.type",
                     f"{clip(name, 40)!r} is not an optimizer sapper models (decoupled_adamw, "
                     "decoupled_lionw, clip_lion, adalr_lion)",
                     "set optimizer.type in a sapper plan given after this file")
        return
    k.set("optimizer.type", _OPTIMIZER_TYPES[name], f"{o}.name")
    lr, betas, eps, decay = _OPTIMIZER_DEFAULTS[name]
    where = f"{name} default"
    k.take_or(f"{o}.lr", "optimizer.lr", "number", lr, where, minimum=0)
    k.take_or(f"{o}.weight_decay", "optimizer.weight_decay", "number", decay, where, minimum=0)
    if eps is not None:
        k.take_or(f"{o}.eps", "optimizer.eps", "number", eps, where, minimum=0)
    raw = k.raw(f"{o}.betas")
    if raw is MISSING or raw is None:
        k.set("optimizer.betas", list(betas), f"{o}.betas ({where})")
    else:
        if not isinstance(raw, list) or len(raw) != 2:
            raise k.error(f"{o}.betas", raw, "two numbers, e.g. [0.9, 0.95]")
        pair = [k.value(f"{o}.betas.{i}", "optimizer.betas", "number", minimum=0, maximum=1)
                for i in range(2)]
        if None not in pair:
            k.set("optimizer.betas", [float(b) for b in pair], f"{o}.betas")  # type: ignore[arg-type]
    if k.has(f"{o}.disable_grad"):
        k.unresolved(f"{o}.disable_grad", TRAINABLE,
                     "freezes the parameters it matches: a sapper plan describes full training "
                     "of every parameter, so the memory verdict is left unknown",
                     "read `sapper memory` as an upper bound")


def _schedule(k: Keyed) -> None:
    s = "scheduler"
    k.section(s)
    name = k.value(f"{s}.name", "schedule.type", "str")
    if name in _SCHEDULE_TYPES:
        k.set("schedule.type", _SCHEDULE_TYPES[name], f"{s}.name")
    elif name is not None:
        k.unresolved(f"{s}.name", "schedule.type",
                     f"{clip(name, 40)!r} is not a scheduler llm-foundry registers "
                     "(cosine_with_warmup, linear_decay_with_warmup, constant_with_warmup, "
                     "inv_sqrt_with_warmup)", "set schedule.type in a sapper plan")
    elif not k.given(f"{s}.name"):
        k.unresolved(f"{s}.name", "schedule.type", "not given: llm-foundry requires it",
                     "set scheduler.name")
    duration = _duration(k)
    if k.has(f"{s}.t_max") and k.raw(f"{s}.t_max") != "1dur":
        total = _steps(k, f"{s}.t_max", "schedule.total_steps", duration)
        if total is not None:
            k.set("schedule.total_steps", max(total, 1), f"{s}.t_max")
    elif duration is not None and duration[1] == "ba":
        k.set("schedule.total_steps", max(duration[0], 1), "max_duration")
    if name in _SCHEDULE_TYPES:
        if not k.given(f"{s}.t_warmup"):
            k.unresolved(f"{s}.t_warmup", "schedule.warmup_steps",
                         "not given: every llm-foundry scheduler requires it",
                         "set scheduler.t_warmup (e.g. 100ba)")
        else:
            warm = _steps(k, f"{s}.t_warmup", "schedule.warmup_steps", duration)
            if warm is not None:
                k.set("schedule.warmup_steps", warm, f"{s}.t_warmup")
    floor = _FLOOR.get(name or "")
    lr = k.src.data.get("optimizer", {}).get("lr")
    if floor is not None and isinstance(lr, (int, float)):
        factor, origin = k.pick(f"{s}.{floor[0]}", "schedule.min_lr", "number", floor[1],
                                "Composer default", minimum=0, maximum=1)
        if factor is not None:
            k.set("schedule.min_lr", factor * lr, f"{origin} × optimizer.lr")


def _duration(k: Keyed) -> tuple[int, str] | None:
    """``max_duration`` as (optimizer steps, "ba"), or (value, unit) when it is not known
    in steps; None (C006 reported) when it cannot be read."""
    key = "max_duration"
    raw = k.raw(key)
    if raw is MISSING or raw is None:
        k.unresolved(key, "schedule.total_steps", "not given: llm-foundry requires it",
                     "set max_duration (e.g. 10000ba)")
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise k.error(key, raw, 'a Composer time such as "10000ba", "2ep" or "1e9tok"')
    if isinstance(raw, int):
        k.unresolved(key, "schedule.total_steps",
                     f"{raw} epoch(s) (Composer reads a bare number as epochs): the step count "
                     "depends on the dataset's size", "give max_duration in batches (Nba)")
        return None
    steps = _steps(k, key, "schedule.total_steps", None)
    return (steps, "ba") if steps is not None else None


def _steps(k: Keyed, key: str, field: str, duration: tuple[int, str] | None) -> int | None:
    """A Composer time string at ``key`` in optimizer steps (C006 when the file cannot
    tell)."""
    raw = k.raw(key)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raise k.error(key, raw, 'a time with its unit, e.g. "100ba" or "0.01dur"')
    value = k.value(key, field, "str")
    if value is None:
        return None
    match = _TIME.match(value.strip()) if len(value) <= 64 else None
    number = _number(match.group(1)) if match else None
    if match is None or number is None or number < 0:
        raise k.error(key, raw, 'a Composer time: a number and ba, sp, tok, ep, iter or dur '
                      '(e.g. "100ba", "0.01dur")')
    unit = match.group(2).lower()
    if unit != "dur" and not number.is_integer():
        raise k.error(key, raw, f"a whole number of {unit} (Composer requires it)")
    if unit == "dur":
        if number > 1e6:
            raise k.error(key, raw, "a fraction of the run")
        if duration is None:
            k.unresolved(key, field, f"{value} is a share of max_duration, whose length in "
                         "steps the file does not give", "give it in batches (Nba)" + (
                             ", or pass --warmup N" if field == "schedule.warmup_steps" else ""))
            return None
        return int(number * duration[0])
    if number > 1e18:
        raise k.error(key, raw, "a time below 10^18")
    count = int(number)
    if unit == "ba":
        return count
    batch = k.src.data.get("batch", {})
    global_batch, seq = batch.get("global_batch_size"), batch.get("seq_len")
    if unit == "sp" and global_batch:
        return math.ceil(count / global_batch)
    if unit == "tok" and global_batch and seq and k.raw("train_loader.name") == "text":
        return math.ceil(count / (global_batch * seq))
    why = {
        "ep": "epochs: the step count depends on the dataset's size",
        "iter": "iterations (groups of epochs): the step count depends on the dataset's size",
        "sec": "wall-clock time, which Composer's schedulers do not take",
        "sp": "samples, and the global batch is not known",
        "tok": "tokens: a fine-tuning loader pads its sequences (or the batch or sequence "
               "length is not known), so the tokens per step are not",
    }[unit]
    k.unresolved(key, field, f"{value} is {why}", "give it in batches (Nba)" + (
        ", or pass --warmup N" if field == "schedule.warmup_steps" else ""))
    return None


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().replace("_", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _clipping(k: Keyed) -> None:
    g = "algorithms.gradient_clipping"
    k.section("algorithms")
    if not k.given(g):
        k.set("clipping.max_norm", None, f"{g} (absent: Composer does not clip)")
        return
    k.section(g)
    kind, _ = k.word(f"{g}.clipping_type", "clipping.max_norm", ("norm", "value", "adaptive"))
    if kind is None:
        if not k.given(f"{g}.clipping_type"):
            raise k.error(f"{g}.clipping_type", None, "norm / value / adaptive")
        return
    if kind != "norm":
        k.unresolved(f"{g}.clipping_type", "clipping.max_norm",
                     f"{kind} clipping has no counterpart in sapper's plan (clipping by the "
                     "global norm)", "set clipping in a sapper plan given after this file")
        return
    threshold = k.value(f"{g}.clipping_threshold", "clipping.max_norm", "number", minimum=0)
    if threshold is None:
        if not k.given(f"{g}.clipping_threshold"):
            raise k.error(f"{g}.clipping_threshold", None, "a positive number")
        return
    k.set("clipping.max_norm", threshold or None, f"{g}.clipping_threshold")
    # The trainer unscales fp16 gradients before AFTER_TRAIN_BATCH, where clipping runs.
    k.set("clipping.applied", "after_unscale", f"{g} (Composer unscales before it clips)")


# ---- recognition -----------------------------------------------------------------------
#: Keys only llm-foundry's train YAMLs have at the top (OLMo's configs share
#: global_train_batch_size, device_train_microbatch_size and precision; they have neither
#: variables:, train_loader: nor fsdp_config:).
_SIGNATURE = frozenset({"variables", "train_loader", "fsdp_config", "max_seq_len",
                        "algorithms", "icl_tasks", "eval_gauntlet", "tp_config",
                        "device_train_microbatch_size", "global_train_batch_size"})


def _recognise(sniff: Sniff) -> float:
    """A YAML mapping whose ``model:`` names an llm-foundry model (``name``) beside
    TrainConfig's keys (``train_loader``, ``variables``, ``max_duration`` ...); most top-level
    keys TrainConfig's."""
    doc = sniff.yaml
    if not isinstance(doc, dict) or not doc or sniff.json is not None:
        return 0.0
    model = doc.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        return 0.0
    keys = {str(key) for key in doc}
    hits = len(keys & _SIGNATURE)
    if hits < 2 or ("train_loader" not in keys and "variables" not in keys):
        return 0.0
    share = len(keys & TOP_LEVEL) / len(keys)
    return 0.5 + 0.45 * share if share >= 0.6 else 0.0


FORMAT = ConfigFormat(
    name="llmfoundry",
    title="an llm-foundry training YAML (Composer)",
    looks_for="model: with name (mpt_causal_lm, hf_causal_lm), train_loader:, variables:, "
    "global_train_batch_size, max_duration, fsdp_config:",
    recognise=_recognise,
    read=read_llmfoundry_config,
)
