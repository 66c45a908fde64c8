"""Read an accelerate config (the YAML ``accelerate config`` writes to
~/.cache/huggingface/accelerate/default_config.yaml) into the Plan: processes and machines,
mixed precision, and the FSDP, DeepSpeed or Megatron-LM block.

The framework is what runs the training step: the DeepSpeed engine under
``distributed_type: DEEPSPEED`` (it derives the batch triple and owns the precision and
ZeRO layout), Megatron-LM's under ``MEGATRON_LM``, accelerate's own ``Accelerator`` (DDP or
FSDP around the user's loop, with a GradScaler for fp16) otherwise.

Values follow accelerate's semantics (accelerate 1.15: commands/config/config_args.py,
commands/launch.py, utils/launch.py, utils/dataclasses.py):

* ``num_processes`` counts processes on all machines together; ``-1`` (the dataclass
  default, for launchers that pass it themselves) leaves the GPU count unknown (C006).
* FSDP1's ``fsdp_sharding_strategy`` is a name or its number 1..5 (FULL_SHARD,
  SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2), FULL_SHARD by default; FSDP1
  also takes that name as ``fsdp_reshard_after_forward``. FSDP2's ``fsdp_reshard_after_forward``
  is a boolean, true by default: true shards parameters between uses (ZeRO-3), false keeps
  them gathered after forward (ZeRO-2). HYBRID_SHARD shards within a node and replicates
  across nodes; the Plan has no shard-group size, so it is read as ZeRO-3.
* ``fsdp_offload_params`` is FSDP's CPUOffload: parameters and gradients live on the CPU
  and the optimizer steps there, so both offload fields are set.
* A DeepSpeed block that names ``deepspeed_config_file`` hands everything to that file
  (read first, as ``refs["deepspeed"]``); otherwise accelerate builds the config from the
  block, with its defaults (``DeepSpeedPlugin.__post_init__``: ZeRO stage 2, no offload).

Top-level keys accelerate does not know make ``accelerate launch`` refuse the file; keys
in a block that accelerate never reads have no effect. Both are C005
(:mod:`sapper.plan.readers.accelerate_keys`).
"""

from __future__ import annotations

from typing import Any

from sapper.errors import InputError
from sapper.plan.readers.accelerate_keys import BLOCKS, TOP_LEVEL
from sapper.plan.readers.base import (
    ConfigFormat,
    Sniff,
    unknown_key_findings,
    unresolved_finding,
)
from sapper.plan.readers.hf_trainer import MISSING, Values, local_path
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_accelerate_config"]

#: accelerate.utils.DistributedType (accelerate/utils/dataclasses.py).
DISTRIBUTED_TYPES = (
    "NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
    "MULTI_XPU", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM", "MULTI_HPU", "MULTI_NEURON",
)
#: Also in a SageMaker config (SageMakerDistributedType).
_SAGEMAKER_TYPES = ("DATA_PARALLEL", "MODEL_PARALLEL")
_PRECISIONS = {"no": None, "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}
#: accelerate.utils.constants.FSDP_SHARDING_STRATEGY, numbered from 1 like torch's enum.
_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
_SHARDING_STAGE = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3,
                   "HYBRID_SHARD_ZERO2": 2}
_OFFLOAD = ("none", "cpu", "nvme")


def read_accelerate_config(sniff: Sniff) -> PlanSource:
    raw = sniff.mapping
    if raw is None:
        raise InputError(
            "an accelerate config must be a mapping of settings", file=sniff.name,
            expected="keys such as distributed_type, num_processes, mixed_precision",
        )
    src = PlanSource(name=sniff.name)
    v = Values(raw, src)
    kind = _distributed_type(v)
    framework = {"DEEPSPEED": "deepspeed", "MEGATRON_LM": "megatron"}.get(kind, "accelerate")
    v.set("framework", framework, f"distributed_type {kind}")
    _check_keys(raw, src)
    _machines(v, kind)
    _precision(v, kind)
    if kind == "FSDP":
        _fsdp(v)
    elif kind == "DEEPSPEED":
        _deepspeed(v, sniff)
    elif kind == "MEGATRON_LM":
        _megatron(v)
    _parallelism(v)
    return src


def _distributed_type(v: Values) -> str:
    value = v.get("distributed_type")
    if value is MISSING or value is None:
        raise InputError(
            "missing value", file=v.file, field="distributed_type",
            expected="one of " + ", ".join(DISTRIBUTED_TYPES) + " (accelerate refuses a "
            "config without it)",
        )
    if not isinstance(value, str) or value not in DISTRIBUTED_TYPES + _SAGEMAKER_TYPES:
        raise v.error("distributed_type", value, "one of " + ", ".join(DISTRIBUTED_TYPES))
    return value


