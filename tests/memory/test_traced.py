"""The traced estimator: fake tensors count exactly what a real step allocates, and the
analytic model agrees with it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from memory_plans import LLAMA_7B, TINY_LLAMA, make_plan

from sapper.memory import MemoryOptions, estimate
from sapper.memory.traced import StepConfig, hf_config_from_plan, trace_hf_config, trace_plan

TINY_GPT2 = {
    "family": "gpt2",
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "position_encoding": "learned",
    "activation": "gelu",
    "hidden_act": "gelu_new",
    "norm_type": "layernorm",
    "tied_embeddings": True,
    "attention_bias": True,
    "mlp_bias": True,
}


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT2], ids=["llama", "gpt2"])
def test_fake_step_counts_what_a_real_step_allocates(model: dict) -> None:
    plan = make_plan(model, precision={"dtype": "fp32"}, batch={"seq_len": 128})
    cfg = StepConfig(micro_batch=2, seq_len=128, autocast="bf16")
    config = hf_config_from_plan(plan)
    fake = trace_hf_config(config, cfg)
    real = trace_hf_config(config, cfg, fake=False)
    assert fake.peak_bytes == real.peak_bytes
    assert fake.breakdown == real.breakdown
    assert set(fake.phases) == {"forward", "backward", "optimizer"}


@pytest.mark.parametrize(
    ("model", "attn", "autocast", "ckpt"),
    [
        (TINY_LLAMA, "sdpa", True, False),
        (TINY_LLAMA, "eager", False, True),
        (TINY_GPT2, "eager", True, False),
        (TINY_GPT2, "sdpa", False, True),
    ],
)
def test_analytic_agrees_with_traced(model: dict, attn: str, autocast: bool, ckpt: bool) -> None:
    plan = make_plan(
        {**model, "attention_impl": attn},
        precision={"dtype": "bf16" if autocast else "fp32", "autocast": autocast},
        batch={"micro_batch_size": 2, "seq_len": 256},
        parallel={"checkpointing": {"granularity": "full" if ckpt else "none"}},
    )
    traced = trace_plan(plan).peak_bytes
    analytic = estimate(plan, MemoryOptions(device="cpu")).tensor_peak_bytes
    # the benchmark's per-row target is 5%; even these tiny models stay within 2%
    assert analytic == pytest.approx(traced, rel=0.02)


def test_master_weights_recipe_is_traced() -> None:
    plan = make_plan(TINY_LLAMA, batch={"seq_len": 128})  # bf16 weights, fp32 master
    traced = trace_plan(plan)
    assert traced.breakdown["optimizer"] > 0
    analytic = estimate(plan, MemoryOptions(device="cpu")).tensor_peak_bytes
    assert analytic == pytest.approx(traced.peak_bytes, rel=0.01)


@pytest.mark.slow
def test_7b_traces_well_under_a_minute() -> None:
    plan = make_plan(
        LLAMA_7B,
        batch={"micro_batch_size": 1, "seq_len": 4096},
        parallel={"checkpointing": {"granularity": "full"}},
    )
    start = time.perf_counter()
    traced = trace_plan(plan)
    assert time.perf_counter() - start < 45
    assert traced.num_params == 6_738_415_616
    # bf16 weights + grads, fp32 master + m + v: 16 bytes per parameter
    states = sum(traced.phases["optimizer"][k] for k in ("params", "grads", "optimizer"))
    assert states == pytest.approx(16 * traced.num_params, rel=1e-3)


def _memory_json(*args: str):
    import json

    from typer.testing import CliRunner

    from sapper.cli.app import _register_commands, app

    _register_commands()
    res = CliRunner().invoke(app, ["memory", *args, "--format", "json"])
    return res.exit_code, json.loads(res.stdout)


HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def test_traced_builds_the_users_own_config() -> None:
    """OPT is no family the Plan rebuilds (its 512-wide embeddings projected to 1024,
    learned positions at offset 2): --traced builds opt-350m.json itself, in the plan's
    fp32 although the file records float16."""
    code, doc = _memory_json("--model", str(HF / "opt-350m.json"), "--micro-batch", "1",
                             "--seq-len", "256", "--traced")
    assert code == 0 and "traced_skipped" not in doc
    traced = doc["traced"]
    assert traced["num_params"] == 331_196_416 == doc["estimate"]["num_params"]
    assert traced["phases"]["optimizer"]["params"] >= 4 * traced["num_params"]  # fp32
    assert any("opt-350m.json describes" in n for n in traced["notes"])


def test_a_model_that_cannot_be_traced_keeps_the_analytic_answer() -> None:
    """A config that needs its repository's code: no prompt, no trace, the analytic JSON
    with the reason, and the exit code of the verdict (it fits on an 80 GB GPU)."""
    code, doc = _memory_json("--model", str(HF / "falcon-7b-legacy.json"), "--micro-batch",
                             "1", "--seq-len", "256", "--gpu", "H100-80GB", "--zero", "0",
                             "--dtype", "bf16", "--traced")
    assert "traced" not in doc and "custom code" in doc["traced_skipped"]
    assert code == (0 if doc["verdict"]["fits"] else 1)
