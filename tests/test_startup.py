"""What the fast commands import, not how fast they are (benchmarks/startup.py times them).

Each case runs one ``sapper`` command in a fresh interpreter, as the console script does,
and lists the heavy packages it imported: listing and explaining rules must not import
torch, transformers or numpy; checking a model of a family sapper counts itself must
not import transformers or torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "numpy", "tensorboard")

_PROBE = """
import json, sys
args, watched = json.loads(sys.argv[1]), json.loads(sys.argv[2])
from sapper.cli.app import main
sys.argv = ["sapper", *args]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = [m for m in watched if m in sys.modules]
sys.__stdout__.write("\\n" + json.dumps({"code": code, "heavy": heavy}) + "\\n")
"""


def _imports(*args: str) -> tuple[int, list[str]]:
    """(exit code, heavy packages imported) of ``sapper ARGS`` in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args), json.dumps(HEAVY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.stdout.strip(), proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["code"], out["heavy"]


def _pyproject_rule_modules() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(data["project"]["entry-points"]["sapper.rules"])


def _installed_rule_modules() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group="sapper.rules")}


def test_installed_rule_entry_points_match_pyproject() -> None:
    """The rule modules are found through the installed metadata, which an editable
    install writes once: after the entry points change, reinstall."""
    assert _installed_rule_modules() == _pyproject_rule_modules(), (
        "the installed sapper.rules entry points predate pyproject.toml: "
        "reinstall sapper (pip install -e .)"
    )


@pytest.mark.parametrize(
    "args", [("--help",), ("rules",), ("explain", "N102"), ("explain", "X005")]
)
def test_rules_and_help_import_nothing_heavy(args: tuple[str, ...]) -> None:
    if _installed_rule_modules() != _pyproject_rule_modules():
        pytest.skip("stale installed entry points (see the test above)")
    code, heavy = _imports(*args)
    assert code == 0
    assert heavy == []


@pytest.mark.parametrize("command", ["check", "memory"])
def test_a_known_family_is_read_without_transformers(command: str) -> None:
    code, heavy = _imports(
        command,
        "--model", "examples/hf/llama-2-7b.json",
        "--gpus", "64", "--gpus-per-node", "8", "--gpu", "A100-80GB",
        "--seq-len", "4096", "--micro-batch", "1",
    )
    assert code in (0, 1)
    assert "transformers" not in heavy
    if _installed_rule_modules() == _pyproject_rule_modules():  # stale: X rules load torch
        assert "torch" not in heavy


def test_log_format_help_lists_the_readers_formats() -> None:
    """analyze/report/watch spell the format list out (the readers load lazily)."""
    from sapper.cli.analyze_cmd import LOG_FORMATS
    from sapper.logs import FORMATS

    assert LOG_FORMATS == FORMATS


def test_lazy_exports_resolve() -> None:
    """The packages that export lazily still export every name in __all__."""
    import sapper
    import sapper.distributed
    import sapper.plan

    for module in (sapper, sapper.plan, sapper.distributed):
        for name in module.__all__:
            assert getattr(module, name) is not None, (module.__name__, name)
