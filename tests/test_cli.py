"""The CLI in-process: exit codes, lines, and one clear message on bad input."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples" / "plans"
runner = CliRunner()
_register_commands()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_healthy_example_passes() -> None:
    res = invoke("check", str(EXAMPLES / "healthy-llama-7b.yaml"))
    assert res.exit_code == 0, res.output
    assert "0 error(s)" in res.output
    assert "global batch 512" in res.output


def test_json_schema() -> None:
    res = invoke("check", str(EXAMPLES / "broken-fp16-static-scale.yaml"), "--format", "json")
    payload = json.loads(res.stdout)
    assert set(payload) == {"findings", "plan", "origins", "summary"}
    f = payload["findings"][0]
    assert {"code", "severity", "check", "title", "message", "fix"} <= set(f)
    assert payload["summary"]["items"]["precision"] in ("warn", "fail")


def test_select_and_ignore_by_prefix() -> None:
    path = str(EXAMPLES / "broken-fp16-static-scale.yaml")
    res = invoke("check", path, "-f", "json", "--ignore", "N")
    assert all(not f["code"].startswith("N") for f in json.loads(res.stdout)["findings"])
    res = invoke("check", path, "-f", "json", "--select", "N103")
    assert {f["code"] for f in json.loads(res.stdout)["findings"]} == {"N103"}


def test_strict_fails_on_warnings() -> None:
    path = str(EXAMPLES / "broken-fp16-static-scale.yaml")
    assert invoke("check", path, "--select", "N103").exit_code == 0
    assert invoke("check", path, "--select", "N103", "--strict").exit_code == 1


def test_rules_and_explain() -> None:
    res = invoke("rules")
    assert res.exit_code == 0 and "N102" in res.output
    res = invoke("explain", "n102")
    assert res.exit_code == 0
    for heading in ("Why it explodes", "Early signs", "How to defuse"):
        assert heading in res.output
    # Its place in diagnose's causal map: a strong sign of broken loss scaling.
    assert "strong sign of loss-scaling" in res.output
    res = invoke("explain", "R001", "--format", "json")
    links = json.loads(res.stdout)["causes"]
    assert not links["sign_of"] and "fp16-overflow" in {c["cause"] for c in links["symptom_of"]}


def test_unknown_code_is_input_error() -> None:
    res = invoke("explain", "Z999")
    assert res.exit_code == 2
    assert "unknown rule code" in res.output and "Traceback" not in res.output


def test_missing_file(tmp_path: Path) -> None:
    res = invoke("check", str(tmp_path / "nope.yaml"))
    assert res.exit_code == 2
    assert "nope.yaml: file not found" in res.output


def test_malformed_yaml(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  hidden_size: [1, 2\n")
    res = invoke("check", str(p))
    assert res.exit_code == 2
    assert "bad.yaml: malformed YAML at line" in res.output


def test_unknown_field_names_path(tmp_path: Path) -> None:
    p = tmp_path / "typo.yaml"
    p.write_text("precision:\n  dtpye: bf16\n")
    res = invoke("check", str(p))
    assert res.exit_code == 2
    assert "typo.yaml: precision.dtpye: unknown field" in res.output


def test_wrong_type_names_value_and_expectation(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("model: {hidden_size: -4, num_layers: 2, num_heads: 2, vocab_size: 10}\n")
    res = invoke("check", str(p))
    assert res.exit_code == 2
    assert "model.hidden_size: invalid value (got -4); expected a number > 0" in res.output


def test_bad_option_value_names_option() -> None:
    res = invoke("check", "--gpu", "TPU-v9")
    assert res.exit_code == 2
    assert "--gpu (plan field hardware.gpu): invalid value (got 'TPU-v9')" in res.output
    assert "A100-80GB" in res.output


def test_nothing_to_check() -> None:
    res = invoke("check")
    assert res.exit_code == 2
    assert "nothing to check" in res.output


def test_every_shipped_plan_is_checked_and_estimated() -> None:
    """No shipped example may end in an input error (2) or a crash (3): the README's main
    job runs them all, and `sapper memory` explains every plan the checklist accepts."""
    for plan in sorted(EXAMPLES.glob("*.yaml")):
        for command in ("check", "memory"):
            res = invoke(command, str(plan))
            assert res.exit_code in (0, 1), (command, plan.name, res.output)
