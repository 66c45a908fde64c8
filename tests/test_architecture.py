"""ARCHITECTURE.md stays true: every path it names exists, its layer table is the layers
contract, and the import contracts in pyproject.toml hold (``lint-imports``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "ARCHITECTURE.md"
SRC = ROOT / "src" / "sapper"

#: Back-quoted repository paths in the page: `src/...`, `.ci/run`, `pyproject.toml`.
_PATH = re.compile(r"`((?:src|tests|\.ci)/[^`\s]*|pyproject\.toml)`")


def _tomllib():  # tomllib from 3.11, tomli (a dependency) before
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib


def _contracts() -> list[dict]:
    data = _tomllib().loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return data["tool"]["importlinter"]["contracts"]


def _layers() -> list[str]:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    return layers["layers"]


def test_every_path_the_page_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    named = sorted(set(_PATH.findall(text)))
    assert len(named) > 30, named  # the page names its folders; a broken regex finds none
    missing = [p for p in named if not (ROOT / p).exists()]
    assert missing == []


def test_layer_table_is_the_contract() -> None:
    """The table's first column, top to bottom, is the layers contract's list."""
    rows = re.findall(r"^\| `([^`]+)` \|", DOC.read_text(encoding="utf-8"), flags=re.M)
    assert [r.replace("\\|", "|") for r in rows] == _layers()


def test_layers_cover_every_top_level_module() -> None:
    """Every package and module directly under src/sapper/ has a layer (the contract is
    exhaustive too; this says which one is missing without running import-linter)."""
    named = {name.strip() for layer in _layers() for name in re.split(r"[|:]", layer)}
    present = {
        p.stem if p.is_file() else p.name
        for p in SRC.iterdir()
        if (p.is_file() and p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert present - named == set()
    assert named - present == set()


#: Folders that are entries of a child process's ``PYTHONPATH``, not packages: their
#: modules are imported under top-level names (``sapper run``'s ``sitecustomize``).
PATH_ENTRIES = {"src/sapper/launch/site"}


def test_every_source_folder_is_a_package() -> None:
    """import-linter sees regular packages only: a folder of modules without
    ``__init__.py`` (a namespace package) would drop out of every contract unnoticed."""
    folders = {p.parent for p in SRC.rglob("*.py") if "__pycache__" not in p.parts}
    namespaces = [f for f in folders if not (f / "__init__.py").exists()]
    named = sorted(str(f.relative_to(ROOT)) for f in namespaces)
    assert [f for f in named if f not in PATH_ENTRIES] == []
    # a path entry holds just the module Python looks for there
    for entry in PATH_ENTRIES:
        assert sorted(p.name for p in (ROOT / entry).glob("*.py")) == ["sitecustomize.py"]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with ``root``'s pyproject.toml over ``root``/src."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports"
    )
    assert exe is not None, "lint-imports not found: install the dev extra (import-linter)"
    path = os.pathsep.join(p for p in (str(root / "src"), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [exe, "--no-cache", "--no-logo"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_import_contracts_hold() -> None:
    """``lint-imports`` over the source tree: the layers, live/offline, light rule-listing
    and no-cycle contracts. The failure output names each broken import."""
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"Contracts: \d+ kept, 0 broken", proc.stdout), proc.stdout[-2000:]


def test_an_upward_import_fails_naming_it(tmp_path: Path) -> None:
    """What CI does with a broken contract: a deferred import from the memory layer up to
    the command line, and a cycle inside memory, each fail ``lint-imports`` by name."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(SRC, tmp_path / "src" / "sapper",
                    ignore=shutil.ignore_patterns("__pycache__", "assets"))
    units = tmp_path / "src" / "sapper" / "memory" / "units.py"
    units.write_text(
        units.read_text(encoding="utf-8")
        + "\n\ndef _up():\n    from sapper.cli.output import console\n\n"
        "    from sapper.memory.estimate import estimate\n\n    return console, estimate\n",
        encoding="utf-8",
    )
    proc = _lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "sapper.memory is not allowed to import sapper.cli" in proc.stdout
    assert "sapper.memory.units -> sapper.cli.output" in proc.stdout
    assert "No cycles are allowed in sapper.memory" in proc.stdout
