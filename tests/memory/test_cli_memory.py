"""``sapper memory`` in-process: table, JSON, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

ROOT = Path(__file__).parent.parent.parent
HEALTHY = str(ROOT / "examples" / "plans" / "healthy-llama-7b.yaml")
runner = CliRunner()
_register_commands()


def test_table_for_a_plan_that_fits() -> None:
    res = runner.invoke(app, ["memory", HEALTHY])
    assert res.exit_code == 0, res.output
    assert "FITS on A100-80GB" in res.output
    for word in ("parameters", "optimizer states", "activations", "remedies", "what if"):
        assert word in res.output
    assert "largest micro batch that fits" in res.output


def test_same_options_as_check_and_exit_1_when_it_does_not_fit() -> None:
    res = runner.invoke(app, ["memory", HEALTHY, "--gpus", "8", "--tp", "1", "--zero", "0",
                              "--checkpointing", "none", "--gpu", "V100-16GB"])
    assert res.exit_code == 1, res.output
    assert "DOES NOT FIT" in res.output


def test_json() -> None:
    res = runner.invoke(app, ["memory", HEALTHY, "--format", "json"])
    payload = json.loads(res.stdout)
    assert set(payload) == {"estimate", "verdict"}
    est = payload["estimate"]
    assert est["fits"] is True and est["peak_bytes"] > est["tensor_peak_bytes"]
    assert set(est["breakdown"]) >= {"params", "grads", "optimizer", "activations"}
    assert payload["verdict"]["remedies"]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: {hidden_size: 4096, num_layers: 32, num_heads: 30, vocab_size: 32000}\n"
        "batch: {micro_batch_size: 1, seq_len: 2048}\n"
    )
    res = runner.invoke(app, ["memory", str(plan)])
    assert res.exit_code == 2
    assert "not divisible by num_heads 30" in res.output
    assert "Traceback" not in res.output


def test_missing_micro_batch_is_named(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("model: {hidden_size: 64, num_layers: 2, num_heads: 4, vocab_size: 100}\n")
    res = runner.invoke(app, ["memory", str(plan)])
    assert res.exit_code == 2
    assert "batch.micro_batch_size" in res.output
