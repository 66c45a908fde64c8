"""The GPU check script imports without a GPU and its estimates run on any machine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_memory_check.py"


def _load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_memory_check", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_memory_check"] = module
    spec.loader.exec_module(module)
    return module


def test_dry_run_gives_allocated_and_reserved_for_the_accuracy_grid(capsys) -> None:  # type: ignore[no-untyped-def]
    gmc = _load()
    assert gmc.main(["--dry-run", "--quick", "--family", "gpt2"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| gpt2")]
    assert len(lines) == 2  # the quick grid's two gpt2 rows
    row = gmc.rows(True, ["foreach"])[0]
    e = gmc.estimates(row)
    # reserved holds at least what is allocated; the allocator rounds, never shrinks
    assert e.analytic_reserved > e.analytic_allocated
    assert e.traced_reserved >= e.traced_allocated > 0
