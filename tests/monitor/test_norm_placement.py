"""Norm placement from the residual structure: every common block style, built for real
(HF families from configs, torch's transformer layers, hand-written blocks), classified
from one traced training forward; and R101 on a real deep Post-LN run."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers
from tinytrain import gpt2, llama, train
from torch import nn

from sapper.monitor.residual import ResidualTracer
from sapper.monitor.structure import StructureProbe

transformers.logging.set_verbosity_error()

H = 32
IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def _guard(part: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)  # tests see the tracer's errors


def placement(model: nn.Module, *args: Any, **kwargs: Any) -> str:
    probe = StructureProbe(model, _guard)
    model.train()
    probe.arm()
    model(*args, **kwargs)
    probe.disarm()
    return probe.result()[0]


# ---- HF families, built from configs ------------------------------------------------


def _hf(config: str, model: str, **cfg: Any) -> Callable[[], str]:
    def run() -> str:
        torch.manual_seed(0)
        built = getattr(transformers, model)(getattr(transformers, config)(vocab_size=64, **cfg))
        return placement(built, input_ids=IDS)

    return run


_LLAMA_LIKE = dict(
    hidden_size=H,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
)
_BERT_LIKE = dict(hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
_OPT = dict(
    hidden_size=H, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2, word_embed_proj_dim=H
)
_FALCON = dict(hidden_size=H, num_hidden_layers=2, num_attention_heads=2)

HF_CASES: dict[str, tuple[Callable[[], str], str]] = {
    "gpt2": (_hf("GPT2Config", "GPT2LMHeadModel", n_embd=H, n_layer=2, n_head=2), "pre"),
    "llama": (_hf("LlamaConfig", "LlamaForCausalLM", **_LLAMA_LIKE), "pre"),
    "qwen2": (_hf("Qwen2Config", "Qwen2ForCausalLM", **_LLAMA_LIKE), "pre"),
    "gemma2-sandwich": (
        _hf("Gemma2Config", "Gemma2ForCausalLM", head_dim=16, **_LLAMA_LIKE),
        "sandwich",
    ),
    "qwen3-qk-norm": (_hf("Qwen3Config", "Qwen3ForCausalLM", head_dim=16, **_LLAMA_LIKE), "pre"),
    "mixtral-moe": (
        _hf(
            "MixtralConfig",
            "MixtralForCausalLM",
            num_local_experts=2,
            num_experts_per_tok=1,
            **_LLAMA_LIKE,
        ),
        "pre",
    ),
    "cohere-parallel": (_hf("CohereConfig", "CohereForCausalLM", **_LLAMA_LIKE), "pre"),
    "gemma3-sandwich": (
        _hf("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=16, **_LLAMA_LIKE),
        "sandwich",
    ),
    "olmo2-norm-after-branch": (_hf("Olmo2Config", "Olmo2ForCausalLM", **_LLAMA_LIKE), "res-post"),
    "bert": (_hf("BertConfig", "BertLMHeadModel", is_decoder=True, **_BERT_LIKE), "post"),
    "roberta": (_hf("RobertaConfig", "RobertaForMaskedLM", **_BERT_LIKE), "post"),
    "electra": (
        _hf("ElectraConfig", "ElectraForMaskedLM", embedding_size=H, **_BERT_LIKE),
        "post",
    ),
    "distilbert": (
        _hf(
            "DistilBertConfig", "DistilBertForMaskedLM", dim=H, hidden_dim=64, n_layers=2, n_heads=2
        ),
        "post",
    ),
    "opt": (_hf("OPTConfig", "OPTForCausalLM", **_OPT), "pre"),
    "opt-350m-post": (
        _hf("OPTConfig", "OPTForCausalLM", do_layer_norm_before=False, **_OPT),
        "post",
    ),
    "falcon-parallel": (
        _hf("FalconConfig", "FalconForCausalLM", parallel_attn=True, **_FALCON),
        "pre",
    ),
    "falcon-sequential": (
        _hf("FalconConfig", "FalconForCausalLM", parallel_attn=False, **_FALCON),
        "pre",
    ),
    "neox-parallel-residual": (
        _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", use_parallel_residual=True, **_BERT_LIKE),
        "pre",
    ),
    "neox-sequential": (
        _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", use_parallel_residual=False, **_BERT_LIKE),
        "pre",
    ),
    "phi-parallel": (_hf("PhiConfig", "PhiForCausalLM", **_BERT_LIKE), "pre"),
    "gptj-parallel": (
        _hf("GPTJConfig", "GPTJForCausalLM", n_embd=H, n_layer=2, n_head=2, rotary_dim=8),
        "pre",
    ),
    "bloom": (_hf("BloomConfig", "BloomForCausalLM", hidden_size=H, n_layer=2, n_head=2), "pre"),
    "t5-encoder": (
        _hf("T5Config", "T5EncoderModel", d_model=H, d_ff=64, num_layers=2, num_heads=2, d_kv=16),
        "pre",
    ),
}


# ---- torch's layers -----------------------------------------------------------------


def _encoder(norm_first: bool) -> Callable[[], str]:
    def run() -> str:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(H, 2, 64, batch_first=True, norm_first=norm_first)
        enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        return placement(enc, torch.randn(2, 8, H))

    return run


def _decoder(norm_first: bool) -> Callable[[], str]:
    def run() -> str:
        torch.manual_seed(0)
        layer = nn.TransformerDecoderLayer(H, 2, 64, batch_first=True, norm_first=norm_first)
        dec = nn.TransformerDecoder(layer, 2)
        return placement(dec, torch.randn(2, 8, H), torch.randn(2, 5, H))

    return run


# ---- hand-written blocks ------------------------------------------------------------


class NanoLayerNorm(nn.Module):
    """nanoGPT's LayerNorm (optional bias), through F.layer_norm."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class NanoAttention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, 2, c // 2).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


