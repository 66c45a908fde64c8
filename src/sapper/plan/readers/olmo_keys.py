"""The keys an OLMo (v1 trainer) YAML config may hold, per section, for C005 (typos).

Read from the source, not written by hand: the fields of the dataclasses in olmo/config.py
at allenai/OLMo commit 59a53e3f (Sep 2025): ``TrainConfig`` for the top level,
``ModelConfig``, ``OptimizerConfig``, ``SchedulerConfig``, ``DataConfig``,
``FSDPConfig``, ``DDPConfig``, ``TokenizerConfig``, ``WandbConfig``,
``SpeedMonitorConfig``, ``CompilerConfig`` and ``SingleGPUConfig`` for their sections.
OLMo merges the YAML into these structured configs with OmegaConf, which refuses a key a
dataclass does not have: the job stops at start (``OLMoConfigurationError``).
"""

from __future__ import annotations

__all__ = ["SECTIONS"]

SECTIONS: dict[str, frozenset[str]] = {
    "": frozenset({
        "activation_checkpointing", "auxiliary_loss_multiplier", "canceled_check_interval",
        "compile", "console_log_interval", "data", "ddp", "device_eval_batch_size",
        "device_train_batch_size", "device_train_grad_accum", "device_train_microbatch_size",
        "distributed_strategy", "dry_run", "early_stopping_factor", "epoch", "eval_interval",
        "eval_on_load", "eval_subset_num_batches", "evaluators", "extra_steps_after_cancel",
        "fast_forward_batches", "force_save_unsharded", "fsdp", "fused_loss",
        "gen1_gc_interval", "global_train_batch_size", "hf_datasets_cache_dir", "load_path",
        "load_path_sharded_checkpointer", "max_duration", "max_grad_norm",
        "max_grad_norm_ratio", "model", "module_outputs_save_steps", "new_style_checkpoints",
        "no_pre_train_checkpoint", "optimizer", "precision", "python_profiling",
        "remote_save_folder", "reset_optimizer_state", "reset_trainer_state",
        "restore_dataloader", "run_name", "save_data_indices", "save_folder",
        "save_interval", "save_interval_ephemeral", "save_interval_unsharded",
        "save_num_checkpoints_to_keep", "save_num_unsharded_checkpoints_to_keep",
        "save_overwrite", "scheduler", "seed", "sharded_checkpointer", "single",
        "softmax_auxiliary_loss", "speed_monitor", "stop_after", "stop_at", "time_limit",
        "tokenizer", "torch_profiling", "try_load_latest_save", "wandb",
    }),
    "model": frozenset({
        "activation_type", "alibi", "alibi_bias_max", "attention_dropout",
        "attention_layer_norm", "attention_layer_norm_with_affine", "bias_for_layer_norm",
        "block_group_size", "block_type", "clip_qkv", "d_model", "emb_init_std",
        "embedding_dropout", "embedding_layer_norm", "embedding_size", "eos_token_id",
        "flash_attention", "include_bias", "init_cutoff_factor", "init_device", "init_fn",
        "init_std", "layer_norm_eps", "layer_norm_type", "layer_norm_with_affine",
        "max_sequence_length", "mlp_hidden_size", "mlp_ratio", "multi_query_attention",
        "n_heads", "n_kv_heads", "n_layers", "norm_after", "pad_token_id", "precision",
        "residual_dropout", "rope", "rope_full_precision", "rope_theta", "scale_emb_init",
        "scale_logits", "vocab_size", "weight_tying",
    }),
    "optimizer": frozenset({
        "betas", "decay_embeddings", "decay_norm_and_bias", "eps", "learning_rate",
        "metrics_log_interval", "name", "no_decay_norm_and_bias", "record_update_metrics",
        "selective_updates", "weight_decay",
    }),
    "scheduler": frozenset({
        "alpha_f", "grad_clip_warmup_factor", "grad_clip_warmup_steps", "name", "t_max",
        "t_warmup", "units", "warmup_min_lr",
    }),
    "data": frozenset({
        "custom_dataset", "datasets", "drop_last", "generate_attention_mask",
        "generate_doc_lengths", "instance_filter", "label_mask_paths", "memmap_dtype",
        "num_workers", "pad_direction", "paths", "persistent_workers", "pin_memory",
        "prefetch_factor", "seed", "timeout",
    }),
    "fsdp": frozenset({
        "hybrid_sharding_num_model_replicas", "precision", "sharding_strategy",
        "use_orig_params", "wrapping_strategy",
    }),
    "ddp": frozenset({"find_unused_params", "grad_sync_mode"}),
    "tokenizer": frozenset({"identifier", "truncate_direction"}),
    "wandb": frozenset({
        "entity", "group", "log_artifacts", "log_interval", "name", "project",
        "rank_zero_only", "tags",
    }),
    "speed_monitor": frozenset({"gpu_flops_available", "window_size"}),
    "compile": frozenset({"backend", "dynamic", "fullgraph", "mode"}),
    "single": frozenset({"device"}),
}
