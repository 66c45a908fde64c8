"""Read a Nanotron training YAML (examples/config_tiny_llama.yaml and the like) into the
Plan.

Nanotron (huggingface/nanotron) loads the file with PyYAML's SafeLoader and builds its
``Config`` dataclasses with dacite (src/nanotron/config/config.py), so there are no
interpolations and a key the dataclasses do not define stops the job (C005). Values keep
their YAML key as origin. Defaults are the dataclasses' (commit 2411b022, Apr 2026), cited
per value; most of what sapper reads has none (``tokens``, ``parallelism`` dp/tp/pp, the
optimizer's ``zero_stage``, ``weight_decay``, ``clip_grad``, ``accumulate_grad_in_fp32``,
the Adam settings): a file without them is refused by Nanotron, and sapper leaves the
field unknown (C006).

What Nanotron does with them (src/nanotron/trainer.py, helpers.py, models/llama.py,
models/qwen.py, scaling/parametrization.py):

* Layout: ``parallelism`` dp × tp × pp × ``context_parallel_size`` GPUs,
  ``expert_parallel_size`` for MoE; ``tp_mode: REDUCE_SCATTER`` is sequence parallelism
  (``ALL_REDUCE``, the default, is not); ``pp_engine`` 1f1b or afab (all forward, all
  backward: GPipe; the default); ``recompute_layer`` checkpoints every block.
* Batch: ``tokens.micro_batch_size`` per GPU, ``batch_accumulation_per_replica``
  micro-batches per step, ``sequence_length`` tokens, ``train_steps`` steps; a data
  stage's own ``sequence_length`` different from it is unknown to sapper (C006).
* Precision: ``model.dtype`` (bfloat16 by default) is the weights' dtype; with
  ``accumulate_grad_in_fp32`` the optimizer steps fp32 copies of the weights from fp32
  gradient buffers, else AdamW updates the 16-bit weights and keeps its moments in their
  dtype. No autocast, no loss scaling (Nanotron has no GradScaler).
* ZeRO: ``zero_stage`` > 0 builds ``ZeroDistributedOptimizer``, which shards optimizer
  states over DP (sapper's stage 1) whatever the number.
* Optimizer: torch AdamW (``torch_adam_is_fused``) or SGD, ``learning_rate_scheduler``:
  linear warmup over ``lr_warmup_steps`` (default 0; ``lr_warmup_style: constant`` starts
  at the peak), then ``lr_decay_style`` (linear by default, cosine, 1-sqrt) down to
  ``min_decay_lr``, which defaults to the learning rate itself (no decay); a decay that
  starts after the warmup (``lr_decay_starting_step``) is a warmup-stable-decay schedule.
  ``lr_warmup_style`` has no usable default at this commit: Nanotron refuses a config
  without it (C006).
* Model: ``model_config`` is a LlamaConfig, Starcoder2Config or Qwen2Config (the first
  whose fields hold every key); llama and qwen2 are a SwiGLU (``hidden_act`` silu) MLP of
  ``intermediate_size``, RMSNorm, RoPE, no biases but Qwen2's optional QKV bias, vocab
  padded to a multiple of ``make_vocab_size_divisible_by`` × TP; a Qwen2 ``moe_config``
  gives the experts. Starcoder2 and custom model classes leave the model unknown (C006).
  ``init_method``: ``std`` for every weight with the output projections divided by
  √(2·layers) (``scaling_method`` NUM_LAYERS, the default); ``use_mup`` (spectral µP)
  leaves the std unknown; ``path`` loads a checkpoint, as does
  ``checkpoints.resume_checkpoint_path``.
"""

from __future__ import annotations

import math
from typing import Any

from sapper.errors import clip
from sapper.plan.readers.base import ConfigFormat, Sniff
from sapper.plan.readers.keyed import MISSING, Keyed
from sapper.plan.readers.nanotron_keys import (
    DATA_STAGE,
    DATASET,
    MODEL_CONFIGS,
    QWEN2,
    SECTIONS,
    STAGE_DATA,
)
from sapper.plan.readers.typed import bad_value
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_nanotron_config"]

_FIX = "write the value into the file, or give it in a sapper plan given after this file"
_EFFECT = "(Nanotron builds its Config with dacite, strict: it refuses the key at start)"
_MODEL = "Nanotron default"
#: Most data stages read for keys (a real config has a handful).
MAX_STAGES = 64
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_GLU = {"silu": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}


