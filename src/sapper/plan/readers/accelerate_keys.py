"""The keys accelerate's config file knows, for C005 (typos).

Read from accelerate 1.15.0: the top level is the fields of ``ClusterConfig`` and
``SageMakerConfig`` (accelerate/commands/config/config_args.py), plus the two legacy keys
``BaseConfig.process_config`` still converts (``fp16``, ``dynamo_backend``); accelerate
refuses a file with any other top-level key. Each block's keys are the ``accelerate
launch`` arguments it is copied onto (accelerate/commands/launch.py,
``launch_command_parser`` and the copy loop in ``_validate_launch_command``) and the ones
accelerate/utils/launch.py reads: a key in a block that is none of them is set on the
argument namespace and never read. ``fsdp_config`` keys may omit the ``fsdp_`` prefix and
``fp8_config`` keys do (launch adds it); ``dynamo_config`` keys are prefixed ``dynamo_``.
tests/plan/test_accelerate_config.py compares these tables with the installed accelerate.
"""

from __future__ import annotations

__all__ = ["BLOCKS", "TOP_LEVEL"]

TOP_LEVEL: frozenset[str] = frozenset(
    {
        "additional_args", "base_job_name", "command_file", "commands", "compute_environment",
        "debug", "deepspeed_config", "distributed_type", "downcast_bf16", "dynamo_backend",
        "dynamo_config", "ec2_instance_type", "enable_cpu_affinity", "fp16", "fp8_config",
        "fsdp_config", "gpu_ids", "iam_role_name", "image_uri", "machine_rank", "main_process_ip",
        "main_process_port", "main_training_function", "megatron_lm_config", "mixed_precision",
        "mpirun_config", "num_machines", "num_processes", "parallelism_config", "profile",
        "py_version", "pytorch_version", "rdzv_backend", "region", "sagemaker_inputs_file",
        "sagemaker_metrics_file", "same_network", "tpu_env", "tpu_name", "tpu_use_cluster",
        "tpu_use_sudo", "tpu_vm", "tpu_zone", "transformers_version", "use_cpu",
    }
)

_FSDP: frozenset[str] = frozenset(
    {
        "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload",
        "fsdp_auto_wrap_policy", "fsdp_backward_prefetch", "fsdp_cpu_ram_efficient_loading",
        "fsdp_forward_prefetch", "fsdp_ignored_modules", "fsdp_min_num_params",
        "fsdp_offload_params", "fsdp_reshard_after_forward", "fsdp_sharding_strategy",
        "fsdp_state_dict_type", "fsdp_sync_module_states", "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_use_orig_params", "fsdp_version",
    }
)

_DEEPSPEED: frozenset[str] = frozenset(
    {
        "deepspeed_config_file", "deepspeed_exclusion_filter", "deepspeed_hostfile",
        "deepspeed_inclusion_filter", "deepspeed_moe_layer_cls_names",
        "deepspeed_multinode_launcher", "gradient_accumulation_steps", "gradient_clipping",
        "offload_optimizer_device", "offload_optimizer_nvme_path", "offload_param_device",
        "offload_param_nvme_path", "zero3_init_flag", "zero3_save_16bit_model", "zero_stage",
    }
)

_MEGATRON: frozenset[str] = frozenset(
    {
        "megatron_lm_attention_backend", "megatron_lm_attention_dropout",
        "megatron_lm_attention_softmax_in_fp32", "megatron_lm_calculate_per_token_loss",
        "megatron_lm_context_parallel_size", "megatron_lm_decoder_last_pipeline_num_layers",
        "megatron_lm_eod_mask_loss", "megatron_lm_expert_model_parallel_size",
        "megatron_lm_expert_tensor_parallel_size", "megatron_lm_gradient_clipping",
        "megatron_lm_hidden_dropout", "megatron_lm_no_load_optim", "megatron_lm_no_save_optim",
        "megatron_lm_num_micro_batches", "megatron_lm_optimizer_cpu_offload",
        "megatron_lm_overlap_cpu_optimizer_d2h_h2d", "megatron_lm_pp_degree",
        "megatron_lm_recompute_activations", "megatron_lm_recompute_granularity",
        "megatron_lm_recompute_method", "megatron_lm_recompute_num_layers",
        "megatron_lm_sequence_parallelism", "megatron_lm_tp_degree", "megatron_lm_use_custom_fsdp",
        "megatron_lm_use_distributed_optimizer", "megatron_lm_use_precision_aware_optimizer",
        "megatron_lm_use_rotary_position_embeddings",
    }
)

_FP8: frozenset[str] = frozenset(
    {
        "amax_compute_algo", "amax_history_len", "backend", "enable_fsdp_float8_all_gather",
        "format", "fp8_amax_compute_algo", "fp8_amax_history_len", "fp8_backend",
        "fp8_enable_fsdp_float8_all_gather", "fp8_format", "fp8_interval", "fp8_margin",
        "fp8_opt_level", "fp8_override_linear_precision", "fp8_pad_inner_dim",
        "fp8_use_autocast_during_eval", "interval", "margin", "opt_level",
        "override_linear_precision", "pad_inner_dim", "use_autocast_during_eval",
    }
)

_DYNAMO: frozenset[str] = frozenset(
    {
        "dynamo_backend", "dynamo_mode", "dynamo_use_dynamic", "dynamo_use_fullgraph",
        "dynamo_use_regional_compilation",
    }
)

_PARALLELISM: frozenset[str] = frozenset(
    {
        "parallelism_config_cp_backend", "parallelism_config_cp_comm_strategy",
        "parallelism_config_cp_size", "parallelism_config_dp_replicate_size",
        "parallelism_config_dp_shard_size", "parallelism_config_sp_attn_implementation",
        "parallelism_config_sp_backend", "parallelism_config_sp_seq_length",
        "parallelism_config_sp_seq_length_is_variable", "parallelism_config_sp_size",
        "parallelism_config_tp_size",
    }
)

#: Block -> the keys accelerate reads in it (``fsdp_config`` also without ``fsdp_``).
BLOCKS: dict[str, frozenset[str]] = {
    "fsdp_config": _FSDP | frozenset(k.removeprefix("fsdp_") for k in _FSDP),
    "deepspeed_config": _DEEPSPEED,
    "megatron_lm_config": _MEGATRON,
    "fp8_config": _FP8,
    "dynamo_config": _DYNAMO,
    "parallelism_config": _PARALLELISM,
    "mpirun_config": frozenset({"mpirun_hostfile"}),
}
