"""torchtitan's job-config keys, per TOML section, and the shapes of the llama3, qwen3 and
deepseek_v3 flavors.

``SECTIONS`` is the union over every version of torchtitan's job config in the
pytorch/torchtitan history up to the TOML era's end (commit 238fa995, Feb 2026, the
parent of the "Config System Refactor: TOML to Python Dataclass Registry" #2386):
``torchtitan/config_manager.py`` (argparse ``--section.key`` options until mid-2025, then
dataclasses) and ``torchtitan/config/job_config.py`` (dataclasses), extracted from the
files themselves, so both old layouts (``[training] batch_size``, ``[experimental]``
pipeline keys, ``[float8]``) and new ones (``local_batch_size``, ``[parallelism]``,
``[quantize.linear.float8]``) are known. torchtitan refuses a TOML key its JobConfig
does not have, so each one it does not know stops the job at start.
"""

from __future__ import annotations

__all__ = ["DEEPSEEK_V3_FLAVORS", "LLAMA3_FLAVORS", "QWEN3_FLAVORS", "SECTIONS"]

SECTIONS: dict[str, frozenset[str]] = {
    "activation_checkpoint": frozenset({
        "debug", "determinism_check", "early_stop", "memory_budget", "mode",
        "per_op_sac_force_recompute_mm_shapes_by_fqns", "preserve_rng_state",
        "selective_ac_option", "visualize_memory_budget_pareto",
    }),
    "checkpoint": frozenset({
        "async_mode", "create_seed_checkpoint", "enable", "enable_checkpoint",
        "enable_first_step_checkpoint", "enable_ft_dataloader_checkpoints",
        "exclude_from_loading", "export_dtype", "folder", "initial_load_in_hf",
        "initial_load_in_hf_quantized", "initial_load_model_only",
        "initial_load_model_weights_only", "initial_load_path", "interval", "interval_type",
        "keep_latest_k", "last_save_in_hf", "last_save_in_safetensors_format",
        "last_save_model_only", "last_save_model_weights_only", "load_only", "load_step",
        "model_weights_only",
    }),
    "comm": frozenset({
        "init_timeout_seconds", "mode", "save_traces_file_prefix", "save_traces_folder",
        "trace_buf_size", "train_timeout_seconds",
    }),
    "compile": frozenset({
        "backend", "components", "enable",
    }),
    "debug": frozenset({
        "deterministic", "deterministic_warn_only", "moe_force_load_balance", "seed",
    }),
    "estimate": frozenset({
        "memory", "mode",
    }),
    "experimental": frozenset({
        "context_parallel_degree", "context_parallel_rotate_method", "custom_args_module",
        "custom_import", "custom_model_path", "enable_async_tensor_parallel",
        "enable_compiled_autograd", "pipeline_parallel_degree",
        "pipeline_parallel_microbatches", "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv", "pipeline_parallel_split_mode",
        "pipeline_parallel_split_points", "torch_spmd",
    }),
    "fault_tolerance": frozenset({
        "enable", "fragment_sync_delay", "fragment_update_alpha", "group_size",
        "min_replica_size", "module_fqns_per_model_fragment", "num_fragments", "process_group",
        "process_group_timeout_ms", "replica_id", "semi_sync_method", "should_quantize",
        "sync_steps",
    }),
    "float8": frozenset({
        "emulate", "enable_float8_linear", "enable_fsdp_float8_all_gather", "filter_fqns",
        "force_recompute_fp8_weight_in_bwd", "moe_fqns_prototype",
        "precompute_float8_dynamic_scale_for_fsdp", "recipe_name", "scaling_type_grad_output",
        "scaling_type_input", "scaling_type_weight",
    }),
    "job": frozenset({
        "config_file", "custom_config_module", "description", "dump_folder", "print_args",
        "print_config", "save_config_file", "save_config_folder", "use_for_integration_test",
    }),
    "lr_scheduler": frozenset({
        "decay_ratio", "decay_type", "lr_min", "min_lr_factor", "total_steps", "warmup_steps",
    }),
    "memory_estimation": frozenset({
        "disable_fake_mode", "enable", "enabled",
    }),
    "metrics": frozenset({
        "disable_color_printing", "disable_logging_from_checkpoint", "enable_color_printing",
        "enable_tensorboard", "enable_wandb", "log_freq", "rank_0_only", "save_for_all_ranks",
        "save_tb_folder",
    }),
    "model": frozenset({
        "attn_mask_type", "converters", "flavor", "hf_assets_path", "name", "norm_type",
        "print_after_conversion", "tokenizer_path", "use_flex_attn",
    }),
    "mx": frozenset({
        "filter_fqns", "moe_fqns_prototype", "mxfp8_dim1_cast_kernel_choice", "recipe_name",
        "use_fp8_dim1_cast_triton_kernel",
    }),
    "optimizer": frozenset({
        "beta1", "beta2", "early_step_in_backward", "eps", "fused", "implementation", "lr",
        "name", "weight_decay",
    }),
    "parallelism": frozenset({
        "context_parallel_degree", "context_parallel_load_balancer",
        "context_parallel_rotate_method", "data_parallel_replicate_degree",
        "data_parallel_shard_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
        "enable_compiled_autograd", "expert_parallel_comm_backend", "expert_parallel_degree",
        "expert_tensor_parallel_degree", "fsdp_reshard_after_forward",
        "module_fqns_per_model_part", "pipeline_parallel_degree",
        "pipeline_parallel_expert_parallel_overlap",
        "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
        "pipeline_parallel_layers_per_stage", "pipeline_parallel_microbatch_size",
        "pipeline_parallel_microbatches", "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv", "pipeline_parallel_split_points",
        "tensor_parallel_degree",
    }),
    "profiling": frozenset({
        "enable_memory_snapshot", "enable_profiling", "profile_every_x_iter", "profile_freq",
        "profiler_active", "profiler_warmup", "run_profiler", "save_memory_snapshot_folder",
        "save_traces_folder",
    }),
    "quantize.dense.float8": frozenset({
        "emulate", "enable_fsdp_float8_all_gather", "filter_fqns",
        "precompute_float8_dynamic_scale_for_fsdp", "recipe_name",
    }),
    "quantize.dense.mx": frozenset({
        "filter_fqns", "mxfp8_dim1_cast_kernel_choice", "recipe_name",
    }),
    "quantize.grouped_mm.float8": frozenset({
        "fqns",
    }),
    "quantize.grouped_mm.mx": frozenset({
        "fqns", "recipe_name",
    }),
    "quantize.linear.float8": frozenset({
        "emulate", "enable_fsdp_float8_all_gather", "filter_fqns",
        "precompute_float8_dynamic_scale_for_fsdp", "recipe_name",
    }),
    "quantize.linear.mx": frozenset({
        "filter_fqns", "mxfp8_dim1_cast_kernel_choice", "recipe_name",
    }),
    "quantize.moe.float8": frozenset({
        "fqns",
    }),
    "quantize.moe.mx": frozenset({
        "fqns",
    }),
    "training": frozenset({
        "batch_size", "compile", "data_parallel_degree", "data_parallel_replicate_degree",
        "data_parallel_shard_degree", "data_parallel_type", "dataset", "dataset_path",
        "debug_moe_force_load_balance", "deterministic", "disable_loss_parallel", "dtype",
        "enable_cpu_offload", "enable_float8_linear", "enable_fp8_linear",
        "enable_fsdp_float8_all_gather", "enable_fsdp_fp8_all_gather", "enable_loss_parallel",
        "float8_scaling_type_grad_output", "float8_scaling_type_input",
        "float8_scaling_type_weight", "fp8_linear", "fsdp_reshard_after_forward", "gc_debug",
        "gc_freq", "global_batch_size", "local_batch_size", "max_norm", "mixed_precision_param",
        "mixed_precision_reduce", "pipeline_parallel_degree",
        "precompute_float8_dynamic_scale_for_fsdp", "seed", "seq_len", "steps",
        "tensor_parallel_degree", "warmup_steps",
    }),
    "training.dataloader": frozenset({
        "num_workers", "persistent_workers", "pin_memory", "prefetch_factor",
    }),
    "validation": frozenset({
        "dataset", "dataset_path", "enable", "enabled", "freq", "local_batch_size", "seq_len",
        "steps",
    }),
    "validation.dataloader": frozenset({
        "num_workers", "persistent_workers", "pin_memory", "prefetch_factor",
    }),
}

