"""The keys a torchtune recipe config may hold, for C005 (typos).

torchtune reads its YAML with OmegaConf and hands it to a recipe, which reads the keys it
wants (``cfg.batch_size``, ``cfg.get("clip_grad_norm")``) and never looks at the rest: a
misspelled key has no effect. ``TOP_LEVEL`` is the union, over torchtune's history in
pytorch/torchtune (tags v0.1.1, v0.2.1, v0.3.1, v0.4.0, v0.5.0, v0.6.1 and commit
bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1, Apr 2026), of every key a recipe
(``recipes/*.py``, ``recipes/dev/*.py``) reads from its config and every top-level key of
the shipped configs (``recipes/configs/**/*.yaml``), so an older config's keys
(``fsdp_sharding_strategy``, ``memory_efficient_fsdp_wrap``) are known too.

A ``_component_`` section is instantiated by ``torchtune.config.instantiate``: its other keys
are keyword arguments of the component, and one the component does not take stops the
job at start (TypeError). ``OPTIMIZER_ARGS`` and ``SCHEDULER_ARGS`` are those of the
components sapper maps, from their signatures (torch 2.13 ``torch.optim``, bitsandbytes
``bitsandbytes/optim/adamw.py`` at commit 95f9af30 plus the ``percentile_clipping`` and
``block_wise`` of its older releases, torchtune ``training/lr_schedulers.py``); the model
builders' are in :mod:`sapper.plan.readers.torchtune_models`.
"""

from __future__ import annotations

__all__ = ["OPTIMIZER_ARGS", "SCHEDULER_ARGS", "TOP_LEVEL"]

TOP_LEVEL: frozenset[str] = frozenset(
    {
        "ac_mode", "ac_option", "activation_offloading_use_streams", "apply_chat_template",
        "base_model_path", "batch_size", "batch_size_val", "chat_format", "chat_template",
        "checkpointer", "clip_grad_norm", "collate_fn", "compile", "context_parallel_dim",
        "context_parallel_rotate_method", "cudnn_deterministic_mode",
        "custom_sharded_layers", "data_parallel_replicate_dim", "data_parallel_shard_dim",
        "dataloader", "dataset", "dataset_val", "datasets", "debug_logging_enabled",
        "debug_num_samples_per_step", "device", "dtype", "early_exit_loss",
        "enable_activation_checkpointing", "enable_activation_offloading",
        "enable_async_checkpointing", "enable_expandable_segments", "enable_fp8_training",
        "enable_kv_cache", "epochs", "fake_quant_after_n_steps", "forward_batch_size",
        "fp8_recipe_name", "fsdp", "fsdp_cpu_offload", "fsdp_reshard_after_forward",
        "fsdp_sharding_strategy", "fused", "gamma", "gradient_accumulation_steps",
        "grpo_samples", "include_path", "inference", "instruct_template", "kd_loss",
        "kd_ratio", "kl_coeff", "layer_dropout", "limit", "lmbda", "log_every_n_steps",
        "log_level", "log_peak_memory_stats", "loss", "low_cpu_ram", "lr_scheduler",
        "max_generated_tokens", "max_new_tokens", "max_seq_length", "max_steps_per_epoch",
        "memory_efficient_fsdp_wrap", "metric_logger", "min_response_length", "model",
        "name", "num_steps", "optimizer", "optimizer_in_bwd", "orchestration", "output_dir",
        "penalise_no_eos", "policy_model", "postprocessing", "ppo_batch_size", "ppo_epochs",
        "profiler", "prompt", "quantizer", "ref_checkpointer", "ref_policy_checkpointer",
        "resize_token_embeddings", "resume_from_checkpoint", "reward_and_value_model",
        "reward_checkpointer", "reward_functions", "reward_penalty",
        "run_val_every_n_steps", "save_adapter_weights_only", "save_every_n_epochs",
        "save_every_n_steps", "seed", "shuffle", "stop_token_ids", "tasks",
        "teacher_checkpointer", "teacher_model", "temperature", "tensor_parallel_dim",
        "tensor_parallel_plan", "tokenizer", "top_k", "training",
        "use_distributed_state_dict", "use_flex", "value_checkpointer", "whiten_rewards",
    }
)

_TORCH_COMMON = frozenset({
    "lr", "weight_decay", "maximize", "foreach", "capturable", "differentiable", "fused",
})
_ADAM = _TORCH_COMMON | {"betas", "eps", "amsgrad"}
_BNB_ADAMW = frozenset({
    "lr", "betas", "eps", "weight_decay", "amsgrad", "optim_bits", "args", "min_8bit_size",
    "percentile_clipping", "block_wise",
})

#: Keyword arguments each mapped optimizer component takes (besides the parameters).
OPTIMIZER_ARGS: dict[str, frozenset[str]] = {
    "torch.optim.AdamW": _ADAM,
    "torch.optim.Adam": _ADAM | {"decoupled_weight_decay"},
    "torch.optim.SGD": (_TORCH_COMMON - {"capturable"}) | {"momentum", "dampening", "nesterov"},
    "bitsandbytes.optim.AdamW": _BNB_ADAMW | {"is_paged"},
    "bitsandbytes.optim.AdamW8bit": _BNB_ADAMW | {"is_paged"},
    "bitsandbytes.optim.AdamW32bit": _BNB_ADAMW | {"is_paged"},
    "bitsandbytes.optim.PagedAdamW": _BNB_ADAMW,
    "bitsandbytes.optim.PagedAdamW8bit": _BNB_ADAMW,
    "bitsandbytes.optim.PagedAdamW32bit": _BNB_ADAMW,
}

#: torchtune's cosine schedule: the recipe passes the optimizer, num_training_steps and
#: last_epoch itself; the config gives the rest.
SCHEDULER_ARGS: frozenset[str] = frozenset({"num_warmup_steps", "num_cycles"})
