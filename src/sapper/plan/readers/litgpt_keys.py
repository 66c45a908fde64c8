"""The keys a LitGPT YAML config may hold, for C005 (typos), and the model shapes of the
names LitGPT's own config files use.

LitGPT reads ``litgpt pretrain --config x.yaml`` (and ``finetune_full``, ``finetune_lora``,
``finetune_adapter``, ``finetune_adapter_v2``) with jsonargparse against the script's
``setup()`` signature, which refuses a key it does not have at start. Read from
Lightning-AI/litgpt at commit 26857050fe3ff627cd714fe92f5838f51a3d5efa (Jun 2026):
``TOP_LEVEL`` the union of the ``setup()`` parameters of litgpt/pretrain.py and
litgpt/finetune/{full,lora,lora_legacy,adapter,adapter_v2}.py; ``TRAIN``, ``EVAL``,
``LOG`` the fields of ``TrainArgs``, ``EvalArgs``, ``LogArgs`` (litgpt/args.py);
``CONFIG_FIELDS`` those of ``Config`` (litgpt/config.py), which an inline
``model_config:`` may set.

``MODELS`` holds the shape keys of the ``Config`` entries in litgpt/config.py that LitGPT's
config_hub files name (``model_name`` in config_hub/pretrain/, the checkpoint folders of
config_hub/finetune/), by ``Config.name``; ``HF_NAMES`` maps the Hugging Face name a
checkpoint folder carries (``checkpoints/meta-llama/Meta-Llama-3.1-8B``) to it. Missing
keys take ``Config``'s defaults (see :func:`sapper.plan.readers.litgpt.config_shape`). Any
other name leaves the model unknown: pass ``--model config.json``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONFIG_FIELDS", "EVAL", "HF_NAMES", "LOG", "MODELS", "TOP_LEVEL", "TRAIN"]

TOP_LEVEL: frozenset[str] = frozenset({
    "access_token", "checkpoint_dir", "data", "devices", "eval", "initial_checkpoint_dir",
    "log", "logger_name", "lora_alpha", "lora_dropout", "lora_head", "lora_key", "lora_mlp",
    "lora_projection", "lora_query", "lora_r", "lora_value", "model_config", "model_name",
    "num_nodes", "optimizer", "out_dir", "precision", "quantize", "resume", "seed",
    "tokenizer_dir", "train",
})

TRAIN: frozenset[str] = frozenset({
    "save_interval", "log_interval", "global_batch_size", "micro_batch_size",
    "lr_warmup_steps", "lr_warmup_fraction", "epochs", "max_tokens", "max_steps", "max_time",
    "max_seq_length", "tie_embeddings", "max_norm", "min_lr",
})

EVAL: frozenset[str] = frozenset({
    "interval", "max_new_tokens", "max_iters", "initial_validation", "final_validation",
    "evaluate_example",
})

LOG: frozenset[str] = frozenset({
    "project", "run", "group", "teamspace", "metadata", "log_model", "save_logs",
    "checkpoint_name",
})

CONFIG_FIELDS: frozenset[str] = frozenset({
    "attention_logit_softcapping", "attention_scores_scalar", "attn_bias", "bias",
    "block_size", "final_logit_softcapping", "first_k_dense_replace", "gelu_approximate",
    "head_size", "hf_config", "intermediate_size", "latent_attention", "lm_head_bias",
    "mlp_class_name", "moe_intermediate_size", "n_embd", "n_expert", "n_expert_groups",
    "n_expert_per_token", "n_head", "n_layer", "n_query_groups", "n_shared_expert",
    "n_topk_groups", "n_topk_scores_per_group", "name", "norm_1", "norm_2",
    "norm_class_name", "norm_eps", "norm_qk", "norm_qk_type", "norm_topk_prob",
    "padded_vocab_size", "padding_multiple", "parallel_residual", "post_attention_norm",
    "post_mlp_norm", "rope_adjustments", "rope_base", "rope_condense_ratio", "rope_indices",
    "rope_interleave", "rope_local_base_freq", "rotary_percentage", "routed_scaling_factor",
    "scale_embeddings", "shared_attention_norm", "sliding_window_indices",
    "sliding_window_size", "vocab_size",
})

#: Config.name -> the shape keys of its entry in litgpt/config.py (# org/name on the hub).
MODELS: dict[str, dict[str, Any]] = {
    "tiny-llama-1.1b": {  # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T
        "block_size": 2048, "vocab_size": 32000, "padding_multiple": 64, "n_layer": 22,
        "n_head": 32, "n_embd": 2048, "n_query_groups": 4, "rotary_percentage": 1.0,
        "parallel_residual": False, "bias": False, "norm_class_name": "RMSNorm",
        "mlp_class_name": "LLaMAMLP", "intermediate_size": 5632,
    },
    "micro-llama-300M": {  # keeeeenw/MicroLlama
        "block_size": 2048, "vocab_size": 32000, "padding_multiple": 64, "n_layer": 12,
        "n_head": 16, "n_embd": 1024, "n_query_groups": 4, "rotary_percentage": 1.0,
        "parallel_residual": False, "bias": False, "norm_class_name": "RMSNorm",
        "mlp_class_name": "LLaMAMLP", "intermediate_size": 5632,
    },
    "pythia-14m": {  # EleutherAI/pythia-14m
        "block_size": 512, "padding_multiple": 128, "n_layer": 6, "n_head": 4, "n_embd": 128,
    },
    "Gemma-2-2b": {  # google/gemma-2-2b
        "block_size": 8192, "vocab_size": 256000, "n_layer": 26, "n_head": 8, "n_embd": 2304,
        "n_query_groups": 4, "head_size": 256, "rotary_percentage": 1.0,
        "parallel_residual": False, "bias": False, "norm_class_name": "RMSNorm",
        "mlp_class_name": "GemmaMLP", "gelu_approximate": "tanh", "intermediate_size": 9216,
        "post_attention_norm": True, "post_mlp_norm": True,
    },
    "Gemma-2-9b": {  # google/gemma-2-9b
        "block_size": 8192, "vocab_size": 256000, "n_layer": 42, "n_head": 16, "n_embd": 3584,
        "n_query_groups": 8, "head_size": 256, "rotary_percentage": 1.0,
        "parallel_residual": False, "bias": False, "norm_class_name": "RMSNorm",
        "mlp_class_name": "GemmaMLP", "gelu_approximate": "tanh", "intermediate_size": 14336,
        "post_attention_norm": True, "post_mlp_norm": True,
    },
    "Gemma-2b": {  # google/gemma-2b
        "vocab_size": 256000, "padding_multiple": 64, "n_layer": 18, "n_head": 8, "n_embd": 2048,
        "n_query_groups": 1, "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
        "norm_class_name": "RMSNorm", "mlp_class_name": "GemmaMLP", "gelu_approximate": "tanh",
        "intermediate_size": 16384,
    },
    "Gemma-7b": {  # google/gemma-7b
        "vocab_size": 256000, "padding_multiple": 64, "n_layer": 28, "n_head": 16, "n_embd": 3072,
        "head_size": 256, "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
        "norm_class_name": "RMSNorm", "mlp_class_name": "GemmaMLP", "gelu_approximate": "tanh",
        "intermediate_size": 24576,
    },
    "Llama-2-7b-hf": {  # meta-llama/Llama-2-7b-hf
        "vocab_size": 32000, "padding_multiple": 64, "n_layer": 32, "rotary_percentage": 1.0,
        "parallel_residual": False, "bias": False, "norm_class_name": "RMSNorm",
        "mlp_class_name": "LLaMAMLP", "intermediate_size": 11008,
    },
    "Llama-3.2-1B": {  # meta-llama/Llama-3.2-1B
        "block_size": 131072, "vocab_size": 128000, "padded_vocab_size": 128256, "n_layer": 16,
        "n_head": 32, "n_embd": 2048, "n_query_groups": 8, "rotary_percentage": 1.0,
        "parallel_residual": False, "bias": False, "norm_class_name": "RMSNorm",
        "mlp_class_name": "LLaMAMLP", "intermediate_size": 8192, "rope_base": 500000,
        "rope_adjustments": {"factor": 32.0, "original_max_seq_len": 8192},
    },
    "Llama-3.2-3B": {  # meta-llama/Llama-3.2-3B
        "block_size": 131072, "vocab_size": 128000, "padded_vocab_size": 128256, "n_layer": 28,
        "n_head": 24, "n_embd": 3072, "n_query_groups": 8, "rotary_percentage": 1.0,
        "parallel_residual": False, "bias": False, "norm_class_name": "RMSNorm",
        "mlp_class_name": "LLaMAMLP", "intermediate_size": 8192, "rope_base": 500000,
        "rope_adjustments": {"factor": 32.0, "original_max_seq_len": 8192},
    },
    "Llama-3-8B": {  # meta-llama/Meta-Llama-3-8B
        "block_size": 8192, "vocab_size": 128000, "padded_vocab_size": 128256, "n_layer": 32,
        "n_head": 32, "n_query_groups": 8, "rotary_percentage": 1.0, "parallel_residual": False,
        "bias": False, "norm_class_name": "RMSNorm", "mlp_class_name": "LLaMAMLP",
        "intermediate_size": 14336, "rope_base": 500000,
    },
    "Llama-3.1-8B": {  # meta-llama/Meta-Llama-3.1-8B
        "block_size": 131072, "vocab_size": 128000, "padded_vocab_size": 128256, "n_layer": 32,
        "n_head": 32, "n_query_groups": 8, "rotary_percentage": 1.0, "parallel_residual": False,
        "bias": False, "norm_class_name": "RMSNorm", "mlp_class_name": "LLaMAMLP",
        "intermediate_size": 14336, "rope_base": 500000,
        "rope_adjustments": {"factor": 8.0, "original_max_seq_len": 8192},
    },
    "Phi-3-mini-4k-instruct": {  # microsoft/Phi-3-mini-4k-instruct
        "block_size": 4096, "vocab_size": 32000, "padded_vocab_size": 32064, "n_layer": 32,
        "n_embd": 3072, "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
        "norm_class_name": "RMSNorm", "mlp_class_name": "LLaMAMLP", "intermediate_size": 8192,
    },
    "phi-2": {  # microsoft/phi-2
        "block_size": 2048, "vocab_size": 50257, "padded_vocab_size": 51200, "n_layer": 32,
        "n_embd": 2560, "rotary_percentage": 0.4, "shared_attention_norm": True,
        "lm_head_bias": True, "gelu_approximate": "tanh",
    },
    "Mistral-7B-v0.1": {  # mistralai/Mistral-7B-v0.1
        "block_size": 4096, "padded_vocab_size": 32000, "n_layer": 32, "n_query_groups": 8,
        "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
        "norm_class_name": "RMSNorm", "mlp_class_name": "LLaMAMLP", "intermediate_size": 14336,
    },
    "stablelm-base-alpha-3b": {  # stabilityai/stablelm-base-alpha-3b

    },
    "falcon-7b": {  # tiiuae/falcon-7b
        "block_size": 2048, "vocab_size": 65024, "padded_vocab_size": 65024, "n_layer": 32,
        "n_head": 71, "n_embd": 4544, "n_query_groups": 1, "rotary_percentage": 1.0,
        "shared_attention_norm": True, "bias": False,
    },
    "Mistral-7B-v0.2": {  # unsloth/Mistral-7B-v0.2
        "block_size": 32768, "padded_vocab_size": 32000, "n_layer": 32, "n_query_groups": 8,
        "rotary_percentage": 1.0, "parallel_residual": False, "bias": False,
        "norm_class_name": "RMSNorm", "mlp_class_name": "LLaMAMLP", "intermediate_size": 14336,
        "rope_base": 1000000,
    },
}

#: The Hugging Face name of each entry (its hf_config), as a checkpoint folder is named.
HF_NAMES: dict[str, str] = {
    "TinyLlama-1.1B-intermediate-step-1431k-3T": "tiny-llama-1.1b",
    "MicroLlama": "micro-llama-300M",
    "pythia-14m": "pythia-14m",
    "gemma-2-2b": "Gemma-2-2b",
    "gemma-2-9b": "Gemma-2-9b",
    "gemma-2b": "Gemma-2b",
    "gemma-7b": "Gemma-7b",
    "Llama-2-7b-hf": "Llama-2-7b-hf",
    "Llama-3.2-1B": "Llama-3.2-1B",
    "Llama-3.2-3B": "Llama-3.2-3B",
    "Meta-Llama-3-8B": "Llama-3-8B",
    "Meta-Llama-3.1-8B": "Llama-3.1-8B",
    "Phi-3-mini-4k-instruct": "Phi-3-mini-4k-instruct",
    "phi-2": "phi-2",
    "Mistral-7B-v0.1": "Mistral-7B-v0.1",
    "stablelm-base-alpha-3b": "stablelm-base-alpha-3b",
    "falcon-7b": "falcon-7b",
    "Mistral-7B-v0.2": "Mistral-7B-v0.2",
}
