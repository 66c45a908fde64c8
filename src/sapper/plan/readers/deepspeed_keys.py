"""DeepSpeed's documented configuration keys, section by section.

DeepSpeed reads most of its JSON with ``dict.get``: a misspelled key is simply never read
and its default applies (``"gradient_cliping": 1.0`` trains without clipping). Recent
versions validate a few sections strictly (``zero_optimization``, the offload blocks,
``fp16``/``bf16``), so the same typo either changes nothing silently or stops the launch,
depending on the version. sapper checks every key against this table, built from the
DeepSpeed configuration JSON reference (deepspeed.ai/docs/config-json) and the field names
of its config models, and suggests the nearest documented key.

A section maps to the set of keys documented for it, or to ``None`` when its contents are
passed through to something else (optimizer/scheduler constructor arguments, apex AMP
options, plug-in configs) or are too open-ended to list; such sections are checked only
for their own name.
"""

from __future__ import annotations

import difflib

__all__ = ["DEPRECATED", "SECTIONS", "STRICT_SECTIONS", "known_keys", "suggest"]

_TOP_LEVEL = frozenset(
    {
        # batch size
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "managed_gradient_accumulation",
        # optimizer / scheduler
        "optimizer",
        "scheduler",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        # communication
        "communication_data_type",
        "seq_parallel_communication_data_type",
        "gradient_allreduce_op",
        "prescale_gradients",
        "gradient_predivide_factor",
        "sparse_gradients",
        "fp32_allreduce",
        "disable_allgather",
        "allgather_size",
        # precision
        "fp16",
        "bf16",
        "bfloat16",
        "amp",
        "torch_autocast",
        "data_types",
        # clipping
        "gradient_clipping",
        # ZeRO, offload, parallelism
        "zero_optimization",
        "aio",
        "tensor_parallel",
        "expert_parallel",
        "sequence_parallel_size",
        "pipeline",
        "hybrid_engine",
        "elasticity",
        "use_data_before_expert_parallelism",
        # activation checkpointing
        "activation_checkpointing",
        # logging, profiling, monitoring
        "steps_per_print",
        "wall_clock_breakdown",
        "memory_breakdown",
        "dump_state",
        "flops_profiler",
        "autotuning",
        "tensorboard",
        "wandb",
        "comet",
        "csv_monitor",
        "comms_logger",
        "timers",
        # checkpoints
        "checkpoint",
        "nebula",
        "load_universal_checkpoint",
        "use_node_local_storage",
        # data and training techniques
        "dataloader_drop_last",
        "data_efficiency",
        "curriculum_learning",
        "progressive_layer_drop",
        "sparse_attention",
        "eigenvalue",
        "compression_training",
        "quantize_training",
        "weight_quantization",
        "vocabulary_size",
        # runtime
        "compile",
        "graph_harvesting",
        "disable_python_gc",
    }
)

_ZERO = frozenset(
    {
        "stage",
        "allgather_partitions",
        "allgather_bucket_size",
        "compute_grad_norm",
        "overlap_comm",
        "reduce_scatter",
        "reduce_bucket_size",
        "use_multi_rank_bucket_allreduce",
        "contiguous_gradients",
        "load_from_fp32_weights",
        "elastic_checkpoint",
        "grad_hooks",
        "round_robin_gradients",
        "parameter_alignment",
        "offload_param",
        "offload_optimizer",
        "cpu_offload",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "sub_group_size",
        # stage-3 knobs: DeepSpeed accepts the documented ``stage3_`` names and the bare
        # field names they alias.
        "stage3_max_live_parameters",
        "max_live_parameters",
        "stage3_max_reuse_distance",
        "max_reuse_distance",
        "stage3_prefetch_bucket_size",
        "prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "param_persistence_threshold",
        "stage3_model_persistence_threshold",
        "model_persistence_threshold",
        "stage3_gather_16bit_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "stage3_module_granularity_threshold",
        "module_granularity_threshold",
        "stage3_use_all_reduce_for_fetch_params",
        "use_all_reduce_for_fetch_params",
        "stage3_allgather_sequential",
        "allgather_sequential",
        "stage3_partition_stream_chunk_size",
        "partition_stream_chunk_size",
        "ignore_unused_parameters",
        "legacy_stage1",
        "zero_hpz_partition_size",
        "zero_quantized_weights",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_gradients",
        "zeropp_loco_param",
        "mics_shard_size",
        "mics_hierarchical_params_gather",
        "memory_efficient_linear",
        "pipeline_loading_checkpoint",
        "override_module_apply",
        "log_trace_cache_warnings",
        "enable_sanity_checks",
        "save_muon_momentum_buffer_in_memory",
        "leaf_module",
        "zenflow",
    }
)

