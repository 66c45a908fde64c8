"""Read a torchtitan TOML job config (``train_configs/*.toml``) into the Plan.

Values keep their TOML key as origin (``parallelism.tensor_parallel_degree``). What the
file leaves out is torchtitan's default, from the JobConfig that reads it (cited per
value: torchtitan/config/job_config.py at commit 238fa995, the last TOML-era version, and
the same in torchtitan/config_manager.py before it). Both layouts are read: the current
one (``[training] local_batch_size``, ``[parallelism]``, ``[lr_scheduler]``) and the
older one (``[training] batch_size``, ``data_parallel_shard_degree`` and
``tensor_parallel_degree`` under ``[training]``, pipeline keys under ``[experimental]``,
``[training] warmup_steps``); a key in both places is read from the newer one.

torchtitan names a model by ``[model] name`` and ``flavor``; the flavors of llama3, qwen3
(dense and MoE) and deepseek_v3 (MLA, leading dense blocks, routed and shared experts),
whose arguments torchtitan's source gives (:mod:`torchtitan_keys`), become a model shape.
Any other (llama4, whose MoE and dense blocks interleave; gpt_oss; flux) leaves the model
unknown (C006): pass ``--model config.json``. Expert parallelism is read with its
expert-TP degree; ``etp`` 1 under TP (EP spanning the TP ranks) leaves EP unknown.
"""

from __future__ import annotations

import math
from typing import Any

from sapper.plan.readers.base import (
    ConfigFormat,
    Sniff,
    unknown_key_findings,
    unresolved_finding,
)
from sapper.plan.readers.torchtitan_keys import (
    DEEPSEEK_V3_FLAVORS,
    LLAMA3_FLAVORS,
    QWEN3_FLAVORS,
    SECTIONS,
)
from sapper.plan.readers.typed import bad_value, check_kind
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_torchtitan_config"]

_MISSING: Any = object()
#: torchtitan's pipeline schedules (torch.distributed.pipelining) -> Plan schedule.
_SCHEDULES = {
    "1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved",
    "loopedbfs": "interleaved", "interleavedzerobubble": "interleaved",
    "zbvzerobubble": "interleaved", "dualpipev": "interleaved",
}
_AC_FIX = "set parallel.checkpointing in a sapper plan given after this file"


def read_torchtitan_config(sniff: Sniff) -> PlanSource:
    """A Plan source from a torchtitan TOML job config, with C005/C006 findings."""
    doc = sniff.toml
    if doc is None:
        if "toml" in sniff.errors:
            raise sniff.errors["toml"]
        raise bad_value(sniff.name, "(the whole file)", sniff.text[:40],
                        "a TOML job config with [training] and [parallelism] sections")
    r = _Reader(doc, PlanSource(name=sniff.name))
    r.src.set("framework", "torchtitan", "(a torchtitan job config)")
    r.check_keys()
    _batch(r)
    _parallel(r)
    _precision(r)
    _optimizer(r)
    _schedule(r)
    _checkpointing(r)
    _model(r)
    # A checkpoint to start from (initial_load_path) means the init never runs.
    path = r.raw("checkpoint.initial_load_path")
    if isinstance(path, str) and path.strip():
        r.src.set("init.from_pretrained", True, "checkpoint.initial_load_path")
    return r.src


class _Reader:
    def __init__(self, doc: dict[str, Any], src: PlanSource) -> None:
        self.doc, self.src, self.file = doc, src, src.name

    def raw(self, key: str) -> Any:
        node: Any = self.doc
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node

    def first(self, *keys: str) -> str:
        """The first of ``keys`` the file has (new layout before old), else the first."""
        return next((k for k in keys if self.raw(k) is not _MISSING), keys[0])

    def value(self, key: str, kind: str, default: Any = _MISSING, *,
              minimum: float | None = None, maximum: float | None = None) -> tuple[Any, str]:
        """(checked value, origin): the file's, else torchtitan's ``default``."""
        value = self.raw(key)
        if value is _MISSING:
            return (None if default is _MISSING else default), f"{key} (torchtitan default)"
        return check_kind(self.file, key, value, kind, minimum=minimum, maximum=maximum), key

    def take(self, key: str, field: str, kind: str, default: Any = _MISSING, *,
             minimum: float | None = None, maximum: float | None = None) -> Any:
        value, origin = self.value(key, kind, default, minimum=minimum, maximum=maximum)
        if value is not None:
            self.src.set(field, value, origin)
        return value

    def check_keys(self) -> None:
        sections = set(SECTIONS)
        parents = {s.rsplit(".", i)[0] for s in sections for i in range(1, s.count(".") + 1)}
        keys: list[str] = []

        def walk(node: dict[str, Any], prefix: str) -> None:
            for name, value in node.items():
                path = f"{prefix}.{name}" if prefix else str(name)
                if isinstance(value, dict) and (path in sections or path in parents):
                    walk(value, path)
                else:
                    keys.append(path)

        walk(self.doc, "")
        known = {f"{s}.{k}" for s, ks in SECTIONS.items() for k in ks} | sections | parents
        self.src.findings.extend(unknown_key_findings(
            keys, known, file=self.file, framework="torchtitan",
            effect="torchtitan's JobConfig refuses it at start (Invalid field names); "
            "versions before mid-2025 ignored it",
        ))


