"""Published numbers the estimator must reproduce (issue 3, item 6)."""

from __future__ import annotations

import pytest
from memory_plans import make_plan

from sapper.memory import estimate
from sapper.memory.activations import block_activations
from sapper.memory.inputs import shape_from_plan

STATES = ("params", "grads", "optimizer")


def _states(plan) -> int:  # type: ignore[no-untyped-def]
    est = estimate(plan)
    return max(sum(s.phases["optimizer"][k] for k in STATES) for s in est.stages)


def test_seed_7b_adam_mixed_precision_is_112_gb() -> None:
    """Seed §3.1: fp32 master + m + v, 16-bit weights and grads = 16 B/param."""
    model = {**make_plan().model.model_dump(), "num_params": 7_000_000_000}
    plan = make_plan(model, hardware={"gpu": "A100-80GB", "num_gpus": 1})
    assert _states(plan) == pytest.approx(112e9, rel=1e-9)
    assert estimate(plan).fits is False  # more than one 80 GB GPU before activations


@pytest.mark.parametrize(
    ("stage", "gb"),
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)],
)
def test_zero_paper_table_1(stage: int, gb: float) -> None:
    """Rajbhandari et al. 2020, Table 1: Ψ = 7.5B, N_d = 64, K = 12."""
    model = {**make_plan().model.model_dump(), "num_params": 7_500_000_000}
    plan = make_plan(
        model,
        parallel={"zero_stage": stage},
        hardware={"gpu": "A100-80GB", "num_gpus": 64},
    )
    # the table gives three significant digits
    assert float(f"{_states(plan) / 1e9:.3g}") == gb


# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
# Models"), §4: per-layer activation bytes with 16-bit activations, dropout on, MHA and a
# 4h GELU MLP (GPT-3 175B shapes: a = 96, h = 12288, s = 2048).
S, B, H, A = 2048, 1, 12288, 96
KORTHIKANTI = {
    "family": "gpt2",
    "hidden_size": H,
    "num_layers": 96,
    "num_heads": A,
    "vocab_size": 51200,
    "activation": "gelu",
    "norm_type": "layernorm",
    "position_encoding": "learned",
    "max_position_embeddings": S,
    "attention_impl": "eager",
    "dropout": 0.1,
    "implementation": "megatron",
}


def _layer(t: int = 1, sp: bool = False, ckpt: str = "none") -> int:
    plan = make_plan(
        KORTHIKANTI,
        precision={"dtype": "fp16", "master_weights": "fp32"},
        batch={"micro_batch_size": B, "seq_len": S},
        parallel={"tp": t, "sequence_parallel": sp},
    )
    return block_activations(shape_from_plan(plan)).kept(ckpt)


def test_korthikanti_no_parallelism() -> None:
    assert _layer() == pytest.approx(S * B * H * (34 + 5 * A * S / H), rel=1e-3)


def test_korthikanti_tensor_parallel() -> None:
    t = 8
    want = S * B * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert _layer(t) == pytest.approx(want, rel=1e-3)


def test_korthikanti_tensor_and_sequence_parallel() -> None:
    t = 8
    assert _layer(t, sp=True) == pytest.approx(S * B * H / t * (34 + 5 * A * S / H), rel=1e-3)


def test_korthikanti_selective_recompute_with_sp() -> None:
    t = 8
    assert _layer(t, sp=True, ckpt="selective") == pytest.approx(S * B * H * 34 / t, rel=1e-3)


def test_korthikanti_full_recompute() -> None:
    assert _layer(ckpt="full") == 2 * S * B * H
    assert _layer(8, sp=True, ckpt="full") == 2 * S * B * H // 8