def read_nanotron_config(sniff: Sniff) -> PlanSource:
    """A Plan source from a Nanotron training YAML, with C005/C006 findings."""
    doc = sniff.yaml
    if not isinstance(doc, dict):
        raise bad_value(sniff.name, "(the whole file)", type(doc).__name__,
                        "a mapping with general:, parallelism:, model:, tokens: and optimizer:")
    k = Keyed(doc, PlanSource(name=sniff.name), fix=_FIX, interpolate=False)
    k.set("framework", "torch", "(a Nanotron config: Nanotron's trainer over PyTorch)")
    kind = _check_keys(k)
    _parallel(k)
    _batch(k)
    _precision(k)
    _model(k, kind)
    _optimizer(k)
    _schedule(k)
    for key in ("checkpoints.resume_checkpoint_path", "model.init_method.path"):
        if k.has(key):
            k.set("init.from_pretrained", True, key)
            break
    return k.src


# ---- keys ------------------------------------------------------------------------------
def _model_kind(config: Any) -> tuple[str, frozenset[str]]:
    """The model class dacite builds for ``model_config``: the first of the union whose
    fields hold every key; else ModelArgs builds a Qwen2Config from the mapping."""
    keys = {str(key) for key in config} if isinstance(config, dict) else set()
    for name, fields in MODEL_CONFIGS:
        if keys <= fields:
            return name, fields
    # A key none of them takes: the job stops there (C005); the file's is_<model>_config
    # flag says which class it meant, so the other keys are checked against that one.
    for name, fields in MODEL_CONFIGS:
        if f"is_{name}_config" in keys:
            return name, fields
    return "qwen2", QWEN2


def _check_keys(k: Keyed) -> str:
    for section, known in SECTIONS.items():
        k.unknown_keys(section, known, framework="Nanotron", effect=_EFFECT)
    kind, fields = _model_kind(k.raw("model.model_config"))
    k.unknown_keys("model.model_config", fields, framework="Nanotron",
                   effect="(no model config class takes it: Qwen2Config refuses the keyword "
                   "at start)")
    stages = k.raw("data_stages")
    if isinstance(stages, list):
        for i in range(min(len(stages), MAX_STAGES)):
            k.unknown_keys(f"data_stages.{i}", DATA_STAGE, framework="Nanotron",
                           effect=_EFFECT)
            k.unknown_keys(f"data_stages.{i}.data", STAGE_DATA, framework="Nanotron",
                           effect=_EFFECT)
            k.unknown_keys(f"data_stages.{i}.data.dataset", DATASET, framework="Nanotron",
                           effect=_EFFECT)
    return kind


def _required(k: Keyed, key: str, field: str, kind: str, *, minimum: float | None = None,
              maximum: float | None = None, store: bool = True) -> Any:
    """A value Nanotron's dataclass has no default for: its checked value (set in
    ``field`` when ``store``), or C006."""
    if not k.given(key):
        k.unresolved(key, field, "not given, and Nanotron has no default: it refuses to "
                     "start without it", f"set {key}")
        return None
    if not store:
        return k.value(key, field, kind, minimum=minimum, maximum=maximum)
    return k.take(key, field, kind, minimum=minimum, maximum=maximum)