def _batch(r: _Reader) -> None:
    # Training.local_batch_size = 8 (per-device), formerly training.batch_size = 8.
    key = r.first("training.local_batch_size", "training.batch_size")
    r.take(key, "batch.micro_batch_size", "int", 8, minimum=1)
    # global_batch_size -1 (default): local × data-parallel degree, no accumulation;
    # larger, torchtitan accumulates global / (local × dp) micro-batches.
    total, origin = r.value("training.global_batch_size", "int", -1, minimum=-1)
    if total is not None and total > 0:
        r.src.set("batch.global_batch_size", total, origin)
    elif total == 0:
        raise bad_value(r.file, "training.global_batch_size", 0, "a positive integer or -1")
    else:
        r.src.set("batch.gradient_accumulation_steps", 1, origin)
    r.take("training.seq_len", "batch.seq_len", "int", 2048, minimum=1)
    steps = r.take("training.steps", "schedule.total_steps", "int", 10000, minimum=1)
    r.take("lr_scheduler.total_steps", "schedule.total_steps", "int", steps, minimum=1)
    # max_norm = 1.0; torchtitan clips the total norm over every parameter.
    r.take("training.max_norm", "clipping.max_norm", "number", 1.0, minimum=0)


def _degree(r: _Reader, new: str, old: str, default: int) -> tuple[int, str]:
    key = r.first(f"parallelism.{new}", old)
    value, origin = r.value(key, "int", default, minimum=-1 if "shard" in new else 1)
    return value, origin


