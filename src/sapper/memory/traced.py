"""Traced estimator: run one real training step on fake tensors and count every byte.

The model is the real one — built by transformers from an HF config (or from the Plan's
architecture, or any ``nn.Module`` factory) — but under ``FakeTensorMode`` every tensor
is shape-only: nothing is allocated and no arithmetic runs, yet every op the step issues
goes through :class:`~sapper.memory.tracker.LiveBytes`. One warm-up step creates the
optimizer states; the second step is measured. The result is exact for the code that
runs (the CPU kernels: a GPU may choose other attention kernels, and CUDA dropout keeps
a bool mask where the CPU keeps a noise tensor), for a single device: tensor, pipeline
and ZeRO sharding are the analytic estimator's job.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sapper.errors import InputError, SapperError
from sapper.memory.allocator import CachingAllocator
from sapper.memory.fake_moe import fake_moe_support, prepare_experts
from sapper.memory.tracker import LiveBytes
from sapper.model.optimizers import IMPL_KIND

__all__ = [
    "StepConfig",
    "TracedMemory",
    "build_optimizer",
    "hf_config_from_plan",
    "run_step",
    "step_config_from_plan",
    "trace_hf_config",
    "trace_plan",
    "trace_step",
]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepConfig:
    """How one training step runs (the knobs that change its memory)."""

    micro_batch: int
    seq_len: int
    optimizer: str = "adamw"  # adamw / adam / sgd / adafactor
    autocast: str | None = None  # None (fp32) / bf16 / fp16: torch.autocast over fp32 weights
    weights: str = "fp32"  # fp32 / bf16 / fp16: the dtype the model itself is stored in
    master: bool = False  # low-precision weights with an fp32 master copy in the optimizer
    checkpointing: bool = False
    foreach: bool = True  # PyTorch's default on GPUs; False = per-tensor loop
    fused: bool = False
    momentum: float = 0.9
    weight_decay: float = 0.01


@dataclass
class TracedMemory:
    """Exact live-tensor bytes of one training step (per category at the peak)."""

    peak_bytes: int
    peak_phase: str
    breakdown: dict[str, int]
    phases: dict[str, dict[str, int]]  # phase -> categories at that phase's peak
    num_params: int
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: the step replayed under the CUDA caching allocator's rules (memory/allocator.py):
    #: peak blocks handed out (``max_memory_allocated``: requests rounded to 512 bytes)
    #: and peak segments held (``max_memory_reserved``)
    cuda_allocated_bytes: int = 0
    cuda_reserved_bytes: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "breakdown": self.breakdown,
            "phases": self.phases,
            "num_params": self.num_params,
            "cuda_allocated_bytes": self.cuda_allocated_bytes,
            "cuda_reserved_bytes": self.cuda_reserved_bytes,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
        }


class MasterWeights:
    """The mixed-precision optimizer of DeepSpeed and Megatron, in its simplest form:
    fp32 master copies of low-precision weights; each step upcasts the gradients, steps
    the master and copies it back into the model."""

    def __init__(self, params: list[torch.Tensor], make: Callable[[list[Any]], Any]) -> None:
        self.params = params
        self.master = [p.detach().float().requires_grad_(True) for p in params]
        self.inner = make(self.master)

    @property
    def state(self) -> dict[Any, Any]:
        return self.inner.state

    def step(self) -> None:
        for m, p in zip(self.master, self.params, strict=True):
            m.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        with torch.no_grad():
            for m, p in zip(self.master, self.params, strict=True):
                p.copy_(m)
                m.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def build_optimizer(model: nn.Module, cfg: StepConfig) -> Any:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.master:
        return MasterWeights(params, lambda ps: _make_optimizer(ps, cfg))
    return _make_optimizer(params, cfg)


def _make_optimizer(params: list[Any], cfg: StepConfig) -> torch.optim.Optimizer:
    kind = cfg.optimizer.lower()
    impl: dict[str, Any] = {"fused": True} if cfg.fused else {"foreach": cfg.foreach}
    if kind in ("adamw", "adam"):
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-4, weight_decay=cfg.weight_decay, **impl)
    if kind == "sgd":
        return torch.optim.SGD(
            params, lr=1e-3, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **impl
        )
    if kind == "adafactor" and hasattr(torch.optim, "Adafactor"):
        return torch.optim.Adafactor(params, lr=1e-2, foreach=cfg.foreach)
    raise InputError(
        "optimizer not supported by the traced estimator",
        field="optimizer.type",
        value=cfg.optimizer,
        expected="adamw, adam, sgd or adafactor",
    )


def run_step(
    model: nn.Module,
    opt: Any,
    input_ids: torch.Tensor,
    cfg: StepConfig,
    tracker: LiveBytes | None = None,
) -> None:
    """One training step as a typical loop writes it: forward with the loss inside the
    autocast region, backward, optimizer step, ``zero_grad(set_to_none=True)``. The KV
    cache is off (a training forward that fills one keeps copies of every K and V)."""
    phase = tracker.set_phase if tracker else (lambda _p: None)
    amp = (
        torch.autocast(input_ids.device.type, dtype=_DTYPES[cfg.autocast])
        if cfg.autocast
        else contextlib.nullcontext()
    )
    phase("forward")
    with amp:
        loss = model(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    phase("backward")
    loss.backward()
    del loss
    phase("optimizer")
    opt.step()
    opt.zero_grad(set_to_none=True)
    phase("done")


@contextlib.contextmanager
def _tagging(tracker: LiveBytes, model: nn.Module) -> Iterator[None]:
    """Tag saved tensors as activations and accumulated gradients as grads."""
    handles = [
        p.register_post_accumulate_grad_hook(lambda p: tracker.tag(p.grad, "grads"))
        for p in model.parameters()
        if p.requires_grad
    ]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            tracker.tag(t, "activations", only_from=("temporaries",))
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _real_code_path() -> Iterator[None]:
    """Let transformers take the path it takes on real data.

    transformers looks at ``position_ids`` to detect packed sequences; fake tensors have
    no values, so it would assume packing and build an explicit mask per layer. The step
    feeds ordinary sequences (positions 0..s-1), for which the answer is "not packed".
    """
    try:
        from transformers import masking_utils
    except ImportError:  # a plain nn.Module factory needs no transformers
        yield
        return
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda *_a, **_k: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def trace_step(
    build: Callable[[], nn.Module], cfg: StepConfig, vocab_size: int, *, fake: bool = True
) -> TracedMemory:
    """Build the model (under fake tensors unless ``fake=False``) and measure one
    steady-state training step."""
    import logging

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)  # a failing op is reported once, below
    try:
        return _trace(build, cfg, vocab_size, fake)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        if not fake:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SapperError(
            f"the traced estimator cannot run this model on fake tensors ({first}); "
            "use the analytic estimate"
        ) from None
    finally:
        fake_log.setLevel(level)


def _trace(
    build: Callable[[], nn.Module], cfg: StepConfig, vocab_size: int, fake: bool
) -> TracedMemory:
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    mode = FakeTensorMode(allow_non_fake_inputs=False) if fake else contextlib.nullcontext()
    moe = fake_moe_support() if fake else contextlib.nullcontext()
    with mode, moe, _real_code_path():
        default = torch.get_default_dtype()
        if cfg.weights != "fp32":  # build in the weights' dtype (no fp32 copy first)
            torch.set_default_dtype(_DTYPES[cfg.weights])
        try:
            model = build()
        finally:
            torch.set_default_dtype(default)
        model.train()
        moe_notes = prepare_experts(model) if fake else []
        if cfg.checkpointing:
            _enable_checkpointing(model)
        opt = build_optimizer(model, cfg)
        ids = torch.randint(0, vocab_size, (cfg.micro_batch, cfg.seq_len))
        run_step(model, opt, ids, cfg)  # warm-up: creates the optimizer states
        allocator = CachingAllocator()
        tracker = LiveBytes(allocator)
        for p in model.parameters():
            tracker.track(p, "params")
        for b in model.buffers():
            tracker.track(b, "params")
        for m in getattr(opt, "master", ()):
            tracker.track(m, "optimizer")
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    tracker.track(v, "optimizer")
        tracker.track(ids, "activations")
        with tracker, _tagging(tracker, model):
            run_step(model, opt, ids, cfg, tracker)
    phases = {ph: cats for ph, (_, cats) in tracker.phases.items() if ph in _PHASES}
    num_params = sum(p.numel() for p in model.parameters())
    return TracedMemory(
        peak_bytes=tracker.peak,
        peak_phase=tracker.peak_phase,
        breakdown=tracker.peak_breakdown,
        phases=phases,
        num_params=num_params,
        seconds=time.perf_counter() - start,
        cuda_allocated_bytes=allocator.peak_allocated,
        cuda_reserved_bytes=allocator.peak_reserved,
        notes=["CPU kernels on fake tensors; one device (no TP/PP/ZeRO sharding).", *moe_notes],
    )


_PHASES = ("forward", "backward", "optimizer")


def _enable_checkpointing(model: nn.Module) -> None:
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise InputError(
            "this model has no gradient_checkpointing_enable()",
            field="parallel.checkpointing",
            expected="a transformers model, or a factory that sets up checkpointing itself",
        )
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def trace_hf_config(config: Any, cfg: StepConfig, *, fake: bool = True) -> TracedMemory:
    """Trace a causal LM built from a transformers config (object or dict)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(config, dict):
        data = dict(config)
        model_type = data.pop("model_type", None)
        if model_type is None:
            raise InputError("the HF config has no model_type", field="model_type")
        config = AutoConfig.for_model(model_type, **data)

    def build() -> nn.Module:
        # The step's weights dtype (set as the default around the build), not the dtype a
        # config.json records its checkpoint in (OPT's says float16).
        return AutoModelForCausalLM.from_config(config, dtype=torch.get_default_dtype())

    return trace_step(build, cfg, config.vocab_size, fake=fake)


