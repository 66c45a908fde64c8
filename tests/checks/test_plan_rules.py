"""Edges of the clipping, init, normalization, data and batch rules beyond fires/quiet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sapper.checks import clipping, consistency, data, init, normalization
from sapper.checks.engine import NotEvaluated
from sapper.plan.schema import Plan
from sapper.rules.model import Finding, Severity

LLAMA2_7B: dict[str, Any] = {
    "family": "llama",
    "hidden_size": 4096,
    "num_layers": 32,
    "num_heads": 32,
    "ffn_hidden_size": 11008,
    "activation": "swiglu",
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "position_encoding": "rope",
    "norm_type": "rmsnorm",
}
BERT_LARGE: dict[str, Any] = {
    "hidden_size": 1024,
    "num_layers": 24,
    "num_heads": 16,
    "vocab_size": 30522,
    "norm_placement": "post",
}


def plan(**sections: Any) -> Plan:
    return Plan.model_validate(sections)


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


def test_planned_throughput_matches_a_published_run() -> None:
    # Llama 2 (Touvron et al. 2023, Table 2): the 7B model took 184,320 A100-80GB GPU-hours
    # for 2.0T tokens at 4096 context: 3,014 tokens/s per GPU. At the assumed 40% MFU the
    # estimate must land in the same range.
    p = plan(
        model=LLAMA2_7B,
        precision={"dtype": "bf16"},
        batch={"seq_len": 4096},
        hardware={"gpu": "A100-80GB"},
    )
    published = 2.0e12 / (184_320 * 3600)
    estimate = data.planned_tokens_per_sec_per_gpu(p)
    assert estimate is not None
    assert 0.75 < estimate / published < 1.25


def test_planned_throughput_needs_model_gpu_and_seq() -> None:
    assert data.planned_tokens_per_sec_per_gpu(plan(model=LLAMA2_7B)) is None
    no_bf16 = plan(
        model=LLAMA2_7B,
        precision={"dtype": "bf16"},
        batch={"seq_len": 2048},
        hardware={"gpu": "V100-32GB"},
    )
    assert data.planned_tokens_per_sec_per_gpu(no_bf16) is None


def test_loader_shared_by_model_parallel_group() -> None:
    sections = {
        "model": LLAMA2_7B,
        "precision": {"dtype": "bf16"},
        "batch": {"seq_len": 4096},
        "hardware": {"gpu": "A100-80GB", "num_gpus": 16},
        "data": {"loader_tokens_per_sec": 5000},
    }
    assert list(data.loader_too_slow(plan(**sections))) == []
    # With tp 4 one loader feeds four GPUs' worth of tokens.
    f = only(list(data.loader_too_slow(plan(**sections, parallel={"tp": 4}))))
    assert "× 4 GPUs per replica" in f.message and f.threshold > 4 * 2500


def test_negative_max_norm_is_refused_by_the_plan() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        plan(clipping={"max_norm": -1.0})


def test_small_threshold_and_none_vs_zero() -> None:
    assert (
        "every step is clipped"
        in only(list(clipping.clip_threshold(plan(clipping={"max_norm": 0.01})))).message
    )
    unset = only(list(clipping.clipping_off(plan())))
    assert "not set" in unset.message and "DeepSpeed" not in unset.message


def test_auto_clipping_is_not_reported_as_off() -> None:
    for key in ("clipping.max_norm", "gradient_clipping"):
        assert list(clipping.clipping_off(plan(unresolved=[key]))) == []


def test_clip_before_unscale_static_scale_and_bf16_quiet() -> None:
    f = only(
        list(
            clipping.clip_before_unscale(
                plan(
                    precision={
                        "dtype": "fp16",
                        "loss_scaling": {"mode": "static", "static_scale": 1024},
                    },
                    clipping={"max_norm": 1.0, "applied": "before_unscale"},
                )
            )
        )
    )
    assert "static loss scale 1024" in f.message and "0.00098" in f.message
    quiet = plan(
        precision={"dtype": "bf16"}, clipping={"max_norm": 1.0, "applied": "before_unscale"}
    )
    assert list(clipping.clip_before_unscale(quiet)) == []


def test_vocab_share_counts_tied_matrix_once() -> None:
    gpt2_small = {
        "hidden_size": 768,
        "num_layers": 12,
        "num_heads": 12,
        "vocab_size": 50257,
        "max_position_embeddings": 1024,
        "tied_embeddings": True,
    }
    vocab, total, share = clipping.vocab_param_share(plan(model=gpt2_small))
    assert vocab == 50257 * 768 and 124e6 < total < 125e6 and 0.30 < share < 0.32


def test_init_gain_bounds() -> None:
    # 0.02 is fine at GPT-2 widths and too large at 16384 (gain 2.56).
    assert list(init.std_vs_width(plan(model={**LLAMA2_7B}, init={"std": 0.02}))) == []
    wide = {**LLAMA2_7B, "hidden_size": 16384, "num_heads": 128}
    f = only(list(init.std_vs_width(plan(model=wide, init={"std": 0.02}))))
    assert f.severity == Severity.WARNING and "2.56" in f.message
    tiny = only(list(init.std_vs_width(plan(model=LLAMA2_7B, init={"std": 0.001}))))
    assert "< 0.2" in tiny.message


def test_residual_rule_needs_an_init_statement() -> None:
    # A plan that says nothing about init is not taken as "unscaled", nor as a pass.
    (unknown,) = init.residual_not_scaled(plan(model=LLAMA2_7B))
    assert isinstance(unknown, NotEvaluated) and unknown.missing == ("init.residual_scaling",)
    f = only(list(init.residual_not_scaled(plan(model=LLAMA2_7B, init={"std": 0.02}))))
    assert "1/√(2·32) = 0.125" in f.message and "std 0.0025" in f.message
    shallow = {**LLAMA2_7B, "num_layers": 4}
    assert list(init.residual_not_scaled(plan(model=shallow, init={"std": 0.02}))) == []


def test_init_rules_skip_checkpoints() -> None:
    wide = {**LLAMA2_7B, "hidden_size": 16384, "num_heads": 128}
    loaded = plan(model=wide, init={"std": 0.02, "from_pretrained": True})
    assert list(init.std_vs_width(loaded)) == []
    assert list(init.residual_not_scaled(loaded)) == []


def test_custom_scale_without_value() -> None:
    f = only(
        list(
            init.residual_scale_mismatch(plan(model=LLAMA2_7B, init={"residual_scaling": "custom"}))
        )
    )
    assert "residual_scale is not set" in f.message


@pytest.mark.parametrize(
    ("layers", "expected"), [(4, None), (6, Severity.WARNING), (12, Severity.ERROR)]
)
def test_post_ln_without_warmup_by_depth(layers: int, expected: Severity | None) -> None:
    p = plan(model={**BERT_LARGE, "num_layers": layers}, schedule={"warmup_steps": 0})
    found = list(normalization.post_ln_no_warmup(p))
    assert [f.severity for f in found] == ([expected] if expected else [])


def test_unknown_schedule_is_not_no_warmup() -> None:
    # An HF config alone says nothing about the schedule: N401 stays silent, and N403
    # warns (an unverified Post-LN stack is never a PASS), also below the deep threshold.
    for layers in (6, 24):
        p = plan(model={**BERT_LARGE, "num_layers": layers})
        assert list(normalization.post_ln_no_warmup(p)) == []
        f = only(list(normalization.post_ln_prefer_pre_ln(p)))
        assert f.severity == Severity.WARNING and "no schedule visible" in f.message


def test_short_run_asks_for_ten_percent() -> None:
    assert normalization.required_post_ln_warmup(3000) == 300
    assert normalization.required_post_ln_warmup(None) == 4000
    ok = plan(model=BERT_LARGE, schedule={"warmup_steps": 300, "total_steps": 3000})
    assert list(normalization.post_ln_short_warmup(ok)) == []
    short = plan(model=BERT_LARGE, schedule={"warmup_steps": 100, "total_steps": 3000})
    f = only(list(normalization.post_ln_short_warmup(short)))
    assert "10% of the 3000-step run" in f.message


def test_rope_scaled_but_still_too_long() -> None:
    model = {**LLAMA2_7B, "rope_scaling": {"type": "linear", "factor": 2}}
    assert list(data.rope_beyond_context(plan(model=model, batch={"seq_len": 8192}))) == []
    f = only(list(data.rope_beyond_context(plan(model=model, batch={"seq_len": 32768}))))
    assert "factor 2 over 4096" in f.message and f.data["factor_needed"] == 8


def test_alibi_and_rope_never_hit_the_table_rule() -> None:
    for enc in ("alibi", "rope"):
        p = plan(model={**LLAMA2_7B, "position_encoding": enc}, batch={"seq_len": 8192})
        assert list(data.position_overflow(p)) == []


def test_lr_rules_for_sgd_and_smaller_batch() -> None:
    sgd = plan(
        optimizer={"type": "sgd", "lr": 0.1},
        batch={"global_batch_size": 8192, "reference_global_batch": 256, "reference_lr": 0.1},
    )
    f = only(list(data.lr_not_rescaled(sgd)))
    assert "global batch 8192" in f.message and "3.2 (linear rule)" in f.fix
    smaller = plan(
        optimizer={"lr": 3e-4},
        batch={"global_batch_size": 64, "reference_global_batch": 256, "reference_lr": 3e-4},
    )
    assert "0.00015" in only(list(data.lr_not_rescaled(smaller))).message
    near = plan(
        optimizer={"lr": 3e-4},
        batch={"global_batch_size": 288, "reference_global_batch": 256, "reference_lr": 3e-4},
    )
    assert list(data.lr_not_rescaled(near)) == []


def test_batch_arithmetic_needs_known_dp() -> None:
    unknown_dp = plan(
        batch={"micro_batch_size": 4, "gradient_accumulation_steps": 8, "global_batch_size": 1024},
        parallel={"tp": 3},
        hardware={"num_gpus": 16},
    )
    assert list(consistency.global_batch_mismatch(unknown_dp)) == []
    given_ga = plan(
        batch={"micro_batch_size": 4, "gradient_accumulation_steps": 8, "global_batch_size": 1000},
        hardware={"num_gpus": 16},
    )
    assert list(consistency.global_batch_indivisible(given_ga)) == []
    small = plan(batch={"micro_batch_size": 4, "global_batch_size": 32}, hardware={"num_gpus": 16})
    assert (
        "use a global batch of 64," in only(list(consistency.global_batch_indivisible(small))).fix
    )


def test_post_ln_warmup_left_auto_is_not_reported_as_missing() -> None:
    """A DeepSpeed warmup of "auto" is unknown, not zero: N401 must not fire."""
    from sapper.checks.engine import run_checklist
    from sapper.plan.load import load_plan

    root = Path(__file__).parents[2] / "examples"
    loaded = load_plan(
        hf_config=root / "hf" / "opt-350m.json",
        deepspeed=root / "deepspeed" / "zero3-offload-hf-auto.json",
    )
    assert "schedule.warmup_steps" in loaded.plan.unresolved
    codes = {f.code for f in run_checklist(loaded).findings}
    assert "N401" not in codes