def _parallel(r: _Reader) -> None:
    replicate, rep_key = _degree(r, "data_parallel_replicate_degree",
                                 "training.data_parallel_replicate_degree", 1)
    shard, shard_key = _degree(r, "data_parallel_shard_degree",
                               "training.data_parallel_shard_degree", -1)
    tp, tp_key = _degree(r, "tensor_parallel_degree", "training.tensor_parallel_degree", 1)
    pp, pp_key = _degree(r, "pipeline_parallel_degree",
                         r.first("training.pipeline_parallel_degree",
                                 "experimental.pipeline_parallel_degree"), 1)
    cp, cp_key = _degree(r, "context_parallel_degree", "experimental.context_parallel_degree", 1)
    ep, ep_key = _degree(r, "expert_parallel_degree", "parallelism.expert_parallel_degree", 1)
    if replicate < 1:
        raise bad_value(r.file, rep_key, replicate, "a positive integer")
    if shard == 0:
        raise bad_value(r.file, shard_key, shard, "a positive integer or -1 (infer)")
    for field, value, key in (("tp", tp, tp_key), ("pp", pp, pp_key), ("cp", cp, cp_key)):
        r.src.set(f"parallel.{field}", value, key)
    etp, etp_key = _degree(r, "expert_tensor_parallel_degree",
                           "parallelism.expert_tensor_parallel_degree", 1)
    if ep > 1 and tp > 1 and etp != tp:
        # ParallelDims: etp 1 with TP makes EP borrow the TP ranks too (dp_shard x cp x tp)
        # and leaves the routed experts unsplit by TP, which sapper's layout (experts
        # split by TP, EP within DP) does not describe.
        unresolved_finding(r.src, etp_key, "parallel.ep",
                           f"expert_tensor_parallel_degree {etp} with TP {tp}: the routed "
                           "experts are not split by TP and EP spans the TP ranks too",
                           "set expert_tensor_parallel_degree = tensor_parallel_degree, or "
                           "give parallel.ep in a sapper plan")
    else:
        r.src.set("parallel.ep", ep, ep_key)
    # ParallelDims: dp_shard -1 takes the GPUs the other degrees leave, like sapper's -1.
    if shard == -1:
        if replicate == 1:
            r.src.set("parallel.dp", -1, shard_key)
        else:
            unresolved_finding(r.src, shard_key, "parallel.dp",
                               f"-1 with data_parallel_replicate_degree {replicate}: the "
                               "data-parallel degree follows the GPU count, given at launch",
                               "give --dp (replicate × shard)")
    else:
        r.src.set("parallel.dp", replicate * shard, f"{rep_key} × {shard_key}")
    # FSDP (fully_shard) wherever the shard degree is not 1 (-1 is every GPU the other
    # degrees leave): parameters, gradients and optimizer states sharded, which sapper
    # counts as ZeRO stage 3. With HSDP (replicate > 1) the states are sharded over the
    # shard group only, so the estimate is a lower bound there.
    r.src.set("parallel.zero_stage", 3 if shard != 1 else 0, shard_key)
    if tp > 1:
        # parallelize_llama plans SequenceParallel() on the norms whenever TP is on
        # (torchtitan/models/llama3/infra/parallelize.py).
        r.src.set("parallel.sequence_parallel", True, f"{tp_key} (torchtitan's TP plan)")
        key = r.first("parallelism.enable_async_tensor_parallel",
                      "experimental.enable_async_tensor_parallel")
        r.take(key, "parallel.tp_comm_overlap", "bool", False)
    if pp > 1:
        key = r.first("parallelism.pipeline_parallel_schedule",
                      "experimental.pipeline_parallel_schedule")
        name, origin = r.value(key, "str", "1F1B")
        mapped = _SCHEDULES.get(name.lower())
        if mapped is None:
            unresolved_finding(r.src, key, "parallel.pipeline_schedule",
                               f"schedule {name!r} has no counterpart in sapper's model",
                               "set parallel.pipeline_schedule in a sapper plan")
        else:
            r.src.set("parallel.pipeline_schedule", mapped, origin)
        _pipeline_microbatches(r)


def _pipeline_microbatches(r: _Reader) -> None:
    """Under PP the local batch runs as micro-batches through the stages
    (distributed/pipeline_parallel.py: n_microbatches = local_batch_size //
    pipeline_parallel_microbatch_size, default size 1; older versions gave the count,
    ``pipeline_parallel_microbatches``, default the PP degree)."""
    batch = r.src.data["batch"]
    local, local_origin = batch["micro_batch_size"], r.src.origin["batch.micro_batch_size"]
    count_key = r.first("parallelism.pipeline_parallel_microbatches",
                        "experimental.pipeline_parallel_microbatches")
    if r.raw("parallelism.pipeline_parallel_microbatch_size") is _MISSING and (
        r.raw(count_key) is not _MISSING
    ):
        count, origin = r.value(count_key, "int", minimum=1)
        if local % count:
            raise bad_value(r.file, count_key, count, f"a divisor of the local batch {local}")
        size = local // count
    else:
        size, origin = r.value("parallelism.pipeline_parallel_microbatch_size", "int", 1,
                               minimum=1)
        if local % size:
            raise bad_value(r.file, "parallelism.pipeline_parallel_microbatch_size", size,
                            f"a divisor of {local_origin.split(' ')[0]} ({local})")
    r.src.set("batch.micro_batch_size", size, origin)
    if "global_batch_size" not in batch:
        r.src.set("batch.gradient_accumulation_steps", local // size,
                  f"{local_origin} / {origin}")


def _fsdp(r: _Reader) -> bool:
    shard = r.src.data.get("parallel", {}).get("zero_stage") == 3
    return shard or r.src.data.get("parallel", {}).get("cp", 1) > 1