# ---- layout and batch ------------------------------------------------------------------
def _parallel(k: Keyed) -> None:
    p = "parallelism"
    k.section(p)
    dp = _required(k, f"{p}.dp", "parallel.dp", "int", minimum=1)
    tp = _required(k, f"{p}.tp", "parallel.tp", "int", minimum=1)
    pp = _required(k, f"{p}.pp", "parallel.pp", "int", minimum=1)
    cp = k.take_or(f"{p}.context_parallel_size", "parallel.cp", "int", 1, _MODEL, minimum=1)
    k.take_or(f"{p}.expert_parallel_size", "parallel.ep", "int", 1, _MODEL, minimum=1)
    if dp is not None and tp is not None and pp is not None and cp is not None:
        # ParallelContext asserts TP × CP × DP × PP == WORLD_SIZE.
        k.set("hardware.num_gpus", dp * tp * pp * cp,
              f"{p}.dp × tp × pp × context_parallel_size (Nanotron's world size)")
    mode, origin = k.word(f"{p}.tp_mode", "parallel.sequence_parallel",
                          ("ALL_REDUCE", "REDUCE_SCATTER"), "ALL_REDUCE", _MODEL)
    if mode is not None:
        k.set("parallel.sequence_parallel", mode == "REDUCE_SCATTER", origin)
    engine, origin = k.word(f"{p}.pp_engine", "parallel.pipeline_schedule", ("1f1b", "afab"),
                            "afab", _MODEL)
    if engine is not None and pp is not None and pp > 1:
        k.set("parallel.pipeline_schedule", "1f1b" if engine == "1f1b" else "gpipe", origin)
    recompute, origin = k.pick(f"{p}.recompute_layer", "parallel.checkpointing.granularity",
                               "bool", False, _MODEL)
    if recompute is not None:
        k.set("parallel.checkpointing.granularity", "full" if recompute else "none", origin)
    zero = _required(k, "optimizer.zero_stage", "parallel.zero_stage", "int", minimum=0,
                     store=False) if isinstance(k.raw("optimizer"), dict) else None
    if zero is not None and zero <= 1:
        k.set("parallel.zero_stage", zero, "optimizer.zero_stage")
    elif zero is not None:
        # helpers.py: any stage above 0 builds ZeroDistributedOptimizer (states sharded).
        k.set("parallel.zero_stage", 1, "optimizer.zero_stage (Nanotron shards optimizer "
              "states only: ZeRO 1)")


def _batch(k: Keyed) -> None:
    t = "tokens"
    if not isinstance(k.raw(t), dict):
        if k.given(t) and k.raw(t) is not None:
            raise k.error(t, k.raw(t), "a mapping of settings")
        k.unresolved(t, "batch.micro_batch_size", "no tokens: section: Nanotron's trainer "
                     "needs its sequence length, batch and steps", "set tokens:")
        return
    _required(k, f"{t}.micro_batch_size", "batch.micro_batch_size", "int", minimum=1)
    _required(k, f"{t}.batch_accumulation_per_replica", "batch.gradient_accumulation_steps",
              "int", minimum=1)
    seq = _required(k, f"{t}.sequence_length", "batch.seq_len", "int", minimum=1)
    _required(k, f"{t}.train_steps", "schedule.total_steps", "int", minimum=1)
    stages = k.raw("data_stages")
    if seq is None or not isinstance(stages, list):
        return
    for i in range(min(len(stages), MAX_STAGES)):
        key = f"data_stages.{i}.sequence_length"
        if k.raw(f"data_stages.{i}") is not None:
            k.section(f"data_stages.{i}")
        other = k.value(key, "batch.seq_len", "int", minimum=1)
        if other is not None and other != seq:
            k.unresolved(key, "batch.seq_len",
                         f"stage {i} trains at {other} tokens, the others at {seq}: sapper "
                         "plans one sequence length", "check each length with --seq-len")
            return


# ---- precision -------------------------------------------------------------------------
def _precision(k: Keyed) -> None:
    word, origin = k.word("model.dtype", "precision.dtype", _DTYPES, "bfloat16",
                          "Nanotron ModelArgs default")
    if word is None:
        return
    dtype = _DTYPES[word]
    k.set("precision.dtype", dtype, origin)
    if dtype == "fp32":
        return
    k.set("precision.autocast", False, f"{origin} (the weights themselves are {dtype})")
    k.set("precision.loss_scaling.mode", "none", f"{origin} (Nanotron has no loss scaling)")
    key = "optimizer.accumulate_grad_in_fp32"
    fp32 = _required(k, key, "precision.master_weights", "bool", store=False) if isinstance(
        k.raw("optimizer"), dict) else None
    if fp32 is None:
        return
    if fp32:
        # FP32GradientAccumulator: fp32 copies of the weights and fp32 gradient buffers.
        k.set("precision.master_weights", "fp32", key)
        k.set("precision.grad_dtype", "fp32", key)
    else:
        for field in ("precision.master_weights", "precision.optimizer_states",
                      "precision.grad_dtype"):
            k.set(field, dtype, f"{key} (AdamW steps the {dtype} weights)")