#: transformers model types the Plan maps onto, and the config keys each one reads.
_LLAMA_LIKE = ("llama", "mistral", "qwen2")


def _infer_family(plan_model: Any) -> str:
    fam = (plan_model.family or "").lower()
    if fam in (*_LLAMA_LIKE, "gpt2", "mixtral", "gpt_neox"):
        return fam
    if plan_model.is_moe:
        return "mixtral"
    if plan_model.norm_type.value == "layernorm" and plan_model.position_encoding.value in (
        "learned",
        "none",
    ):
        return "gpt2"
    if plan_model.parallel_residual:
        return "gpt_neox"
    return "llama"


def hf_config_from_plan(plan: Any) -> dict[str, Any]:
    """A transformers config (as a dict with ``model_type``) for the Plan's model."""
    m = plan.model
    if m is None:
        raise InputError("the plan has no model", field="model")
    fam = _infer_family(m)
    act = m.hidden_act or ("silu" if m.activation.gated else "gelu_new")
    if fam == "gpt2":
        return {
            "model_type": "gpt2",
            "n_embd": m.hidden_size,
            "n_layer": m.num_layers,
            "n_head": m.num_heads,
            "n_inner": m.ffn_size,
            "vocab_size": m.vocab_size,
            "n_positions": m.max_position_embeddings or plan.batch.seq_len or 1024,
            "activation_function": act,
            "resid_pdrop": m.dropout_at("hidden"),
            "embd_pdrop": m.dropout_at("embedding"),
            "attn_pdrop": m.dropout_at("attention"),
            "tie_word_embeddings": m.tied_embeddings,
            "attn_implementation": m.attention_impl.value,
        }
    common = {
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.kv_heads,
        "head_dim": m.head_size,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings or plan.batch.seq_len or 4096,
        "hidden_act": act,
        "tie_word_embeddings": m.tied_embeddings,
        "attention_dropout": m.dropout_at("attention"),
        "attn_implementation": m.attention_impl.value,
    }
    if fam == "mixtral":
        return {
            "model_type": "mixtral",
            **common,
            "intermediate_size": m.moe_ffn_hidden_size or m.ffn_size,
            "num_local_experts": m.num_experts,
            "num_experts_per_tok": m.experts_top_k,
        }
    if fam == "gpt_neox":
        common.pop("num_key_value_heads")
        common.pop("head_dim")
        return {"model_type": "gpt_neox", **common, "use_parallel_residual": True}
    return {
        "model_type": fam,
        **common,
        "attention_bias": m.attention_bias,
        **({"mlp_bias": m.mlp_bias} if fam == "llama" else {}),
    }