def _precision(r: _Reader) -> None:
    """torchtitan's precision (Training docstrings, distributed/utils.py maybe_enable_amp):
    ``training.dtype = "bfloat16"`` trains everything in bf16 with no fp32 copy; else
    FSDP (shard degree ≠ 1, or CP) gathers ``mixed_precision_param`` (bf16) weights from
    fp32 shards and reduces gradients in fp32; without FSDP, DDP or one GPU use
    torch.autocast, and TP or PP alone train in fp32."""
    dtype, origin = r.value("training.dtype", "str", "float32")
    if dtype not in ("float32", "bfloat16"):
        raise bad_value(r.file, "training.dtype", dtype, "float32 / bfloat16")
    if dtype == "bfloat16":
        for field in ("precision.dtype", "precision.master_weights",
                      "precision.optimizer_states", "precision.grad_dtype"):
            r.src.set(field, "bf16", origin)
        return
    param, origin = r.value("training.mixed_precision_param", "str", "bfloat16")
    if param not in ("float32", "bfloat16"):
        raise bad_value(r.file, "training.mixed_precision_param", param, "bfloat16 / float32")
    parallel = r.src.data.get("parallel", {})
    if param == "float32":
        r.src.set("precision.dtype", "fp32", origin)
    elif _fsdp(r):
        r.src.set("precision.dtype", "bf16", origin)
        r.src.set("precision.grad_dtype", "fp32", "training.mixed_precision_reduce")
    elif parallel.get("tp", 1) > 1 or parallel.get("pp", 1) > 1:
        r.src.set("precision.dtype", "fp32", f"{origin} (ignored with TP/PP and no FSDP)")
    else:
        r.src.set("precision.dtype", "bf16", origin)
        r.src.set("precision.autocast", True, f"{origin} (torch.autocast)")
    r.src.set("precision.loss_scaling.mode", "none", "(torchtitan has no loss scaling)")


def _optimizer(r: _Reader) -> None:
    # Optimizer: name "AdamW", lr 8e-4, eps 1e-8, weight_decay 0.1, beta1 0.9, beta2 0.95.
    name, origin = r.value("optimizer.name", "str", "AdamW")
    r.src.set("optimizer.type", name.lower(), origin)
    r.take("optimizer.lr", "optimizer.lr", "number", 8e-4, minimum=0)
    r.take("optimizer.eps", "optimizer.eps", "number", 1e-8, minimum=0)
    r.take("optimizer.weight_decay", "optimizer.weight_decay", "number", 0.1, minimum=0)
    beta1, o1 = r.value("optimizer.beta1", "number", 0.9, minimum=0, maximum=1)
    beta2, o2 = r.value("optimizer.beta2", "number", 0.95, minimum=0, maximum=1)
    r.src.set("optimizer.betas", [float(beta1), float(beta2)], o1 if o1 == o2 else f"{o1}, {o2}")
    fused, origin = r.value("optimizer.implementation", "str", "fused")
    r.src.set("optimizer.fused", fused in ("fused", "foreach"), origin)


def _schedule(r: _Reader) -> None:
    """Linear warmup, then (with ``decay_ratio``) a stable phase and a decay over the last
    part, else decay over all the rest (components/lr_scheduler.py); warmup 200, decay
    linear to ``min_lr_factor`` (0) × lr."""
    key = r.first("lr_scheduler.warmup_steps", "training.warmup_steps")
    r.take(key, "schedule.warmup_steps", "int", 200, minimum=0)
    decay, origin = r.value("lr_scheduler.decay_type", "str", "linear")
    ratio = r.raw("lr_scheduler.decay_ratio")
    if ratio is not _MISSING:
        check_kind(r.file, "lr_scheduler.decay_ratio", ratio, "number", minimum=0, maximum=1)
        r.src.set("schedule.type", "wsd", "lr_scheduler.decay_ratio")
    else:
        r.src.set("schedule.type", decay, origin)
    factor, origin = r.value("lr_scheduler.min_lr_factor", "number", 0.0, minimum=0,
                             maximum=1)
    lr = r.src.data.get("optimizer", {}).get("lr")
    if isinstance(lr, (int, float)):
        r.src.set("schedule.min_lr", factor * lr, f"{origin} × optimizer.lr")


