"""The keys an llm-foundry training YAML may hold, for C005 (likely typos).

Read from the sources, not written by hand: ``TOP_LEVEL`` is the fields of ``TrainConfig``
(llmfoundry/utils/config_utils.py at mosaicml/llm-foundry commit 8c8dd48f, Jul 2025),
which refuses any other top-level key at start ("Unused parameters ... found in cfg").
``MPT_MODEL`` is the arguments of ``MPTConfig.__init__``
(llmfoundry/models/mpt/configuration_mpt.py) and ``ComposerMPTCausalLM.__init__``
(models/mpt/modeling_mpt.py), with ``name``, ``master_weights_dtype`` (popped by
train.py) and ``activation_checkpointing_target`` (read from the config by
``activation_checkpointing_fn``); ``HF_MODEL`` the arguments of
``ComposerHFCausalLM.__init__`` (models/hf/hf_causal_lm.py). ``ATTN_CONFIG`` and
``INIT_CONFIG`` are llm-foundry's defaults tables (models/utils/config_defaults.py) with
the keys the layers also take (``kv_n_heads``, ``reuse_kv_layer_idx`` ...); ``FFN_CONFIG``
what the dense FFN builders take. ``FSDP_CONFIG`` is the fields of Composer's
``FSDPConfig`` and ``FSDP2Config`` (composer/utils/parallelism.py at Composer v0.32.1,
the version llm-foundry 8c8dd48f pins: ``mosaicml>=0.32.0,<0.33``).
``OPTIMIZERS`` and ``SCHEDULERS`` are the constructor arguments of what llm-foundry
registers under each name (llmfoundry/optim/__init__.py), which refuse any other.
"""

from __future__ import annotations

__all__ = [
    "ATTN_CONFIG",
    "FFN_CONFIG",
    "FSDP_CONFIG",
    "HF_MODEL",
    "INIT_CONFIG",
    "MPT_MODEL",
    "OPTIMIZERS",
    "SCHEDULERS",
    "TOP_LEVEL",
    "TP_CONFIG",
]

TOP_LEVEL: frozenset[str] = frozenset({
    "accumulate_train_batch_on_tokens", "algorithms", "autoresume", "callbacks", "code_paths",
    "compile_config", "console_log_interval", "cuda_load_lazy", "device_eval_batch_size",
    "device_train_batch_size", "device_train_grad_accum", "device_train_microbatch_size",
    "dist_timeout", "eval_first", "eval_gauntlet", "eval_gauntlet_str", "eval_interval",
    "eval_loader", "eval_loaders", "eval_subset_num_batches", "expandable_segments",
    "flatten_metadata", "fsdp_config", "global_train_batch_size", "icl_seq_len",
    "icl_subset_num_batches", "icl_tasks", "icl_tasks_str", "load_ignore_keys", "load_path",
    "load_strict_model_weights", "load_weights_only", "log_config", "log_to_console",
    "loggers", "max_duration", "max_seq_len", "max_split_size_mb", "metadata", "model",
    "n_gpus", "only_composer_checkpoint", "only_hf_checkpoint", "optimizer", "precision",
    "profiler", "progress_bar", "python_log_level", "run_name", "save_filename",
    "save_folder", "save_ignore_keys", "save_interval", "save_latest_filename",
    "save_num_checkpoints_to_keep", "save_overwrite", "save_weights_only", "scheduler",
    "seed", "spin_dataloaders", "tokenizer", "tp_config", "train_loader",
    "train_subset_num_batches", "variables",
})

MPT_MODEL: frozenset[str] = frozenset({
    "activation_checkpointing_target", "additional_train_metrics", "attention_bias",
    "attn_config", "block_overrides", "d_model", "emb_pdrop", "embedding_fraction",
    "expansion_ratio", "fc_type", "ffn_config", "final_logit_softcapping", "head_dim",
    "init_config", "init_device", "learned_pos_emb", "logit_scale", "loss_fn",
    "master_weights_dtype", "max_seq_len", "n_heads", "n_layers", "name", "no_bias",
    "norm_eps", "norm_type", "resid_pdrop", "tie_word_embeddings", "use_cache",
    "use_pad_tok_in_ffn", "use_train_metrics", "vocab_size",
})

