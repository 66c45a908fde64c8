"""The keys a TRL command-line config (``trl sft --config x.yaml``, ``trl dpo --config``
...) may hold, for C005 (typos) and to tell which ``trl`` command a file is written for.

Read from TRL at commit f2cd57710ae345ea6428ae95363267fcf38a3dc8 (Jul 2026, v1.9.0-26,
version 1.10.0.dev0) of github.com/huggingface/trl. ``trl <command> --config x.yaml`` parses
the file with ``TrlParser`` (trl/scripts/utils.py ``parse_args_and_config``) into the
command's dataclasses (trl/scripts/<command>.py ``make_parser``): ``SCRIPT``
(``ScriptArguments`` and ``DatasetMixtureConfig`` of trl/scripts/utils.py, the
``reward_funcs`` of ``trl grpo``/``trl rloo``, and ``env``, which the parser pops), ``MODEL``
(``ModelConfig``, trl/trainer/model_config.py) and the command's trainer config, which
extends Hugging Face ``TrainingArguments`` (the installed transformers' fields, read when a
file is read): ``SFT``, ``DPO``, ``REWARD``, ``KTO``, ``GRPO``, ``RLOO`` hold the fields each
config class defines itself (trl/trainer/sft_config.py, dpo_config.py, reward_config.py,
kto_config.py, grpo_config.py, rloo_config.py; their shared base, base_config.py, only
changes defaults of TrainingArguments fields).

Keys none of these define are handed to ``accelerate launch`` (trl/cli/commands/training.py),
which takes the ``LAUNCH`` options (accelerate 1.16's ``launch_command_parser``, plus TRL's
own ``accelerate_config``, trl/cli/accelerate_config.py) and refuses anything else.
``LEGACY`` holds, per command (and for ``ModelConfig`` and ``ScriptArguments``), the
fields the releases tagged v0.12.0, v0.14.0, v0.16.0, v0.19.0, v0.21.0, v0.24.0, v0.27.0,
v0.29.0 and v1.0.0 defined and this one does not (``max_seq_length`` became ``max_length`` in
0.20, ``torch_dtype`` became ``dtype``, ``DPOConfig.max_prompt_length`` went in 0.29): a
config written for an older release names them, and this release refuses them.
"""

from __future__ import annotations

__all__ = [
    "DPO", "GRPO", "KTO", "LAUNCH", "LEGACY", "MODEL", "REWARD", "RLOO", "SCRIPT", "SFT",
]

SFT: frozenset[str] = frozenset(
    {
        "activation_offloading", "assistant_only_loss", "chat_template_path",
        "completion_only_loss", "dataset_kwargs", "dataset_num_proc", "dataset_text_field",
        "eos_token", "eval_packing", "learning_rate", "loss_type", "max_length",
        "model_init_kwargs", "packing", "packing_strategy", "pad_to_multiple_of", "pad_token",
        "padding_free", "router_aux_loss_coef", "shuffle_dataset", "truncation_mode",
        "trust_remote_code",
    }
)


DPO: frozenset[str] = frozenset(
    {
        "activation_offloading", "beta", "dataset_num_proc", "disable_dropout", "discopop_tau",
        "f_alpha_divergence_coef", "f_divergence_type", "label_smoothing", "ld_alpha",
        "learning_rate", "loss_type", "loss_weights", "max_length", "model_init_kwargs",
        "pad_to_multiple_of", "pad_token", "padding_free", "precompute_ref_batch_size",
        "precompute_ref_log_probs", "ref_model_mixup_alpha", "ref_model_sync_steps",
        "router_aux_loss_coef", "sync_ref_model", "truncation_mode", "trust_remote_code",
        "use_weighting",
    }
)


REWARD: frozenset[str] = frozenset(
    {
        "activation_offloading", "center_rewards_coefficient", "chat_template_path",
        "dataset_num_proc", "disable_dropout", "eos_token", "learning_rate", "max_length",
        "model_init_kwargs", "pad_to_multiple_of", "pad_token", "trust_remote_code",
    }
)


KTO: frozenset[str] = frozenset(
    {
        "activation_offloading", "beta", "dataset_num_proc", "desirable_weight", "disable_dropout",
        "learning_rate", "loss_type", "max_length", "model_init_kwargs", "pad_to_multiple_of",
        "precompute_ref_batch_size", "precompute_ref_log_probs", "ref_model_mixup_alpha",
        "ref_model_sync_steps", "router_aux_loss_coef", "sync_ref_model", "train_sampling_strategy",
        "trust_remote_code", "undesirable_weight",
    }
)