#: ``llama3_args`` of torchtitan/models/llama3/__init__.py (commit 238fa995): flavor ->
#: TransformerModelArgs given there; unset ones are the dataclass defaults of
#: torchtitan/models/llama3/model/args.py (vocab_size 128256, multiple_of 256,
#: ffn_dim_multiplier None, n_kv_heads = n_heads, rope_theta 10000).
LLAMA3_FLAVORS: dict[str, dict[str, float | int | None]] = {
    "debugmodel": {"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048,
                   "rope_theta": 500000},
    "8B": {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
           "ffn_dim_multiplier": 1.3, "multiple_of": 1024, "rope_theta": 500000},
    "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8,
            "ffn_dim_multiplier": 1.3, "multiple_of": 4096, "rope_theta": 500000},
    "405B": {"dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8,
             "ffn_dim_multiplier": 1.2, "multiple_of": 4096, "rope_theta": 500000},
}

#: ``qwen3_args`` of torchtitan/models/qwen3/__init__.py (commit 238fa995): flavor ->
#: Qwen3ModelArgs given there (head_dim 128, qk_norm, rope_theta 1e6 in every one;
#: ``hidden_dim`` is the dense MLP width; the MoE flavors put MoE in every block, with
#: ``moe_inter_dim`` per expert and no shared expert).
QWEN3_FLAVORS: dict[str, dict[str, float | int | bool]] = {
    "debugmodel": {"dim": 256, "n_layers": 8, "n_heads": 16, "n_kv_heads": 8,
                   "vocab_size": 2048, "hidden_dim": 3072, "rope_theta": 1000000,
                   "tied": True},
    "0.6B": {"dim": 1024, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8,
             "vocab_size": 151936, "hidden_dim": 3072, "rope_theta": 1000000, "tied": True},
    "1.7B": {"dim": 2048, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8,
             "vocab_size": 151936, "hidden_dim": 6144, "rope_theta": 1000000, "tied": True},
    "4B": {"dim": 2560, "n_layers": 36, "n_heads": 32, "n_kv_heads": 8,
           "vocab_size": 151936, "hidden_dim": 9728, "rope_theta": 1000000, "tied": True},
    "8B": {"dim": 4096, "n_layers": 36, "n_heads": 32, "n_kv_heads": 8,
           "vocab_size": 151936, "hidden_dim": 12288, "rope_theta": 1000000},
    "14B": {"dim": 5120, "n_layers": 40, "n_heads": 40, "n_kv_heads": 8,
            "vocab_size": 151936, "hidden_dim": 17408, "rope_theta": 1000000},
    "32B": {"dim": 5120, "n_layers": 64, "n_heads": 64, "n_kv_heads": 8,
            "vocab_size": 151936, "hidden_dim": 25600, "rope_theta": 1000000},
    "debugmodel_moe": {"dim": 256, "n_layers": 8, "n_heads": 16, "n_kv_heads": 8,
                       "vocab_size": 2048, "hidden_dim": 3072, "rope_theta": 1000000,
                       "num_experts": 64, "top_k": 8, "moe_inter_dim": 768},
    "30B-A3B": {"dim": 2048, "n_layers": 48, "n_heads": 32, "n_kv_heads": 4,
                "vocab_size": 151936, "hidden_dim": 6144, "rope_theta": 1000000,
                "num_experts": 128, "top_k": 8, "moe_inter_dim": 768},
    "235B-A22B": {"dim": 4096, "n_layers": 94, "n_heads": 64, "n_kv_heads": 4,
                  "vocab_size": 151936, "hidden_dim": 12288, "rope_theta": 5000000,
                  "num_experts": 128, "top_k": 8, "moe_inter_dim": 1536},
}

