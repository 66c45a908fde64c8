"""Megatron's arguments in Plan terms: what each one means as Megatron runs it, and the
defaults Megatron applies to the ones a launch leaves out.

Defaults and derived values follow NVIDIA/Megatron-LM ``megatron/training/arguments.py``
at d98e8a64 (2026-08-22), the same since Megatron-LM v2 for everything used here:
``--clip-grad`` 1.0, ``--init-method-std`` 0.02, ``--initial-loss-scale`` 2**32,
``--min-loss-scale`` 1.0, ``--loss-scale-window`` 1000, ``--hysteresis`` 2,
``--lr-decay-style`` linear, ``--lr-warmup-iters`` 0, ``--min-lr`` 0, ``--adam-beta1/2``
0.9/0.999, ``--adam-eps`` 1e-8, ``--weight-decay`` 0.01, ``--optimizer`` adam,
``--make-vocab-size-divisible-by`` 128, ``--position-embedding-type`` learned_absolute,
``--normalization`` LayerNorm, ``--hidden-dropout`` 0.1, biases on (``add_bias_linear``),
embeddings tied to the output layer; ``validate_args`` sets ``ffn_hidden_size`` to 4h
(``--swiglu``: ``int(4h·2/3 / 64)·64``), ``kv_channels`` to h / heads,
``num_query_groups`` to the head count without ``--group-query-attention``, and the
global batch to micro × DP. The fp16 loss scaler is ``DynamicGradScaler`` with growth 2
and backoff 0.5 (``megatron/core/optimizer/__init__.py``); Adam is AdamW
(``OptimizerConfig.decoupled_weight_decay = True``); bf16 accumulates and all-reduces
gradients in fp32 unless ``--grad-reduce-in-bf16``; the output layers of each block are
initialised with std / √(2L) (``scaled_init_method_normal``).

With ``--deepspeed`` (Megatron-DeepSpeed) the DeepSpeed engine runs the step: Megatron's
``get_megatron_optimizer`` hands DeepSpeed the bare optimizer (microsoft/Megatron-DeepSpeed
``megatron/optimizer/__init__.py``: ``if args.deepspeed: return optimizer``), so loss
scaling, clipping and ZeRO are the DeepSpeed config's; the framework is ``deepspeed`` and
the model, layout and schedule are still Megatron's arguments.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip
from sapper.plan.readers.base import unresolved_finding
from sapper.plan.readers.megatron_args import OPTIONS
from sapper.plan.readers.megatron_launch import Arg, Launch
from sapper.plan.readers.megatron_vocab import GPT2_VOCAB, SENTENCEPIECE, file_vocab
from sapper.plan.readers.shell import Word
from sapper.plan.sources import MAX_INT_DIGITS, PlanSource

__all__ = ["map_launch"]


_FLOAT = re.compile(r"[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?")


class _Unknown:
    """A value the launch leaves open (already reported as C006)."""


UNKNOWN = _Unknown()

#: dest -> the option a user writes for it (for the names of defaults).
_OPTION_OF: dict[str, str] = {}
for _opt, (_dest, _kind) in OPTIONS.items():
    if _dest not in _OPTION_OF or (_kind == "v" and not _opt.startswith("--no-")):
        _OPTION_OF.setdefault(_dest, _opt)

_DECAY = {
    "constant": "constant",
    "linear": "linear",
    "cosine": "cosine",
    "inverse-square-root": "inverse_sqrt",
    "wsd": "wsd",
}
_POSITIONS = {
    "learned_absolute": "learned",
    "rope": "rope",
    "yarn": "rope",
    "mrope": "rope",
    "alibi": "alibi",
    "relative": "none",
    "none": "none",
}
_NO_FILE_FIX = (
    "run sapper where the file is, or give the values it holds on the command line "
    "(--gpus, --nodes, --micro-batch ...) or in a sapper plan passed with another --config"
)


class _Map:
    """Typed access to the launch's arguments; every value lands in the Plan with the
    user's key as its origin, an unknown one becomes C006, a bad one an InputError."""

    def __init__(self, launch: Launch, src: PlanSource, base: Path) -> None:
        self.launch, self.src, self.base = launch, src, base
        self.file = launch.file
        self.dump = launch.kind == "dump"

    # -- access --------------------------------------------------------------------------
    def arg(self, dest: str) -> Arg | None:
        return self.launch.args.get(dest)

    def key(self, dest: str) -> str:
        arg = self.arg(dest)
        if arg is not None:
            return arg.key
        return dest if self.dump else _OPTION_OF.get(dest, "--" + dest.replace("_", "-"))

    def origin(self, dest: str) -> str:
        arg = self.arg(dest)
        if arg is None:
            key = self.key(dest)
            if key.startswith("--no-") or key.startswith("--disable-"):
                return f"(Megatron default, without {key})"
            return f"{key} (Megatron default)"
        via = [v for w in arg.values[:1] for v in w.via]
        return f"{arg.key} (via ${via[0]})" if via and not self.dump else arg.key

    def flag(self, dest: str, default: bool = False) -> bool:
        arg = self.arg(dest)
        if arg is None:
            return default
        if arg.flag is None:  # a value given to a flag: argparse would refuse it
            raise self.error(dest, " ".join(w.shown for w in arg.values), "no value (a flag)")
        return arg.flag

    def raw(self, dest: str, field: str) -> str | _Unknown | None:
        """The first value's text; UNKNOWN (reported) when the script leaves it open."""
        arg = self.arg(dest)
        if arg is None:
            return None
        if arg.flag is not None:
            raise self.error(dest, arg.key, "a value after it")
        if not arg.values:
            raise self.error(dest, "(nothing)", "a value after it")
        word = arg.values[0]
        if not word.known:
            self.unknown(dest, field, word.unknown)
            return UNKNOWN
        return word.text

    def unknown(self, dest: str, field: str, names: tuple[str, ...] | list[str]) -> None:
        why = "; ".join(self.launch.reasons.get(n, n) for n in names)
        unresolved_finding(
            self.src,
            self.key(dest),
            field,
            f"its value {', '.join(names)} is not known from the file ({why}), so "
            f"{field} is left unknown",
            "give the value in the script, on sapper's command line, or in a sapper plan "
            "passed with another --config",
        )

    def error(self, dest: str, value: Any, expected: str) -> InputError:
        return InputError(
            "invalid value",
            file=self.file,
            field=self.key(dest),
            value=clip(str(value)),
            has_value=True,
            expected=expected,
        )

    def integer(
        self, dest: str, field: str, minimum: int | None = 1
    ) -> int | _Unknown | None:
        text = self.raw(dest, field)
        if text is None or isinstance(text, _Unknown):
            return text
        words = "a whole number" + (f" ≥ {minimum}" if minimum is not None else "")
        t = text.strip()
        if len(t) > MAX_INT_DIGITS or not re.fullmatch(r"[-+]?\d[\d_]*", t):
            raise self.error(dest, text, words)
        value = int(t)
        if minimum is not None and value < minimum:
            raise self.error(dest, text, words)
        return value

    def number(self, dest: str, field: str, minimum: float | None = 0.0) -> float | _Unknown | None:
        text = self.raw(dest, field)
        if text is None or isinstance(text, _Unknown):
            return text
        words = "a number" + (f" ≥ {minimum:g}" if minimum is not None else "")
        t = text.strip()
        if len(t) > MAX_INT_DIGITS or not _FLOAT.fullmatch(t):
            raise self.error(dest, text, words)
        value = float(t.replace("_", ""))
        if not math.isfinite(value) or (minimum is not None and value < minimum):
            raise self.error(dest, text, words)
        return value

    def choice(self, dest: str, field: str, choices: dict[str, Any]) -> Any:
        text = self.raw(dest, field)
        if text is None or isinstance(text, _Unknown):
            return text
        folded = {k.lower(): v for k, v in choices.items()}
        if text.lower() not in folded:
            raise self.error(dest, text, " / ".join(choices))
        return folded[text.lower()]

    # -- writing ----------------------------------------------------------------------
    def put(self, field: str, value: Any, dest: str, origin: str | None = None) -> None:
        self.src.set(field, value, origin=origin or self.origin(dest))

    def take(self, dest: str, field: str, value: Any, default: Any = None) -> Any:
        """Set ``field`` from ``value`` (read by a typed getter), or Megatron's default
        when the argument is absent and ``default`` is given."""
        if isinstance(value, _Unknown):
            return value
        if value is None:
            if default is None:
                return None
            value = default
        self.put(field, value, dest)
        return value


