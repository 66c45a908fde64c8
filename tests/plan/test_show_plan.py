"""``--show-plan``: the plan as sapper read it, each value with where it came from, in
text (YAML with origin comments) and in JSON (``plan``, ``origins``, ``summary.derived``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sapper.checks.engine import DERIVED_FIELDS, plan_values, run_checklist
from sapper.cli.app import _register_commands, app
from sapper.plan.load import load_plan
from sapper.plan.sources import leaves

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()
_register_commands()

#: Shipped examples of different formats, each with the options a user would add.
CASES = [
    ("plans/healthy-llama-7b.yaml", []),
    ("llamafactory/qwen3_full_sft.yaml", ["--gpus", "8", "--gpu", "H100"]),
    ("megatron/train_llama3_8b_h100_fp8.sh", ["--gpus", "16"]),
    ("axolotl/fft-8b-liger-fsdp.yaml", ["--gpus", "8"]),
]


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400"})


def plan_block(output: str) -> str:
    """The YAML --show-plan prints, up to the blank line before the checklist."""
    return output.split("\n\n", 1)[0]


@pytest.mark.parametrize(("example", "extra"), CASES)
def test_every_printed_value_has_an_origin(example: str, extra: list[str]) -> None:
    res = invoke("check", str(EXAMPLES / example), "--show-plan", *extra)
    assert res.exit_code in (0, 1), res.output
    block = plan_block(res.output)
    assert "check " not in block  # the checklist follows, after the plan
    assert re.search(r"^check\s+status", res.output, re.M)
    for line in block.splitlines():
        if line.lstrip().startswith("#") or line.rstrip().endswith(":"):
            continue  # a heading comment or a section
        assert re.search(r"\S  # \S", line), f"no origin: {line!r}"
    # The printed YAML is YAML: comments aside, it parses to the plan's values.
    doc = yaml.safe_load(block)
    assert isinstance(doc.get("derived"), dict)


@pytest.mark.parametrize(("example", "extra"), CASES)
def test_json_carries_the_plan_its_origins_and_derived(example: str, extra: list[str]) -> None:
    res = invoke("check", str(EXAMPLES / example), "-f", "json", *extra)
    assert res.exit_code in (0, 1), res.output
    out = json.loads(res.stdout)
    loaded = load_plan(configs=[EXAMPLES / example])
    assert set(leaves(out["plan"])) == set(out["origins"])
    assert all(isinstance(v, str) and v for v in out["origins"].values())
    derived = out["summary"]["derived"]
    assert set(DERIVED_FIELDS) <= set(derived)  # every key, null where unknown
    if not extra:  # the same inputs: the same values as the Plan sapper checked
        values, where = plan_values(loaded.plan, loaded.origins)
        assert out["plan"] == json.loads(json.dumps(values))
        assert out["origins"] == where
    report = run_checklist(loaded)
    for key, field in DERIVED_FIELDS.items():
        if field is None or derived[key] is None or extra:
            continue
        assert derived[key] == report.to_json()["summary"]["derived"][key]
        assert field not in loaded.plan.unresolved


def test_derived_is_null_where_the_config_leaves_it_open() -> None:
    res = invoke("check", str(EXAMPLES / "llamafactory/qwen3_full_sft.yaml"), "-f", "json")
    d = json.loads(res.stdout)["summary"]["derived"]
    # warmup_ratio of a run whose length is unknown: not the Plan's default of 0
    assert d["warmup_steps"] is None and d["parameters"] is None
    assert d["zero_stage"] == 3 and d["seq_len"] == 2048 and d["dtype"] == "bf16"
    assert d["lr"] == 1e-05 and d["checkpointing"] == "full" and d["max_grad_norm"] == 1.0


def test_command_line_values_show_their_flags() -> None:
    res = invoke("check", str(EXAMPLES / "llamafactory/qwen3_full_sft.yaml"), "--show-plan",
                 "--gpus", "8", "--gpu", "H100", "--lr", "2e-5")
    block = plan_block(res.output)
    assert re.search(r"^  num_gpus: 8  # --gpus$", block, re.M), block
    assert re.search(r"^  gpu: H100  # --gpu$", block, re.M), block
    assert re.search(r"^  lr: 2.0e-05  # --lr$", block, re.M), block
    assert "cutoff_len" in block and "qwen3_full_sft.yaml: cutoff_len" in block
    out = json.loads(invoke("check", str(EXAMPLES / "llamafactory/qwen3_full_sft.yaml"),
                            "-f", "json", "--gpus", "8", "--lr", "2e-5").stdout)
    assert out["origins"]["hardware.num_gpus"] == "--gpus"
    assert out["origins"]["optimizer.lr"] == "--lr"
    assert out["origins"]["batch.seq_len"] == "qwen3_full_sft.yaml: cutoff_len"


def test_unknown_values_say_why() -> None:
    res = invoke("check", str(EXAMPLES / "llamafactory/qwen3_full_sft.yaml"), "--show-plan")
    block = plan_block(res.output)
    unknown = block.split("unknown:", 1)[1]
    assert re.search(r"- model  # qwen3_full_sft.yaml: model_name_or_path: .*hub", unknown)
    assert re.search(r"- schedule.warmup_steps  # .*warmup_ratio", unknown)
    assert re.search(r"- hardware.gpu  # not given; needed by .*M001", unknown)


def test_derived_values_say_how() -> None:
    res = invoke("check", str(EXAMPLES / "llamafactory/qwen3_full_sft.yaml"), "--show-plan",
                 "--gpus", "8")
    block = plan_block(res.output)
    assert re.search(r"^  dp: 8  # derived: world_size / \(tp x pp x cp\)$", block, re.M)
    assert re.search(r"^  global_batch_size: 16  # derived: what deepspeed computes", block,
                     re.M)


@pytest.mark.parametrize("command", ["memory", "plan"])
def test_memory_and_plan_show_it_too(command: str) -> None:
    path = str(EXAMPLES / "plans/healthy-llama-7b.yaml")
    res = invoke(command, path, "--show-plan", "--top", "1") if command == "plan" else invoke(
        command, path, "--show-plan")
    assert res.output.startswith("# the plan as sapper read it"), res.output
    assert "healthy-llama-7b.yaml: " in plan_block(res.output)
    args = [command, path, "--show-plan", "-f", "json"] + (["--top", "1"] if command == "plan"
                                                           else [])
    out = json.loads(invoke(*args).stdout)
    assert {"plan", "origins", "derived", "unknown"} <= set(out)
    assert set(leaves(out["plan"])) == set(out["origins"])


def test_the_json_contract_is_documented() -> None:
    docs = (EXAMPLES.parent / "docs" / "plan.md").read_text()
    readme = (EXAMPLES.parent / "README.md").read_text()
    for key in DERIVED_FIELDS:
        assert f"`{key}`" in docs or key in ("tp", "pp", "cp", "ep"), key
        assert f"`{key}`" in readme, key
    assert "`summary.partial`" in docs and '"partial"' in readme
    assert "--show-plan" in docs and "--show-plan" in readme


def test_partial_item_says_what_ran_and_what_did_not() -> None:
    args = ["check", "--model", str(EXAMPLES / "hf/llama-2-7b.json"), "--gpus", "64",
            "--zero", "3", "--micro-batch", "1", "--seq-len", "4096", "--dtype", "bf16"]
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    assert re.search(r"memory\s+PASS \(1 check not run: M001/M002/M003 need --gpu\)",
                     res.output), res.output
    out = json.loads(invoke(*args, "-f", "json").stdout)["summary"]
    assert out["items"]["memory"] == "unknown"
    assert out["partial"]["memory"] == ["M001", "M002", "M003"]
    assert invoke(*args, "--strict").exit_code == 1
    # an item of which nothing could run still reads UNKNOWN
    only = invoke(*args, "--ignore", "M004,M005,M006")
    assert re.search(r"memory\s+UNKNOWN\s", only.output), only.output
    out = json.loads(invoke(*args, "--ignore", "M004,M005,M006", "-f", "json").stdout)
    assert "memory" not in out["summary"]["partial"]
