"""The keys a LLaMA-Factory training config (``llamafactory-cli train x.yaml``) may hold,
for C005 (typos).

Read from LLaMA-Factory's argument classes at commit
ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30 (Aug 2026, version 0.9.6.dev0) of
github.com/hiyouga/LLaMA-Factory: ``OWN`` holds the fields of ``ModelArguments``,
``DataArguments``, ``FinetuningArguments``, ``GeneratingArguments`` and the fields
LLaMA-Factory adds to ``TrainingArguments`` (Ray, profiler, FP8, ``overwrite_output_dir``),
every class they inherit from included (src/llamafactory/hparams/model_args.py,
data_args.py, finetuning_args.py, generating_args.py, training_args.py); fields declared
``init=False`` (``compute_dtype``, ``device_map``, ``model_max_length``) are not arguments
and are left out. ``MEGATRON_BRIDGE`` is ``MegatronBridgeArguments``
(hparams/megatron_bridge_args.py), parsed only under ``USE_MEGATRON_BRIDGE=1``.

The rest of a config is Hugging Face ``Seq2SeqTrainingArguments``: the installed
transformers' ``TrainingArguments`` fields (read when a file is read), ``SEQ2SEQ`` (the
fields ``Seq2SeqTrainingArguments`` adds, transformers/training_args_seq2seq.py) and
``TRANSFORMERS_4``, the fields transformers 4.57.1 had that 5.x dropped (LLaMA-Factory
supports transformers 4.55 to 5.8, so a config may be written for either).

LLaMA-Factory parses a config with ``HfArgumentParser.parse_dict(..., allow_extra_keys=
False)`` (hparams/parser.py ``_parse_train_args``): a key no class defines stops it at start,
unless the environment sets ``ALLOW_EXTRA_ARGS=1``.
"""

from __future__ import annotations

__all__ = ["MEGATRON_BRIDGE", "OWN", "SEQ2SEQ", "TRANSFORMERS_4"]

