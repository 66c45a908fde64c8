"""The keys a Nanotron training YAML may hold, per section, for C005 (typos).

Read from the source, not written by hand: the dataclass fields of
src/nanotron/config/config.py, models_config.py and parallelism_config.py at
huggingface/nanotron commit 2411b022 (Apr 2026). Nanotron builds its ``Config`` from the
YAML with dacite (``strict=True``), which refuses a key a dataclass does not define, so a
typo stops the job at start. ``model.model_config`` is matched against ``LlamaConfig``,
``Starcoder2Config`` then ``Qwen2Config`` (the union in ``NanotronConfigs``); a mapping
none of them takes is built as ``Qwen2Config(**model_config)``, which refuses an
unexpected keyword. A data stage's ``dataset`` is one of the pretraining (HF datasets),
SFT or Nanoset argument classes.
"""

from __future__ import annotations

__all__ = ["DATASET", "DATA_STAGE", "LLAMA", "MODEL_CONFIGS", "QWEN2", "SECTIONS",
           "STAGE_DATA", "STARCODER2"]

SECTIONS: dict[str, frozenset[str]] = {
    "": frozenset({
        "checkpoints", "data_stages", "general", "lighteval", "logging", "metrics_logging",
        "model", "optimizer", "parallelism", "profiler", "s3_upload", "tokenizer", "tokens",
    }),
    "general": frozenset({
        "benchmark_csv_path", "consumed_train_samples", "ignore_sanity_checks", "project",
        "run", "seed", "step",
    }),
    "parallelism": frozenset({
        "context_parallel_size", "dp", "expert_parallel_size", "pp", "pp_engine",
        "recompute_layer", "tp", "tp_linear_async_communication", "tp_mode",
        "tp_recompute_allgather",
    }),
    "model": frozenset({
        "ddp_bucket_cap_mb", "dtype", "init_method", "make_vocab_size_divisible_by",
        "model_config",
    }),
    "tokenizer": frozenset({"tokenizer_max_length", "tokenizer_name_or_path",
                            "tokenizer_revision"}),
    "checkpoints": frozenset({
        "checkpoint_interval", "checkpoints_path", "checkpoints_path_is_shared_file_system",
        "load_lr_scheduler", "load_optimizer", "resume_checkpoint_path", "save_final_state",
        "save_initial_state",
    }),
    "logging": frozenset({"iteration_step_info_interval", "log_level", "log_level_replica"}),
    "metrics_logging": frozenset({"log_detail_interval", "log_level"}),
    "tokens": frozenset({
        "batch_accumulation_per_replica", "limit_test_batches", "limit_val_batches",
        "micro_batch_size", "sequence_length", "train_steps", "val_check_interval",
    }),
    "optimizer": frozenset({
        "accumulate_grad_in_fp32", "clip_grad", "learning_rate_scheduler", "optimizer_factory",
        "weight_decay", "weight_decay_exclude_named_params", "zero_stage",
    }),
    "optimizer.learning_rate_scheduler": frozenset({
        "learning_rate", "lr_decay_starting_step", "lr_decay_steps", "lr_decay_style",
        "lr_warmup_steps", "lr_warmup_style", "min_decay_lr",
    }),
    # AdamWOptimizerArgs and SGDOptimizerArgs.
    "optimizer.optimizer_factory": frozenset({
        "adam_beta1", "adam_beta2", "adam_eps", "name", "torch_adam_is_fused",
    }),
    "profiler": frozenset({
        "active", "export_chrome_trace", "profile_memory", "profiler_export_path",
        "record_shapes", "repeat", "skip_first", "wait", "warmup", "with_stack",
    }),
    "s3_upload": frozenset({
        "remove_after_upload", "s5cmd_concurrency", "s5cmd_numworkers", "s5cmd_path",
        "upload_s3_path",
    }),
    # RandomInit, SpectralMupInit and ExistingCheckpointInit.
    "model.init_method": frozenset({"path", "scaling_method", "std", "use_mup"}),
    "model.model_config.moe_config": frozenset({
        "enable_shared_expert", "layers", "moe_intermediate_size", "num_experts",
        "router_aux_loss_coef", "shared_expert_intermediate_size", "token_dispatcher_type",
        "top_k",
    }),
}

LLAMA: frozenset[str] = frozenset({
    "_attn_implementation", "attention_bias", "bos_token_id", "eos_token_id", "hidden_act",
    "hidden_size", "initializer_range", "intermediate_size", "is_llama_config",
    "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
    "num_key_value_heads", "pad_token_id", "pretraining_tp", "rms_norm_eps", "rope_interleaved",
    "rope_scaling", "rope_theta", "tie_word_embeddings", "use_cache", "vocab_size",
    "z_loss_coefficient", "z_loss_enabled",
})
QWEN2: frozenset[str] = frozenset({
    "_attn_implementation", "_fused_rms_norm", "_fused_rotary_emb", "_use_doc_masking",
    "_use_qkv_packed", "attention_bias", "bos_token_id", "eos_token_id", "flex_attention_mask",
    "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "is_qwen2_config",
    "log_attn_probs", "max_position_embeddings", "moe_config", "no_rope_layer",
    "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
    "pretraining_tp", "ring_attn_heads_k_stride", "rms_norm_eps", "rope_interleaved",
    "rope_scaling", "rope_seq_len_interpolation_factor", "rope_theta", "sliding_window_size",
    "tie_word_embeddings", "use_cache", "vocab_size", "z_loss_coefficient", "z_loss_enabled",
})
STARCODER2: frozenset[str] = frozenset({
    "_attn_implementation", "activation_function", "attention_softmax_in_fp32", "attn_pdrop",
    "bos_token_id", "embd_pdrop", "eos_token_id", "global_attn_layers", "grouped_query",
    "hidden_size", "initializer_range", "intermediate_size", "is_starcoder2_config",
    "layer_norm_epsilon", "max_position_embeddings", "multi_query", "num_attention_heads",
    "num_hidden_layers", "num_kv_heads", "resid_pdrop", "rope_theta",
    "scale_attention_softmax_in_fp32", "scale_attn_weights", "sliding_window_size",
    "use_position_embeddings", "use_rotary_embeddings", "vocab_size",
})
#: In the order dacite tries the union (NanotronConfigs).
MODEL_CONFIGS: tuple[tuple[str, frozenset[str]], ...] = (
    ("llama", LLAMA), ("starcoder2", STARCODER2), ("qwen2", QWEN2),
)

DATA_STAGE: frozenset[str] = frozenset({"data", "name", "sequence_length",
                                        "start_training_step"})
STAGE_DATA: frozenset[str] = frozenset({"dataset", "num_loading_workers", "seed"})
#: PretrainDatasetsArgs, SFTDatasetsArgs and NanosetDatasetsArgs together.
DATASET: frozenset[str] = frozenset({
    "dataset_folder", "dataset_max_tokens", "dataset_overwrite_cache",
    "dataset_processing_num_proc_per_process", "dataset_read_path", "dataset_weights",
    "debug_max_samples", "hf_dataset_config_name", "hf_dataset_or_datasets",
    "hf_dataset_splits", "pad_samples_to_global_batch_size", "return_positions",
    "sft_dataloader", "shuffle_files", "skip_in_stream", "text_column_name",
    "token_size_in_bytes", "tokenizer_name", "use_old_brrr_dataloader", "vocab_size",
})