#: ``deepseekv3_args`` of torchtitan/models/deepseek_v3/__init__.py (commit 238fa995):
#: flavor -> DeepSeekV3ModelArgs given there; unset ones are the dataclass defaults of
#: model/args.py (q_lora_rank 0: queries not compressed, kv_lora_rank 512,
#: qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, rope_theta 10000).
#: ``n_dense_layers`` leading blocks have an MLP of ``inter_dim``; the others
#: ``num_experts`` routed experts of ``moe_inter_dim`` and ``n_shared`` shared ones.
DEEPSEEK_V3_FLAVORS: dict[str, dict[str, int]] = {
    "debugmodel": {"vocab_size": 2048, "dim": 256, "inter_dim": 1024, "moe_inter_dim": 256,
                   "n_layers": 6, "n_dense_layers": 1, "n_heads": 16, "num_experts": 8,
                   "n_shared": 2, "top_k": 3, "q_lora_rank": 0},
    "debugmodel_flex_attn": {"vocab_size": 2048, "dim": 256, "inter_dim": 1024,
                             "moe_inter_dim": 256, "n_layers": 6, "n_dense_layers": 1,
                             "n_heads": 16, "num_experts": 8, "n_shared": 2, "top_k": 3,
                             "q_lora_rank": 0},
    "16B": {"vocab_size": 102400, "dim": 2048, "inter_dim": 10944, "moe_inter_dim": 1408,
            "n_layers": 27, "n_dense_layers": 1, "n_heads": 16, "num_experts": 64,
            "n_shared": 2, "top_k": 6, "q_lora_rank": 0},
    "236B": {"vocab_size": 102400, "dim": 5120, "inter_dim": 12288, "moe_inter_dim": 1536,
             "n_layers": 60, "n_dense_layers": 1, "n_heads": 128, "num_experts": 160,
             "n_shared": 2, "top_k": 6, "q_lora_rank": 1536},
    "671B": {"vocab_size": 129280, "dim": 7168, "inter_dim": 18432, "moe_inter_dim": 2048,
             "n_layers": 61, "n_dense_layers": 3, "n_heads": 128, "num_experts": 256,
             "n_shared": 1, "top_k": 8, "q_lora_rank": 1536},
}
