"""The keys NeMo's Megatron GPT configs take, per section, for C005 (likely typos).

Derived from NeMo's own files, not written by hand: the union of the keys in every
training config of NVIDIA/NeMo ``examples/nlp/language_modeling/conf/*.yaml`` and
``examples/nlp/language_modeling/tuning/conf/*.yaml`` (commit 8cfedd72, Sep 2025) and of
NVIDIA/NeMo-Megatron-Launcher ``launcher_scripts/conf/training/**`` and
``conf/fine_tuning/**`` (commit 4550dc9f, Jul 2024), together with every ``cfg.get("...")``
key NeMo's model code reads (nemo/collections/nlp/models/language_modeling,
nemo/collections/nlp/parts, nemo/collections/nlp/modules/common/megatron,
nemo/core/classes/modelPT.py). ``trainer`` takes the arguments of Lightning's
``Trainer.__init__`` (lightning.pytorch 2.x) and the Lightning 1.x ones older NeMo configs
still carry (``replace_sampler_ddp``, ``gpus`` ...).
"""

from __future__ import annotations

__all__ = ["SECTIONS"]

_TOP = frozenset({
    "allow_tf32", "base_model", "chat", "chatbot_config", "cluster_type", "defaults",
    "delta_model", "do_training", "exp_manager", "export", "hydra", "infer", "inference",
    "model", "name", "password", "port", "prune", "quantization", "restore_from_path", "run",
    "s3_checkpointing", "seed", "server", "share", "trainer", "username", "web_port",
    "web_server",
})

_TRAINER = frozenset({
    "accelerator", "accumulate_grad_batches", "amp_backend", "amp_level", "auto_lr_find",
    "auto_scale_batch_size", "auto_select_gpus", "barebones", "benchmark", "callbacks",
    "check_val_every_n_epoch", "checkpoint_callback", "default_root_dir", "detect_anomaly",
    "deterministic", "devices", "enable_autolog_hparams", "enable_checkpointing",
    "enable_model_summary", "enable_progress_bar", "fast_dev_run", "flush_logs_every_n_steps",
    "gpus", "gradient_clip_algorithm", "gradient_clip_val", "inference_mode", "ipus",
    "limit_predict_batches", "limit_test_batches", "limit_train_batches", "limit_val_batches",
    "log_every_n_steps", "log_gpu_memory", "logger", "max_epochs", "max_steps", "max_time",
    "min_epochs", "min_steps", "model_registry", "move_metrics_to_cpu",
    "multiple_trainloader_mode", "num_nodes", "num_processes", "num_sanity_val_steps",
    "overfit_batches", "plugins", "precision", "prepare_data_per_node", "process_position",
    "profiler", "progress_bar_refresh_rate", "reload_dataloaders_every_epoch",
    "reload_dataloaders_every_n_epochs", "replace_sampler_ddp", "resume_from_checkpoint",
    "stochastic_weight_avg", "strategy", "sync_batchnorm", "terminate_on_nan", "tpu_cores",
    "track_grad_norm", "truncated_bptt_steps", "use_distributed_sampler", "val_check_interval",
    "weights_save_path", "weights_summary",
})

