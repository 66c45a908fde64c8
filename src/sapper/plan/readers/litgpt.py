"""Read a LitGPT YAML config (``litgpt pretrain --config x.yaml``, ``litgpt finetune_lora
--config ...``) into the Plan.

LitGPT runs its own loop on Lightning Fabric, so the framework is ``lightning``. Which
command reads the file is on the command line; the file's keys say which can: jsonargparse
refuses a key the command's ``setup()`` does not take, so ``model_name``/``model_config``
is ``pretrain``, ``checkpoint_dir`` a fine-tune, ``lora_*`` keys ``finetune_lora`` and
``quantize`` an adapter or LoRA run; a fine-tune config with neither is read as
``finetune_full`` (full training: the upper bound of the others' memory).

Defaults are LitGPT's, from Lightning-AI/litgpt at commit
26857050fe3ff627cd714fe92f5838f51a3d5efa (Jun 2026): the ``setup()`` signatures of
litgpt/pretrain.py (``train`` = TrainArgs(global_batch_size=512, micro_batch_size=4,
max_tokens=3e12, max_norm=1.0, min_lr=4e-5, lr_warmup_steps=2000, tie_embeddings=False),
``devices`` "auto", ``optimizer`` "AdamW") and litgpt/finetune/{full,lora,adapter}.py
(TrainArgs(global_batch_size=16, micro_batch_size=1, lr_warmup_steps=100, epochs=5),
``devices`` 1), ``num_nodes`` 1; ``precision`` None is bf16-mixed on a GPU with bf16, else
16-mixed (litgpt/utils.py ``get_default_supported_precision``): the GPU decides, so it is
unknown (C006). ``TrainArgs.gradient_accumulation_iters`` floors: global // (devices ×
nodes) // micro. With more than one GPU, pretraining runs FSDP HYBRID_SHARD (sharded
within a node; sapper counts ZeRO-3 over all GPUs, a lower bound across nodes) and the
fine-tunes FSDP FULL_SHARD with every Block checkpointed. Pretraining's LR warms up
linearly over ``lr_warmup_steps`` optimizer steps then follows a cosine to ``min_lr``
(``get_lr``); the fine-tunes' warm up then follow a cosine to 0 (``get_lr_scheduler``) and
never clip (``validate_args`` refuses ``max_norm``).

Precision (Lightning Fabric's plugins): ``*-true`` converts the model, so weights,
gradients and optimizer states are in that dtype with no fp32 copy and, for ``16-true``,
no loss scaling; ``*-mixed`` is torch.autocast over fp32 weights (``16-mixed`` with a
GradScaler). The model is a name in LitGPT's config table (:mod:`sapper.plan.readers.
litgpt_keys`), an inline ``model_config``, or a local checkpoint folder's
``model_config.yaml`` (else its config.json); its parameters are counted as LitGPT's GPT
builds them (fused qkv, separate lm_head unless ``tie_embeddings``). LoRA and quantized
runs train only part of the model: ``model.trainable_parameters`` is unresolved and the
memory verdict unknown.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip
from sapper.plan.readers.base import (
    ConfigFormat,
    Sniff,
    local_model_config,
    unknown_key_findings,
    unresolved_finding,
)
from sapper.plan.readers.litgpt_keys import (
    CONFIG_FIELDS,
    EVAL,
    HF_NAMES,
    LOG,
    MODELS,
    TOP_LEVEL,
    TRAIN,
)
from sapper.plan.readers.typed import bad_value, check_kind
from sapper.plan.sources import PlanSource, parse_yaml_text, read_text_file

__all__ = ["FORMAT", "config_shape", "read_litgpt_config"]

TRAINABLE = "model.trainable_parameters"
_MISSING: Any = object()
_LITGPT = "LitGPT default"
#: TrainArgs of each command's setup() signature (only the fields sapper reads).
_TRAIN_DEFAULTS = {
    "pretrain": {"global_batch_size": 512, "micro_batch_size": 4, "lr_warmup_steps": 2000,
                 "max_tokens": 3 * 10**12, "max_norm": 1.0, "min_lr": 4e-5,
                 "tie_embeddings": False, "epochs": None, "max_seq_length": None},
    "finetune": {"global_batch_size": 16, "micro_batch_size": 1, "lr_warmup_steps": 100,
                 "max_tokens": None, "max_norm": None, "min_lr": 6e-5, "tie_embeddings": None,
                 "epochs": 5, "max_seq_length": None},
}
#: Fabric precision -> (dtype, how): true (the model converted), mixed (autocast).
_PRECISIONS = {
    "bf16-true": ("bf16", "true"), "16-true": ("fp16", "true"), "32-true": ("fp32", "full"),
    "bf16-mixed": ("bf16", "mixed"), "16-mixed": ("fp16", "mixed"),
    "32": ("fp32", "full"), "16": ("fp16", "mixed"), "bf16": ("bf16", "mixed"),
}
_QUANTIZE = ("bnb.nf4", "bnb.nf4-dq", "bnb.fp4", "bnb.fp4-dq", "bnb.int8-training")
#: Optimizers sapper maps: Plan type, 8-bit states (torch.optim defaults lr 1e-3,
#: betas (0.9, 0.999), eps 1e-8; AdamW's weight decay 0.01, Adam's and SGD's 0).
_OPTIMIZERS = {
    "torch.optim.AdamW": ("adamw", False), "torch.optim.Adam": ("adam", False),
    "torch.optim.SGD": ("sgd", False), "bitsandbytes.optim.AdamW8bit": ("adamw", True),
    "bitsandbytes.optim.PagedAdamW8bit": ("adamw", True),
    "bitsandbytes.optim.AdamW": ("adamw", False),
}


def read_litgpt_config(sniff: Sniff) -> PlanSource:
    """A Plan source from a LitGPT YAML config, with C005/C006 findings."""
    doc = sniff.yaml
    if not isinstance(doc, dict):
        raise bad_value(sniff.name, "(the whole file)", type(doc).__name__,
                        "a mapping with train:, and model_name or checkpoint_dir")
    r = _Reader(doc, PlanSource(name=sniff.name), sniff.path.parent)
    r.src.set("framework", "lightning", "(a LitGPT config: LitGPT's loop on Lightning Fabric)")
    r.check_keys()
    _hardware(r)
    _model(r)
    _precision(r)
    _batch(r)
    _parallel(r)
    _optimizer(r)
    _schedule(r)
    _adapter(r)
    return r.src


class _Reader:
    def __init__(self, doc: dict[str, Any], src: PlanSource, base: Path) -> None:
        self.doc, self.src, self.file, self.base = doc, src, src.name, base
        keys = {str(k) for k in doc}
        if "checkpoint_dir" in keys and keys & {"model_name", "model_config"}:
            raise InputError(
                "checkpoint_dir and model_name/model_config are both set", file=self.file,
                field="checkpoint_dir", value=doc.get("checkpoint_dir"), has_value=True,
                expected="one of them: no LitGPT command takes both (pretrain takes "
                "model_name, the fine-tunes checkpoint_dir)",
            )
        self.command = "finetune" if "checkpoint_dir" in keys else "pretrain"
        self.lora = sorted(k for k in keys if k.startswith("lora_"))
        #: GPUs in the job when the file says (devices × num_nodes), else None.
        self.world: int | None = None

    def raw(self, key: str) -> Any:
        node: Any = self.doc
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node

    def value(self, key: str, kind: str, *, minimum: float | None = None,
              maximum: float | None = None) -> Any:
        """The checked value of ``key``, None when absent or null."""
        value = self.raw(key)
        if value is _MISSING or value is None:
            return None
        return check_kind(self.file, key, value, kind, minimum=minimum, maximum=maximum)

    def train(self, name: str, kind: str, **bounds: float) -> tuple[Any, str]:
        """(value, origin) of ``train.<name>``: the file's, else the command's default
        (a key given as null is null, as jsonargparse reads it)."""
        key = f"train.{name}"
        if self.raw(key) is _MISSING:
            default = _TRAIN_DEFAULTS[self.command][name]
            return default, f"{key} ({_LITGPT} for {self.command})"
        return self.value(key, kind, **bounds), key

    def section(self, key: str) -> dict[str, Any]:
        node = self.raw(key)
        if node is _MISSING or node is None:
            return {}
        if not isinstance(node, dict):
            raise bad_value(self.file, key, node, "a mapping of settings")
        return node

    def check_keys(self) -> None:
        effect = "(LitGPT's command line, jsonargparse, refuses it at start)"
        findings = unknown_key_findings([str(k) for k in self.doc], TOP_LEVEL, file=self.file,
                                        framework="LitGPT", effect=effect)
        for section, known in (("train", TRAIN), ("eval", EVAL), ("log", LOG),
                               ("model_config", CONFIG_FIELDS)):
            node = self.section(section)
            findings += unknown_key_findings(
                [f"{section}.{k}" for k in node], {f"{section}.{k}" for k in known},
                file=self.file, framework="LitGPT", effect=effect)
        self.src.findings.extend(findings)


# ---- the model --------------------------------------------------------------------------
def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


def config_shape(conf: dict[str, Any], file: str, where: str) -> dict[str, Any] | None:
    """Plan ``model`` fields of a LitGPT ``Config`` (its keys as in litgpt/config.py,
    ``Config.__post_init__``'s derivations, defaults for what is missing) with the exact
    parameter count of the GPT it builds; None for what sapper does not count (mixture of
    experts, latent attention). ``where`` names the keys in errors."""
    def get(name: str, kind: str, default: Any, **bounds: float) -> Any:
        value = conf.get(name, default)
        if value is None:
            return default
        return check_kind(file, f"{where}.{name}", value, kind, **bounds)

    if conf.get("n_expert") or conf.get("latent_attention") or conf.get(
        "mlp_class_name") == "LLaMAMoE":
        return None
    n = get("n_embd", "int", 4096, minimum=1)
    layers = get("n_layer", "int", 16, minimum=1)
    heads = get("n_head", "int", 32, minimum=1)
    hs = get("head_size", "int", None, minimum=1)
    if hs is None:
        if n % heads:
            raise bad_value(file, f"{where}.n_head", heads, f"a divisor of n_embd ({n})")
        hs = n // heads
    groups = get("n_query_groups", "int", heads, minimum=1)
    if heads % groups:
        raise bad_value(file, f"{where}.n_query_groups", groups, f"a divisor of n_head ({heads})")
    vocab = get("vocab_size", "int", 50254, minimum=1)
    padded = get("padded_vocab_size", "int", None, minimum=1)
    if padded is None:
        padded = _find_multiple(vocab, get("padding_multiple", "int", 512, minimum=1))
    mlp = get("mlp_class_name", "str", "GptNeoxMLP")
    if mlp not in ("GptNeoxMLP", "LLaMAMLP", "GemmaMLP"):
        raise bad_value(file, f"{where}.mlp_class_name", mlp,
                        "GptNeoxMLP / LLaMAMLP / GemmaMLP / LLaMAMoE")
    inner = get("intermediate_size", "int", None, minimum=1)
    if inner is None:
        if mlp != "GptNeoxMLP":
            raise bad_value(file, f"{where}.intermediate_size", None,
                            f"a width: LitGPT requires it for {mlp}")
        inner = 4 * n
    norm_name = get("norm_class_name", "str", "LayerNorm")
    if norm_name not in ("LayerNorm", "RMSNorm"):
        raise bad_value(file, f"{where}.norm_class_name", norm_name, "LayerNorm / RMSNorm")
    flag = {k: get(k, "bool", d) for k, d in (
        ("bias", True), ("attn_bias", False), ("lm_head_bias", False), ("norm_1", True),
        ("norm_2", True), ("shared_attention_norm", False), ("post_attention_norm", False),
        ("post_mlp_norm", False), ("parallel_residual", True), ("norm_qk", False))}

    def norm(size: int) -> int:
        return size * (2 if norm_name == "LayerNorm" else 1)

    qkv = (heads + 2 * groups) * hs
    block = n * qkv + (qkv if flag["bias"] or flag["attn_bias"] else 0)
    block += hs * heads * n + (n if flag["bias"] else 0)
    block += norm(n) * (flag["norm_1"] + flag["post_attention_norm"] + flag["post_mlp_norm"]
                        + (flag["norm_2"] and not flag["shared_attention_norm"]))
    if flag["norm_qk"]:
        olmo = conf.get("norm_qk_type") == "olmo2"
        block += norm(heads * hs if olmo else hs) + norm(groups * hs if olmo else hs)
    gated = mlp != "GptNeoxMLP"
    block += (3 if gated else 2) * n * inner
    if flag["bias"]:
        block += (2 if gated else 1) * inner + n
    total = layers * block + 2 * padded * n + norm(n) + (padded if flag["lm_head_bias"] else 0)
    tanh = conf.get("gelu_approximate") == "tanh"
    name = str(conf.get("name") or "")
    fields: dict[str, Any] = {
        "hidden_size": n, "num_layers": layers, "num_heads": heads, "num_kv_heads": groups,
        "head_dim": hs, "ffn_hidden_size": inner,
        "activation": {"GptNeoxMLP": "gelu", "LLaMAMLP": "swiglu", "GemmaMLP": "geglu"}[mlp],
        "hidden_act": "silu" if mlp == "LLaMAMLP" else (
            "gelu_pytorch_tanh" if tanh else "gelu"),
        "vocab_size": padded, "position_encoding": "rope",
        "rope_theta": float(get("rope_base", "number", 10000, minimum=1)),
        "max_position_embeddings": get("block_size", "int", 4096, minimum=1),
        "norm_type": "rmsnorm" if norm_name == "RMSNorm" else "layernorm",
        "norm_placement": "sandwich" if flag["post_attention_norm"] and flag["post_mlp_norm"]
        else "pre",
        "tied_embeddings": False,
        "attention_bias": flag["bias"] or flag["attn_bias"], "mlp_bias": flag["bias"],
        "parallel_residual": flag["parallel_residual"], "dropout": 0.0, "num_params": total,
    }
    family = _family(name)
    if family:
        fields["family"] = family
    adjust = conf.get("rope_adjustments")
    if isinstance(adjust, dict) and "factor" in adjust:
        fields["rope_scaling"] = {
            "type": "llama3",
            "factor": float(check_kind(file, f"{where}.rope_adjustments.factor",
                                       adjust["factor"], "number", minimum=1)),
            "original_max_position_embeddings": check_kind(
                file, f"{where}.rope_adjustments.original_max_seq_len",
                adjust.get("original_max_seq_len", 8192), "int", minimum=1),
        }
    return fields


def _family(name: str) -> str | None:
    """The Hugging Face family of a LitGPT config name (for the traits of its blocks)."""
    low = name.lower()
    for prefix, family in (("gemma-2", "gemma2"), ("gemma", "gemma"), ("phi-3", "phi3"),
                           ("phi-2", "phi"), ("mistral", "mistral"), ("falcon", "falcon"),
                           ("pythia", "gpt_neox"), ("stablelm", "gpt_neox")):
        if low.startswith(prefix):
            return family
    return "llama" if "llama" in low or low.startswith("stories") else None


def _set_model(r: _Reader, conf: dict[str, Any], where: str, origin: str) -> None:
    fields = config_shape(conf, r.file, where)
    if fields is None:
        unresolved_finding(r.src, where, "model",
                           "a mixture-of-experts or latent-attention config, which sapper "
                           "does not count from LitGPT's keys",
                           "pass --model config.json (the model's Hugging Face config)")
        return
    for field, value in fields.items():
        r.src.set(f"model.{field}", value, origin)


def _pretrain_init(r: _Reader) -> None:
    """pretrain.py ``initialize_weights`` (GPT-NeoX's): every Linear and the embedding at
    std sqrt(2 / 5n), the attention's and LLaMA MLP's output projections at 1/sqrt(n)/L,
    unless ``initial_checkpoint_dir`` loads weights."""
    if r.value("initial_checkpoint_dir", "str"):
        r.src.set("init.from_pretrained", True, "initial_checkpoint_dir")
        return
    model = r.src.data.get("model")
    if not model:
        return
    n, layers = model["hidden_size"], model["num_layers"]
    origin = "(pretrain.py initialize_weights)"
    r.src.set("init.std", math.sqrt(2.0 / 5 / n), origin)
    r.src.set("init.residual_scaling", "custom", origin)
    r.src.set("init.residual_scale", math.sqrt(2.5) / layers, origin)


def _named(name: str) -> tuple[str, dict[str, Any]] | None:
    key = name if name in MODELS else HF_NAMES.get(name)
    return (key, {"name": key, **MODELS[key]}) if key else None


def _model(r: _Reader) -> None:
    if r.command == "pretrain":
        inline = r.raw("model_config")
        if isinstance(inline, dict) and inline:
            _set_model(r, inline, "model_config", "model_config")
            _pretrain_init(r)
            return
        if inline not in (_MISSING, None) and not isinstance(inline, dict):
            raise bad_value(r.file, "model_config", inline, "a mapping of litgpt.Config keys")
        name = r.value("model_name", "str")
        if name is None:
            unresolved_finding(r.src, "model_name", "model", "not given: litgpt pretrain "
                               "requires model_name or model_config", "set model_name")
            return
        found = _named(name)
        if found is None:
            unresolved_finding(
                r.src, "model_name", "model",
                f"{clip(name, 80)!r} is not among the LitGPT config names sapper knows the "
                "shape of", "pass --model config.json (the model's Hugging Face config)")
            return
        _set_model(r, found[1], "model_name", f"model_name ({found[0]} in litgpt/config.py)")
        _pretrain_init(r)
        return
    folder = r.value("checkpoint_dir", "str")
    if folder is None:
        unresolved_finding(r.src, "checkpoint_dir", "model", "not given: LitGPT's fine-tunes "
                           "require it", "set checkpoint_dir")
        return
    r.src.set("init.from_pretrained", True, "checkpoint_dir")
    if _local_model(r, folder):
        return
    found = _named(Path(folder).name)
    if found is not None:
        _set_model(r, found[1], "checkpoint_dir",
                   f"checkpoint_dir ({found[0]} in litgpt/config.py)")
        return
    unresolved_finding(
        r.src, "checkpoint_dir", "model",
        f"{clip(folder, 100)!r} is not on this machine and its name is not among the LitGPT "
        "configs sapper knows", "pass --model config.json (the model's Hugging Face config)")


def _local_model(r: _Reader, folder: str) -> bool:
    """A checkpoint folder on this machine: its model_config.yaml (what the fine-tunes
    read), else its config.json."""
    for base in (r.base, Path.cwd()):
        path = Path(folder).expanduser()
        path = path if path.is_absolute() else base / path
        try:
            yaml_file = path / "model_config.yaml"
            if yaml_file.is_file():
                conf = parse_yaml_text(read_text_file(yaml_file), str(yaml_file))
                if not isinstance(conf, dict):
                    raise bad_value(str(yaml_file), "(the whole file)", type(conf).__name__,
                                    "a mapping of litgpt.Config keys")
                _set_model(r, conf, "model_config.yaml",
                           f"checkpoint_dir ({yaml_file.name})")
                return True
        except OSError:
            continue
        hf = local_model_config(str(path), base)
        if hf is not None:
            r.src.refs["hf_config"] = hf
            return True
    return False


# ---- hardware, precision, batch, layout -------------------------------------------------
def _hardware(r: _Reader) -> None:
    raw = r.raw("devices")
    default = "auto" if r.command == "pretrain" else 1
    key = "devices" if raw is not _MISSING else f"devices ({_LITGPT}: {default})"
    devices = default if raw is _MISSING else raw
    nodes = r.value("num_nodes", "int", minimum=1)
    node_key = "num_nodes" if nodes is not None else f"num_nodes ({_LITGPT})"
    nodes = nodes or 1
    # litgpt/utils.py parse_devices: -1 and "auto" are every GPU of the machine.
    if devices in (-1, "auto"):
        unresolved_finding(r.src, "devices", "hardware.gpus_per_node",
                           f"{devices!r} means every GPU the machine has, known at launch",
                           "give --gpus-per-node (or --gpus)")
        return
    count = check_kind(r.file, "devices", devices, "int", minimum=1)
    r.src.set("hardware.gpus_per_node", count, key)
    r.src.set("hardware.nodes", nodes, node_key)
    r.world = count * nodes


def _precision(r: _Reader) -> None:
    raw = r.value("precision", "str")
    quantize = r.value("quantize", "str")
    if quantize is not None and quantize not in _QUANTIZE:
        raise bad_value(r.file, "quantize", quantize, " / ".join(_QUANTIZE))
    if raw is None:
        unresolved_finding(
            r.src, "precision", "precision.dtype",
            "not given: LitGPT picks bf16-mixed on a GPU with bf16, else 16-mixed (16-true "
            "and bf16-true with quantize): the GPU decides at launch",
            "pass --dtype bf16 (or fp16), or write precision: bf16-mixed")
        return
    if raw not in _PRECISIONS:
        unresolved_finding(r.src, "precision", "precision.dtype",
                           f"{clip(raw, 40)!r} has no counterpart in sapper's precision model "
                           "(transformer-engine, 64-true ...)", "pass --dtype")
        return
    dtype, how = _PRECISIONS[raw]
    if quantize is not None and how == "mixed":
        raise InputError(
            "quantize with a mixed precision", file=r.file, field="precision", value=raw,
            has_value=True, expected="bf16-true, 16-true or 32-true (LitGPT refuses "
            "\"Quantization and mixed precision\")")
    r.src.set("precision.dtype", dtype, "precision")
    if how == "true" or (how == "full" and dtype == "fp32"):
        if dtype != "fp32":
            for field in ("master_weights", "optimizer_states", "grad_dtype"):
                r.src.set(f"precision.{field}", dtype, "precision (Fabric converts the model)")
            r.src.set("precision.autocast", False, "precision")
        r.src.set("precision.loss_scaling.mode", "none", "precision (no GradScaler)")
        return
    r.src.set("precision.autocast", True, "precision (torch.autocast)")
    r.src.set("precision.loss_scaling.mode", "dynamic" if dtype == "fp16" else "none",
              "precision")


def _batch(r: _Reader) -> None:
    micro, micro_key = r.train("micro_batch_size", "int", minimum=1)
    total, total_key = r.train("global_batch_size", "int", minimum=1)
    if micro is None or total is None:
        raise bad_value(r.file, micro_key if micro is None else total_key, None,
                        "a positive integer (LitGPT divides by it)")
    r.src.set("batch.micro_batch_size", micro, micro_key)
    if r.world is None:
        r.src.set("batch.global_batch_size", total, total_key)
    else:
        # TrainArgs.batch_size / gradient_accumulation_iters: floor divisions, asserted > 0.
        accum = total // r.world // micro
        if accum < 1:
            raise bad_value(r.file, total_key, total, f"at least micro_batch_size × GPUs "
                            f"({micro} × {r.world}): LitGPT asserts a gradient accumulation "
                            "of at least 1")
        effective = accum * micro * r.world
        origin = total_key if effective == total else (
            f"{total_key} ({total} floored by LitGPT to GA × micro × GPUs)")
        r.src.set("batch.global_batch_size", effective, origin)
        r.src.set("batch.gradient_accumulation_steps", accum,
                  f"{total_key} // (devices × num_nodes) // {micro_key}")
    seq, seq_key = r.train("max_seq_length", "int", minimum=1)
    if r.command == "pretrain":
        block = r.src.data.get("model", {}).get("max_position_embeddings")
        if seq is None and block is not None:
            seq, seq_key = block, "train.max_seq_length (null: the model's block_size)"
        if seq is not None:
            r.src.set("batch.seq_len", seq, seq_key + " (rows filled to it)")
        else:
            unresolved_finding(r.src, "train.max_seq_length", "batch.seq_len",
                               "null, and the model's block_size is unknown",
                               "set train.max_seq_length, or pass --seq-len N")
        return
    if seq is not None:
        r.src.set("batch.seq_len", seq, seq_key + " (samples cut to it; rows padded to the "
                  "longest in each batch)")
    else:
        unresolved_finding(r.src, "train.max_seq_length", "batch.seq_len",
                           "null: the fine-tunes train at the longest sample's length in the "
                           "dataset, which the file does not give",
                           "set train.max_seq_length, or pass --seq-len N")


def _parallel(r: _Reader) -> None:
    multi = r.world is None or r.world > 1
    where = "devices × num_nodes"
    if r.command == "pretrain":
        r.src.set("parallel.zero_stage", 3 if multi else 0,
                  f"{where} (more than one GPU: FSDPStrategy HYBRID_SHARD)" if multi else where)
        return
    r.src.set("parallel.zero_stage", 3 if multi else 0,
              f"{where} (more than one GPU: FSDP FULL_SHARD)" if multi else where)
    r.src.set("parallel.checkpointing.granularity", "full" if multi else "none",
              f"{where} (more than one GPU: every Block checkpointed)" if multi else where)


def _optimizer(r: _Reader) -> None:
    raw = r.raw("optimizer")
    args: dict[str, Any] = {}
    if raw is _MISSING or raw is None:
        name, origin = "AdamW", f"optimizer ({_LITGPT})"
    elif isinstance(raw, str):
        name, origin = raw, "optimizer"
    elif isinstance(raw, dict):
        name = check_kind(r.file, "optimizer.class_path", raw.get("class_path"), "str")
        origin = "optimizer.class_path"
        args = r.section("optimizer.init_args")
    else:
        raise bad_value(r.file, "optimizer", raw, "an optimizer name such as AdamW, or "
                        "class_path and init_args")
    path = name if "." in name else f"torch.optim.{name}"
    known = _OPTIMIZERS.get(path)
    if known is None:
        unresolved_finding(r.src, origin, "optimizer.type",
                           f"{clip(path, 80)!r} is not an optimizer sapper maps",
                           "set optimizer in a sapper plan given after this file")
        return
    kind, eight_bit = known
    r.src.set("optimizer.type", kind, origin)
    prefix = "optimizer.init_args"
    defaults = {"lr": 1e-3, "weight_decay": 0.0 if kind in ("adam", "sgd") else 0.01,
                "eps": 1e-8}
    for arg, default in defaults.items():
        if kind == "sgd" and arg == "eps":
            continue
        value = args.get(arg)
        if value is None:
            r.src.set(f"optimizer.{arg}", default, f"{prefix}.{arg} ({path} default)")
        else:
            r.src.set(f"optimizer.{arg}", check_kind(r.file, f"{prefix}.{arg}", value,
                                                     "number", minimum=0), f"{prefix}.{arg}")
    if kind != "sgd":
        betas = args.get("betas")
        if betas is None:
            r.src.set("optimizer.betas", [0.9, 0.999], f"{prefix}.betas ({path} default)")
        elif not isinstance(betas, list) or len(betas) != 2:
            raise bad_value(r.file, f"{prefix}.betas", betas, "two numbers, e.g. [0.9, 0.95]")
        else:
            r.src.set("optimizer.betas", [float(check_kind(
                r.file, f"{prefix}.betas[{i}]", b, "number", minimum=0, maximum=1))
                for i, b in enumerate(betas)], f"{prefix}.betas")
    if eight_bit:
        r.src.set("optimizer.eight_bit", True, origin)
        r.src.set("optimizer.impl", "bnb_8bit", origin)
        r.src.set("precision.optimizer_states", "int8", origin)
    elif r.command == "pretrain" and path.startswith("torch.optim.") and kind != "sgd":
        # pretrain.py passes fused=True on CUDA to optimizers that take it.
        r.src.set("optimizer.fused", True, "optimizer (pretrain.py: fused=True on CUDA)")
        r.src.set("optimizer.impl", "fused", "optimizer (pretrain.py: fused=True on CUDA)")


def _schedule(r: _Reader) -> None:
    warmup, warmup_key = r.train("lr_warmup_steps", "int", minimum=0)
    fraction = r.value("train.lr_warmup_fraction", "number", minimum=0, maximum=1)
    max_norm, norm_key = r.train("max_norm", "number", minimum=0)
    if r.command == "finetune":
        for name in ("max_tokens", "max_norm", "tie_embeddings", "lr_warmup_fraction"):
            if r.raw(f"train.{name}") not in (_MISSING, None):
                raise bad_value(r.file, f"train.{name}", r.raw(f"train.{name}"),
                                "null (LitGPT's fine-tunes refuse it at start)")
        r.src.set("schedule.type", "cosine", "(the fine-tunes' warmup then cosine to 0)")
        r.src.set("schedule.min_lr", 0.0, "(the fine-tunes' cosine ends at 0)")
        r.src.set("clipping.max_norm", None, "(LitGPT's fine-tunes do not clip)")
        if warmup is not None:
            r.src.set("schedule.warmup_steps", warmup, warmup_key)
        epochs, _ = r.train("epochs", "int", minimum=1)
        unresolved_finding(
            r.src, "train.epochs", "schedule.total_steps",
            f"{epochs if epochs is not None else '?'} epoch(s) of the dataset: the step count "
            "depends on its size, which the file does not give",
            "write the run's length in a sapper plan given after this file "
            "(schedule: {total_steps: N})")
        return
    if r.raw("train.epochs") not in (_MISSING, None):
        raise bad_value(r.file, "train.epochs", r.raw("train.epochs"),
                        "null (litgpt pretrain refuses it: give max_tokens)")
    if max_norm is None:
        raise bad_value(r.file, "train.max_norm", None,
                        "a number (litgpt pretrain requires it)")
    if max_norm <= 0:
        raise bad_value(r.file, "train.max_norm", max_norm,
                        "a positive number (0 scales every gradient to zero)")
    r.src.set("clipping.max_norm", float(max_norm), norm_key)
    r.src.set("schedule.type", "cosine", "(pretrain.py get_lr: warmup then cosine)")
    min_lr, min_key = r.train("min_lr", "number", minimum=0)
    r.src.set("schedule.min_lr", float(min_lr or 0.0), min_key)
    if fraction and warmup:
        raise bad_value(r.file, "train.lr_warmup_fraction", fraction,
                        "null when lr_warmup_steps is given (LitGPT refuses both)")
    if fraction:
        unresolved_finding(r.src, "train.lr_warmup_fraction", "schedule.warmup_steps",
                           "a share of one epoch of the dataset, whose length the file does "
                           "not give", "set train.lr_warmup_steps (or pass --warmup N)")
    else:
        r.src.set("schedule.warmup_steps", warmup or 0, warmup_key)
    _pretrain_steps(r)
    tie, tie_key = r.train("tie_embeddings", "bool")
    if tie and "model" in r.src.data:
        model = r.src.data["model"]
        model["num_params"] -= model["vocab_size"] * model["hidden_size"]
        r.src.set("model.tied_embeddings", True, tie_key)


def _pretrain_steps(r: _Reader) -> None:
    """pretrain.py: max_iters = max_tokens // GPUs // (micro × seq) micro-batches, one
    optimizer step per gradient_accumulation_iters of them."""
    tokens, tokens_key = r.train("max_tokens", "int", minimum=1)
    steps = r.value("train.max_steps", "int", minimum=1)
    batch = r.src.data["batch"]
    seq, accum = batch.get("seq_len"), batch.get("gradient_accumulation_steps")
    if tokens is None:
        raise bad_value(r.file, "train.max_tokens", None,
                        "a token count (litgpt pretrain requires it)")
    if r.world is None or seq is None or accum is None:
        if steps is None:
            unresolved_finding(r.src, tokens_key, "schedule.total_steps",
                               "max_tokens is divided over the GPUs, whose count is given at "
                               "launch", "pass --gpus (or write devices in the file)")
        else:
            r.src.set("schedule.total_steps", steps, "train.max_steps")
        return
    total = tokens // r.world // (batch["micro_batch_size"] * seq) // accum
    if steps is not None and steps < total:
        r.src.set("schedule.total_steps", steps, "train.max_steps")
    elif total >= 1:
        r.src.set("schedule.total_steps", total,
                  f"{tokens_key} / (GPUs × micro × seq × GA)")


def _adapter(r: _Reader) -> None:
    quantize = r.value("quantize", "str")
    if r.command != "finetune" or (not r.lora and "quantize" not in r.doc):
        return
    if quantize and r.world is not None and r.world > 1:
        raise InputError(
            "quantize with more than one GPU", file=r.file, field="quantize", value=quantize,
            has_value=True, expected="devices: 1 and num_nodes: 1 (LitGPT does not quantize "
            "multi-GPU training)")
    rank = r.value("lora_r", "int", minimum=1)
    what = (f"LoRA adapters (rank {rank if rank is not None else 8})" if r.lora
            else "adapter (or LoRA) weights: finetune_adapter, finetune_adapter_v2 or "
            "finetune_lora take this file")
    extra = f", over base weights quantized {quantize}" if quantize else ""
    unresolved_finding(
        r.src, ("lora_r" if "lora_r" in r.lora else r.lora[0]) if r.lora else "quantize",
        TRAINABLE,
        f"trains only {what} over a frozen base{extra}: a sapper plan describes full "
        "training of every parameter, so the memory verdict is left unknown",
        "estimate the run's memory with `sapper smoke` on the real model, or read `sapper "
        "memory` as an upper bound (full fine-tuning)")


# ---- recognition ------------------------------------------------------------------------
_TRAIN_SIGNS = frozenset({"global_batch_size", "micro_batch_size", "lr_warmup_steps",
                          "max_seq_length", "max_tokens", "save_interval"})


def _recognise(sniff: Sniff) -> float:
    """A YAML mapping with LitGPT's ``train:`` block (global_batch_size, micro_batch_size
    ...) beside ``model_name``, ``model_config`` or ``checkpoint_dir``, most keys LitGPT's
    ``setup()`` parameters."""
    doc = sniff.mapping
    if sniff.json is not None or sniff.toml is not None or not isinstance(doc, dict) or not doc:
        return 0.0
    train = doc.get("train")
    keys = {str(k) for k in doc}
    if not isinstance(train, dict) or not ({str(k) for k in train} & _TRAIN_SIGNS):
        return 0.0
    if not keys & {"model_name", "model_config", "checkpoint_dir"}:
        return 0.0
    share = len(keys & TOP_LEVEL) / len(keys)
    return 0.6 + 0.35 * share if share >= 0.7 else 0.0


FORMAT = ConfigFormat(
    name="litgpt",
    title="a LitGPT config (YAML)",
    looks_for="train: (global_batch_size, micro_batch_size ...) beside model_name, "
    "model_config or checkpoint_dir, and precision, devices, optimizer",
    recognise=_recognise,
    read=read_litgpt_config,
)
