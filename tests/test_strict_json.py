"""Every ``--format json`` output is strict JSON (RFC 8259): a parser that refuses ``NaN``
and ``Infinity`` (as JavaScript's ``JSON.parse``, Go's ``encoding/json`` and ``jq`` do)
reads it, on the runs that matter most, the ones that went NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.jsontext import dumps, finite_safe
from sapper.rules.model import Finding
from sapper.runtime.trackers import findings_document

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
NAN_LOGS = ROOT / "tests" / "fixtures" / "logs"
runner = CliRunner()
_register_commands()


def _refuse(token: str) -> Any:
    raise ValueError(f"non-strict JSON token {token}")


def strict_loads(text: str) -> Any:
    return json.loads(text, parse_constant=_refuse)


def _nan_runlog(path: Path) -> Path:
    """A sapper run log whose loss goes NaN, then Inf, at the end."""
    lines = [{"kind": "step", "step": s, "loss": 3.0 - 0.01 * s, "lr": 1e-4} for s in range(40)]
    lines += [{"kind": "step", "step": 40, "loss": "nan"}, {"kind": "step", "step": 41,
                                                            "loss": "inf", "grad_norm": "nan"}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


COMMANDS = {
    "check": ["check", str(EXAMPLES / "plans" / "broken-fp16-static-scale.yaml")],
    "memory": ["memory", str(EXAMPLES / "plans" / "healthy-llama-7b.yaml")],
    "plan": ["plan", str(EXAMPLES / "plans" / "healthy-llama-7b.yaml")],
    "analyze-nanogpt": [
        "analyze", str(NAN_LOGS / "nanogpt" / "nanogpt-215-gpt2-fp16-nan-3010.txt")
    ],
    "analyze-hf-console": [
        "analyze", str(NAN_LOGS / "hf_console" / "pink-6-stage1-grad-norm-nan.txt")
    ],
    "analyze-megatron": ["analyze", str(EXAMPLES / "logs" / "megatron-gpt345m-fp16.log")],
    "rules": ["rules"],
    "explain": ["explain", "R001"],
    "smoke": ["smoke", "--model", str(EXAMPLES / "smoke" / "llama-toy.json"),
              "--checks", "accumulation"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_writes_strict_json(name: str) -> None:
    res = runner.invoke(app, [*COMMANDS[name], "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    strict_loads(res.stdout)


def test_analyze_of_a_nan_run_spells_the_value(tmp_path: Path) -> None:
    res = runner.invoke(app, ["analyze", str(_nan_runlog(tmp_path / "run.jsonl")), "-f", "json"])
    assert res.exit_code == 1, res.output
    payload = strict_loads(res.stdout)
    text = json.dumps(payload)
    assert '"nan"' in text or '"inf"' in text  # the NaN is there, spelled as a string


def test_watch_json_lines_are_strict(tmp_path: Path) -> None:
    log = _nan_runlog(tmp_path / "run.jsonl")
    out = tmp_path / "findings.jsonl"
    res = runner.invoke(app, ["watch", str(log), "--format", "json", "--poll", "0.05",
                              "--idle-timeout", "0.4", "--findings-out", str(out)])
    assert res.exit_code == 1, res.output
    lines = [strict_loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert any(o.get("kind") == "finding" for o in lines)
    assert [strict_loads(line) for line in out.read_text().splitlines()]


def test_the_tracker_findings_document_is_strict_and_reads_back() -> None:
    finding = Finding(code="R001", severity="error", check="numerics", title="t", message="m",
                      fix="f", value=math.nan, threshold=-math.inf)
    (back,) = strict_loads(findings_document([finding]))["findings"]
    again = Finding.model_validate(back)
    assert math.isnan(again.value) and again.threshold == -math.inf


_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5))
_tree = st.recursive(_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.text(max_size=4), inner, max_size=4)), max_leaves=20)


@given(_tree)
def test_dumps_is_strict_for_any_value(value: Any) -> None:
    strict_loads(dumps(value))
    assert strict_loads(dumps(value)) == json.loads(json.dumps(finite_safe(value)))