def _checkpointing(r: _Reader) -> None:
    """``mode = "selective"`` (the default) with an integer ``selective_ac_option`` (the
    default "2") recomputes every n-th block whole; with "op" it saves chosen ops'
    outputs per block (sapper's selective). ``memory_budget`` is decided by the compiler."""
    ac = "activation_checkpoint"
    mode, origin = r.value(f"{ac}.mode", "str", "selective")
    field = "parallel.checkpointing"
    if mode == "none":
        r.src.set(f"{field}.granularity", "none", origin)
    elif mode == "full":
        r.src.set(f"{field}.granularity", "full", origin)
    elif mode == "selective":
        option, opt_origin = r.value(f"{ac}.selective_ac_option", "str", "2")
        if option == "op":
            r.src.set(f"{field}.granularity", "selective", opt_origin)
        elif option.isdigit() and 0 < len(option) < 6 and int(option) > 0:
            r.src.set(f"{field}.granularity", "full", opt_origin)
            r.src.set(f"{field}.every_k_layers", int(option), opt_origin)
        else:
            raise bad_value(r.file, f"{ac}.selective_ac_option", option,
                            '"op" or a positive integer as a string, e.g. "2"')
    elif mode == "memory_budget":
        unresolved_finding(r.src, f"{ac}.mode", f"{field}.granularity",
                           "memory_budget lets the compiler choose what to recompute",
                           _AC_FIX)
    else:
        raise bad_value(r.file, f"{ac}.mode", mode, "none / selective / full / memory_budget")


def _model(r: _Reader) -> None:
    name, name_origin = r.value("model.name", "str", "llama3")
    flavor, flavor_origin = r.value("model.flavor", "str", "debugmodel")
    table = {"llama3": LLAMA3_FLAVORS, "qwen3": QWEN3_FLAVORS,
             "deepseek_v3": DEEPSEEK_V3_FLAVORS}.get(name, {})
    args = table.get(flavor)
    if args is None:
        why = (f"torchtitan's {name!r} has no flavor {flavor!r} sapper knows" if table else
               f"torchtitan's {name!r} flavor {flavor!r} is named, not described, in the file"
               + (" (Llama 4 interleaves MoE and dense blocks, which sapper's model does "
                  "not describe)" if name == "llama4" else ""))
        unresolved_finding(
            r.src, "model.flavor", "model", why,
            "pass --model config.json (the model's Hugging Face config)",
        )
        return
    if name == "qwen3":
        _qwen3(r, args, f"{name_origin}, {flavor_origin} (torchtitan qwen3_args)")
        return
    if name == "deepseek_v3":
        _deepseek_v3(r, args, f"{name_origin}, {flavor_origin} (torchtitan deepseekv3_args)")
        return
    origin = f"{name_origin}, {flavor_origin} (torchtitan llama3_args)"
    dim, heads = int(args["dim"]), int(args["n_heads"])  # type: ignore[arg-type]
    m = r.src
    m.set("model.family", "llama", origin)
    m.set("model.hidden_size", dim, origin)
    m.set("model.num_layers", args["n_layers"], origin)
    m.set("model.num_heads", heads, origin)
    m.set("model.num_kv_heads", args.get("n_kv_heads") or heads, origin)
    m.set("model.vocab_size", args.get("vocab_size", 128256), origin)
    m.set("model.ffn_hidden_size", _ffn_width(dim, args), origin)
    m.set("model.activation", "swiglu", origin)
    m.set("model.norm_type", "rmsnorm", origin)
    m.set("model.position_encoding", "rope", origin)
    m.set("model.rope_theta", float(args.get("rope_theta") or 10000), origin)
    m.set("model.tied_embeddings", False, origin)
    # Transformer.init_weights (models/llama3/model/model.py): std 0.02, the output
    # projections of block l at 0.02 / sqrt(2 (l + 1)) (depth_init, the default).
    m.set("init.std", 0.02, origin)
    m.set("init.residual_scaling", "depth", f"{origin} (depth_init)")
    # TransformerModelArgs.update_from_config: max_seq_len = training.seq_len.
    m.set("model.max_position_embeddings", r.src.data["batch"]["seq_len"], "training.seq_len")


def _common(r: _Reader, origin: str, family: str) -> None:
    """What torchtitan's llama-like models share: SwiGLU, RMSNorm before each sublayer,
    RoPE, std 0.02 with the output projections of block l at 0.02 / sqrt(2 (l + 1))
    (depth_init), positions up to training.seq_len (update_from_config)."""
    m = r.src
    m.set("model.family", family, origin)
    m.set("model.activation", "swiglu", origin)
    m.set("model.norm_type", "rmsnorm", origin)
    m.set("model.position_encoding", "rope", origin)
    m.set("init.std", 0.02, origin)
    m.set("init.residual_scaling", "depth", f"{origin} (depth_init)")
    m.set("model.max_position_embeddings", r.src.data["batch"]["seq_len"], "training.seq_len")


