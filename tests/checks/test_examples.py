"""The shipped example plans do what their header says.

Every broken example documents its intended findings and exit code in one line,
``# expect: N401 D101; exit 1``; this test holds the examples to it through the CLI,
so the comments users read stay true.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

EXAMPLES = Path(__file__).parent.parent.parent / "examples" / "plans"
EXPECT = re.compile(r"^# expect: (?P<codes>[A-Z0-9 ]+); exit (?P<exit>\d)", re.MULTILINE)
runner = CliRunner()
_register_commands()


def _broken() -> list[Path]:
    return sorted(EXAMPLES.glob("broken-*.yaml"))


def _expectation(path: Path) -> tuple[set[str], int]:
    m = EXPECT.search(path.read_text())
    assert m, f"{path.name} lacks a '# expect: CODES; exit N' line"
    return set(m["codes"].split()), int(m["exit"])


def test_there_are_several_broken_examples() -> None:
    assert len(_broken()) >= 5


@pytest.mark.parametrize("path", _broken(), ids=lambda p: p.stem)
def test_broken_example_fires_its_codes(path: Path) -> None:
    codes, exit_code = _expectation(path)
    res = runner.invoke(app, ["check", str(path), "--format", "json"])
    assert res.exit_code == exit_code, res.output
    fired = {f["code"] for f in json.loads(res.stdout)["findings"]}
    assert codes <= fired, f"expected {sorted(codes)}, got {sorted(fired)}"
    # The text report names each code too, and --strict fails a warnings-only example.
    text = runner.invoke(app, ["check", str(path)])
    assert all(code in text.output for code in codes)
    if exit_code == 0:
        assert runner.invoke(app, ["check", str(path), "--strict"]).exit_code == 1


def test_healthy_example_has_no_warnings_or_errors() -> None:
    res = runner.invoke(app, ["check", str(EXAMPLES / "healthy-llama-7b.yaml"), "-f", "json"])
    assert res.exit_code == 0
    summary = json.loads(res.stdout)["summary"]
    assert (summary["errors"], summary["warnings"]) == (0, 0)
