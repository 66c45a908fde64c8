"""Read a NeMo Megatron GPT config (Hydra YAML: ``trainer:`` and ``model:``) into the Plan.

The files are NeMo 1.x's ``megatron_gpt_config.yaml`` and what is derived from it (the
NeMo-Megatron-Launcher's ``conf/training/gpt3/*.yaml``, ``llama/*.yaml`` ...). Every value
keeps its NeMo key as origin (``model.tensor_model_parallel_size``), and ``${...}``
interpolations into the same file are resolved (:mod:`sapper.plan.readers.interpolation`);
one into anything else (the environment, the launcher's ``${data_dir}``, a resolver that
runs at launch) leaves the field unknown with C006, as does the vocabulary, which lives
in the tokenizer files and not in the YAML.

Defaults are NeMo's, cited where used: the fp16 GradScaler's (2^32, 1000 steps,
hysteresis 2) from nemo/collections/nlp/parts/megatron_trainer_builder.py, the model's
(gelu, layernorm, learned positions, biases, tied embeddings) from
nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py, and Lightning's
``precision="32-true"`` when ``trainer.precision`` is absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sapper.errors import clip
from sapper.plan.readers.base import (
    ConfigFormat,
    Sniff,
    local_model_config,
    unknown_key_findings,
    unresolved_finding,
)
from sapper.plan.readers.interpolation import MISSING, Unresolved
from sapper.plan.readers.keyed import Keyed
from sapper.plan.readers.nemo_keys import SECTIONS
from sapper.plan.readers.typed import bad_value, check_kind
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_nemo_config"]

_FIX = (
    "write the value into the file, or give it as a plan option (--gpus, --seq-len, "
    "--micro-batch ...) or in a sapper plan; sapper reads neither the environment nor "
    "the files a Hydra config is composed with"
)
_VOCAB_FIX = (
    "pass --model config.json (the model's Hugging Face config) or set model.vocab_size "
    "in a sapper plan given after this file"
)

#: trainer.precision -> compute dtype. NeMo's MegatronTrainerBuilder._plugins treats
#: 16/'16'/'16-mixed' as fp16 and 'bf16'/'bf16-mixed' as bf16 mixed precision; the rest
#: are Lightning's own (32-true, 64-true, bf16-true, 16-true).
_PRECISIONS = {
    "16": ("fp16", "mixed"), "16-mixed": ("fp16", "mixed"),
    "bf16": ("bf16", "mixed"), "bf16-mixed": ("bf16", "mixed"),
    "32": ("fp32", "full"), "32-true": ("fp32", "full"),
    "64": ("fp32", "full"), "64-true": ("fp32", "full"),
    "bf16-true": ("bf16", "true"), "16-true": ("fp16", "true"),
}
_ACTIVATIONS = {
    "gelu": "gelu", "geglu": "geglu", "fast-geglu": "geglu", "swiglu": "swiglu",
    "fast-swiglu": "swiglu", "relu": "relu", "silu": "silu",
}
_NORMS = {"layernorm": "layernorm", "layernorm1p": "layernorm", "rmsnorm": "rmsnorm",
          "low_precision_layernorm": "layernorm"}
_POSITIONS = {"learned_absolute": "learned", "rope": "rope", "alibi": "alibi", "none": "none"}
_BLOCKS = {"pre_ln": "pre", "post_ln": "post"}
#: NeMo's optimizer names (nemo/core/optim/optimizers.py). apex's FusedAdam and
#: DistributedFusedAdam decouple weight decay (adam_w_mode=True by default).
_OPTIMIZERS = {
    "fused_adam": "adamw", "distributed_fused_adam": "adamw", "mcore_distributed_optim": "adamw",
    "adamw": "adamw", "adam": "adam", "sgd": "sgd", "adafactor": "adafactor", "lamb": "lamb",
    "novograd": "novograd", "adagrad": "adagrad", "rmsprop": "rmsprop",
}
#: Optimizers that partition fp32 master weights and states over data parallelism.
_DISTRIBUTED = ("distributed_fused_adam", "mcore_distributed_optim")
#: NeMo scheduler names (nemo/core/optim/lr_scheduler.py) -> Plan schedule.type.
_SCHEDULES = {
    "CosineAnnealing": "cosine", "NoamAnnealing": "noam", "WarmupAnnealing": "linear",
    "InverseSquareRootAnnealing": "inverse_sqrt", "SquareRootAnnealing": "sqrt",
    "PolynomialDecayAnnealing": "polynomial", "PolynomialHoldDecayAnnealing": "polynomial",
    "WarmupPolicy": "constant", "WarmupHoldPolicy": "constant", "ConstantLR": "constant",
    "SquareAnnealing": "square", "T5InverseSquareRootAnnealing": "inverse_sqrt",
}


def read_nemo_config(sniff: Sniff) -> PlanSource:
    """A Plan source from a NeMo Hydra YAML, with C005/C006 findings attached."""
    doc = sniff.yaml
    if not isinstance(doc, dict):
        raise bad_value(sniff.name, "(the whole file)", type(doc).__name__,
                        "a mapping with trainer: and model: sections")
    r = _Reader(doc, PlanSource(name=sniff.name))
    r.base = sniff.path.parent
    r.src.set("framework", "nemo", "(a NeMo config)")
    r.check_keys()
    _hardware(r)
    _precision(r)
    _batch(r)
    _parallel(r)
    _model(r)
    _optimizer(r)
    _schedule(r)
    _checkpointing(r)
    _restored(r)
    return r.src


class _Reader(Keyed):
    """Typed, interpolation-resolving access to the config; every value reaches the Plan
    with its NeMo key as origin."""

    def __init__(self, doc: dict[str, Any], src: PlanSource) -> None:
        super().__init__(doc, src, fix=_FIX, max_number=None)
        self.base = Path(".")

    def choice(self, key: str, field: str, table: dict[str, str]) -> str | None:
        """A NeMo word mapped through ``table``; a word the table lacks is an error
        naming the choices."""
        value = self.value(key, field, "str")
        if value is None:
            return None
        mapped = table.get(value.strip().lower())
        if mapped is None:
            raise bad_value(self.file, key, value, " / ".join(table))
        return mapped

    def check_keys(self) -> None:
        effects = {
            "": "NeMo ignores it",
            "trainer": "Lightning's Trainer refuses to start (an unexpected keyword argument)",
            "model": "NeMo ignores it silently, so the setting has no effect",
            "model.optim.sched": "NeMo's scheduler ignores or refuses it",
        }
        for section, known in SECTIONS.items():
            node = self.doc if not section else self.raw(section)
            if not isinstance(node, dict):
                continue
            keys = [f"{section}.{k}" if section else str(k) for k in node]
            full = {f"{section}.{k}" if section else k for k in known}
            self.src.findings.extend(unknown_key_findings(
                keys, full, file=self.file, framework="NeMo", effect=effects[section]
            ))


# ---- sections --------------------------------------------------------------------------
def _hardware(r: _Reader) -> None:
    """GPUs per node as Lightning reads ``devices``: a count, a list of device ids, a
    string of either ("4", "0,1"), or -1 / "auto" for every GPU the machine has."""
    key, field = "trainer.devices", "hardware.gpus_per_node"
    devices = r.raw(key)
    if isinstance(devices, Unresolved):
        unresolved_finding(r.src, key, field, devices.why, _FIX)
    elif devices == -1 or (isinstance(devices, str) and devices.strip() in ("-1", "auto")):
        unresolved_finding(r.src, key, field,
                           f"{devices!r} means every GPU the machine has, known at launch",
                           "give --gpus-per-node (or --gpus)")
    elif isinstance(devices, list) and devices:
        r.src.set(field, len(devices), key)
    elif isinstance(devices, str) and "," in devices:
        ids = [d for d in devices.split(",") if d.strip()]
        if not ids or not all(d.strip().isdigit() for d in ids):
            raise bad_value(r.file, key, devices, 'a GPU count, "auto" or device ids "0,1"')
        r.src.set(field, len(ids), key)
    elif isinstance(devices, str) and devices.strip().isdigit() and len(devices) < 8:
        count = int(devices)
        if count < 1:
            raise bad_value(r.file, key, devices, "a positive GPU count")
        r.src.set(field, count, key)
    elif devices is not MISSING and devices is not None:
        r.take(key, field, "int", minimum=1)
    if r.given("trainer.num_nodes"):
        r.take("trainer.num_nodes", "hardware.nodes", "int", minimum=1)
    else:  # Trainer(num_nodes=1)
        r.src.set("hardware.nodes", 1, "trainer.num_nodes (Lightning default)")


def _precision(r: _Reader) -> None:
    raw = r.raw("trainer.precision")
    if isinstance(raw, Unresolved):
        unresolved_finding(r.src, "trainer.precision", "precision.dtype", raw.why, _FIX)
        return
    key = "trainer.precision"
    if raw is MISSING or raw is None:
        # Lightning's Trainer(precision=None) is "32-true".
        raw, key = "32-true", "trainer.precision (Lightning default)"
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise bad_value(r.file, "trainer.precision", raw, " / ".join(_PRECISIONS))
    word = str(raw).strip().lower()
    if word not in _PRECISIONS:
        raise bad_value(r.file, "trainer.precision", raw, " / ".join(_PRECISIONS))
    dtype, mode = _PRECISIONS[word]
    r.src.set("precision.dtype", dtype, key)
    fsdp = r.value("model.fsdp", "parallel.zero_stage", "bool") is True
    if mode == "true":  # Lightning's *-true: the weights themselves in that dtype
        if dtype != "fp32":
            r.src.set("precision.master_weights", dtype, key)
            r.src.set("precision.optimizer_states", dtype, key)
        r.src.set("precision.loss_scaling.mode", "none", key)
        return
    if mode == "full":
        return
    # megatron_trainer_builder.py: O2 is turned off under FSDP; default False.
    o2 = not fsdp and r.value("model.megatron_amp_O2", "precision.autocast", "bool") is True
    o2_key = "model.megatron_amp_O2" if r.given("model.megatron_amp_O2") else (
        "model.megatron_amp_O2 (NeMo default False)")
    if o2:  # Float16Module: half-precision weights, fp32 main params in the optimizer
        r.src.set("precision.autocast", False, o2_key)
        r.src.set("precision.master_weights", "fp32", o2_key)
        r.src.set("precision.grad_dtype", "fp32", o2_key)
    else:  # PipelineMixedPrecisionPlugin: torch.autocast over fp32 weights
        r.src.set("precision.autocast", True, o2_key if not fsdp else "model.fsdp")
    if dtype == "bf16":
        r.src.set("precision.loss_scaling.mode", "none", key)
        return
    r.src.set("precision.loss_scaling.mode", "dynamic", key)
    if fsdp:
        return  # NeMo passes no scaler to FSDP; Lightning's ShardedGradScaler has torch's
    # MegatronTrainerBuilder._grad_scaler: GradScaler(init_scale=native_amp_init_scale
    # or 2**32, growth_interval=native_amp_growth_interval or 1000, hysteresis or 2).
    ls = "precision.loss_scaling"
    for nemo_key, field, default, kind in (
        ("model.native_amp_init_scale", f"{ls}.initial_scale", float(2**32), "number"),
        ("model.native_amp_growth_interval", f"{ls}.growth_interval", 1000, "int"),
        ("model.hysteresis", f"{ls}.hysteresis", 2, "int"),
    ):
        if r.given(nemo_key):
            value = r.value(nemo_key, field, kind, minimum=1)
            if value is not None:
                r.src.set(field, float(value) if kind == "number" else value, nemo_key)
        else:
            r.src.set(field, default, f"{nemo_key} (NeMo default)")


def _batch(r: _Reader) -> None:
    r.take("model.micro_batch_size", "batch.micro_batch_size", "int", minimum=1)
    r.take("model.global_batch_size", "batch.global_batch_size", "int", minimum=1)
    # The dataset cuts samples of model.data.seq_length (megatron_gpt_config.yaml sets it
    # to ${model.encoder_seq_length}); older configs give only the model's length.
    if r.given("model.data.seq_length"):
        r.take("model.data.seq_length", "batch.seq_len", "int", minimum=1)
    else:
        r.take("model.encoder_seq_length", "batch.seq_len", "int", minimum=1)
    r.take("trainer.max_steps", "schedule.total_steps", "int", minimum=1)
    # Lightning clips by norm unless gradient_clip_algorithm is "value"; 0 or null: off.
    algorithm = r.value("trainer.gradient_clip_algorithm", "clipping.max_norm", "str")
    if algorithm is None or algorithm.lower() == "norm":
        r.take("trainer.gradient_clip_val", "clipping.max_norm", "number", minimum=0)


def _parallel(r: _Reader) -> None:
    m = "model"
    r.take(f"{m}.tensor_model_parallel_size", "parallel.tp", "int", minimum=1)
    pp = r.take(f"{m}.pipeline_model_parallel_size", "parallel.pp", "int", minimum=1)
    r.take(f"{m}.context_parallel_size", "parallel.cp", "int", minimum=1)
    r.take(f"{m}.expert_model_parallel_size", "parallel.ep", "int", minimum=1)
    r.take(f"{m}.sequence_parallel", "parallel.sequence_parallel", "bool")
    vp = r.take(f"{m}.virtual_pipeline_model_parallel_size", "parallel.virtual_pipeline_stages",
                "int", minimum=1)
    if pp and pp > 1:
        r.src.set("parallel.pipeline_schedule", "interleaved" if vp and vp > 1 else "1f1b",
                  f"{m}.virtual_pipeline_model_parallel_size")
    name = r.value(f"{m}.optim.name", "optimizer.type", "str")
    if r.value(f"{m}.fsdp", "parallel.zero_stage", "bool"):
        # NLPFSDPStrategy: 'full' shards weights, grads and states (ZeRO-3), 'grad' grads
        # and states (ZeRO-2), 'hybrid' shards fully within a node (counted as ZeRO-3).
        strategy = r.choice(f"{m}.fsdp_sharding_strategy", "parallel.zero_stage",
                            {"full": "3", "hybrid": "3", "grad": "2"}) or "3"
        r.src.set("parallel.zero_stage", int(strategy), f"{m}.fsdp")
    elif name in _DISTRIBUTED:
        # The distributed optimizer partitions fp32 main weights and Adam states over the
        # data-parallel group: what sapper counts as ZeRO stage 1.
        r.src.set("parallel.zero_stage", 1, f"{m}.optim.name")


def _model(r: _Reader) -> None:
    """The architecture. NeMo's vocabulary is the tokenizer's (padded to a multiple of
    ``make_vocab_size_divisible_by`` × TP), which the YAML does not hold unless
    ``override_vocab_size`` replaces it; without it model.vocab_size is unresolved (C006)
    and the model counts as unknown unless another source (``--model config.json``)
    gives the vocabulary."""
    m = "model"
    if not isinstance(r.raw(m), dict):
        return
    shape = (
        r.take(f"{m}.hidden_size", "model.hidden_size", "int", minimum=1),
        r.take(f"{m}.num_layers", "model.num_layers", "int", minimum=1),
        r.take(f"{m}.num_attention_heads", "model.num_heads", "int", minimum=1),
    )
    if all(v is None for v in shape):
        return
    if r.given(f"{m}.override_vocab_size"):
        r.take(f"{m}.override_vocab_size", "model.vocab_size", "int", minimum=1)
    else:
        _vocab_from_tokenizer(r)
    r.src.set("model.implementation", "megatron", "(NeMo runs Megatron's kernels)")
    r.take(f"{m}.ffn_hidden_size", "model.ffn_hidden_size", "int", minimum=1)
    r.take(f"{m}.num_query_groups", "model.num_kv_heads", "int", minimum=1)
    r.take(f"{m}.kv_channels", "model.head_dim", "int", minimum=1)
    r.take(f"{m}.max_position_embeddings", "model.max_position_embeddings", "int", minimum=1)
    r.take(f"{m}.hidden_dropout", "model.dropout", "number", minimum=0, maximum=0.999)
    r.take(f"{m}.hidden_dropout", "model.hidden_dropout", "number", minimum=0, maximum=0.999)
    r.take(f"{m}.attention_dropout", "model.attention_dropout", "number", minimum=0,
           maximum=0.999)
    r.take(f"{m}.ffn_dropout", "model.activation_dropout", "number", minimum=0, maximum=0.999)
    r.take(f"{m}.num_moe_experts", "model.num_experts", "int", minimum=1)
    if r.given(f"{m}.num_moe_experts"):
        r.take(f"{m}.moe_router_topk", "model.experts_top_k", "int", minimum=1)
    # Defaults of megatron_gpt_model.py (cfg.get(key, default)) where the file is silent.
    _defaulted(r, "activation", "model.activation", _ACTIVATIONS, "gelu")
    _defaulted(r, "normalization", "model.norm_type", _NORMS, "layernorm")
    position = _defaulted(r, "position_embedding_type", "model.position_encoding",
                          _POSITIONS, "learned_absolute")
    if position == "rope":
        r.take(f"{m}.rotary_base", "model.rope_theta", "number", minimum=1)
        if not r.given(f"{m}.rotary_base"):
            r.src.set("model.rope_theta", 10000.0, f"{m}.rotary_base (NeMo default)")
    if r.given(f"{m}.transformer_block_type"):
        block = r.value(f"{m}.transformer_block_type", "model.norm_placement", "str")
        if block is not None and block in _BLOCKS:
            r.src.set("model.norm_placement", _BLOCKS[block], f"{m}.transformer_block_type")
    for key, field, default in (
        ("bias", ("model.attention_bias", "model.mlp_bias"), True),
        ("share_embeddings_and_output_weights", ("model.tied_embeddings",), True),
    ):
        value = r.value(f"{m}.{key}", field[0], "bool")
        origin = f"{m}.{key}" if value is not None else f"{m}.{key} (NeMo default)"
        for f in field:
            r.src.set(f, default if value is None else value, origin)
    r.take(f"{m}.init_method_std", "init.std", "number", minimum=0)
    # Megatron's scaled init (std / sqrt(2 L) on the output projections), on by default
    # (megatron_base_model.py: cfg.get('use_scaled_init_method', True)).
    scaled = r.value(f"{m}.use_scaled_init_method", "init.residual_scaling", "bool")
    r.src.set("init.residual_scaling", "none" if scaled is False else "depth",
              f"{m}.use_scaled_init_method" + ("" if scaled is not None else " (NeMo default)"))


def _restored(r: _Reader) -> None:
    """Weights loaded from a checkpoint: the init scheme never runs."""
    m = "model"
    # megatron_gpt_pretraining.py: restore_from_path loads weights, restore_from_ckpt
    # weights and optimizer states; either means the init never runs.
    # A ``???`` there is a path the job cannot start without (OmegaConf's mandatory
    # value), as in NeMo's fine-tuning configs.
    for key in (f"{m}.restore_from_path", f"{m}.restore_from_ckpt", "restore_from_path"):
        path = r.raw(key)
        if isinstance(path, Unresolved) or (isinstance(path, str) and path.strip()):
            r.src.set("init.from_pretrained", True, key)
            break


def _vocab_from_tokenizer(r: _Reader) -> None:
    """A Hugging Face tokenizer named by a local model folder (``library: huggingface``,
    ``type: /models/llama``) brings that folder's config.json, read before this file; a
    hub id or a tokenizer file leaves the vocabulary unresolved (C006)."""
    t = "model.tokenizer"
    library, kind = r.raw(f"{t}.library"), r.raw(f"{t}.type")
    if library == "huggingface" and isinstance(kind, str):
        local = local_model_config(kind, r.base)
        if local is not None:
            r.src.refs["hf_config"] = local
            return
    what = f" ({clip(kind, 80)})" if isinstance(kind, str) else ""
    fix = _VOCAB_FIX
    if library == "huggingface" and isinstance(kind, str) and "/" in kind:
        fix = f"pass --model config.json ({clip(kind, 80)}'s config.json; sapper never " \
              "downloads it)"
    unresolved_finding(r.src, t, "model.vocab_size",
                       f"the vocabulary size is the tokenizer's{what}, not in this file", fix)


def _defaulted(r: _Reader, key: str, field: str, table: dict[str, str], default: str) -> str:
    """A model choice, NeMo's default when absent. A NeMo value sapper's model has no
    counterpart for (reglu, kerple, xpos ...) leaves the field unknown (C006)."""
    full = f"model.{key}"
    value = r.raw(full)
    if value is MISSING or value is None:
        r.src.set(field, table[default], f"{full} (NeMo default)")
        return default
    word = r.value(full, field, "str")
    if word is None:
        return ""
    word = word.strip().lower()
    if word not in table:
        unresolved_finding(r.src, full, field, f"{word!r} has no counterpart in sapper's model",
                           f"set {field} in a sapper plan to the nearest kind")
        return word
    r.src.set(field, table[word], full)
    return word


def _optimizer(r: _Reader) -> None:
    o = "model.optim"
    if not isinstance(r.raw(o), dict):
        return
    name = r.value(f"{o}.name", "optimizer.type", "str")
    if name is not None:
        r.src.set("optimizer.type", _OPTIMIZERS.get(name.lower(), name.lower()), f"{o}.name")
    r.take(f"{o}.lr", "optimizer.lr", "number", minimum=0)
    r.take(f"{o}.weight_decay", "optimizer.weight_decay", "number", minimum=0)
    r.take(f"{o}.eps", "optimizer.eps", "number", minimum=0)
    r.take(f"{o}.momentum", "optimizer.momentum", "number", minimum=0)
    betas = r.raw(f"{o}.betas")
    if isinstance(betas, Unresolved):
        unresolved_finding(r.src, f"{o}.betas", "optimizer.betas", betas.why, _FIX)
    elif betas is not MISSING and betas is not None:
        if not isinstance(betas, list) or len(betas) != 2:
            raise bad_value(r.file, f"{o}.betas", betas, "two numbers, e.g. [0.9, 0.95]")
        pair = [check_kind(r.file, f"{o}.betas[{i}]", r.raw(f"{o}.betas.{i}"), "number",
                           minimum=0, maximum=1) for i in range(2)]
        r.src.set("optimizer.betas", [float(b) for b in pair], f"{o}.betas")


def _schedule(r: _Reader) -> None:
    s = "model.optim.sched"
    if not isinstance(r.raw(s), dict):
        return
    name = r.value(f"{s}.name", "schedule.type", "str")
    if name is not None:
        r.src.set("schedule.type", _SCHEDULES.get(name, name.lower()), f"{s}.name")
    # NeMo's prepare_lr_scheduler sets the schedule's max_steps from the trainer unless
    # the scheduler gives its own.
    total = r.take(f"{s}.max_steps", "schedule.total_steps", "int", minimum=1)
    if total is None:
        total = r.src.data.get("schedule", {}).get("total_steps")
    if r.given(f"{s}.warmup_steps"):
        r.take(f"{s}.warmup_steps", "schedule.warmup_steps", "int", minimum=0)
    elif r.given(f"{s}.warmup_ratio"):
        ratio = r.value(f"{s}.warmup_ratio", "schedule.warmup_steps", "number", minimum=0,
                        maximum=1)
        if ratio is not None and total:
            r.src.set("schedule.warmup_steps", int(ratio * total),
                      f"{s}.warmup_ratio × trainer.max_steps")
    r.take(f"{s}.min_lr", "schedule.min_lr", "number", minimum=0)


def _checkpointing(r: _Reader) -> None:
    """``activations_checkpoint_granularity``: selective (attention core) or full; full
    with method ``uniform`` checkpoints groups of ``activations_checkpoint_num_layers``
    (every block recomputed), ``block`` only that many blocks per stage."""
    m = "model"
    words = {"selective": "selective", "full": "full"}
    granularity = r.choice(f"{m}.activations_checkpoint_granularity",
                           "parallel.checkpointing.granularity", words)
    if granularity is None:
        if r.raw(f"{m}.activations_checkpoint_granularity") is None and r.given(
            f"{m}.activations_checkpoint_granularity"
        ):
            r.src.set("parallel.checkpointing.granularity", "none",
                      f"{m}.activations_checkpoint_granularity")
        return
    r.src.set("parallel.checkpointing.granularity", granularity,
              f"{m}.activations_checkpoint_granularity")


#: Keys only NeMo's Megatron configs put under ``model:`` (a sapper plan's model section
#: says num_heads, hidden_size; an Axolotl YAML has no model section at all).
_NEMO_MODEL_KEYS = frozenset({
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "encoder_seq_length",
    "megatron_amp_O2", "micro_batch_size", "global_batch_size", "num_attention_heads",
    "optim", "tokenizer", "make_vocab_size_divisible_by", "activations_checkpoint_granularity",
    "native_amp_init_scale", "mcore_gpt", "virtual_pipeline_model_parallel_size",
})


def _recognise(sniff: Sniff) -> float:
    """A YAML mapping whose ``model:`` holds NeMo's Megatron keys; a ``trainer:``
    section beside it makes it certain."""
    doc = sniff.yaml
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        return 0.0
    hits = sum(str(k) in _NEMO_MODEL_KEYS for k in doc["model"])
    if hits < 2:
        return 0.0
    return 0.97 if isinstance(doc.get("trainer"), dict) else 0.8


FORMAT = ConfigFormat(
    name="nemo",
    title="a NeMo Megatron config (Hydra YAML)",
    looks_for="trainer: and model: sections with keys such as tensor_model_parallel_size, "
    "micro_batch_size, encoder_seq_length",
    recognise=_recognise,
    read=read_nemo_config,
)