def _qwen3(r: _Reader, args: dict[str, Any], origin: str) -> None:
    """Qwen3ModelArgs (models/qwen3/model/args.py): head_dim 128 whatever the width,
    QK-norm, weight tying in the small flavors, MoE in every block of the MoE ones."""
    m = r.src
    _common(r, origin, "qwen3_moe" if args.get("num_experts") else "qwen3")
    for field, key in (("hidden_size", "dim"), ("num_layers", "n_layers"),
                       ("num_heads", "n_heads"), ("num_kv_heads", "n_kv_heads"),
                       ("vocab_size", "vocab_size"), ("ffn_hidden_size", "hidden_dim")):
        m.set(f"model.{field}", args[key], origin)
    m.set("model.head_dim", 128, origin)
    m.set("model.rope_theta", float(args["rope_theta"]), origin)
    m.set("model.tied_embeddings", bool(args.get("tied", False)), origin)
    if args.get("num_experts"):
        m.set("model.num_experts", args["num_experts"], origin)
        m.set("model.experts_top_k", args["top_k"], origin)
        m.set("model.moe_ffn_hidden_size", args["moe_inter_dim"], origin)


def _deepseek_v3(r: _Reader, args: dict[str, Any], origin: str) -> None:
    """DeepSeekV3ModelArgs (models/deepseek_v3/model/args.py): multi-head latent
    attention (head_dim = qk_nope 128 + qk_rope 64), leading dense blocks, routed and
    shared experts. Its YaRN scaling (rope_factor 40 past original_seq_len 4096) is left
    out of the model: it changes no size."""
    m = r.src
    _common(r, origin, "deepseek_v3")
    m.set("model.hidden_size", args["dim"], origin)
    m.set("model.num_layers", args["n_layers"], origin)
    m.set("model.num_heads", args["n_heads"], origin)
    m.set("model.num_kv_heads", args["n_heads"], origin)
    m.set("model.vocab_size", args["vocab_size"], origin)
    m.set("model.ffn_hidden_size", args["inter_dim"], origin)
    m.set("model.first_dense_layers", args["n_dense_layers"], origin)
    m.set("model.num_experts", args["num_experts"], origin)
    m.set("model.experts_top_k", args["top_k"], origin)
    m.set("model.moe_ffn_hidden_size", args["moe_inter_dim"], origin)
    m.set("model.shared_expert_ffn_hidden_size", args["n_shared"] * args["moe_inter_dim"],
          origin)
    m.set("model.kv_lora_rank", 512, origin)
    if args["q_lora_rank"]:
        m.set("model.q_lora_rank", args["q_lora_rank"], origin)
    m.set("model.head_dim", 128 + 64, origin)
    m.set("model.qk_rope_head_dim", 64, origin)
    m.set("model.v_head_dim", 128, origin)
    m.set("model.rope_theta", 10000.0, origin)
    m.set("model.tied_embeddings", False, origin)


def _ffn_width(dim: int, args: dict[str, Any]) -> int:
    """FeedForward's hidden width in torchtitan's llama3 model.py: 2/3 of 4·dim, times
    ffn_dim_multiplier, rounded up to a multiple of multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    multiplier = args.get("ffn_dim_multiplier")
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    multiple = int(args.get("multiple_of") or 256)
    return multiple * math.ceil(hidden / multiple)


def _recognise(sniff: Sniff) -> float:
    """A TOML document most of whose tables are torchtitan's JobConfig sections, with
    at least one of [training], [parallelism] or a [model] naming a flavor."""
    doc = sniff.toml
    if not isinstance(doc, dict) or not doc:
        return 0.0
    tops = {s.split(".")[0] for s in SECTIONS}
    share = sum(k in tops for k in doc) / len(doc)
    model = doc.get("model")
    anchor = "training" in doc or "parallelism" in doc or (
        isinstance(model, dict) and "flavor" in model
    )
    return 0.5 + 0.45 * share if anchor and share >= 0.5 else 0.0


FORMAT = ConfigFormat(
    name="torchtitan",
    title="a torchtitan job config (TOML)",
    looks_for="TOML sections such as [model] name/flavor, [training], [parallelism], "
    "[optimizer]",
    recognise=_recognise,
    read=read_torchtitan_config,
)
