"""``sapper plan`` in-process: table, JSON, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.parallel.published import PUBLISHED_RUNS

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples" / "plans"
runner = CliRunner()
_register_commands()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_table_and_reasons() -> None:
    res = invoke("plan", str(EXAMPLES / "healthy-llama-7b.yaml"), "--top", "3")
    assert res.exit_code == 0, res.output
    assert "valid layouts of 64 GPUs ranked in" in res.output
    for head in ("layout", "ZeRO", "ckpt", "mb x GA", "TFLOP/s", "MFU", "GiB", "compute"):
        assert head in res.output
    assert "yours" in res.output
    assert "#1 TP" in res.output and "your layout (TP2 PP1 DP32" in res.output


def test_plan_options_like_check() -> None:
    res = invoke("plan", str(EXAMPLES / "healthy-llama-7b.yaml"), "--gpus", "128", "--top", "1",
                 "-f", "json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["gpus"] == 128 and len(payload["top"]) == 1


def test_json() -> None:
    res = invoke("plan", str(EXAMPLES / "healthy-llama-7b.yaml"), "--format", "json")
    payload = json.loads(res.stdout)
    assert len(payload["top"]) == 5
    assert payload["top"][0]["fits"] is True


def test_missing_global_batch_is_one_line(tmp_path: Path) -> None:
    plan = yaml.safe_load((EXAMPLES / "healthy-llama-7b.yaml").read_text())
    del plan["batch"]["micro_batch_size"]
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(plan))
    res = invoke("plan", str(p))
    assert res.exit_code == 2
    assert "batch.global_batch_size" in res.output and "Traceback" not in res.output


def test_no_gpu_is_one_line(tmp_path: Path) -> None:
    plan = yaml.safe_load((EXAMPLES / "healthy-llama-7b.yaml").read_text())
    del plan["hardware"]["gpu"]
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(plan))
    res = invoke("plan", str(p))
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "hardware.gpu: no GPU model in the plan" in res.output


def test_published_examples_match_the_calibration_data() -> None:
    by_name = {r.plan["name"]: r for r in PUBLISHED_RUNS}
    files = sorted(EXAMPLES.glob("published-*.yaml"))
    assert files
    for f in files:
        data = yaml.safe_load(f.read_text())
        assert data == by_name[data["name"]].plan, f.name


def test_ambiguous_gpu_exits_2_listing_the_candidates() -> None:
    res = invoke("plan", str(EXAMPLES / "healthy-llama-7b.yaml"), "--gpu", "A100")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "A100-40GB" in res.output and "A100-80GB" in res.output


def test_json_names_hidden_collectives_and_calibration_limits() -> None:
    res = invoke("plan", str(EXAMPLES / "published-llama3-405b.yaml"), "--top", "1", "-f",
                 "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    cost = data["top"][0]["cost"]
    assert set(cost["hidden_s"]) == {"tp", "cp", "dp"}
    assert isinstance(cost["assumptions"], list)