# ---- model -----------------------------------------------------------------------------
def _model(k: Keyed, kind: str) -> None:
    m = "model.model_config"
    k.section("model")
    if not isinstance(k.raw(m), dict):
        k.unresolved(m, "model", "not given: Nanotron requires model.model_config",
                     "set model.model_config, or pass --model config.json")
        return
    if kind == "starcoder2":
        k.unresolved(m, "model", "a Starcoder2Config, which sapper does not map from Nanotron",
                     "pass --model config.json (the model's Hugging Face config)")
        return
    k.set("model.family", kind, f"{m} ({'LlamaConfig' if kind == 'llama' else 'Qwen2Config'})")
    where = f"Nanotron {'LlamaConfig' if kind == 'llama' else 'Qwen2Config'} default"
    k.take_or(f"{m}.hidden_size", "model.hidden_size", "int", 4096, where, minimum=1)
    heads = k.take_or(f"{m}.num_attention_heads", "model.num_heads", "int", 32, where,
                      minimum=1)
    layers = k.take_or(f"{m}.num_hidden_layers", "model.num_layers", "int", 32, where,
                       minimum=1)
    kv, origin = k.pick(f"{m}.num_key_value_heads", "model.num_kv_heads", "int", heads,
                        f"{where}: num_attention_heads", minimum=1)
    if kv is not None:
        k.set("model.num_kv_heads", kv, origin)
    k.take_or(f"{m}.intermediate_size", "model.ffn_hidden_size", "int", 11008, where, minimum=1)
    act, origin = k.pick(f"{m}.hidden_act", "model.activation", "str", "silu", where)
    if act is not None and act in _GLU:
        # GLUActivation(hidden_act) over gate_up_proj.
        k.set("model.activation", _GLU[act], origin)
        k.set("model.hidden_act", act, origin)
    elif act is not None:
        k.unresolved(f"{m}.hidden_act", "model.activation",
                     f"a gated MLP over {clip(act, 40)!r} has no counterpart in sapper's model",
                     "set model.activation in a sapper plan")
    _vocab(k, where)
    k.take_or(f"{m}.max_position_embeddings", "model.max_position_embeddings", "int", 2048,
              where, minimum=1)
    k.set("model.position_encoding", "rope", f"{m} ({kind}: rotary embeddings)")
    k.take_or(f"{m}.rope_theta", "model.rope_theta", "number", 10000.0, where, minimum=1)
    k.set("model.norm_type", "rmsnorm", f"{m} ({kind}: RMSNorm)")
    k.set("model.norm_placement", "pre", f"{m} ({kind}: pre-norm blocks)")
    k.take_or(f"{m}.attention_bias", "model.attention_bias", "bool", False, where)
    k.set("model.mlp_bias", False, f"{m} ({kind}: gate_up_proj and down_proj have no bias)")
    k.take_or(f"{m}.tie_word_embeddings", "model.tied_embeddings", "bool", False, where)
    k.set("model.dropout", 0.0, f"{m} ({kind}: no dropout)")
    if kind == "qwen2":
        _moe(k, layers)
    _init(k)


def _vocab(k: Keyed, where: str) -> None:
    """vocab_size padded to a multiple of make_vocab_size_divisible_by × TP
    (helpers._vocab_size_with_padding); -1 takes a Nanoset stage's vocab_size."""
    m = "model.model_config"
    key = f"{m}.vocab_size"
    vocab, origin = k.pick(key, "model.vocab_size", "int", 32000, where, minimum=-1)
    if vocab == -1:
        key = "data_stages.0.data.dataset.vocab_size"
        vocab = k.value(key, "model.vocab_size", "int", minimum=1)
        origin = f"{key} ({m}.vocab_size -1)"
        if vocab is None:
            k.unresolved(f"{m}.vocab_size", "model.vocab_size",
                         "-1 takes the dataset's vocab_size, which the first stage does not "
                         "give", "set model.model_config.vocab_size")
            return
    if vocab is None:
        return
    if vocab == 0:
        raise k.error(key, 0, "a positive vocabulary size (or -1)")
    multiple, m_origin = k.pick("model.make_vocab_size_divisible_by", "model.vocab_size", "int",
                                1, "Nanotron ModelArgs default", minimum=1)
    tp = k.src.data.get("parallel", {}).get("tp")
    if multiple is None or tp is None:
        k.set("model.vocab_size", vocab, origin)
        return
    step = multiple * tp
    padded = step * math.ceil(vocab / step)
    k.set("model.vocab_size", padded,
          origin if padded == vocab else f"{origin} padded to {m_origin} × parallelism.tp")