OWN: frozenset[str] = frozenset(
    {
        "adapter_folder", "adapter_name_or_path", "add_special_tokens", "add_tokens",
        "additional_target", "apollo_layerwise", "apollo_proj", "apollo_proj_type", "apollo_rank",
        "apollo_scale", "apollo_scale_front", "apollo_scale_type", "apollo_target",
        "apollo_update_interval", "asft_alpha", "audio_sampling_rate", "badam_mask_mode",
        "badam_mode", "badam_start_block", "badam_switch_interval", "badam_switch_mode",
        "badam_update_ratio", "badam_verbose", "buffer_size", "cache_dir", "compute_accuracy",
        "create_new_adapter", "crop_to_patches", "cutoff_len", "data_shared_file_system", "dataset",
        "dataset_dir", "default_system", "disable_gradient_checkpointing", "disable_shuffling",
        "do_sample", "double_quantization", "dpo_label_smoothing", "eaft_alpha",
        "early_stopping_steps", "enable_liger_kernel", "enable_thinking", "enable_torch_profiler",
        "eval_dataset", "eval_num_beams", "eval_on_each_dataset", "export_device", "export_dir",
        "export_hub_model_id", "export_legacy_format", "export_quantization_bit",
        "export_quantization_dataset", "export_quantization_maxlen", "export_quantization_nsamples",
        "export_size", "finetuning_type", "flash_attn", "fp8", "fp8_backend",
        "fp8_enable_fsdp_float8_all_gather", "freeze_extra_modules", "freeze_language_model",
        "freeze_multi_modal_projector", "freeze_trainable_layers", "freeze_trainable_modules",
        "freeze_vision_tower", "galore_layerwise", "galore_proj_type", "galore_rank",
        "galore_scale", "galore_target", "galore_update_interval", "hf_hub_token",
        "hyper_parallel_args", "hyper_parallel_cp_size", "ignore_pad_token_for_loss",
        "image_do_pan_and_scan", "image_max_pixels", "image_min_pixels",
        "include_effective_tokens_per_second", "infer_backend", "infer_dtype",
        "init_special_tokens", "interleave_probs", "kt_cpu_activation", "kt_expert_checkpoint_path",
        "kt_lora_expert_intermediate_size", "kt_lora_expert_num", "kt_non_expert_weight_path",
        "kt_use_lora_experts", "kt_weight_path", "kto_chosen_weight", "kto_rejected_weight",
        "ld_alpha", "length_penalty", "lora_alpha", "lora_dropout", "lora_rank", "lora_target",
        "loraplus_lr_embedding", "loraplus_lr_ratio", "low_cpu_mem_usage", "mask_history",
        "master_addr", "master_port", "max_length", "max_new_tokens", "max_samples", "media_dir",
        "mix_strategy", "mixture_of_depths", "model_name_or_path", "model_revision",
        "module_dropout", "moe_aux_loss_coef", "ms_hub_token", "neat_packing",
        "new_special_tokens_config", "num_beams", "offload_folder", "oft_block_size", "oft_rank",
        "oft_target", "om_hub_token", "overwrite_cache", "overwrite_output_dir", "packing",
        "pissa_convert", "pissa_init", "pissa_iter", "plot_loss", "ppo_buffer_size", "ppo_epochs",
        "ppo_score_norm", "ppo_target", "ppo_whiten_rewards", "pref_bco_weight", "pref_beta",
        "pref_ftx", "pref_loss", "preprocessing_batch_size", "preprocessing_num_workers",
        "preserve_thinking", "print_param_status", "profile_modules", "profiler_active_steps",
        "profiler_output_dir", "profiler_profile_memory", "profiler_record_shapes",
        "profiler_repeat", "profiler_wait_steps", "profiler_warmup_steps", "profiler_with_stack",
        "pure_bf16", "quantization_bit", "quantization_device_map", "quantization_method",
        "quantization_type", "ray_init_kwargs", "ray_num_workers", "ref_model",
        "ref_model_adapters", "ref_model_quantization_bit", "repetition_penalty", "resize_vocab",
        "reward_model", "reward_model_adapters", "reward_model_quantization_bit",
        "reward_model_type", "rope_scaling", "sglang_config", "sglang_lora_backend",
        "sglang_maxlen", "sglang_mem_fraction", "sglang_tp_size", "shift_attn", "simpo_gamma",
        "skip_special_tokens", "split_special_tokens", "stage", "streaming", "swanlab_api_key",
        "swanlab_lark_secret", "swanlab_lark_webhook_url", "swanlab_logdir", "swanlab_mode",
        "swanlab_project", "swanlab_run_name", "swanlab_workspace", "temperature", "template",
        "tokenized_path", "tool_format", "top_k", "top_p", "train_from_scratch", "train_on_prompt",
        "trust_remote_code", "upcast_layernorm", "upcast_lmhead_output", "use_adam_mini",
        "use_apollo", "use_asft_loss", "use_audio_in_video", "use_badam", "use_dft_loss",
        "use_dora", "use_eaft_loss", "use_fast_tokenizer", "use_galore", "use_hyper_parallel",
        "use_kt", "use_kv_cache", "use_llama_pro", "use_mca", "use_megatron_bridge", "use_muon",
        "use_reentrant_gc", "use_rslora", "use_swanlab", "use_unsloth", "use_unsloth_gc",
        "use_v1_kernels", "val_size", "video_fps", "video_max_pixels", "video_maxlen",
        "video_min_pixels", "vllm_config", "vllm_enforce_eager", "vllm_gpu_util",
        "vllm_max_lora_rank", "vllm_maxlen",
    }
)


MEGATRON_BRIDGE: frozenset[str] = frozenset(
    {
        "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
        "apply_rope_fusion", "bias_activation_fusion", "calculate_per_token_loss",
        "context_parallel_size", "cross_entropy_loss_fusion", "expert_model_parallel_size",
        "export_hf_on_finish", "extra_config", "masked_softmax_fusion",
        "megatron_pretrained_checkpoint", "mixed_precision", "moe_grouped_gemm",
        "moe_token_dispatcher_type", "overlap_grad_reduce", "overlap_param_gather",
        "pipeline_model_parallel_size", "recompute_granularity", "recompute_method",
        "recompute_num_layers", "sequence_parallel", "tensor_model_parallel_size",
        "use_distributed_optimizer", "use_packed_sequences", "virtual_pipeline_model_parallel_size",
    }
)


TRANSFORMERS_4: frozenset[str] = frozenset(
    {
        "adafactor", "fp16_backend", "fp16_opt_level", "fsdp_min_num_params",
        "fsdp_transformer_layer_cls_to_wrap", "group_by_length", "half_precision_backend",
        "include_inputs_for_metrics", "include_tokens_per_second", "jit_mode_eval", "logging_dir",
        "mp_parameters", "no_cuda", "overwrite_output_dir", "past_index", "per_gpu_eval_batch_size",
        "per_gpu_train_batch_size", "push_to_hub_model_id", "push_to_hub_organization",
        "push_to_hub_token", "ray_scope", "save_safetensors", "torchdynamo", "tpu_metrics_debug",
        "tpu_num_cores", "use_legacy_prediction_loop", "use_mps_device", "warmup_ratio",
    }
)


SEQ2SEQ: frozenset[str] = frozenset(
    {
        "generation_config", "generation_max_length", "generation_num_beams",
        "predict_with_generate", "sortish_sampler",
    }
)
