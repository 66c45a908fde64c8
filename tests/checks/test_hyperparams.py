"""The peak LR against published runs (N501/N502), a static fp16 loss scale's arithmetic
(N103) and warmup against depth for stacks the Post-LN rules cannot see (N404)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sapper.checks import hyperparams, normalization, precision
from sapper.checks.engine import NotEvaluated
from sapper.cli.app import _register_commands, app
from sapper.plan.schema import Plan
from sapper.rules.causes import STRONG, WEAK, causes_of
from sapper.rules.model import Finding, Severity

ROOT = Path(__file__).parent.parent.parent
runner = CliRunner()
_register_commands()

LLAMA_7B: dict[str, Any] = {
    "hidden_size": 4096, "num_layers": 32, "num_heads": 32, "ffn_hidden_size": 11008,
    "activation": "swiglu", "vocab_size": 32000, "norm_placement": "pre",
}
GPT_125M: dict[str, Any] = {
    "hidden_size": 768, "num_layers": 12, "num_heads": 12, "vocab_size": 50257,
}


def plan(**sections: Any) -> Plan:
    return Plan.model_validate(sections)


def lr_out(p: Plan) -> list[Finding | NotEvaluated]:
    return list(hyperparams.peak_lr_vs_published(p))


def codes(out: list[Finding | NotEvaluated]) -> list[str]:
    return [o.code for o in out if isinstance(o, Finding)]


def only(out: list[Finding | NotEvaluated]) -> Finding:
    found = [o for o in out if isinstance(o, Finding)]
    assert len(found) == 1, out
    return found[0]


# ---- the table ----------------------------------------------------------------------


def test_the_table_is_sorted_sourced_and_falls_with_size() -> None:
    rows = hyperparams.PUBLISHED_ADAM
    assert [r.params for r in rows] == sorted(r.params for r in rows)
    assert all(r.source and 1e-5 < r.lr < 1e-2 and r.batch_tokens >= 1e5 for r in rows)
    # Larger models take smaller peak LRs: the smallest run's LR is the largest.
    assert rows[0].lr == max(r.lr for r in rows) and rows[-1].lr < rows[0].lr / 10


@pytest.mark.parametrize("run", hyperparams.PUBLISHED_ADAM, ids=lambda r: r.run)
def test_every_published_run_passes_at_its_own_size_lr_and_batch(
    run: hyperparams.PublishedRun,
) -> None:
    seq = 2048
    p = plan(
        model={**LLAMA_7B, "num_params": int(run.params)},
        optimizer={"type": "adamw", "lr": run.lr},
        batch={"global_batch_size": max(1, round(run.batch_tokens / seq)), "seq_len": seq},
        init={"from_pretrained": False},
    )
    assert codes(lr_out(p)) == []


# ---- far above ----------------------------------------------------------------------


def test_adamw_at_lr_one_is_an_error_naming_the_reference() -> None:
    f = only(lr_out(plan(model=LLAMA_7B, optimizer={"type": "adamw", "lr": 1.0})))
    assert f.code == "N501" and f.severity == Severity.ERROR
    assert f.data["reference_run"] == "LLaMA-7B"
    assert f.data["reference_lr"] == pytest.approx(3e-4)
    assert f.data["ratio"] == pytest.approx(1 / 3e-4, rel=1e-3)
    assert "Touvron et al. 2023" in f.message and "adamw" in f.message


def test_warning_band_between_ten_and_a_hundred_times() -> None:
    warn = only(lr_out(plan(model=LLAMA_7B, optimizer={"type": "adamw", "lr": 6e-3})))
    assert warn.severity == Severity.WARNING and warn.threshold == pytest.approx(3e-3)
    err = only(lr_out(plan(model=LLAMA_7B, optimizer={"type": "adamw", "lr": 3.1e-2})))
    assert err.severity == Severity.ERROR
    assert codes(lr_out(plan(model=LLAMA_7B, optimizer={"type": "adamw", "lr": 2.9e-3}))) == []


def test_adam_at_point_one_is_an_error_even_on_a_tiny_model() -> None:
    tiny = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "vocab_size": 256}
    f = only(lr_out(plan(model=tiny, optimizer={"type": "adam", "lr": 0.1})))
    assert f.severity == Severity.ERROR
    # A tiny model at 1e-3 (nanoGPT's character model) is fine.
    assert codes(lr_out(plan(model=tiny, optimizer={"type": "adam", "lr": 1e-3}))) == []


def test_unnamed_optimizer_is_taken_as_adam_and_said_so() -> None:
    f = only(lr_out(plan(model=GPT_125M, optimizer={"lr": 0.5})))
    assert f.severity == Severity.ERROR and "assumed" in f.message


def test_lion_is_held_three_times_lower_than_adamw() -> None:
    assert codes(lr_out(plan(model=LLAMA_7B, optimizer={"type": "lion", "lr": 3e-4}))) == []
    f = only(lr_out(plan(model=LLAMA_7B, optimizer={"type": "decoupled_lionw", "lr": 2e-3})))
    assert f.severity == Severity.WARNING and "Lion" in f.message
    assert codes(lr_out(plan(model=LLAMA_7B, optimizer={"type": "adamw", "lr": 2e-3}))) == []


def test_adafactor_is_held_to_palm_and_t5() -> None:
    assert codes(lr_out(plan(model=LLAMA_7B, optimizer={"type": "adafactor", "lr": 1e-2}))) == []
    f = only(lr_out(plan(model=LLAMA_7B, optimizer={"type": "adafactor", "lr": 0.2})))
    assert f.severity == Severity.WARNING and "PaLM" in f.message


@pytest.mark.parametrize("name", ["sgd", "muon", "galore_adamw", "schedule_free_adamw", "lamb"])
def test_optimizers_without_a_published_table_are_not_guessed(name: str) -> None:
    (out,) = lr_out(plan(model=LLAMA_7B, optimizer={"type": name, "lr": 1.0}))
    assert isinstance(out, NotEvaluated) and out.missing == ("optimizer.type",)
    assert name in out.what


def test_missing_lr_model_or_auto_lr_is_said_not_passed() -> None:
    (no_lr,) = lr_out(plan(model=LLAMA_7B, optimizer={"type": "adamw"}))
    assert isinstance(no_lr, NotEvaluated) and no_lr.missing == ("optimizer.lr",)
    (no_model,) = lr_out(plan(optimizer={"type": "adamw", "lr": 1.0}))
    assert isinstance(no_model, NotEvaluated) and no_model.missing == ("model",)
    (auto,) = lr_out(
        plan(model=LLAMA_7B, optimizer={"type": "adamw", "lr": 1e-3}, unresolved=["optimizer.lr"])
    )
    assert isinstance(auto, NotEvaluated)


def test_a_larger_batch_raises_the_reference_by_the_square_root_never_lowers_it() -> None:
    big = plan(
        model=LLAMA_7B,
        optimizer={"type": "adamw", "lr": 4e-3},
        batch={"global_batch_size": 16384, "seq_len": 4096},  # 64M tokens: 16× LLaMA's
    )
    ref = hyperparams.lr_reference(big)
    assert isinstance(ref, hyperparams.LrReference)
    assert ref.batch_factor == pytest.approx(math.sqrt(64 * 2**20 / 4e6), rel=1e-3)
    assert codes(lr_out(big)) == []
    small = plan(
        model=LLAMA_7B,
        optimizer={"type": "adamw", "lr": 4e-3},
        batch={"global_batch_size": 8, "seq_len": 4096},
    )
    f = only(lr_out(small))
    assert f.severity == Severity.WARNING and f.data["batch_factor"] == 1.0


def test_moe_is_sized_by_its_active_parameters() -> None:
    mixtral = {
        "hidden_size": 4096, "num_layers": 32, "num_heads": 32, "num_kv_heads": 8,
        "ffn_hidden_size": 14336, "activation": "swiglu", "vocab_size": 32000,
        "num_experts": 8, "experts_top_k": 2,
    }
    ref = hyperparams.lr_reference(plan(model=mixtral, optimizer={"lr": 3e-4}))
    assert isinstance(ref, hyperparams.LrReference)
    assert 12e9 < ref.params < 14e9  # ~12.9B active of ~46.7B


def test_fine_tuning_keeps_the_high_side_and_drops_the_low_side() -> None:
    ft = {"from_pretrained": True}
    assert codes(lr_out(plan(model=LLAMA_7B, optimizer={"lr": 5e-7}, init=ft))) == []
    f = only(lr_out(plan(model=LLAMA_7B, optimizer={"lr": 1.0}, init=ft)))
    assert f.severity == Severity.ERROR and "fine-tuning" in f.message
    # LoRA-level LRs on a pretrained 7B (QLoRA: 2e-4) are not reported.
    assert codes(lr_out(plan(model=LLAMA_7B, optimizer={"lr": 1e-3}, init=ft))) == []


def test_far_below_is_a_warning_from_scratch_and_information_when_unsaid() -> None:
    scratch = only(lr_out(plan(model=GPT_125M, optimizer={"lr": 1e-6},
                               init={"from_pretrained": False})))
    assert scratch.code == "N502" and scratch.severity == Severity.WARNING
    unsaid = only(lr_out(plan(model=GPT_125M, optimizer={"lr": 1e-6})))
    assert unsaid.code == "N502" and unsaid.severity == Severity.INFO
    assert "from_pretrained" in unsaid.message
    # A supervised fine-tuning LR (2e-5) is not "far below" even when unsaid.
    assert codes(lr_out(plan(model=LLAMA_7B, optimizer={"lr": 2e-5}))) == []


# ---- the checklist ------------------------------------------------------------------


def _check(tmp_path: Path, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(body))
    res = runner.invoke(app, ["check", str(path), "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def test_the_optimizer_item_fails_passes_or_says_unknown(tmp_path: Path) -> None:
    code, out = _check(tmp_path, {"model": LLAMA_7B, "optimizer": {"type": "adamw", "lr": 1.0}})
    assert code == 1 and out["summary"]["items"]["optimizer"] == "fail"
    _, out = _check(tmp_path, {"model": LLAMA_7B, "optimizer": {"type": "adamw", "lr": 3e-4}})
    assert out["summary"]["items"]["optimizer"] == "pass"
    _, out = _check(tmp_path, {"model": LLAMA_7B})
    assert out["summary"]["items"]["optimizer"] == "unknown"
    assert any(u["codes"] == ["N501", "N502"] for u in out["summary"]["not_evaluated"])


def test_the_findings_are_evidence_in_the_causal_map() -> None:
    assert ("lr-too-high", STRONG) in [(c.id, s) for c, s in causes_of("N501")]
    assert {c.id for c, s in causes_of("N404") if s == WEAK} >= {"lr-too-high", "post-ln-warmup"}
    assert ("loss-scaling", STRONG) in [(c.id, s) for c, s in causes_of("N103")]


# ---- real public configs --------------------------------------------------------------

#: Released configs of published runs: their own LRs must not be reported.
REAL = [
    ("olmo/OLMo-1B.yaml", ()),
    ("olmo/OLMo-7B.yaml", ()),
    ("litgpt/pretrain-tinyllama.yaml", ()),
    ("llmfoundry/mpt-7b.yaml", ()),
    ("llmfoundry/mpt-125m.yaml", ()),
]


@pytest.mark.parametrize(("name", "extra"), REAL, ids=[n for n, _ in REAL])
def test_released_configs_are_not_reported(name: str, extra: tuple[str, ...]) -> None:
    res = runner.invoke(app, ["check", str(ROOT / "examples" / name), "-f", "json", *extra])
    out = json.loads(res.stdout)
    fired = {f["code"] for f in out["findings"]}
    assert not fired & {"N501", "N502", "N404"}, out["findings"]
    assert out["summary"]["items"].get("optimizer") in ("pass", "unknown")


# ---- the static fp16 loss scale's arithmetic (N103) -------------------------------------


def _static(scale: float, model: dict[str, Any] | None = None) -> Finding:
    p = plan(model=model, precision={"dtype": "fp16",
                                     "loss_scaling": {"mode": "static", "static_scale": scale}})
    out = [f for f in precision.fp16_loss_scaling(p) if isinstance(f, Finding)]
    assert len(out) == 1 and out[0].code == "N103"
    return out[0]


def test_static_scale_states_its_overflow_and_underflow_bounds() -> None:
    f = _static(1024)
    assert f.severity == Severity.WARNING
    assert f.data["overflow_above"] == pytest.approx(65504 / 1024)
    assert f.data["zero_below"] == pytest.approx(2.0**-25 / 1024)
    assert "64 overflows" in f.message and "parameters" not in f.data


def test_static_scale_with_a_model_puts_a_healthy_gradient_in_fp16s_range() -> None:
    f = _static(1024, LLAMA_7B)
    n = f.data["parameters"]
    assert 6e9 < n < 7e9
    assert f.data["rms_element_low"] == pytest.approx(0.1 / math.sqrt(n))
    assert "below fp16's normal range" not in f.message
    low = _static(4, LLAMA_7B)  # 4 × 1.2e-6 = 4.9e-6 < 2^-14
    assert low.severity == Severity.WARNING and "below fp16's normal range" in low.message
    spike = _static(32768, LLAMA_7B)  # 65504 / 32768 = 2: a spike of norm 10 can hold it
    assert "never backs off" in spike.message


def test_dynamic_scaling_and_bf16_have_no_static_arithmetic() -> None:
    dyn = plan(precision={"dtype": "fp16", "loss_scaling": {"mode": "dynamic"}})
    assert list(precision.fp16_loss_scaling(dyn)) == []
    bf16 = plan(precision={"dtype": "bf16", "loss_scaling": {"mode": "static",
                                                             "static_scale": 1024}})
    assert list(precision.fp16_loss_scaling(bf16)) == []


# ---- warmup against depth and placement (N404) ---------------------------------------


def _n404(**sections: Any) -> list[Finding | NotEvaluated]:
    sections.setdefault("schedule", {"warmup_steps": 0, "total_steps": 100_000})
    return list(normalization.deep_stack_no_warmup(plan(**sections)))


def test_pre_ln_deep_stack_without_warmup_at_pretraining_lr_warns() -> None:
    f = only(_n404(model=LLAMA_7B, optimizer={"type": "adamw", "lr": 3e-4}))
    assert f.code == "N404" and f.severity == Severity.WARNING
    assert "pre-LN stack of 32 layers" in f.message and f.threshold == pytest.approx(1e-4)


@pytest.mark.parametrize(
    "sections",
    [
        {"optimizer": {"lr": 3e-5}},  # a tenth of the published peak: no warmup is fine
        {"optimizer": {"lr": 3e-4}, "schedule": {"warmup_steps": 2000}},
        {"optimizer": {"lr": 3e-4}, "init": {"from_pretrained": True}},
        {"optimizer": {"lr": 3e-4}, "schedule": {}},  # no schedule given: unknown, not 0
    ],
    ids=["low-lr", "warmup", "fine-tune", "schedule-unknown"],
)
def test_pre_ln_stays_quiet(sections: dict[str, Any]) -> None:
    assert _n404(model=LLAMA_7B, **sections) == []


def test_unknown_placement_on_a_deep_stack_without_warmup_warns_at_any_lr() -> None:
    unknown = {k: v for k, v in LLAMA_7B.items() if k != "norm_placement"}
    f = only(_n404(model=unknown, optimizer={"lr": 1e-5}))
    assert "no norm placement" in f.message and f.source == "model.norm_placement"
    # Megatron-LM's GPT blocks are Pre-LN: known without the field.
    assert _n404(model={**unknown, "implementation": "megatron"}, optimizer={"lr": 1e-5}) == []


def test_post_ln_and_shallow_stacks_are_left_to_n401() -> None:
    post = {**LLAMA_7B, "norm_placement": "post"}
    assert _n404(model=post, optimizer={"lr": 3e-4}) == []
    shallow = {**LLAMA_7B, "num_layers": 6}
    assert _n404(model=shallow, optimizer={"lr": 3e-4}) == []


def test_pre_ln_without_lr_is_not_evaluated() -> None:
    (out,) = _n404(model=LLAMA_7B)
    assert isinstance(out, NotEvaluated) and out.missing == ("optimizer.lr",)


def test_a_released_config_with_its_lr_typed_wrong_is_reported() -> None:
    # OLMo-7B's own config (peak 3e-4, 4.2M tokens per step) with the exponent slipped.
    path = str(ROOT / "examples" / "olmo" / "OLMo-7B.yaml")
    for lr, severity, exit_code in (("6e-3", "warning", 0), ("3e-2", "warning", 0),
                                    ("3e-1", "error", 1)):
        res = runner.invoke(app, ["check", path, "-f", "json", "--lr", lr])
        out = json.loads(res.stdout)
        n501 = [f for f in out["findings"] if f["code"] == "N501"]
        assert len(n501) == 1 and n501[0]["severity"] == severity, (lr, n501)
        assert res.exit_code == exit_code
        assert n501[0]["data"]["reference_run"] == "LLaMA-7B"