def _moe(k: Keyed, layers: int | None) -> None:
    c = "model.model_config.moe_config"
    if not k.has(c):
        return
    k.section(c)
    experts = k.take_or(f"{c}.num_experts", "model.num_experts", "int", 8, _MODEL, minimum=1)
    top, origin = k.pick(f"{c}.top_k", "model.experts_top_k", "int", 2, _MODEL, minimum=1)
    if top is not None and experts is not None and top > experts:
        raise k.error(f"{c}.top_k", top, f"at most num_experts ({experts})")
    if top is not None:
        k.set("model.experts_top_k", top, origin)
    k.take_or(f"{c}.moe_intermediate_size", "model.moe_ffn_hidden_size", "int", 1408, _MODEL,
              minimum=1)
    if k.value(f"{c}.enable_shared_expert", "model.shared_expert_ffn_hidden_size", "bool"):
        k.take_or(f"{c}.shared_expert_intermediate_size", "model.shared_expert_ffn_hidden_size",
                  "int", 5632, _MODEL, minimum=1)
    raw = k.raw(f"{c}.layers")
    if raw is MISSING or raw is None or raw == [-1]:
        return
    if not isinstance(raw, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                            for i in raw):
        raise k.error(f"{c}.layers", raw, "a list of layer indices ([-1]: every layer)")
    if layers is not None and sorted(raw) == list(range(layers - len(raw), layers)):
        k.set("model.first_dense_layers", layers - len(raw), f"{c}.layers")
    else:
        k.unresolved(f"{c}.layers", "model",
                     "mixture-of-experts on some layers only, which sapper's model (dense "
                     "first layers, then experts) does not describe",
                     "describe the model in a sapper plan given after this file")


def _init(k: Keyed) -> None:
    i = "model.init_method"
    method = k.raw(i)
    if not isinstance(method, dict):
        if method is MISSING or method is None:
            k.unresolved(i, "init.std", "not given: Nanotron requires model.init_method",
                         "set model.init_method (std: 0.02)")
        else:
            raise k.error(i, method, "a mapping: std (random init), use_mup or path")
        return
    if "path" in method:
        return  # ExistingCheckpointInit: the weights come from the checkpoint
    if method.get("use_mup"):
        k.unresolved(f"{i}.use_mup", "init.std",
                     "spectral µP scales each weight's init by its shape; sapper's plan has "
                     "one std", "set init.std in a sapper plan given after this file")
        return
    std = k.take(f"{i}.std", "init.std", "number", minimum=0)
    if std == 0:
        raise k.error(f"{i}.std", 0, "a positive std")
    scaling, origin = k.word(f"{i}.scaling_method", "init.residual_scaling",
                             ("NUM_LAYERS", "NONE", "LAYER_INDEX", "MODEL_SCALE"), "NUM_LAYERS",
                             "Nanotron RandomInit default")
    if scaling == "NUM_LAYERS":
        k.set("init.residual_scaling", "depth", f"{origin}: std/√(2·layers) on o_proj, "
              "down_proj")
    elif scaling == "NONE":
        k.set("init.residual_scaling", "none", origin)
    elif scaling is not None:
        k.unresolved(f"{i}.scaling_method", "init.residual_scaling",
                     f"{scaling} is not implemented by Nanotron's StandardParametrizator (it "
                     "raises at init)", "use NUM_LAYERS or NONE")


# ---- optimizer and schedule ------------------------------------------------------------
def _optimizer(k: Keyed) -> None:
    o = "optimizer"
    if not isinstance(k.raw(o), dict):
        k.unresolved(o, "optimizer.lr", "no optimizer: section: Nanotron trains without one "
                     "only for inference", "set optimizer:")
        return
    k.section(o)
    _required(k, f"{o}.weight_decay", "optimizer.weight_decay", "number", minimum=0)
    if not k.given(f"{o}.clip_grad"):
        k.unresolved(f"{o}.clip_grad", "clipping.max_norm",
                     "not given, and Nanotron has no default (null turns clipping off)",
                     "set optimizer.clip_grad")
    else:
        norm = k.value(f"{o}.clip_grad", "clipping.max_norm", "number", minimum=0)
        k.set("clipping.max_norm", norm or None, f"{o}.clip_grad")
    f = f"{o}.optimizer_factory"
    if not isinstance(k.raw(f), dict):
        k.unresolved(f, "optimizer.type", "not given: Nanotron requires optimizer_factory "
                     "(name, adam_beta1, adam_beta2, adam_eps, torch_adam_is_fused)",
                     f"set {f}")
        return
    name, origin = k.word(f"{f}.name", "optimizer.type", ("adamW", "sgd"), "adamW",
                          "Nanotron AdamWOptimizerArgs default")
    if name == "sgd":
        k.set("optimizer.type", "sgd", origin)
        return
    if name is None:
        return
    k.set("optimizer.type", "adamw", origin)
    _required(k, f"{f}.adam_eps", "optimizer.eps", "number", minimum=0)
    b1 = _required(k, f"{f}.adam_beta1", "optimizer.betas", "number", minimum=0, maximum=1,
                   store=False)
    b2 = _required(k, f"{f}.adam_beta2", "optimizer.betas", "number", minimum=0, maximum=1,
                   store=False)
    if b1 is not None and b2 is not None:
        k.set("optimizer.betas", [float(b1), float(b2)], f"{f}.adam_beta1, {f}.adam_beta2")
    _required(k, f"{f}.torch_adam_is_fused", "optimizer.fused", "bool")


