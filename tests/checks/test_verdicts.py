"""Verdicts a user can trust: a check that could not run is ``unknown``, never PASS, and
the framework's own semantics decide what a config leaves unsaid. On real public configs
(tests/fixtures/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.memory import estimate
from sapper.plan.frameworks import deepspeed_batch
from sapper.plan.load import load_plan
from sapper.plan.sources import PlanSource

ROOT = Path(__file__).parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"
DS = ROOT / "tests" / "fixtures" / "deepspeed"
runner = CliRunner()
_register_commands()


def check(*args: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["check", *args, "-f", "json"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def overrides(**values: object) -> PlanSource:
    src = PlanSource(name="command line")
    for path, value in values.items():
        src.set(path.replace("__", "."), value)
    return src


def test_a_job_larger_than_any_gpu_fails_without_gpu_named() -> None:
    # Llama 2 70B on 8 GPUs, no ZeRO, no TP: over a terabyte per GPU.
    code, out = check("--model", str(HF / "llama-2-70b.json"), "--gpus", "8",
                      "--micro-batch", "4", "--seq-len", "4096")
    assert code == 1
    assert out["summary"]["items"]["memory"] == "fail"
    (m002,) = [f for f in out["findings"] if f["code"] == "M002"]
    assert "exceeds every GPU sapper knows" in m002["message"]


def test_memory_is_unknown_without_the_gpu() -> None:
    code, out = check("--model", str(HF / "llama-2-7b.json"), "--gpus", "64", "--zero", "3",
                      "--micro-batch", "1", "--seq-len", "4096", "--dtype", "bf16")
    assert code == 0
    s = out["summary"]
    assert s["items"]["memory"] == "unknown"
    assert "hardware.gpu" in s["unresolved"]
    memory = [u for u in s["not_evaluated"] if u["item"] == "memory"]
    assert memory and memory[0]["codes"] == ["M001", "M002", "M003"]
    strict = runner.invoke(app, ["check", "--model", str(HF / "llama-2-7b.json"), "--gpus",
                                 "64", "--zero", "3", "--micro-batch", "1", "--seq-len", "4096",
                                 "--dtype", "bf16", "--strict"])
    # The memory checks that ran passed; the estimate itself is named as not run.
    assert strict.exit_code == 1 and "M001/M002/M003 need --gpu" in strict.output
    assert "PASS (1 check not run" in strict.output
    assert s["partial"]["memory"] == ["M001", "M002", "M003"]


def test_missing_batch_makes_memory_unknown_and_names_the_inputs() -> None:
    _, out = check("--model", str(HF / "mistral-7b-v0.1.json"), "--gpu", "H100")
    (memory,) = [u for u in out["summary"]["not_evaluated"] if u["item"] == "memory"
                 and "M002" in u["codes"]]
    assert memory["missing"] == ["batch.micro_batch_size", "batch.seq_len"]
    assert out["summary"]["items"]["memory"] == "unknown"


def test_unstated_dtype_is_unknown_not_fp32() -> None:
    _, out = check("--model", str(HF / "llama-2-7b.json"))
    assert out["summary"]["items"]["precision"] == "unknown"
    assert "precision.dtype" in out["summary"]["unresolved"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "nothing to check"),
        ("null\n", "nothing to check"),
        # a name alone does not make a YAML a sapper plan: refused as no known format
        ("name: only-a-name\n", "not a config sapper can read"),
    ],
)
def test_a_plan_with_nothing_to_check_is_an_input_error(
    tmp_path: Path, text: str, says: str
) -> None:
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    res = runner.invoke(app, ["check", str(p)])
    assert res.exit_code == 2
    assert says in res.output and "Traceback" not in res.output


def test_post_ln_without_a_visible_schedule_warns() -> None:
    # OPT-350m is Post-LN (do_layer_norm_before: false); config.json says nothing of warmup.
    _, out = check("--model", str(HF / "opt-350m.json"))
    assert out["summary"]["items"]["normalization"] == "warn"
    (n403,) = [f for f in out["findings"] if f["code"] == "N403"]
    assert n403["severity"] == "warning"


# ---- DeepSpeed's batch arithmetic ------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "dp", "resolved"),
    [
        ((2048, 2, None), 8, (2048, 2, 128)),
        ((2048, None, 4), 8, (2048, 64, 4)),
        ((None, 2, 4), 8, (64, 2, 4)),
        ((2048, None, None), 8, (2048, 256, 1)),
        ((None, 4, None), 8, (32, 4, 1)),
        ((100, None, None), 8, (100, 12, 1)),  # floor, then DeepSpeed's assertion fails
    ],
)
def test_deepspeed_fills_the_batch_triple_as_its_config_does(
    given: tuple, dp: int, resolved: tuple
) -> None:
    assert deepspeed_batch(*given, dp) == resolved


def test_bloom_deepspeed_config_resolves_gradient_accumulation() -> None:
    # BLOOM-176B: micro 2, global 2048, TP4 PP12 on 384 GPUs → DP 8, GA 128.
    loaded = load_plan(deepspeed=DS / "megatron-bf16-zero0.json",
                       overrides=overrides(hardware__num_gpus=384, parallel__tp=4,
                                           parallel__pp=12))
    assert loaded.plan.batch.gradient_accumulation_steps == 128
    assert not [f for f in loaded.findings if f.code == "C101"]


def test_train_batch_not_a_multiple_of_dp_is_refused(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 100, "bf16": {"enabled": True}}))
    code, out = check("--deepspeed", str(ds), "--gpus", "8")
    assert code == 1
    (c101,) = [f for f in out["findings"] if f["code"] == "C101"]
    assert "12 × 1 × 8 = 96 ≠ 100" in c101["message"] and "refuses to start" in c101["message"]


def test_train_batch_smaller_than_dp_is_refused(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 4, "gradient_accumulation_steps": 2}))
    code, out = check("--deepspeed", str(ds), "--gpus", "8")
    assert code == 1 and any(f["code"] == "C101" for f in out["findings"])


# ---- DeepSpeed's optimizer wrapper -----------------------------------------------------


def test_bf16_without_zero_partitions_optimizer_states_like_deepspeed() -> None:
    """bf16 + stage 0 runs BF16_Optimizer: bf16 weights and fp32 gradients on every GPU,
    fp32 master weights and Adam moments partitioned over DP (not 16 B/param)."""
    bloom = {"hidden_size": 14336, "num_layers": 70, "num_heads": 112,
             "vocab_size": 250880, "position_encoding": "alibi", "activation": "gelu"}
    loaded = load_plan(
        deepspeed=DS / "megatron-bf16-zero0.json",
        overrides=overrides(model=bloom, hardware__num_gpus=384, hardware__gpu="A100-80GB",
                            parallel__tp=4, parallel__pp=12, batch__seq_len=2048),
    )
    plan = loaded.plan
    assert plan.parallel.optimizer_partitioned and plan.precision.grad_dtype == "fp32"
    def states(p: object) -> int:
        b = estimate(p).breakdown  # type: ignore[arg-type]
        return b["params"] + b["grads"] + b["optimizer"]

    replicated = plan.model_copy(
        update={"parallel": plan.parallel.model_copy(update={"optimizer_partitioned": False})}
    )
    # 2 (bf16) + 4 (fp32 grads) + 12 / DP 8 = 7.5 B/param, against 18 replicated.
    assert states(plan) / states(replicated) == pytest.approx(7.5 / 18, rel=0.03)


def test_fp16_with_zero_keeps_the_zero_optimizer(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                              "zero_optimization": {"stage": 2}}))
    plan = load_plan(deepspeed=ds).plan
    assert not plan.parallel.optimizer_partitioned and plan.precision.grad_dtype is None


# ---- fp16 loss-scaling defaults ---------------------------------------------------------


def test_fp16_under_deepspeed_defaults_to_dynamic_scaling(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1}))
    _, out = check("--deepspeed", str(ds), "--dtype", "fp16")
    assert not [f for f in out["findings"] if f["code"] == "N102"]
    assert not [u for u in out["summary"]["not_evaluated"] if "N102" in u["codes"]]


def test_fp16_with_no_framework_is_unknown_until_stated() -> None:
    _, out = check("--model", str(HF / "gpt2.json"), "--dtype", "fp16")
    assert out["summary"]["items"]["precision"] == "unknown"
    assert "precision.loss_scaling.mode" in out["summary"]["unresolved"]
    _, out = check("--model", str(HF / "gpt2.json"), "--dtype", "fp16", "--loss-scale", "1024")
    assert [f["code"] for f in out["findings"] if f["check"] == "precision"] == ["N103"]
    _, out = check("--model", str(HF / "gpt2.json"), "--dtype", "fp16",
                   "--loss-scale", "dynamic")
    assert out["summary"]["items"]["precision"] == "pass"


@pytest.mark.parametrize("bad", ["bogus", "-4", "nan", "inf", "0"])
def test_bad_loss_scale_is_an_input_error(bad: str) -> None:
    res = runner.invoke(app, ["check", "--model", str(HF / "gpt2.json"), "--loss-scale", bad])
    assert res.exit_code == 2 and "--loss-scale" in res.output


@pytest.mark.parametrize("command", ["check", "memory", "plan"])
def test_every_command_gives_the_same_layout_error(command: str) -> None:
    res = runner.invoke(app, [command, "--model", str(HF / "llama-2-7b.json"), "--gpus", "48",
                              "--tp", "3", "--gpu", "A100-80GB", "--micro-batch", "1",
                              "--seq-len", "4096", "--global-batch", "64", "--dtype", "bf16"])
    assert res.exit_code == 1, res.output
    assert "P104" in res.output and "num_heads(32) % tp(3) = 2" in res.output
    assert "FITS" not in res.output
    if command == "check":
        # no memory verdict for a layout that cannot start
        assert "not run: M001/M002/M003" in res.output
