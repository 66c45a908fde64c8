"""What the launch-config reader tests share: the CLI in-process, the verdicts of a check
(checklist items, finding codes, derived numbers), and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples"
LLAMA = EXAMPLES / "hf" / "llama-2-7b.json"
runner = CliRunner()
_register_commands()


def check(*args: str) -> Any:
    return runner.invoke(app, ["check", *args])


def verdicts(*args: str) -> tuple[dict[str, str], list[str], dict[str, Any], list[str]]:
    """Items, sorted finding codes, derived numbers and unresolved fields of a check."""
    res = check(*args, "-f", "json")
    assert res.exit_code in (0, 1), res.output
    out = json.loads(res.stdout)
    summary = out["summary"]
    codes = sorted(f["code"] for f in out["findings"])
    return summary["items"], codes, summary["derived"], sorted(summary.get("unresolved", []))


def same_verdicts(config: Path, plan: dict[str, Any], tmp_path: Path, *extra: str) -> list[str]:
    """``sapper check --config <config>`` and the same job written as a sapper plan by hand
    give the same verdicts, apart from what reading the config itself found (its C0xx
    findings and the ``config`` item, which a hand-written plan cannot have). Returns
    those C0xx codes, for the caller to assert."""
    hand = tmp_path / "hand-written-plan.yaml"
    hand.write_text(yaml.safe_dump(plan))
    items, codes, derived, unresolved = verdicts("--config", str(config), *extra)
    loader = [c for c in codes if c.startswith("C0")]
    items.pop("config", None)
    mine = (items, [c for c in codes if not c.startswith("C0")], derived, unresolved)
    assert mine == verdicts("--config", str(hand), *extra)
    return loader


def one_line_error(path: Path, *parts: str) -> str:
    res = check("--config", str(path))
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output
    assert str(path) in lines[0]
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def hostile_case(folder: Path, name: str, data: bytes, cli: bool) -> None:
    """A mutated example, written next to the files it references: the library returns or
    raises one bounded line, and the CLI exits 0, 1 or 2 without a traceback."""
    from tests.fuzz import time_limit

    from sapper.errors import SapperError
    from sapper.plan.load import load_plan

    target = folder / f"mutated-{name}"
    target.write_bytes(data)
    with time_limit(20):
        try:
            load_plan(configs=[target])
        except SapperError as exc:
            text = str(exc)
            assert "\n" not in text and len(text) < 2000, text[:2000]
        if cli:
            res = check("--config", str(target))
            if res.exception is not None and not isinstance(res.exception, SystemExit):
                raise AssertionError(f"{name}: exit 3") from res.exception
            assert res.exit_code in (0, 1, 2), res.output[:2000]
            assert "Traceback" not in res.output


def write_yaml(tmp_path: Path, config: dict[str, Any], name: str) -> Path:
    """``config`` written as a YAML file in ``tmp_path``."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def changed(base: dict[str, Any], *, drop: object = None, **changes: object) -> dict[str, Any]:
    """A copy of ``base`` with dotted keys (``a__b__0__c``: ``__`` between levels, a number
    indexes a list) set to the given values; a value that ``is drop`` removes the key."""
    config = json.loads(json.dumps(base))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = config
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if value is drop:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return config


def c006_by_key(src: Any) -> dict[str, str]:
    """The C006 notes (values left unresolved) of a PlanSource, by the key they name."""
    return {f.data["key"]: f.message for f in src.findings if f.code == "C006"}