def known(value: Any) -> bool:
    return value is not None and not isinstance(value, _Unknown)


# ---- sections ------------------------------------------------------------------------
def map_launch(launch: Launch, src: PlanSource, base: Path) -> None:
    """Fill ``src`` from ``launch`` (see the module docstring for the semantics)."""
    m = _Map(launch, src, base)
    deepspeed = m.flag("deepspeed")
    src.set(
        "framework",
        "deepspeed" if deepspeed else "megatron",
        origin="--deepspeed (Megatron-DeepSpeed: the DeepSpeed engine runs the step)"
        if deepspeed
        else "(Megatron-LM arguments)",
    )
    tp = m.take("tensor_model_parallel_size", "parallel.tp",
                m.integer("tensor_model_parallel_size", "parallel.tp"))
    _model(m, tp if known(tp) else (1 if m.arg("tensor_model_parallel_size") is None else tp))
    _precision(m, deepspeed)
    _optimizer(m)
    batch = _batch(m)
    _schedule(m, batch)
    _parallel(m, deepspeed)
    _hardware(m)
    _data(m)
    _deepspeed_config(m, deepspeed)
    opened = list(dict.fromkeys(w.shown for w in launch.open_expansions))
    for shown in opened[:5]:
        word = next(w for w in launch.open_expansions if w.shown == shown)
        unresolved_finding(
            src,
            word.shown,
            "(arguments)",
            f"{word.shown} is expanded into the training command and may hold more "
            f"arguments ({'; '.join(launch.reasons.get(n, n) for n in word.unknown)}): "
            "they are not checked",
            "set it in the script, or check the command Megatron prints at start "
            "(sapper check --config on the log's arguments dump)",
        )
    if "(arguments)" in src.unresolved:
        src.unresolved.remove("(arguments)")


