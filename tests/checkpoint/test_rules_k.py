"""The K rules: documented like every sapper rule, listed and explained without torch."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from sapper.checkpoint.rules import CHECKPOINT_RULES
from sapper.cli.app import _register_commands, app

_register_commands()


def test_every_k_rule_has_its_three_parts() -> None:
    codes = [r.code for r in CHECKPOINT_RULES]
    assert codes == sorted(codes) and len(set(codes)) == len(codes)
    for rule in CHECKPOINT_RULES:
        assert rule.code.startswith("K") and rule.why and rule.signs and rule.fix


def test_explain_a_k_rule() -> None:
    res = CliRunner().invoke(app, ["explain", "K005"])
    assert res.exit_code == 0, res.output
    assert "update" in res.output


def test_rules_module_imports_no_heavy_package() -> None:
    probe = (
        "import sys, sapper.checkpoint.rules; "
        "print(sorted(m for m in ('torch', 'numpy', 'safetensors', 'transformers') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