def _check_keys(raw: dict[str, Any], src: PlanSource) -> None:
    top = [str(k) for k in raw]
    src.findings += unknown_key_findings(
        top, TOP_LEVEL, file=src.name, framework="accelerate",
        effect="(accelerate launch refuses a config with unknown keys)",
    )
    for block, known in BLOCKS.items():
        section = raw.get(block)
        if not isinstance(section, dict):
            continue
        src.findings += unknown_key_findings(
            [f"{block}.{k}" for k in section], {f"{block}.{k}" for k in known},
            file=src.name, framework="accelerate",
            effect="(accelerate never reads it: no effect)",
        )


def _machines(v: Values, kind: str) -> None:
    machines = v.value("num_machines", "int", minimum=1) or 1
    processes = v.value("num_processes", "int", minimum=-1)
    if processes == 0:
        raise v.error("num_processes", 0, "a positive number of processes, or -1 (set at launch)")
    if processes is None and kind == "NO":
        processes = 1  # BaseConfig.process_config: a single process without distribution
    if processes is None or processes == -1:
        unresolved_finding(
            v.src, "num_processes", "hardware.num_gpus",
            "not given (-1): the launcher sets the process count at start",
            "pass --gpus N (all machines together)",
        )
    else:
        # Nodes only with the process count: alone, they would multiply the Plan's
        # default of 8 GPUs per node into a GPU count the file never gave.
        v.set("hardware.nodes", machines, "num_machines" if v.has("num_machines") else
              "num_machines (accelerate default)")
        v.set("hardware.num_gpus", processes, "num_processes")
        if processes % machines:
            raise InputError(
                "invalid value", file=v.file, field="num_processes", value=processes,
                expected=f"a multiple of num_machines ({machines}): num_processes counts the "
                "processes of all machines together",
            )
        v.set("hardware.gpus_per_node", processes // machines, "num_processes / num_machines")
    rank = v.value("machine_rank", "int", minimum=0)
    if rank is not None and rank >= machines:
        raise v.error("machine_rank", rank, f"0 .. {machines - 1} (num_machines is {machines})")
    ids = v.get("gpu_ids")
    if ids not in (MISSING, None) and not isinstance(ids, (str, int)):
        raise v.error("gpu_ids", ids, '"all" or comma-separated GPU indices such as "0,1"')


def _precision(v: Values, kind: str) -> None:
    value = v.get("mixed_precision")
    if value is MISSING or value is None:
        legacy = v.value("fp16", "bool")  # process_config's pre-0.6 key
        value = "fp16" if legacy else "no"
        key = "fp16" if legacy else "mixed_precision (accelerate default: no)"
    else:
        key = "mixed_precision"
    if not isinstance(value, str) or value.lower() not in _PRECISIONS:
        raise v.error("mixed_precision", value, "no, fp16, bf16 or fp8")
    dtype = _PRECISIONS[value.lower()]
    if kind == "DEEPSPEED" and dtype is None and v.get("mixed_precision") in (MISSING, None):
        return  # the DeepSpeed config file decides
    v.set("precision.dtype", dtype or "fp32", key)
    if dtype == "bf16":
        v.set("precision.loss_scaling.mode", "none", key)
    if dtype in ("bf16", "fp16") and kind not in ("DEEPSPEED", "MEGATRON_LM"):
        # Accelerator wraps the forward in torch.autocast over fp32 weights (DDP, FSDP).
        v.set("precision.autocast", True, key)


def _fsdp(v: Values) -> None:
    block = "fsdp_config"
    cfg = v.section(block)

    def key(name: str) -> str:
        """fsdp_config keys may omit the ``fsdp_`` prefix (launch adds it)."""
        short = name.removeprefix("fsdp_")
        return f"{block}.{short}" if name not in cfg and short in cfg else f"{block}.{name}"

    version_key = key("fsdp_version")
    version = v.value(version_key, "int") or 1
    if version not in (1, 2):
        raise v.error(version_key, v.get(version_key), "1 or 2")
    strategy_key, reshard_key = key("fsdp_sharding_strategy"), key("fsdp_reshard_after_forward")
    stage = None
    if version == 1:
        for k in (strategy_key, reshard_key):
            stage = _sharding_stage(v, k)
            if stage is not None:
                v.set("parallel.zero_stage", stage, k)
                break
        if stage is None:
            v.set("parallel.zero_stage", 3, f"{strategy_key} (accelerate default: FULL_SHARD)")
    else:
        reshard = v.get(reshard_key)
        if isinstance(reshard, str) and reshard.lower() in ("true", "false"):
            reshard = reshard.lower() == "true"
        if reshard in (MISSING, None):
            v.set("parallel.zero_stage", 3, f"{reshard_key} (accelerate default: true)")
        elif isinstance(reshard, bool):
            v.set("parallel.zero_stage", 3 if reshard else 2, reshard_key)
        else:
            raise v.error(reshard_key, reshard, "true or false (FSDP2 takes no strategy name)")
    if v.value(key("fsdp_offload_params"), "bool"):
        v.set("parallel.offload_params", "cpu", key("fsdp_offload_params"))
        v.set("parallel.offload_optimizer", "cpu", key("fsdp_offload_params"))
    checkpointing = v.value(key("fsdp_activation_checkpointing"), "bool")
    if checkpointing is not None:
        v.set("parallel.checkpointing.granularity", "full" if checkpointing else "none",
              key("fsdp_activation_checkpointing"))
    efficient = v.value(key("fsdp_cpu_ram_efficient_loading"), "bool")
    sync = v.value(key("fsdp_sync_module_states"), "bool")
    if efficient and sync is False:
        raise v.error(key("fsdp_sync_module_states"), False,
                      "true when fsdp_cpu_ram_efficient_loading is true (accelerate launch "
                      "refuses the pair)")


def _sharding_stage(v: Values, key: str) -> int | None:
    value = v.get(key)
    if value is MISSING or value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(_SHARDING):
        return _SHARDING_STAGE[_SHARDING[value - 1]]
    if isinstance(value, str):
        name = value.strip().upper()
        if name.isdigit() and 1 <= int(name) <= len(_SHARDING):
            name = _SHARDING[int(name) - 1]
        if name in _SHARDING_STAGE:
            return _SHARDING_STAGE[name]
    if isinstance(value, bool) and key.endswith("reshard_after_forward"):
        return 3 if value else 2  # the FSDP2 spelling, accepted by FSDP1 as well
    raise v.error(key, value, " / ".join(_SHARDING) + " or their numbers 1-5")


def _deepspeed(v: Values, sniff: Sniff) -> None:
    block = "deepspeed_config"
    v.section(block)
    file_key = f"{block}.deepspeed_config_file"
    if v.has(file_key):
        name = v.value(file_key, "str")
        path = local_path(name, sniff.path.parent)
        if path is not None:
            v.src.refs["deepspeed"] = path
        else:
            unresolved_finding(
                v.src, file_key, "parallel.zero_stage",
                f"{name!r} is not on this machine, and it holds the DeepSpeed settings",
                "pass --deepspeed ds.json",
            )
        return
    stage = v.value(f"{block}.zero_stage", "int")
    if stage is not None and stage not in (0, 1, 2, 3):
        raise v.error(f"{block}.zero_stage", stage, "0, 1, 2 or 3 (the ZeRO stage)")
    if stage is None:
        v.set("parallel.zero_stage", 2, f"{block}.zero_stage (accelerate default)")
    else:
        v.set("parallel.zero_stage", stage, f"{block}.zero_stage")
    for name, field in (("offload_optimizer_device", "parallel.offload_optimizer"),
                        ("offload_param_device", "parallel.offload_params")):
        key = f"{block}.{name}"
        device = v.value(key, "str")
        if device is None:
            continue
        if device.lower() not in _OFFLOAD:
            raise v.error(key, device, "none, cpu or nvme")
        v.set(field, device.lower(), key)
    ga = v.get(f"{block}.gradient_accumulation_steps")
    if ga != "auto":
        v.take(f"{block}.gradient_accumulation_steps", "batch.gradient_accumulation_steps",
               "int", minimum=1)
    clip = v.get(f"{block}.gradient_clipping")
    if clip != "auto":
        norm = v.take(f"{block}.gradient_clipping", "clipping.max_norm", "number", minimum=0)
        if norm == 0:
            v.set("clipping.max_norm", None, f"{block}.gradient_clipping")


def _megatron(v: Values) -> None:
    """accelerate's Megatron-LM plugin: the block's keys carry the ``megatron_lm_`` prefix
    (commands/config/cluster.py)."""
    block = "megatron_lm_config"
    v.section(block)
    p = f"{block}.megatron_lm_"
    v.take(f"{p}tp_degree", "parallel.tp", "int", minimum=1)
    v.take(f"{p}pp_degree", "parallel.pp", "int", minimum=1)
    v.take(f"{p}context_parallel_size", "parallel.cp", "int", minimum=1)
    v.take(f"{p}expert_model_parallel_size", "parallel.ep", "int", minimum=1)
    v.take(f"{p}sequence_parallelism", "parallel.sequence_parallel", "bool")
    v.take(f"{p}num_micro_batches", "batch.gradient_accumulation_steps", "int", minimum=1)
    norm = v.take(f"{p}gradient_clipping", "clipping.max_norm", "number", minimum=0)
    if norm == 0:
        v.set("clipping.max_norm", None, f"{p}gradient_clipping")
    if v.value(f"{p}recompute_activations", "bool"):
        v.set("parallel.checkpointing.granularity", "selective", f"{p}recompute_activations")
    if v.value(f"{p}use_distributed_optimizer", "bool"):
        v.set("parallel.zero_stage", 1, f"{p}use_distributed_optimizer")


def _parallelism(v: Values) -> None:
    """accelerate's ParallelismConfig (FSDP2 with TP/CP, HSDP, DeepSpeed's Ulysses sequence
    parallelism): ``parallelism_config_*``, every size 1 unless given
    (accelerate/parallelism_config.py). The mesh is dp_replicate × dp_shard × tp × cp (× sp)
    and must equal the process count; FSDP shards over dp_shard × cp, as sapper does over
    dp × cp. ``sp_size`` (``sp_backend`` deepspeed, ALST/Ulysses) splits each sequence over
    sp ranks like CP and DeepSpeed forms the SP × DP groups itself: it is read as CP, and
    the data-parallel degree is then what the GPU count leaves. CP and SP together, and CP
    with pure replication (dp_replicate > 1, dp_shard 1), are refused at start."""
    block = "parallelism_config"
    if not v.section(block):
        return
    p = f"{block}.parallelism_config_"
    v.take(f"{p}tp_size", "parallel.tp", "int", minimum=1)
    cp = v.take(f"{p}cp_size", "parallel.cp", "int", minimum=1)
    sp = v.value(f"{p}sp_size", "int", minimum=1)
    backend = v.value(f"{p}sp_backend", "str")
    if backend is not None and backend != "deepspeed":
        raise v.error(f"{p}sp_backend", backend, "deepspeed")
    if sp is not None and sp > 1 and cp is not None and cp > 1:
        raise v.error(f"{p}sp_size", sp, "1 when cp_size > 1 (accelerate refuses context "
                      "and sequence parallelism together)")
    shard = v.value(f"{p}dp_shard_size", "int", minimum=1)
    replicate = v.value(f"{p}dp_replicate_size", "int", minimum=1)
    if cp is not None and cp > 1 and (replicate or 1) > 1 and (shard or 1) == 1:
        raise v.error(f"{p}cp_size", cp, "1 with dp_replicate_size > 1 and dp_shard_size 1 "
                      "(accelerate refuses CP with pure replication)")
    if sp is not None and sp > 1:
        v.set("parallel.cp", sp, f"{p}sp_size (DeepSpeed Ulysses: the sequence split over "
              "sp ranks)")
        return
    if shard is not None or replicate is not None:
        v.set("parallel.dp", (shard or 1) * (replicate or 1),
              f"{p}dp_shard_size × {p}dp_replicate_size")


#: Keys that only an accelerate config has at its top level.
_SIGNATURE = frozenset({
    "distributed_type", "compute_environment", "num_processes", "num_machines",
    "machine_rank", "main_training_function", "fsdp_config", "deepspeed_config",
    "megatron_lm_config", "rdzv_backend", "same_network", "downcast_bf16", "tpu_use_cluster",
    "gpu_ids", "main_process_ip", "main_process_port", "use_cpu", "enable_cpu_affinity",
    "dynamo_config", "fp8_config", "parallelism_config",
})


def _recognise(sniff: Sniff) -> float:
    """A mapping with accelerate's ``distributed_type`` among mostly accelerate keys
    (``mixed_precision`` and ``debug`` alone are shared with other formats)."""
    doc = sniff.mapping
    if not isinstance(doc, dict) or not doc:
        return 0.0
    keys = {str(k) for k in doc}
    hits = keys & _SIGNATURE
    if "distributed_type" not in keys and len(hits) < 3:
        return 0.0
    share = len(keys & TOP_LEVEL) / len(keys)
    return (0.6 if "distributed_type" in keys else 0.4) + 0.38 * share


FORMAT = ConfigFormat(
    name="accelerate",
    title="an accelerate config (YAML)",
    looks_for="distributed_type, num_processes, mixed_precision and an fsdp_config or "
    "deepspeed_config block, as `accelerate config` writes them",
    recognise=_recognise,
    read=read_accelerate_config,
)
