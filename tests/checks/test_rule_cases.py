"""Every pre-flight rule has a case that must fire and one that must not.

Cases live in ``tests/rules_cases/<CODE>.yaml``::

    code: N102
    fires:            # inputs under which the rule must report
      plan: {...}     # a sapper plan (YAML shape)
      deepspeed: {...}  # optional: written to ds.json
      hf_config: {...}  # optional: written to config.json
      files: {name: text}  # optional: written next to the plan (e.g. a jsonl dataset)
      configs: {name: text}  # optional: launch configs of any format, read as --config
    quiet: {...}      # same shape; the rule must stay silent
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sapper.checks.engine import _CHECKS, run_checklist
from sapper.plan.load import load_plan
from sapper.rules.registry import load_rules

CASES = Path(__file__).parent.parent / "rules_cases"


def _case_files() -> list[Path]:
    return sorted(CASES.glob("*.yaml"))


def _run(case: dict, tmp_path: Path) -> set[str]:
    plan_file = hf = ds = None
    for name, text in case.get("files", {}).items():
        (tmp_path / name).write_text(text)
    if "plan" in case:
        plan_file = tmp_path / "plan.yaml"
        plan_file.write_text(yaml.safe_dump(case["plan"]))
    if "hf_config" in case:
        hf = tmp_path / "config.json"
        hf.write_text(json.dumps(case["hf_config"]))
    if "deepspeed" in case:
        ds = tmp_path / "ds.json"
        ds.write_text(json.dumps(case["deepspeed"]))
    configs = []
    for name, text in case.get("configs", {}).items():
        configs.append(tmp_path / name)
        configs[-1].write_text(text)
    report = run_checklist(load_plan(plan_file, configs=configs, hf_config=hf, deepspeed=ds))
    return {f.code for f in report.findings}


@pytest.mark.parametrize("path", _case_files(), ids=lambda p: p.stem)
def test_rule_fires_and_stays_quiet(path: Path, tmp_path: Path) -> None:
    spec = yaml.safe_load(path.read_text())
    code = spec["code"]
    assert code == path.stem
    (tmp_path / "fires").mkdir()
    (tmp_path / "quiet").mkdir()
    assert code in _run(spec["fires"], tmp_path / "fires"), f"{code} did not fire"
    assert code not in _run(spec["quiet"], tmp_path / "quiet"), f"{code} fired on quiet case"


def test_every_plan_rule_has_a_case() -> None:
    load_rules()
    codes = {rule.code for check in _CHECKS for rule in check.rules}
    have = {p.stem for p in _case_files()}
    assert codes - have == set(), "rules without a fires/quiet case"