_MODEL = frozenset({
    "a2a_experimental", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "activation", "activations_checkpoint_granularity",
    "activations_checkpoint_layers_per_pipeline", "activations_checkpoint_method",
    "activations_checkpoint_num_layers", "activations_checkpoint_recurrent", "add_bias_linear",
    "add_bos", "add_bos_to_input", "add_eos", "add_eos_to_input", "add_lm_head", "add_pooler",
    "add_position_embedding", "add_sep", "alpha", "answer_only_loss",
    "apex_transformer_log_level", "apply_embedding_scaling", "apply_query_key_layer_scaling",
    "apply_rope_fusion", "arch", "async_grad_allreduce", "attention_backend",
    "attention_dropout", "attention_type", "batch_p2p_comm", "bert_binary_head",
    "beta_schedule", "bias", "bias_activation_fusion", "bias_dropout_add_fusion",
    "bias_gelu_fusion", "cache_ids", "capture_cudagraph_iters", "ceil_to_power_2",
    "chakra_profile", "channels", "channels_last", "child_model", "chunk_size", "ckpt_path",
    "classes_fraction", "clean", "clip_denoised", "cls_hidden_dim", "cluster_type",
    "column_init_method", "concat_mode", "concat_sampling_probabilities",
    "concat_sampling_technique", "concat_sampling_temperature", "concepts", "cond_stage_config",
    "cond_stage_forward", "cond_stage_key", "cond_stage_trainable", "conditioning",
    "conditioning_key", "context_parallel_size", "control_key", "control_stage_config",
    "cosine_s", "cpu_offloading", "cpu_offloading_activations", "cpu_offloading_num_layers",
    "cpu_offloading_weights", "cross_entropy_loss_fusion", "data", "data_per_class_fraction",
    "ddp_overlap", "dec_cross_attention", "dec_num_layers", "decoder", "decoder_arch",
    "decoder_seq_length", "defer_embedding_wgrad_compute",
    "dist_ckpt_assume_constant_structure", "dist_ckpt_format", "dist_ckpt_load_on_device",
    "dist_ckpt_load_strictness", "dist_ckpt_parallel_dist_opt", "dist_ckpt_parallel_load",
    "dist_ckpt_parallel_save", "dist_ckpt_parallel_save_within_dp",
    "dist_ckpt_torch_dist_multiproc", "distributed_adam_bucket_merge_size",
    "do_layer_norm_weight_decay", "drop_last", "drop_layers", "drop_path_rate",
    "dropout_position", "dump_debug_info", "dump_debug_info_to_file", "embedding_dropout",
    "embedding_init_method_std", "enable_cuda_graph", "enable_megatron_timers",
    "enc_cross_attention", "enc_num_layers", "enc_output_name", "encoder", "encoder_arch",
    "encoder_seq_length", "eval_languages", "existing_tasks", "exp_manager",
    "expert_model_parallel_size", "ffn_dropout", "ffn_hidden_size", "first_stage_config",
    "first_stage_key", "fp16_lm_cross_entropy", "fp32_residual_connection", "fp8",
    "fp8_amax_compute_algo", "fp8_amax_history_len", "fp8_e4m3", "fp8_hybrid", "fp8_interval",
    "fp8_margin", "fp8_params", "fp8_wgrad", "fsdp", "fsdp_cpu_offload",
    "fsdp_grad_reduce_dtype", "fsdp_limit_all_gathers", "fsdp_sharded_checkpoint",
    "fsdp_sharding_strategy", "fsdp_use_orig_params", "fused_opt", "gated_linear_unit",
    "gather_with_grad", "gc_interval", "get_attention_mask_from_fusion", "given_betas",
    "global_batch_size", "global_sample_mapping", "grad_allreduce_chunk_size_mb",
    "grad_div_ar_fusion", "gradient_accumulation_fusion", "gradient_as_bucket_view", "head",
    "headscale", "hf_dataset", "hidden_dropout", "hidden_size", "hidden_steps", "hiddens",
    "high_freq_factor", "hybrid_override_pattern", "hyena", "hysteresis", "ignore_keys",
    "image_logger", "image_size", "img_h", "img_w", "index_mapping_dir", "inductor",
    "inductor_cudagraphs", "init_method_std", "init_strict", "kd_teacher_restore_from_path",
    "kv_channels", "l_simple_weight", "label_key", "label_smoothing", "language_model",
    "language_model_path", "layer_selection", "layer_type", "layernorm_epsilon",
    "layernorm_zero_centered_gamma", "learn_logvar", "learning_rate", "linear_end",
    "linear_start", "load_only_unet", "local_loss", "log_every_t", "log_token_counts",
    "logits_soft_cap", "logvar_init", "loss", "loss_type", "low_freq_factor",
    "make_vocab_size_divisible_by", "mamba_ssm_ngroups", "mask_prob", "masked_softmax_fusion",
    "max_position_embeddings", "max_seq_length", "mcore_bert", "mcore_customization_config",
    "mcore_gpt", "mcore_t5", "megatron_amp_O2", "megatron_legacy", "megatron_lm_compatible",
    "megatron_timer_kwargs", "memmap_workers", "memory_profile", "metadata_file",
    "micro_batch_size", "min_seq_length", "mm_cfg", "model_parallel_size", "moe_aux_loss_coeff",
    "moe_dropout", "moe_expert_capacity_factor", "moe_frequency", "moe_grouped_gemm",
    "moe_input_jitter_eps", "moe_pad_expert_input_to_capacity",
    "moe_router_load_balancing_type", "moe_router_topk", "moe_token_dispatcher_type",
    "moe_token_dropping", "moe_z_loss_coeff", "monitor", "multi_latent_attention",
    "n_transformers", "name", "native_amp_growth_interval", "native_amp_init_scale",
    "nccl_communicator_config_path", "nemo_path", "new_tasks", "noise_cond_aug",
    "noise_scheduler", "norm_position", "norm_type", "normalization",
    "normalize_attention_scores", "nsys_profile", "num_attention_heads", "num_channels",
    "num_classes", "num_layers", "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "num_micro_batches_with_partial_activation_checkpoints", "num_moe_experts",
    "num_query_groups", "num_self_attention_per_cross_attention", "num_sentinel_tokens",
    "num_seq_classification_layers", "num_timesteps_cond", "num_tok_classification_layers",
    "num_workers", "old_context_len", "only_mid_control", "only_mlm_loss", "onnx_safe",
    "openai_gelu", "optim", "original_elbo_weight", "output_dim", "overlap_p2p_comm",
    "override_vocab_size", "packed_sequence", "packed_sequence_return_cu_seqlen",
    "pad_to_max_length", "parameterization", "patch_dim", "peft", "persist_layer_norm",
    "pin_memory", "pipeline_model_parallel_comm_backend", "pipeline_model_parallel_size",
    "pipeline_model_parallel_split_rank", "position_embedding_strategy",
    "position_embedding_type", "post_process", "pre_process", "precision", "preconditioning",
    "preconditioning_type", "preproc_out_dir", "pretrained_checkpoint", "pretrained_model_path",
    "prior_loss_weight", "prompt_template", "qkv_bias", "rampup_batch_size", "reduce_amax",
    "replace_bos_with_pad", "report_validation_accuracy", "report_validation_metric",
    "reset_lr", "reset_lr_steps", "restore_from_ckpt", "restore_from_path", "restore_path",
    "resume_from_checkpoint", "retro", "rotary_base", "rotary_interleaved", "rotary_percentage",
    "row_init_method", "sample_weight", "save_nemo_on_validation_end", "save_path",
    "scale_by_std", "scale_factor", "scale_positional_embedding", "sd_locked", "seed", "sep_id",
    "seq_len_interpolation_factor", "seq_length", "sequence_parallel", "shape_file",
    "shard_strategy", "share_decoder_tokens_head_embeddings",
    "share_embeddings_and_output_weights", "share_token_embeddings", "sharp", "short_seq_prob",
    "sim_hidden_dim", "skip_fp8_attention_checkpoint_load", "skip_train", "sync_batch_comm",
    "tar_files", "tar_shuffle_n", "target_modules", "tensor_model_parallel_size",
    "tensor_model_parallel_world_size", "test_ds", "text", "text_embedding_dropout_rate",
    "timesteps", "tokenizer", "tokens_head_bias", "tokens_to_generate", "tp_comm_atomic_ag",
    "tp_comm_atomic_rs", "tp_comm_split_ag", "tp_comm_split_rs", "tp_only_amax_red", "train_ds",
    "train_text_encoder", "transform", "transformer_block_type", "transformer_engine",
    "truncation_field", "tunable_base_param_names", "ub_tp_comm_bootstrap_backend",
    "ub_tp_comm_overlap", "ub_tp_comm_overlap_cfg", "unet", "unet_config", "unet_type",
    "use_cached_latents", "use_cpu_initialization", "use_ema", "use_emha",
    "use_flash_attention", "use_loss_mask", "use_positional_encodings",
    "use_scaled_init_method", "use_tarred_dataset", "use_te_rng_tracker",
    "use_tp_pp_dp_mapping", "v_posterior", "validation_drop_last", "validation_ds",
    "validation_global_batch_size", "validation_metric", "validation_micro_batch_size",
    "validation_param_sync_overlap", "variant", "version",
    "virtual_pipeline_model_parallel_size", "vision", "vision_pretraining_type", "vocab_file",
    "vocab_size", "window_size", "with_fp32_embedding_grads", "with_prior_preservation",
    "write_predictions_to_file",
})

_SCHED = frozenset({
    "constant_steps", "cycle", "d_model", "decay_steps", "hold_ratio", "hold_steps",
    "last_epoch", "max_steps", "max_steps_for_lr_sched", "min_lr", "monitor", "name", "power",
    "reduce_on_plateau", "warmup_ratio", "warmup_steps",
})

#: Section (dotted; "" is the top level) -> the keys NeMo knows there. Sections not
#: listed (``model.optim`` takes the chosen optimizer's own arguments, ``exp_manager``,
#: ``model.data``) are not checked.
SECTIONS: dict[str, frozenset[str]] = {
    "": _TOP,
    "trainer": _TRAINER,
    "model": _MODEL,
    "model.optim.sched": _SCHED,
}