def _model(m: _Map, tp: Any) -> None:
    shape = ("num_layers", "hidden_size", "num_attention_heads")
    placeholders = [d for d in shape if m.arg(d) and m.raw(d, "model") == "-1"]
    if placeholders or m.flag("use_checkpoint_args"):
        key = m.key("use_checkpoint_args") if not placeholders else ", ".join(
            f"{m.key(d)} -1" for d in placeholders)
        unresolved_finding(
            m.src, key, "model",
            "the model's shape is the checkpoint's (--use-checkpoint-args, or -1 "
            "placeholders the program replaces with the loaded checkpoint's values)",
            "pass --model config.json of the checkpoint's model, or give the shape in a "
            "sapper plan passed with another --config",
        )
        for dest in ("seq_length", "max_position_embeddings"):
            if m.arg(dest) and m.raw(dest, "batch.seq_len") == "-1":
                m.launch.args.pop(dest)
        return
    layers = m.integer("num_layers", "model.num_layers")
    if layers is None:
        layers = m.integer("encoder_num_layers", "model.num_layers")
    hidden = m.integer("hidden_size", "model.hidden_size")
    heads = m.integer("num_attention_heads", "model.num_heads")
    if not (known(layers) and known(hidden) and known(heads)):
        missing = [k for k, v in (("num_layers", layers), ("hidden_size", hidden),
                                  ("num_attention_heads", heads)) if v is None]
        if missing:
            unresolved_finding(
                m.src,
                ", ".join(m.key(k) for k in missing),
                "model",
                "the model's shape is not given (Megatron takes it from the checkpoint "
                "with --use-checkpoint-args, or refuses to start), so the model is unknown",
                "give the model's shape in the script, or pass --model config.json",
            )
        elif "model" not in m.src.unresolved:
            m.src.unresolved.append("model")
        return
    assert isinstance(layers, int) and isinstance(hidden, int) and isinstance(heads, int)
    if hidden % heads and m.arg("kv_channels") is None:
        raise m.error("hidden_size", hidden, f"a multiple of --num-attention-heads ({heads}) "
                      "unless --kv-channels is given (Megatron asserts it)")
    m.put("model.implementation", "megatron", "num_layers",
          origin="(Megatron-LM model code)")
    if m.launch.program:
        fam = re.search(r"pretrain_([a-z0-9]+)", m.launch.program.rsplit("/", 1)[-1])
        if fam:
            m.put("model.family", fam.group(1), "", origin=m.launch.program)
    m.put("model.num_layers", layers, "num_layers" if m.arg("num_layers") else
          "encoder_num_layers")
    m.put("model.hidden_size", hidden, "hidden_size")
    m.put("model.num_heads", heads, "num_attention_heads")
    _attention(m, heads)
    m.take("kv_channels", "model.head_dim", m.integer("kv_channels", "model.head_dim"))
    swiglu = m.flag("swiglu")
    ffn = m.integer("ffn_hidden_size", "model.ffn_hidden_size")
    if ffn is None:
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
        if ffn > 0:
            m.put("model.ffn_hidden_size", ffn, "ffn_hidden_size",
                  origin="--ffn-hidden-size (Megatron default: "
                  + ("int(4h·2/3 / 64)·64 with --swiglu)" if swiglu else "4h)"))
    else:
        m.take("ffn_hidden_size", "model.ffn_hidden_size", ffn)
    if swiglu:
        m.put("model.activation", "swiglu", "swiglu")
        m.put("model.hidden_act", "silu", "swiglu")
    elif m.flag("squared_relu"):
        m.put("model.activation", "relu", "squared_relu")
        m.put("model.hidden_act", "squared_relu", "squared_relu")
    else:
        m.put("model.activation", "gelu", "swiglu", origin="(Megatron default: GeLU)")
        m.put("model.hidden_act", "gelu_new" if m.flag("openai_gelu") else "gelu",
              "openai_gelu", origin="--openai-gelu" if m.flag("openai_gelu") else
              "(Megatron default: GeLU)")
    untie = m.flag("untie_embeddings_and_output_weights")
    m.put("model.tied_embeddings", not untie, "untie_embeddings_and_output_weights")
    _positions(m)
    norm = m.choice("normalization", "model.norm_type",
                    {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"})
    m.take("normalization", "model.norm_type", norm, "layernorm")
    bias = m.flag("add_bias_linear", default=True)
    m.put("model.mlp_bias", bias, "add_bias_linear")
    qkv = m.flag("add_qkv_bias")
    m.put("model.attention_bias", bias or qkv, "add_qkv_bias" if qkv and not bias else
          "add_bias_linear")
    m.take("max_position_embeddings", "model.max_position_embeddings",
           m.integer("max_position_embeddings", "model.max_position_embeddings"))
    hidden = m.take("hidden_dropout", "model.dropout",
                    m.number("hidden_dropout", "model.dropout"), 0.1)
    # Megatron drops the residual-branch outputs and the embeddings with --hidden-dropout
    # and the attention probabilities with --attention-dropout (both 0.1 by default).
    if known(hidden):
        m.put("model.hidden_dropout", hidden, "hidden_dropout")
    m.take("attention_dropout", "model.attention_dropout",
           m.number("attention_dropout", "model.attention_dropout"), 0.1)
    _vocab(m, tp)
    _experts(m)
    _latent_attention(m)
    std = m.number("init_method_std", "init.std")
    m.take("init_method_std", "init.std", std if std != 0 else None, 0.02)
    m.put("init.residual_scaling", "depth", "init_method_std",
          origin="(Megatron: output layers of each block initialised with std/√(2L))")
    if m.flag("finetune") or m.arg("pretrained_checkpoint") is not None:
        dest = "finetune" if m.flag("finetune") else "pretrained_checkpoint"
        m.put("init.from_pretrained", True, dest)


def _attention(m: _Map, heads: int) -> None:
    if m.flag("group_query_attention"):
        groups = m.integer("num_query_groups", "model.num_kv_heads")
        m.take("num_query_groups", "model.num_kv_heads", groups, 1)
        return
    if m.dump and known(kv := m.integer("num_key_value_heads", "model.num_kv_heads")):
        m.take("num_key_value_heads", "model.num_kv_heads", kv)  # Megatron-DeepSpeed's GQA
        return
    m.put("model.num_kv_heads", heads, "group_query_attention",
          origin="--num-attention-heads (no --group-query-attention)")


def _positions(m: _Map) -> None:
    kind = m.choice("position_embedding_type", "model.position_encoding", _POSITIONS)
    if isinstance(kind, type(UNKNOWN)):
        return
    rotary = m.flag("use_rotary_position_embeddings")
    dest = "position_embedding_type"
    if kind in (None, "learned") and rotary:
        kind, dest = "rope", "use_rotary_position_embeddings"
    elif kind in (None, "learned") and not m.flag("add_position_embedding", default=True):
        kind, dest = "none", "add_position_embedding"
    m.take(dest, "model.position_encoding", kind, "learned")
    if kind == "rope":
        base = m.number("rotary_base", "model.rope_theta", minimum=None)
        m.take("rotary_base", "model.rope_theta", base, 10000.0)


def _vocab(m: _Map, tp: Any) -> None:
    """The embedding's rows: the padded vocabulary (a multiple of
    ``--make-vocab-size-divisible-by`` × TP, ``vocab_size_with_padding`` in
    megatron/core/tokenizers/utils/build_tokenizer.py). Known from the file only when the
    launch says it: a log's "padded vocab" line, ``--padded-vocab-size``, Megatron-DeepSpeed's
    ``--pad-vocab-size-to``, ``--vocab-size`` with the Null or TikToken tokenizer, the
    GPT-2 tokenizer's fixed size, or a Hugging Face / SentencePiece tokenizer file on this
    machine (:mod:`sapper.plan.readers.megatron_vocab`); otherwise unknown."""
    field = "model.vocab_size"
    if m.launch.padded_vocab is not None:
        size, padded = m.launch.padded_vocab
        m.put(field, padded, "", origin=f"> padded vocab (size: {size}) ... (new size: {padded})")
        return
    for dest in ("padded_vocab_size", "pad_vocab_size_to"):
        value = m.integer(dest, field)
        if value is not None:
            m.take(dest, field, value)
            return
    tokenizer = m.raw("tokenizer_type", field)
    size = m.integer("vocab_size", field)
    if isinstance(size, int) and tokenizer in (None, "NullTokenizer", "TikTokenizer"):
        _pad(m, tp, size, m.origin("vocab_size"))
        return
    if isinstance(tokenizer, _Unknown):
        return
    read = _tokenizer_vocab(m, tokenizer, tp)
    if isinstance(read, int):
        return
    if isinstance(size, _Unknown) or read is UNKNOWN:
        return
    files = [m.arg(d) for d in ("tokenizer_model", "vocab_file", "tokenizer_name_or_path")]
    keys = [a.key for a in files if a is not None]
    if tokenizer:
        keys.insert(0, f"{m.key('tokenizer_type')} {tokenizer}")
    said = f" ({', '.join(keys)})" if keys else " (no --vocab-size is given)"
    if isinstance(read, str):
        said = f" ({', '.join(keys)}: {read})"
    if m.dump and not keys:
        said = " (the dump has no padded_vocab_size and no '> padded vocab' line follows it)"
    if not keys and m.launch.open_expansions:
        opened = ", ".join(dict.fromkeys(w.shown for w in m.launch.open_expansions))
        said = f" (not among the arguments the file decides; {opened} may hold it)"
    unresolved_finding(
        m.src,
        keys[0].split()[0] if keys else m.key("vocab_size"),
        field,
        f"the vocabulary is the tokenizer's{said}, which sapper does not load, so the "
        "model's size and memory are unknown",
        "give the padded vocabulary in a sapper plan passed with another --config "
        "(model.vocab_size), or pass --model config.json of the same model",
    )


def _pad(m: _Map, tp: Any, size: int, origin: str) -> None:
    """``size`` padded as ``vocab_size_with_padding`` pads it, once TP is known."""
    field = "model.vocab_size"
    divisible = m.integer("make_vocab_size_divisible_by", field)
    divisible = divisible if known(divisible) else (128 if divisible is None else divisible)
    if known(divisible) and known(tp):
        multiple = divisible * tp  # type: ignore[operator]
        padded = -(-size // multiple) * multiple
        m.put(field, padded, "vocab_size", origin=f"{origin} padded to a multiple of "
              f"{divisible}×TP = {multiple}")


def _tokenizer_vocab(m: _Map, tokenizer: str | None, tp: Any) -> int | str | _Unknown | None:
    """The unpadded vocabulary the tokenizer type decides (GPT-2's), or the one read from
    ``--tokenizer-model`` on this machine (:mod:`megatron_vocab`), padded into the Plan:
    the size, else why not (a sentence), UNKNOWN when the path is left open (reported),
    None when the type says nothing."""
    added = [m.key(d) for d in ("special_tokens", "vocab_extra_ids") if m.arg(d) is not None
             and not (d == "vocab_extra_ids" and m.raw(d, "model.vocab_size") == "0")]
    if tokenizer == "GPT2BPETokenizer" and added:
        return f"{', '.join(added)} adds tokens to GPT-2's {GPT2_VOCAB:,}"
    if tokenizer == "GPT2BPETokenizer":
        _pad(m, tp, GPT2_VOCAB, f"{m.key('tokenizer_type')} GPT2BPETokenizer (GPT-2's "
             f"{GPT2_VOCAB:,} tokens)")
        return GPT2_VOCAB
    if tokenizer not in ("HuggingFaceTokenizer", *SENTENCEPIECE):
        return None
    if added:
        return f"{', '.join(added)} adds tokens to the tokenizer's"
    path = m.raw("tokenizer_model", "model.vocab_size")
    if path is None or isinstance(path, _Unknown):
        return path
    file = Path(path).expanduser()
    if not file.is_absolute():
        file = m.base / file
    read = file_vocab(tokenizer, file)
    if read.size is None:
        return read.said
    _pad(m, tp, read.size, f"{m.key('tokenizer_model')} {read.said}")
    return read.size


def _experts(m: _Map) -> None:
    experts = m.integer("num_experts", "model.num_experts")
    if not known(experts) or experts == 1:  # type: ignore[comparison-overlap]
        return
    m.take("num_experts", "model.num_experts", experts)
    if m.arg("moe_router_topk") is None and m.arg("topk") is not None:  # Megatron-DeepSpeed
        m.take("topk", "model.experts_top_k", m.integer("topk", "model.experts_top_k"))
    else:
        m.take("moe_router_topk", "model.experts_top_k",
               m.integer("moe_router_topk", "model.experts_top_k"), 2)
    m.take("moe_ffn_hidden_size", "model.moe_ffn_hidden_size",
           m.integer("moe_ffn_hidden_size", "model.moe_ffn_hidden_size"))
    field = "model.shared_expert_ffn_hidden_size"
    m.take("moe_shared_expert_intermediate_size", field,
           m.integer("moe_shared_expert_intermediate_size", field))


def _latent_attention(m: _Map) -> None:
    """--multi-latent-attention with its widths, at Megatron's defaults when absent
    (kv_lora_rank 32, no q_lora_rank, qk_head_dim 128 + qk_pos_emb_head_dim 64,
    v_head_dim 128: megatron/training/arguments.py); head_dim is the query/key width."""
    if not m.flag("multi_latent_attention"):
        return
    m.take("kv_lora_rank", "model.kv_lora_rank",
           m.integer("kv_lora_rank", "model.kv_lora_rank"), 32)
    m.take("q_lora_rank", "model.q_lora_rank", m.integer("q_lora_rank", "model.q_lora_rank"))
    nope = m.integer("qk_head_dim", "model.head_dim")
    rope = m.take("qk_pos_emb_head_dim", "model.qk_rope_head_dim",
                  m.integer("qk_pos_emb_head_dim", "model.qk_rope_head_dim"), 64)
    nope = 128 if nope is None else nope
    if known(nope) and known(rope):
        m.put("model.head_dim", nope + rope, "qk_head_dim")
    m.take("v_head_dim", "model.v_head_dim", m.integer("v_head_dim", "model.v_head_dim"), 128)


def _precision(m: _Map, deepspeed: bool) -> None:
    fp16, bf16 = m.flag("fp16"), m.flag("bf16")
    if fp16 and bf16:
        raise InputError(
            "both --fp16 and --bf16 are given: Megatron refuses to start (validate_args "
            "asserts not both)",
            file=m.file,
            field=f"{m.key('fp16')}, {m.key('bf16')}",
            expected="one of them",
        )
    fp8 = m.raw("fp8", "precision.dtype")
    if isinstance(fp8, str) and fp8 not in ("e4m3", "hybrid"):
        raise m.error("fp8", fp8, "e4m3 or hybrid")
    dtype, dest = ("bf16", "bf16") if bf16 else ("fp16", "fp16") if fp16 else ("fp32", "fp16")
    if isinstance(fp8, str):
        dtype, dest = "fp8", "fp8"
    m.put("precision.dtype", dtype, dest, origin=None if m.arg(dest) else
          "(no --fp16/--bf16: fp32)")
    if bf16:
        dest = "bf16"
    if bf16:
        if m.dump and m.arg("accumulate_allreduce_grads_in_fp32") is not None:
            fp32 = m.flag("accumulate_allreduce_grads_in_fp32")
            m.put("precision.grad_dtype", "fp32" if fp32 else "bf16",
                  "accumulate_allreduce_grads_in_fp32")
        elif not deepspeed:
            grad = "bf16" if m.flag("grad_reduce_in_bf16") else "fp32"
            m.put("precision.grad_dtype", grad, "grad_reduce_in_bf16",
                  origin="--grad-reduce-in-bf16" if grad == "bf16" else
                  "--bf16 (Megatron accumulates bf16 gradients in fp32)")
    if deepspeed:
        return  # loss scaling is the DeepSpeed config's
    scaling = "precision.loss_scaling"
    if not fp16:
        m.put(f"{scaling}.mode", "none", dest, origin=f"{m.key(dest)} (no loss scaling)"
              if dtype != "fp32" else "(fp32: no loss scaling)")
        return
    static = m.number("loss_scale", f"{scaling}.static_scale")
    if isinstance(static, _Unknown):
        return
    if static:
        m.put(f"{scaling}.mode", "static", "loss_scale")
        m.put(f"{scaling}.static_scale", static, "loss_scale")
        return
    m.put(f"{scaling}.mode", "dynamic", "loss_scale",
          origin="--fp16 without --loss-scale (Megatron: dynamic scaling)")
    m.take("initial_loss_scale", f"{scaling}.initial_scale",
           m.number("initial_loss_scale", f"{scaling}.initial_scale"), float(2**32))
    m.take("min_loss_scale", f"{scaling}.min_scale",
           m.number("min_loss_scale", f"{scaling}.min_scale"), 1.0)
    m.take("loss_scale_window", f"{scaling}.growth_interval",
           m.integer("loss_scale_window", f"{scaling}.growth_interval"), 1000)
    m.take("hysteresis", f"{scaling}.hysteresis",
           m.integer("hysteresis", f"{scaling}.hysteresis"), 2)


def _optimizer(m: _Map) -> None:
    name = m.raw("optimizer", "optimizer.type")
    if isinstance(name, str):
        name = name.lower()
    kind = {"adam": "adamw", "sgd": "sgd"}.get(name or "adam", name)
    if not isinstance(name, _Unknown):
        m.put("optimizer.type", kind, "optimizer", origin=(
            f"{m.origin('optimizer')} (Megatron's Adam decouples weight decay: AdamW)"
            if kind == "adamw" else None))
    m.take("lr", "optimizer.lr", m.number("lr", "optimizer.lr"))
    if kind == "sgd":
        m.take("sgd_momentum", "optimizer.momentum",
               m.number("sgd_momentum", "optimizer.momentum"), 0.9)
    else:
        b1 = m.number("adam_beta1", "optimizer.betas")
        b2 = m.number("adam_beta2", "optimizer.betas")
        if known(b1) or known(b2) or (b1 is None and b2 is None):
            betas = [b1 if known(b1) else 0.9, b2 if known(b2) else 0.999]
            if not (isinstance(b1, _Unknown) or isinstance(b2, _Unknown)):
                dest = "adam_beta1" if m.arg("adam_beta1") else "adam_beta2"
                m.put("optimizer.betas", betas, dest,
                      origin=f"{m.origin('adam_beta1')}, {m.origin('adam_beta2')}")
        m.take("adam_eps", "optimizer.eps", m.number("adam_eps", "optimizer.eps"), 1e-8)
    m.take("weight_decay", "optimizer.weight_decay",
           m.number("weight_decay", "optimizer.weight_decay"), 0.01)


def _batch(m: _Map) -> dict[str, Any]:
    micro = m.take("micro_batch_size", "batch.micro_batch_size",
                   m.integer("micro_batch_size", "batch.micro_batch_size"))
    glob = m.integer("global_batch_size", "batch.global_batch_size")
    ramp = m.arg("rampup_batch_size") or m.arg("step_batch_size_schedule")
    if known(glob):
        origin = m.origin("global_batch_size")
        if ramp is not None:
            origin += (f" (reached after {ramp.key} "
                       f"{clip(' '.join(w.shown for w in ramp.values))}; the checks use it)")
        m.put("batch.global_batch_size", glob, "global_batch_size", origin=origin)
    seq = m.integer("seq_length", "batch.seq_len")
    if seq is None:
        seq = m.integer("encoder_seq_length", "batch.seq_len")
        m.take("encoder_seq_length", "batch.seq_len", seq)
    else:
        m.take("seq_length", "batch.seq_len", seq)
    return {"micro": micro, "global": glob, "ramp": ramp is not None}


def _steps(m: _Map, dest: str, field: str, batch: dict[str, Any]) -> int | _Unknown | None:
    """A length in samples as optimizer steps (Megatron: samples // global batch), known
    only with a fixed global batch."""
    samples = m.integer(dest, field, minimum=0)
    if not known(samples):
        return samples
    if batch["ramp"] or not known(batch["global"]):
        why = ("the batch ramps up (--rampup-batch-size), so the step count depends on the "
               "ramp" if batch["ramp"] else "the global batch size is not known")
        unresolved_finding(m.src, m.key(dest), field, f"{m.key(dest)} counts samples and {why}",
                           "give the length in steps (--train-iters / --lr-warmup-iters), "
                           "or pass --warmup on sapper's command line")
        return UNKNOWN
    return samples // batch["global"]  # type: ignore[operator]


def _schedule(m: _Map, batch: dict[str, Any]) -> None:
    style = m.choice("lr_decay_style", "schedule.type", _DECAY)
    m.take("lr_decay_style", "schedule.type", style, "linear")
    m.take("min_lr", "schedule.min_lr", m.number("min_lr", "schedule.min_lr"), 0.0)
    total = m.integer("train_iters", "schedule.total_steps")
    if total is None and m.arg("train_samples") is not None:
        total = _steps(m, "train_samples", "schedule.total_steps", batch)
        if known(total):
            m.put("schedule.total_steps", total, "train_samples",
                  origin=f"{m.origin('train_samples')} / --global-batch-size")
    else:
        m.take("train_iters", "schedule.total_steps", total)
    decay = m.integer("lr_decay_iters", "schedule.warmup_steps")
    decay = decay if decay is not None else total
    fraction = m.number("lr_warmup_fraction", "schedule.warmup_steps")
    field = "schedule.warmup_steps"
    if known(fraction):
        if known(decay):
            m.put(field, int(fraction * decay), "lr_warmup_fraction",  # type: ignore[operator]
                  origin=f"{m.origin('lr_warmup_fraction')} × {m.key('lr_decay_iters')}")
        elif decay is None:
            unresolved_finding(m.src, m.key("lr_warmup_fraction"), field,
                               "a fraction of the decay length, which is not given",
                               "give --lr-decay-iters or --train-iters")
        return
    samples = m.integer("lr_warmup_samples", field, minimum=0)
    if isinstance(samples, _Unknown):
        return
    if samples:
        steps = _steps(m, "lr_warmup_samples", field, batch)
        if known(steps):
            m.put(field, steps, "lr_warmup_samples",
                  origin=f"{m.origin('lr_warmup_samples')} / --global-batch-size")
        return
    m.take("lr_warmup_iters", field, m.integer("lr_warmup_iters", field, minimum=0), 0)


def _parallel(m: _Map, deepspeed: bool) -> None:
    p = "parallel"
    m.take("pipeline_model_parallel_size", f"{p}.pp",
           m.integer("pipeline_model_parallel_size", f"{p}.pp"))
    m.take("context_parallel_size", f"{p}.cp", m.integer("context_parallel_size", f"{p}.cp"))
    ep_dest = "expert_model_parallel_size" if m.arg("moe_expert_parallel_size") is None else (
        "moe_expert_parallel_size")
    m.take(ep_dest, f"{p}.ep", m.integer(ep_dest, f"{p}.ep"))
    if m.flag("sequence_parallel"):
        tp = m.src.data.get("parallel", {}).get("tp", 1)
        # validate_args: "Disabling sequence parallelism because tensor model parallelism
        # is disabled" (megatron/training/arguments.py)
        m.put(f"{p}.sequence_parallel", tp != 1, "sequence_parallel",
              origin=None if tp != 1 else "--sequence-parallel (Megatron turns it off "
              "with TP 1)")
    _virtual(m)
    _recompute(m)
    if not deepspeed:
        dist = m.flag("use_distributed_optimizer")
        m.put(f"{p}.zero_stage", 1 if dist else 0, "use_distributed_optimizer",
              origin=m.origin("use_distributed_optimizer") + (
                  " (shards master weights and optimizer states: ZeRO-1)" if dist else ""))
        m.put(f"{p}.overlap_dp_comm", m.flag("overlap_grad_reduce"), "overlap_grad_reduce")
        m.put(f"{p}.overlap_param_gather", m.flag("overlap_param_gather"),
              "overlap_param_gather")
        m.take("clip_grad", "clipping.max_norm", m.number("clip_grad", "clipping.max_norm"), 1.0)
        scatter = m.flag("scatter_gather_tensors_in_pipeline", default=True)
        m.put(f"{p}.pipeline_scatter_gather", scatter, "scatter_gather_tensors_in_pipeline")
    else:
        m.put(f"{p}.pipeline_scatter_gather", False, "deepspeed",
              origin="--deepspeed (DeepSpeed's pipeline engine sends whole activations)")
    m.put(f"{p}.tp_comm_overlap", m.flag("tp_comm_overlap"), "tp_comm_overlap")
    for dest, field in (("decoder_first_pipeline_num_layers", f"{p}.first_stage_layers"),
                        ("decoder_last_pipeline_num_layers", f"{p}.last_stage_layers")):
        m.take(dest, field, m.integer(dest, field))


def _virtual(m: _Map) -> None:
    field = "parallel.virtual_pipeline_stages"
    per_stage = m.integer("num_layers_per_virtual_pipeline_stage", field)
    chunks = m.integer("num_virtual_stages_per_pipeline_rank", field)
    if chunks is None:
        chunks = m.integer("virtual_pipeline_model_parallel_size", field)
        dest = "virtual_pipeline_model_parallel_size"
    else:
        dest = "num_virtual_stages_per_pipeline_rank"
    layers = m.src.data.get("model", {}).get("num_layers")
    pp = m.src.data.get("parallel", {}).get("pp", 1)
    if known(per_stage) and chunks is None:
        if isinstance(layers, int) and layers % (pp * per_stage) == 0:  # type: ignore[operator]
            chunks = layers // (pp * per_stage)  # type: ignore[operator]
            dest = "num_layers_per_virtual_pipeline_stage"
        else:
            raise m.error("num_layers_per_virtual_pipeline_stage", per_stage,
                          f"a divisor of --num-layers / --pipeline-model-parallel-size "
                          f"({layers} / {pp}); Megatron asserts it")
    if known(chunks) and chunks > 1:  # type: ignore[operator]
        m.put(field, chunks, dest)
        m.put("parallel.pipeline_schedule", "interleaved", dest)


def _recompute(m: _Map) -> None:
    c = "parallel.checkpointing"
    if m.flag("checkpoint_activations"):  # Megatron before 2022 and Megatron-DeepSpeed
        m.put(f"{c}.granularity", "full", "checkpoint_activations")
        m.take("checkpoint_num_layers", f"{c}.every_k_layers",
               m.integer("checkpoint_num_layers", f"{c}.every_k_layers"))
        return
    granularity = m.choice("recompute_granularity", f"{c}.granularity",
                           {"full": "full", "selective": "selective"})
    if granularity is None and m.flag("recompute_activations"):
        m.put(f"{c}.granularity", "selective", "recompute_activations")
        return
    m.take("recompute_granularity", f"{c}.granularity", granularity, "none")
    if granularity != "full":
        return
    method = m.choice("recompute_method", f"{c}.every_k_layers",
                      {"uniform": "uniform", "block": "block"})
    if method == "uniform":
        m.take("recompute_num_layers", f"{c}.every_k_layers",
               m.integer("recompute_num_layers", f"{c}.every_k_layers"), 1)
    elif method == "block":
        unresolved_finding(
            m.src, m.key("recompute_method"), f"{c}.every_k_layers",
            "block recomputes only the first --recompute-num-layers blocks of each pipeline "
            "stage, which sapper's memory model (one block in k) does not represent",
            "check the memory with the uniform method, or measure it",
        )


def _hardware(m: _Map) -> None:
    h = "hardware"
    launch = m.launch
    if m.dump:
        world = m.integer("world_size", f"{h}.num_gpus")
        m.take("world_size", f"{h}.num_gpus", world)
        return
    name = launch.launcher_name
    if launch.program is None:
        return
    if name is None or (name == "python" and launch.wrapped is None):
        if name == "python":
            m.put(f"{h}.num_gpus", 1, "", origin=f"python {launch.program} (one process)")
        return
    if name == "python":  # srun/mpirun python ...: the scheduler starts the processes
        unresolved_finding(
            m.src, launch.wrapped or "", f"{h}.num_gpus",
            f"{launch.wrapped} starts the processes, as many as the job's allocation",
            "pass --gpus (and --gpus-per-node) on sapper's command line")
        return
    per_node_key = next((k for k in launch.launcher if k in
                         ("--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num-gpus")),
                        None)
    nodes_key = next((k for k in launch.launcher if k in
                      ("--nnodes", "--num_nodes", "--num-nodes")), None)
    torchrun = name == "torchrun"
    for key, field, default in (
        (per_node_key, f"{h}.gpus_per_node", 1 if torchrun else None),
        (nodes_key, f"{h}.nodes", 1 if torchrun else None),
    ):
        if key is None:
            if default is None:
                why = ("deepspeed without --num_gpus starts one process per visible GPU"
                       if field.endswith("gpus_per_node") else
                       "deepspeed without --num_nodes runs on every host of its hostfile "
                       "(--hostfile, by default /job/hostfile)")
                unresolved_finding(m.src, name, field, why,
                                   "pass --gpus-per-node / --nodes on sapper's command line")
            else:
                m.src.set(field, default, origin=f"{name} ({field.split('.')[1]} default "
                          f"{default})")
            continue
        word = launch.launcher[key]
        if not word.known:
            why = "; ".join(launch.reasons.get(n, n) for n in word.unknown)
            unresolved_finding(
                m.src, f"{name} {key}", field,
                f"{word.shown} is not known from the file ({why})",
                "pass --gpus-per-node / --nodes on sapper's command line")
            continue
        if not re.fullmatch(r"\d{1,7}", word.text):
            elastic = key == "--nnodes" and re.fullmatch(r"\d+:\d+", word.text)
            if elastic or word.text in ("gpu", "auto", "cpu", "xpu"):
                why = (f"{word.text} is an elastic range: the node count is decided at "
                       "launch" if elastic else f"{word.text}: one process per device "
                       "visible at launch")
                unresolved_finding(m.src, f"{name} {key}", field, why,
                                   "pass --gpus-per-node / --nodes on sapper's command line")
                continue
            raise InputError("invalid value", file=m.file, field=f"{name} {key}",
                             value=word.shown, expected="a whole number ≥ 1")
        via = launch.origins.get(word.via[0]) if word.via else None
        m.src.set(field, int(word.text), origin=f"{name} {key}" + (f" ({via})" if via else ""))


def _data(m: _Map) -> None:
    arg = m.arg("data_path")
    if arg is None or not arg.values:
        return
    field = "data.path"
    unknown = [n for w in arg.values for n in w.unknown]
    if unknown:
        m.unknown("data_path", field, list(dict.fromkeys(unknown)))
        return
    words = [w.text for w in arg.values]
    paths = words if len(words) == 1 else words[1::2]
    if len(paths) != 1:
        unresolved_finding(m.src, arg.key, field,
                           f"a blend of {len(paths)} datasets; sapper scans one",
                           "pass --dataset with one of the datasets' .bin files")
        return
    prefix = Path(paths[0]).expanduser()
    if not prefix.is_absolute():
        prefix = m.base / prefix
    data = prefix.with_name(prefix.name + ".bin")
    try:
        there = data.is_file()
    except (OSError, ValueError):
        there = False
    if not there:
        unresolved_finding(m.src, arg.key, field,
                           f"{clip(str(data))} is not on this machine", _NO_FILE_FIX)
        return
    m.put(field, str(data), "data_path")
    m.put("data.format", "megatron", "data_path")


def _inline_deepspeed(m: _Map, name: str, text: Word) -> bool:
    """The DeepSpeed config the script writes itself (``cat <<EOT > $config_json``),
    read as the DeepSpeed reader reads a file; the launch's own arguments win where both
    set a value. False when its text is not known (an unset variable in it) or not
    JSON."""
    from sapper.plan.readers.deepspeed import read_deepspeed_dict
    from sapper.plan.sources import parse_json_text

    label = f"{m.file}: the DeepSpeed config written to {clip(name)}"
    if not text.known:
        return False
    try:
        raw = parse_json_text(text.text, label)
    except InputError:
        return False
    if not isinstance(raw, dict):
        return False
    ds = read_deepspeed_dict(raw, label)
    from sapper.plan.sources import leaves, set_path

    for path, value in leaves(ds.data).items():
        if path not in m.src.origin:
            set_path(m.src.data, path, value)
            m.src.origin[path] = f"{ds.origin.get(path, path)} (in the heredoc for {name})"
    m.src.findings.extend(ds.findings)
    m.src.unresolved.extend(u for u in ds.unresolved if u not in m.src.unresolved)
    return True


def _deepspeed_config(m: _Map, deepspeed: bool) -> None:
    if not deepspeed:
        return
    arg = m.arg("deepspeed_config") or m.arg("deepscale_config")
    fields = ["clipping.max_norm", "parallel.zero_stage"]
    if m.flag("fp16"):
        fields.insert(1, "precision.loss_scaling.mode")
    why = None
    written = m.launch.files.get(arg.values[0].text) if arg and arg.values else None
    if written is not None and _inline_deepspeed(m, arg.values[0].shown, written):
        return
    if arg is None or not arg.values:
        why = "--deepspeed without --deepspeed_config"
    elif not arg.values[0].known:
        word = arg.values[0]
        why = (f"{word.shown} is not known from the file "
               f"({'; '.join(m.launch.reasons.get(n, n) for n in word.unknown)})")
    else:
        path = Path(arg.values[0].text).expanduser()
        if not path.is_absolute():
            path = m.base / path
        try:
            there = path.is_file()
        except (OSError, ValueError):
            there = False
        if there:
            m.src.refs["deepspeed"] = path
            return
        why = f"{clip(str(path))} is not on this machine (or is written at launch)"
    for field in fields:
        unresolved_finding(
            m.src, m.key("deepspeed_config") if arg else "--deepspeed", field,
            f"the DeepSpeed config decides {field} and {why}",
            "pass the DeepSpeed JSON with --deepspeed ds.json",
        )
