"""The loaders through the CLI, in-process: the no-YAML command, and bad input as one line
naming the file, the key, the bad value and what was expected (exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

ROOT = Path(__file__).parent.parent.parent
HF = ROOT / "examples" / "hf"
DS = ROOT / "examples" / "deepspeed"
runner = CliRunner()
_register_commands()

CLUSTER = ["--gpus", "64", "--gpus-per-node", "8", "--gpu", "A100-80GB", "--seq-len", "4096"]


def check(*args: str):
    return runner.invoke(app, ["check", *args])


def test_model_and_deepspeed_without_a_plan_file() -> None:
    res = check(
        "--model", str(HF / "llama-2-7b.json"), "--deepspeed", str(DS / "zero2-bf16.json"), *CLUSTER
    )
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "parameters 6,738,415,616" in text
    assert "world size 64" in text and "global batch 512" in text
    assert "tokens per step 2,097,152" in text


def test_typo_and_static_scale_reported_with_the_users_key() -> None:
    res = check(
        "--model",
        str(HF / "llama-2-7b.json"),
        "--deepspeed",
        str(DS / "fp16-static-typo.json"),
        *CLUSTER,
        "-f",
        "json",
    )
    findings = json.loads(res.stdout)["findings"]
    typo = next(f for f in findings if f["code"] == "C001")
    assert typo["data"]["suggestion"] == "stage3_param_persistence_threshold"
    assert typo["source"].endswith("zero_optimization.stage3_param_persitance_threshold")
    assert "N103" in {f["code"] for f in findings}


def test_both_precisions_is_an_error(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"fp16": {"enabled": True}, "bf16": {"enabled": True}}))
    res = check("--deepspeed", str(ds), "--select", "C")
    assert res.exit_code == 1
    assert "C003" in res.output


def test_unresolved_auto_listed_in_json() -> None:
    res = check("--deepspeed", str(DS / "zero3-offload-hf-auto.json"), "-f", "json")
    summary = json.loads(res.stdout)["summary"]
    assert "batch.micro_batch_size" in summary["unresolved"]


@pytest.mark.parametrize(
    ("option", "content", "parts"),
    [
        (
            "--model",
            '{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}',
            ["malformed JSON at line 3, column 23"],
        ),
        (
            "--deepspeed",
            '{"train_batch_size": 8\n"fp16": {}}',
            ["malformed JSON at line 2, column 1"],
        ),
        ("--model", "[1, 2, 3]", ["must be a JSON object", "'list'"]),
        ("--model", '{"hidden_size": 4096}', ["model_type: missing value", "expected"]),
        (
            "--model",
            '{"model_type": "gpt3"}',
            ["model_type: unknown model family (got 'gpt3')", "llama", "falcon", "phi"],
        ),
        (
            "--model",
            '{"model_type": "llama", "hidden_size": "big"}',
            ["hidden_size: invalid value (got 'big'); expected a positive integer"],
        ),
        (
            "--model",
            '{"model_type": "llama", "hidden_size": 4095}',
            ["hidden size (4095)", "LlamaConfig"],
        ),
        (
            "--deepspeed",
            '{"zero_optimization": {"stage": 4}}',
            ["zero_optimization.stage: invalid value (got 4); expected 0, 1, 2 or 3"],
        ),
        (
            "--deepspeed",
            '{"gradient_accumulation_steps": "many"}',
            ["gradient_accumulation_steps: invalid value (got 'many')", '"auto"'],
        ),
        (
            "--deepspeed",
            '{"fp16": {"enabled": true, "loss_scale_window": 0}}',
            ["fp16.loss_scale_window (plan field precision.loss_scaling.growth_interval)", "got 0"],
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, option: str, content: str, parts: list) -> None:
    path = tmp_path / ("config.json" if option == "--model" else "ds.json")
    path.write_text(content)
    res = check(option, str(path))
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output
    assert str(path) in lines[0]
    for part in parts:
        assert part in lines[0]


@pytest.mark.parametrize("option", ["--model", "--deepspeed"])
def test_missing_file(tmp_path: Path, option: str) -> None:
    res = check(option, str(tmp_path / "absent.json"))
    assert res.exit_code == 2
    assert "absent.json: file not found" in res.output


def test_loader_rules_are_listed_and_have_cases() -> None:
    res = runner.invoke(app, ["rules", "--select", "C0"])
    assert res.exit_code == 0
    cases = ROOT / "tests" / "rules_cases"
    for code in ("C001", "C002", "C003", "C004", "C005", "C006"):
        assert code in res.output
        assert (cases / f"{code}.yaml").exists()
    explained = runner.invoke(app, ["explain", "C002"])
    assert "How to defuse" in explained.output