def _mlp(dim: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))


class NanoBlock(nn.Module):
    """nanoGPT's Block: Pre-LN."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln_1, self.attn = NanoLayerNorm(dim), NanoAttention(dim)
        self.ln_2, self.mlp = NanoLayerNorm(dim), _mlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class MHABlock(nn.Module):
    """nn.MultiheadAttention (its out_proj is never called as a module) in a Post-LN,
    Pre-LN or sandwich block."""

    def __init__(self, dim: int, style: str) -> None:
        super().__init__()
        self.style = style
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True, dropout=0.1)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ln3, self.ln4 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp, self.drop = _mlp(dim), nn.Dropout(0.1)

    def _sa(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.attn(x, x, x, need_weights=False)[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "post":
            x = self.ln1(x + self._sa(x))
            return self.ln2(x + self.drop(self.mlp(x)))
        if self.style == "pre":
            x = x + self._sa(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = x + self.ln3(self._sa(self.ln1(x)))  # sandwich
        return x + self.ln4(self.mlp(self.ln2(x)))


class InlineNormBlock(nn.Module):
    """Norms written out in the forward, no norm module: RMS (Pre-LN) or LayerNorm
    (Post-LN), with a residual scale."""

    def __init__(self, dim: int, style: str) -> None:
        super().__init__()
        self.style, self.attn, self.mlp = style, NanoAttention(dim), _mlp(dim)
        self.g = nn.Parameter(torch.ones(dim))

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return self.g * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x)

    def _ln(self, x: torch.Tensor) -> torch.Tensor:
        c = x - x.mean(-1, keepdim=True)
        return c / torch.sqrt(c.var(-1, keepdim=True, unbiased=False) + 1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "pre":
            x = x + self.attn(self._rms(x))
            return x + self.mlp(self._rms(x))
        x = self._ln(0.5 * x + self.attn(x))  # DeepNorm-like: scaled residual, Post-LN
        return self._ln(0.5 * x + self.mlp(x))


class ParallelBlock(nn.Module):
    """GPT-NeoX's parallel residual: x + attn(ln1(x)) + mlp(ln2(x))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.mlp = NanoAttention(dim), _mlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.ln1(x)) + self.mlp(self.ln2(x))


class NoNormBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = _mlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class Stack(nn.Module):
    def __init__(self, make: Callable[[], nn.Module], layers: int = 2) -> None:
        super().__init__()
        self.h = nn.ModuleList(make() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return x


def _stack(make: Callable[[], nn.Module]) -> Callable[[], str]:
    def run() -> str:
        torch.manual_seed(0)
        return placement(Stack(make), torch.randn(2, 8, H))

    return run


BLOCK_CASES: dict[str, tuple[Callable[[], str], str]] = {
    "torch-encoder-norm-first": (_encoder(True), "pre"),
    "torch-encoder-post": (_encoder(False), "post"),
    "torch-decoder-norm-first": (_decoder(True), "pre"),
    "torch-decoder-post": (_decoder(False), "post"),
    "nanogpt": (_stack(lambda: NanoBlock(H)), "pre"),
    "mha-post": (_stack(lambda: MHABlock(H, "post")), "post"),
    "mha-pre": (_stack(lambda: MHABlock(H, "pre")), "pre"),
    "mha-sandwich": (_stack(lambda: MHABlock(H, "sandwich")), "sandwich"),
    "inline-rms-pre": (_stack(lambda: InlineNormBlock(H, "pre")), "pre"),
    "inline-layernorm-post": (_stack(lambda: InlineNormBlock(H, "post")), "post"),
    "parallel-residual": (_stack(lambda: ParallelBlock(H)), "pre"),
    "no-norm": (_stack(lambda: NoNormBlock(H)), "none"),
}

CASES = {**HF_CASES, **BLOCK_CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_placement_is_read_from_the_residual_structure(name: str) -> None:
    run, expected = CASES[name]
    assert run() == expected


def test_tracing_leaves_the_block_as_it_was() -> None:
    torch.manual_seed(0)
    model = Stack(lambda: MHABlock(H, "post"))
    x = torch.randn(2, 8, H)
    model.eval()  # dropout off: the same values with and without the trace
    before = model(x)
    probe = StructureProbe(model, _guard)
    probe.arm()
    traced = model(x)
    probe.disarm()
    assert torch.equal(before, traced)
    assert "forward" not in model.h[0].__dict__ and probe.placement == "post"
    assert not probe.armed


def test_a_failing_tracer_gives_unknown_and_training_goes_on(monkeypatch) -> None:
    def broken(self, *args):  # type: ignore[no-untyped-def]
        raise RuntimeError("tracer bug")

    monkeypatch.setattr(ResidualTracer, "_record", broken)
    torch.manual_seed(0)
    model = Stack(lambda: MHABlock(H, "post"))
    assert placement(model, torch.randn(2, 8, H)) == "unknown"


def test_an_error_in_the_block_leaves_no_tracing_mode_behind() -> None:
    class Raises(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(H, H)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("user bug")

    model = Stack(Raises)
    probe = StructureProbe(model, _guard)
    probe.arm()
    with pytest.raises(ValueError, match="user bug"):
        model(torch.randn(2, 8, H))
    probe.disarm()
    from torch.overrides import _get_current_function_mode_stack

    assert not any(isinstance(m, ResidualTracer) for m in _get_current_function_mode_stack())


# ---- R101 on real training -------------------------------------------------------------


class MHAPostLN(nn.Module):
    """A deep Post-LN language model built from nn.MultiheadAttention blocks."""

    def __init__(self, layers: int = 8, dim: int = H, vocab: int = 256) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(64, dim)
        self.blocks = nn.ModuleList(MHABlock(dim, "post") for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        t = input_ids.shape[1]
        x = self.emb(input_ids) + self.pos(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
        )
        return SimpleNamespace(loss=loss, logits=logits)


#: Steps allowed for R101 (FAST's structure.warmup_probe_steps is 5: the LR of the first
#: six records decides).
R101_WITHIN = 6


def test_deep_postln_mha_without_warmup_gets_r101() -> None:
    run = train(MHAPostLN(), steps=10)
    assert run.error is None
    placement_found = next(f for f in run.monitor.findings if f.code == "R102")
    assert "post-norm" in placement_found.message
    step = run.first_step("R101")
    assert step is not None and step <= R101_WITHIN, [f.message for f in run.monitor.findings]


def test_deep_postln_mha_with_warmup_is_quiet() -> None:
    run = train(MHAPostLN(), steps=10, schedule=lambda s: min(1.0, (s + 1) / 20))
    assert "R101" not in run.codes()


@pytest.mark.parametrize("make", [lambda: gpt2(layers=8), lambda: llama(layers=8)])
def test_deep_preln_without_warmup_is_quiet(make: Callable[[], nn.Module]) -> None:
    run = train(make(), steps=10)
    assert "R101" not in run.codes()
    assert any(f.code == "R102" and "pre-norm" in f.message for f in run.monitor.findings)