GRPO: frozenset[str] = frozenset(
    {
        "beta", "cache_implementation", "cast_lm_head_to_fp32", "chat_template_kwargs", "delta",
        "disable_dropout", "ds3_gather_for_generation", "entropy_coef", "entropy_coef_delta",
        "entropy_coef_max", "entropy_coef_min", "entropy_target", "epsilon", "epsilon_high",
        "generation_batch_size", "generation_kwargs", "importance_sampling_level", "learning_rate",
        "log_completions", "log_completions_hub_repo", "log_multimodal", "log_unique_prompts",
        "loss_type", "mask_truncated_completions", "max_completion_length",
        "max_tool_calling_iterations", "min_p", "model_init_kwargs", "multi_objective_aggregation",
        "num_completions_to_print", "num_generations", "num_generations_eval", "num_iterations",
        "off_policy_mask_threshold", "pad_to_multiple_of", "ref_model_mixup_alpha",
        "ref_model_sync_steps", "remove_unused_columns", "repetition_penalty", "reward_weights",
        "router_aux_loss_coef", "sapo_temperature_neg", "sapo_temperature_pos", "scale_rewards",
        "shuffle_dataset", "steps_per_generation", "sync_ref_model", "temperature",
        "top_entropy_quantile", "top_k", "top_p", "transformers_continuous_batching_config",
        "trust_remote_code", "use_adaptive_entropy", "use_bias_correction_kl",
        "use_transformers_continuous_batching", "use_transformers_paged", "use_vllm", "vespo_k_neg",
        "vespo_k_pos", "vespo_lambda_neg", "vespo_lambda_pos", "vllm_enable_sleep_mode",
        "vllm_gpu_memory_utilization", "vllm_group_port", "vllm_importance_sampling_cap",
        "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min",
        "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
        "vllm_max_model_length", "vllm_mode", "vllm_model_impl", "vllm_server_base_url",
        "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
        "vllm_structured_outputs_regex", "vllm_tensor_parallel_size",
    }
)


RLOO: frozenset[str] = frozenset(
    {
        "beta", "cache_implementation", "chat_template_kwargs", "disable_dropout",
        "ds3_gather_for_generation", "epsilon", "epsilon_high", "generation_batch_size",
        "generation_kwargs", "learning_rate", "log_completions", "log_multimodal",
        "log_unique_prompts", "mask_truncated_completions", "max_completion_length", "min_p",
        "model_init_kwargs", "normalize_advantages", "num_completions_to_print", "num_generations",
        "num_generations_eval", "num_iterations", "pad_to_multiple_of", "ref_model_mixup_alpha",
        "ref_model_sync_steps", "remove_unused_columns", "repetition_penalty", "reward_clip_range",
        "reward_weights", "router_aux_loss_coef", "shuffle_dataset", "steps_per_generation",
        "sync_ref_model", "temperature", "top_k", "top_p",
        "transformers_continuous_batching_config", "trust_remote_code",
        "use_transformers_continuous_batching", "use_transformers_paged", "use_vllm",
        "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization", "vllm_group_port",
        "vllm_max_model_length", "vllm_mode", "vllm_model_impl", "vllm_server_base_url",
        "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
        "vllm_structured_outputs_regex", "vllm_tensor_parallel_size",
    }
)


SCRIPT: frozenset[str] = frozenset(
    {
        "dataset_config", "dataset_name", "dataset_streaming", "dataset_test_split",
        "dataset_train_split", "datasets", "env", "ignore_bias_buffers", "reward_funcs",
        "reward_model_name_or_path", "streaming", "test_split_size",
    }
)


MODEL: frozenset[str] = frozenset(
    {
        "attn_implementation", "bnb_4bit_quant_storage", "bnb_4bit_quant_type", "dtype",
        "load_in_4bit", "load_in_8bit", "lora_alpha", "lora_dropout", "lora_modules_to_save",
        "lora_r", "lora_target_modules", "lora_target_parameters", "lora_task_type",
        "model_name_or_path", "model_revision", "use_bnb_nested_quant", "use_dora", "use_peft",
        "use_rslora",
    }
)


LEGACY: dict[str, frozenset[str]] = {
    "sft": frozenset({
        "chars_per_token", "dataset_batch_size", "max_seq_length", "num_of_sequences", "use_liger",
    }),
    "dpo": frozenset({
        "base_model_attribute_name", "force_use_ref_model", "generate_during_eval",
        "is_encoder_decoder", "label_pad_token_id", "max_completion_length", "max_prompt_length",
        "max_target_length", "model_adapter_name", "padding_value", "ref_adapter_name",
        "ref_model_init_kwargs", "reference_free", "rpo_alpha", "tools", "use_liger_loss",
        "use_logits_to_keep", "use_num_logits_to_keep",
    }),
    "reward": frozenset(),
    "kto": frozenset({
        "base_model_attribute_name", "generate_during_eval", "is_encoder_decoder",
        "label_pad_token_id", "max_completion_length", "max_prompt_length", "padding_value",
        "ref_model_init_kwargs", "truncation_mode", "use_liger_loss",
    }),
    "grpo": frozenset({
        "max_prompt_length", "use_liger_loss", "vllm_device", "vllm_dtype",
        "vllm_enable_prefix_caching", "vllm_guided_decoding_regex", "vllm_max_model_len",
        "wandb_log_unique_prompts",
    }),
    "rloo": frozenset({
        "cliprange", "dataset_num_proc", "exp_name", "kl_coef", "local_rollout_forward_batch_size",
        "max_prompt_length", "missing_eos_penalty", "normalize_advantage", "normalize_reward",
        "num_mini_batches", "num_ppo_epochs", "num_sample_generations", "response_length",
        "reward_model_path", "rloo_k", "stop_token", "stop_token_id", "token_level_kl",
        "total_episodes", "vllm_guided_decoding_regex", "wandb_log_unique_prompts",
        "whiten_rewards",
    }),
    "model": frozenset({
        "torch_dtype",
    }),
    "script": frozenset({
        "gradient_checkpointing_use_reentrant",
    }),
}