def step_config_from_plan(plan: Any) -> StepConfig:
    """How the Plan's step runs, in the traced estimator's terms."""
    p = plan.precision
    b = plan.batch
    if b.micro_batch_size is None or b.seq_len is None:
        field_ = "batch.micro_batch_size" if b.micro_batch_size is None else "batch.seq_len"
        raise InputError("missing value: needed to trace a step", field=field_)
    low = p.dtype in ("bf16", "fp16")
    # optimizer.impl as the memory model reads it (auto: multi-tensor, as on CUDA)
    foreach, fused = IMPL_KIND.get(
        plan.optimizer.impl, (not plan.optimizer.fused, plan.optimizer.fused)
    )
    autocast = p.dtype if (low and p.autocast) else None
    weights = p.dtype if (low and not p.autocast) else "fp32"
    master = low and not p.autocast and p.master_weights == "fp32"
    return StepConfig(
        micro_batch=b.micro_batch_size,
        seq_len=b.seq_len,
        optimizer=plan.optimizer.type,
        autocast=autocast,
        weights=weights,
        master=master,
        checkpointing=plan.parallel.checkpointing.granularity == "full",
        foreach=foreach,
        fused=fused or master,
        momentum=plan.optimizer.momentum,
        weight_decay=plan.optimizer.weight_decay,
    )