HF_MODEL: frozenset[str] = frozenset({
    "additional_eval_metrics", "additional_train_metrics", "allow_embedding_resizing",
    "attn_implementation", "config_overrides", "init_device", "load_in_8bit",
    "master_weights_dtype", "name", "peft_config", "pretrained",
    "pretrained_lora_id_or_path", "pretrained_model_name_or_path", "should_save_peft_only",
    "trust_remote_code", "use_auth_token", "use_flash_attention_2", "use_train_metrics",
})

ATTN_CONFIG: frozenset[str] = frozenset({
    "alibi", "alibi_bias_max", "attn_impl", "attn_logit_softcapping", "attn_pdrop",
    "attn_temperature_tuning", "attn_type", "attn_uses_sequence_id", "clip_qkv", "fused_qkv",
    "kv_dim", "kv_n_heads", "nope", "qk_gn", "qk_ln", "reuse_kv_layer_idx",
    "reuse_kv_x_layer_idx", "rope", "rope_dail_config", "rope_hf_config", "rope_impl",
    "rope_theta", "seq_parallel_world_size", "sliding_window_size", "softmax_scale",
})

#: What llm-foundry's dense FFN builders take (build_mptmlp, build_mptglu, build_te_ln_mlp in
#: llmfoundry/models/layers/ffn.py); a MoE ``ffn_type`` passes the rest to MegaBlocks.
FFN_CONFIG: frozenset[str] = frozenset({"fc_type", "ffn_act_fn", "ffn_hidden_size", "ffn_type"})

INIT_CONFIG: frozenset[str] = frozenset({
    "emb_init_std", "emb_init_uniform_lim", "fan_mode", "init_div_is_residual", "init_gain",
    "init_nonlinearity", "init_std", "name",
})

FSDP_CONFIG: frozenset[str] = frozenset({
    "activation_checkpointing", "activation_checkpointing_reentrant",
    "activation_cpu_offload", "auto_wrap", "backward_prefetch", "backward_prefetch_limit",
    "cpu_offload", "data_parallel_replicate_degree", "data_parallel_shard_degree",
    "device_mesh", "forward_prefetch", "forward_prefetch_limit", "ignored_modules",
    "keep_low_precision_grads", "limit_all_gathers", "load_monolith_rank0_only",
    "load_planner", "mixed_precision", "process_group", "reshard_after_forward",
    "save_planner", "sharded_ckpt_prefix_dir", "sharding_strategy", "state_dict_type",
    "sync_module_states", "te_checkpoint_wrapper", "te_shard_fp8_weight", "use_orig_params",
    "verbose",
})

TP_CONFIG: frozenset[str] = frozenset({"strategy", "tensor_parallel_degree", "layer_plan"})

#: ``optimizer.name`` -> the keys its constructor takes (besides ``name``, and the
#: ``disable_grad`` / ``param_groups`` that llm-foundry's builder pops first).
_PARAM_GROUPS = frozenset({"name", "disable_grad", "param_groups"})
OPTIMIZERS: dict[str, frozenset[str]] = {
    "decoupled_adamw": _PARAM_GROUPS | {"lr", "betas", "eps", "weight_decay", "amsgrad"},
    "decoupled_lionw": _PARAM_GROUPS | {"lr", "betas", "weight_decay"},
    "clip_lion": _PARAM_GROUPS | {"lr", "betas", "weight_decay", "outlier_threshold"},
    "adalr_lion": _PARAM_GROUPS | {"lr", "betas", "weight_decay", "outlier_threshold",
                                   "timeout", "lr_penalty", "min_scale"},
    "no_op": _PARAM_GROUPS,
}

#: ``scheduler.name`` -> the keys its constructor takes (Composer's schedulers,
#: composer/optim/scheduler.py v0.32.1; inv_sqrt_with_warmup is llm-foundry's own,
#: llmfoundry/optim/scheduler.py).
SCHEDULERS: dict[str, frozenset[str]] = {
    "cosine_with_warmup": frozenset({"name", "t_warmup", "t_max", "alpha_f", "scale_warmup"}),
    "constant_with_warmup": frozenset({"name", "t_warmup", "alpha", "t_max", "scale_warmup"}),
    "linear_decay_with_warmup": frozenset({"name", "t_warmup", "alpha_i", "alpha_f", "t_max",
                                           "scale_warmup"}),
    "inv_sqrt_with_warmup": frozenset({"name", "t_warmup", "t_scale", "t_cooldown", "t_max",
                                       "alpha_f_decay", "alpha_f_cooldown"}),
}