LAUNCH: frozenset[str] = frozenset(
    {
        "accelerate_config", "aws_access_key_id", "aws_secret_access_key", "config_file", "cpu",
        "debug", "deepspeed_config_file", "deepspeed_exclusion_filter", "deepspeed_hostfile",
        "deepspeed_inclusion_filter", "deepspeed_moe_layer_cls_names",
        "deepspeed_multinode_launcher", "downcast_bf16", "dynamo_backend", "dynamo_mode",
        "dynamo_use_dynamic", "dynamo_use_fullgraph", "dynamo_use_regional_compilation",
        "enable_cpu_affinity", "env", "fp8_amax_compute_algo", "fp8_amax_history_len",
        "fp8_backend", "fp8_enable_fsdp_float8_all_gather", "fp8_format", "fp8_interval",
        "fp8_margin", "fp8_override_linear_precision", "fp8_pad_inner_dim",
        "fp8_use_autocast_during_eval", "fsdp_activation_checkpointing",
        "fsdp_activation_checkpointing_offload", "fsdp_auto_wrap_policy", "fsdp_backward_prefetch",
        "fsdp_cpu_ram_efficient_loading", "fsdp_forward_prefetch", "fsdp_min_num_params",
        "fsdp_offload_params", "fsdp_reshard_after_forward", "fsdp_sharding_strategy",
        "fsdp_state_dict_type", "fsdp_sync_module_states", "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_use_orig_params", "fsdp_version", "gpu_ids", "gradient_accumulation_steps",
        "gradient_clipping", "log_dir", "machine_rank", "main_process_ip", "main_process_port",
        "main_training_function", "max_restarts", "megatron_lm_attention_backend",
        "megatron_lm_attention_dropout", "megatron_lm_attention_softmax_in_fp32",
        "megatron_lm_calculate_per_token_loss", "megatron_lm_context_parallel_size",
        "megatron_lm_decoder_last_pipeline_num_layers", "megatron_lm_eod_mask_loss",
        "megatron_lm_expert_model_parallel_size", "megatron_lm_expert_tensor_parallel_size",
        "megatron_lm_gradient_clipping", "megatron_lm_hidden_dropout", "megatron_lm_no_load_optim",
        "megatron_lm_no_save_optim", "megatron_lm_num_micro_batches",
        "megatron_lm_optimizer_cpu_offload", "megatron_lm_overlap_cpu_optimizer_d2h_h2d",
        "megatron_lm_pp_degree", "megatron_lm_recompute_activations",
        "megatron_lm_recompute_granularity", "megatron_lm_recompute_method",
        "megatron_lm_recompute_num_layers", "megatron_lm_sequence_parallelism",
        "megatron_lm_tp_degree", "megatron_lm_use_custom_fsdp",
        "megatron_lm_use_distributed_optimizer", "megatron_lm_use_precision_aware_optimizer",
        "megatron_lm_use_rotary_position_embeddings", "mixed_precision", "module",
        "monitor_interval", "mpirun_hostfile", "multi_gpu", "no_python", "no_tpu_cluster",
        "num_cpu_threads_per_process", "num_machines", "num_processes", "offload_optimizer_device",
        "offload_optimizer_nvme_path", "offload_param_device", "offload_param_nvme_path",
        "parallelism_config_cp_backend", "parallelism_config_cp_comm_strategy",
        "parallelism_config_cp_size", "parallelism_config_dp_replicate_size",
        "parallelism_config_dp_shard_size", "parallelism_config_sp_attn_implementation",
        "parallelism_config_sp_backend", "parallelism_config_sp_seq_length",
        "parallelism_config_sp_seq_length_is_variable", "parallelism_config_sp_size",
        "parallelism_config_tp_size", "quiet", "rdzv_backend", "rdzv_conf", "role", "same_network",
        "tee", "tpu", "tpu_cluster", "tpu_use_sudo", "use_deepspeed", "use_fsdp", "use_megatron_lm",
        "use_parallelism_config", "vm", "zero3_init_flag", "zero3_save_16bit_model", "zero_stage",
    }
)