_MONITOR = frozenset({"enabled", "output_path", "job_name"})

#: section path (dotted, "" = top level) -> documented keys, or None (not checked inside).
SECTIONS: dict[str, frozenset[str] | None] = {
    "": _TOP_LEVEL,
    "optimizer": frozenset({"type", "params", "legacy_fusion"}),
    "optimizer.params": None,  # constructor kwargs: a typo fails at launch with TypeError
    "scheduler": frozenset({"type", "params"}),
    "scheduler.params": None,
    "fp16": frozenset(
        {
            "enabled",
            "auto_cast",
            "loss_scale",
            "initial_scale_power",
            "loss_scale_window",
            "hysteresis",
            "consecutive_hysteresis",
            "min_loss_scale",
            "fp16_master_weights_and_grads",
        }
    ),
    "bf16": frozenset(
        {
            "enabled",
            "immediate_grad_update",
            "check_grad_overflow",
            "bf16_master_weights_and_grads",
            "bf16_optimizer_states",
        }
    ),
    "amp": None,  # everything but "enabled" goes to apex.amp.initialize
    "torch_autocast": frozenset({"enabled", "dtype", "lower_precision_safe_modules"}),
    "data_types": frozenset({"grad_accum_dtype"}),
    "zero_optimization": _ZERO,
    "zero_optimization.offload_param": frozenset(
        {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu"}
    ),
    "zero_optimization.offload_optimizer": frozenset(
        {
            "device",
            "nvme_path",
            "pin_memory",
            "buffer_count",
            "pipeline_read",
            "pipeline_write",
            "fast_init",
            "ratio",
            "super_offload",
            "convert_grad_on_cpu",
            "cpuadam_cores_perc",
        }
    ),
    "zero_optimization.zeropp_loco_param": frozenset({"err_beta", "reset_T"}),
    "zero_optimization.zenflow": None,
    "zero_optimization.leaf_module": None,
    "aio": frozenset(
        {
            "block_size",
            "queue_depth",
            "intra_op_parallelism",
            "thread_count",
            "single_submit",
            "overlap_events",
            "use_gds",
        }
    ),
    "activation_checkpointing": frozenset(
        {
            "partition_activations",
            "cpu_checkpointing",
            "contiguous_memory_optimization",
            "number_checkpoints",
            "synchronize_checkpoint_boundary",
            "profile",
        }
    ),
    "tensor_parallel": frozenset(
        {
            "autotp_size",
            "tp_size",
            "preset_model",
            "tp_overlap_comm",
            "vocab_parallel_lm_head",
            "partition_config",
        }
    ),
    "tensor_parallel.partition_config": None,
    "expert_parallel": None,
    "pipeline": frozenset(
        {
            "stages",
            "partition",
            "seed_layers",
            "activation_checkpoint_interval",
            "pipe_partitioned",
            "grad_partitioned",
        }
    ),
    "hybrid_engine": frozenset(
        {
            "enabled",
            "max_out_tokens",
            "inference_tp_size",
            "release_inference_cache",
            "pin_parameters",
            "tp_gather_partition_size",
            "enable_cuda_graph",
        }
    ),
    "elasticity": frozenset(
        {
            "enabled",
            "max_train_batch_size",
            "micro_batch_sizes",
            "min_gpus",
            "max_gpus",
            "min_time",
            "version",
            "prefer_larger_batch",
            "ignore_non_elastic_batch_info",
            "num_gpus_per_node",
            "model_parallel_size",
        }
    ),
    "flops_profiler": frozenset(
        {
            "enabled",
            "recompute_fwd_factor",
            "profile_step",
            "module_depth",
            "top_modules",
            "detailed",
            "output_file",
        }
    ),
    "autotuning": frozenset(
        {
            "enabled",
            "results_dir",
            "exps_dir",
            "overwrite",
            "metric",
            "start_profile_step",
            "end_profile_step",
            "fast",
            "max_train_batch_size",
            "min_train_batch_size",
            "max_train_micro_batch_size_per_gpu",
            "min_train_micro_batch_size_per_gpu",
            "mp_size",
            "num_tuning_micro_batch_sizes",
            "tuner_type",
            "tuner_early_stopping",
            "tuner_num_trials",
            "arg_mappings",
            "model_info",
            "model_info_path",
        }
    ),
    "tensorboard": _MONITOR,
    "csv_monitor": _MONITOR,
    "wandb": frozenset({"enabled", "group", "team", "project"}),
    "comet": frozenset(
        {
            "enabled",
            "workspace",
            "project",
            "samples_log_interval",
            "experiment_name",
            "api_key",
            "experiment_key",
            "online",
            "mode",
        }
    ),
    "comms_logger": frozenset({"enabled", "verbose", "prof_all", "debug", "prof_ops"}),
    "checkpoint": frozenset(
        {"tag_validation", "load_universal", "use_node_local_storage", "parallel_write", "writer"}
    ),
    "checkpoint.parallel_write": frozenset({"pipeline_stage"}),
    "checkpoint.writer": None,
    "nebula": frozenset(
        {
            "enabled",
            "persistent_storage_path",
            "persistent_time_interval",
            "num_of_version_in_retention",
            "enable_nebula_load",
            "load_path",
        }
    ),
    "progressive_layer_drop": frozenset({"enabled", "theta", "gamma"}),
    "curriculum_learning": frozenset(
        {
            "enabled",
            "curriculum_type",
            "min_difficulty",
            "max_difficulty",
            "schedule_type",
            "schedule_config",
        }
    ),
    "curriculum_learning.schedule_config": None,
    "eigenvalue": frozenset(
        {
            "enabled",
            "verbose",
            "max_iter",
            "tol",
            "stability",
            "gas_boundary_resolution",
            "layer_name",
            "layer_num",
        }
    ),
    "sparse_attention": frozenset(
        {
            "mode",
            "block",
            "different_layout_per_head",
            "num_local_blocks",
            "num_global_blocks",
            "attention",
            "horizontal_global_attention",
            "num_different_global_patterns",
            "num_random_blocks",
            "local_window_blocks",
            "global_block_indices",
            "global_block_end_indices",
            "num_sliding_window_blocks",
        }
    ),
    "data_efficiency": None,
    "compression_training": None,
    "quantize_training": None,
    "weight_quantization": None,
    "compile": None,
    "timers": None,
}
SECTIONS["bfloat16"] = SECTIONS["bf16"]

#: Sections that recent DeepSpeed versions validate strictly (unknown key = launch error);
#: older versions read them with ``dict.get`` and ignore unknown keys.
STRICT_SECTIONS = frozenset(
    {
        "zero_optimization",
        "zero_optimization.offload_param",
        "zero_optimization.offload_optimizer",
        "fp16",
        "bf16",
        "bfloat16",
    }
)

#: Deprecated key path -> what DeepSpeed's documentation says to use instead.
DEPRECATED: dict[str, str] = {
    "bfloat16": "bf16",
    "zero_optimization.cpu_offload": 'zero_optimization.offload_optimizer {"device": "cpu"}',
    "zero_optimization.cpu_offload_param": 'zero_optimization.offload_param {"device": "cpu"}',
    "zero_optimization.cpu_offload_use_pin_memory": (
        "zero_optimization.offload_optimizer / offload_param pin_memory"
    ),
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": (
        "zero_optimization.stage3_gather_16bit_weights_on_model_save"
    ),
    "zero_optimization.elastic_checkpoint": "universal checkpointing",
    "allgather_size": "zero_optimization.allgather_bucket_size",
}


def known_keys(section: str) -> frozenset[str] | None:
    """Documented keys of ``section``; ``None`` when its contents are not checked."""
    return SECTIONS.get(section)


def suggest(key: str, section: str) -> str | None:
    """The documented key of ``section`` closest to ``key`` (difflib ratio ≥ 0.6), if any.

    A key documented in another section (``stage`` at the top level) is suggested with its
    full path, since moving it is the fix.
    """
    keys = SECTIONS.get(section) or frozenset()
    close = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.6)
    if close:
        return close[0]
    lowered = key.lower()
    if lowered in keys:
        return lowered
    for other, other_keys in SECTIONS.items():
        if other != section and other_keys and key in other_keys:
            return f"{other}.{key}" if other else key
    return None