def trace_plan(plan: Any, hf_config: Path | None = None) -> TracedMemory:
    """Trace the model for one step on one device, with the Plan's batch, precision,
    optimizer and checkpointing. ``hf_config``: the user's own ``config.json``, traced as
    it is (its family, dropout sites, biases, position table: what the Plan's fields
    cannot all say); without it, a model transformers builds from the Plan's
    architecture fields, and the notes say so."""
    cfg = step_config_from_plan(plan)
    if hf_config is not None:
        from transformers import AutoConfig

        options: dict[str, Any] = {}
        if plan.model is not None and "attention_impl" in plan.model.model_fields_set:
            options["attn_implementation"] = plan.model.attention_impl.value
        try:
            # never the repository's own code (and never transformers' prompt for it)
            config = AutoConfig.from_pretrained(
                str(hf_config), trust_remote_code=False, **options
            )
        except (OSError, ValueError, KeyError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SapperError(
                f"transformers cannot build the model of {hf_config} ({first})"
            ) from None
        result = trace_hf_config(config, cfg)
        result.notes.append(
            f"Traced the model {hf_config.name} describes, as transformers builds it."
        )
    else:
        built = hf_config_from_plan(plan)
        result = trace_hf_config(built, cfg)
        result.notes.append(
            f"Traced a {built['model_type']} model rebuilt from the plan's architecture "
            "fields; give the model's config.json (--model) to trace the model itself."
        )
    par = plan.parallel
    if par.tp * par.pp * par.cp > 1 or par.zero_stage or par.ep > 1:
        result.notes.append(
            "The layout (TP/PP/CP/EP, ZeRO) is not traced: this is one unsharded replica."
        )
    return result