def _schedule(k: Keyed) -> None:
    s = "optimizer.learning_rate_scheduler"
    if not isinstance(k.raw("optimizer"), dict):
        return
    if not isinstance(k.raw(s), dict):
        k.unresolved(s, "optimizer.lr", "not given: Nanotron requires learning_rate_scheduler",
                     f"set {s}")
        return
    lr = _required(k, f"{s}.learning_rate", "optimizer.lr", "number", minimum=0)
    warm_style, w_origin = k.word(f"{s}.lr_warmup_style", "schedule.warmup_steps",
                                  ("linear", "constant"))
    warmup, origin = k.pick(f"{s}.lr_warmup_steps", "schedule.warmup_steps", "int", 0,
                            "Nanotron default", minimum=0)
    if warm_style is None and not k.has(f"{s}.lr_warmup_style"):
        k.unresolved(f"{s}.lr_warmup_style", "schedule.warmup_steps",
                     "not given: Nanotron's LRSchedulerArgs refuses None (linear or constant)",
                     f"set {s}.lr_warmup_style: linear")
    elif warm_style == "constant":
        k.set("schedule.warmup_steps", 0, f"{w_origin} (the warmup runs at the peak LR)")
    elif warmup is not None:
        k.set("schedule.warmup_steps", warmup, origin)
    decay, d_origin = k.word(f"{s}.lr_decay_style", "schedule.type",
                             ("linear", "cosine", "1-sqrt"), "linear", "Nanotron default")
    floor, f_origin = k.pick(f"{s}.min_decay_lr", "schedule.min_lr", "number", lr,
                             "Nanotron default: the learning rate", minimum=0)
    if floor is not None:
        k.set("schedule.min_lr", floor, f_origin)
    if decay is None:
        return
    start = k.value(f"{s}.lr_decay_starting_step", "schedule.type", "int", minimum=0)
    k.value(f"{s}.lr_decay_steps", "schedule.type", "int", minimum=0)
    if floor is not None and lr is not None and floor >= lr:
        k.set("schedule.type", "constant", f"{f_origin} = learning_rate: no decay")
    elif start is not None and warmup is not None and start > warmup:
        k.set("schedule.type", "wsd", f"{s}.lr_decay_starting_step (after the warmup)")
    else:
        k.set("schedule.type", decay, d_origin)


# ---- recognition -----------------------------------------------------------------------
def _recognise(sniff: Sniff) -> float:
    """A YAML mapping with Nanotron's ``model.model_config`` beside ``parallelism:`` (dp,
    tp, pp) and ``tokens:`` or ``general:``; most top-level keys Nanotron's."""
    doc = sniff.yaml
    if not isinstance(doc, dict) or not doc or sniff.json is not None:
        return 0.0
    model, parallel = doc.get("model"), doc.get("parallelism")
    if not isinstance(model, dict) or not isinstance(model.get("model_config"), dict):
        return 0.0
    if not isinstance(parallel, dict) or not {"dp", "tp", "pp"} & set(map(str, parallel)):
        return 0.0
    keys = {str(key) for key in doc}
    share = len(keys & SECTIONS[""]) / len(keys)
    anchor = "tokens" in keys or "general" in keys
    return 0.55 + 0.4 * share if anchor and share >= 0.6 else 0.0


FORMAT = ConfigFormat(
    name="nanotron",
    title="a Nanotron training config (YAML)",
    looks_for="model: model_config, parallelism: dp/tp/pp, tokens:, optimizer: "
    "learning_rate_scheduler, general:",
    recognise=_recognise,
    read=read_nanotron_config,
)
