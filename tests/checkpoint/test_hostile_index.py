"""Large listings in a checkpoint's metadata: a shard index naming hundreds of thousands of
files, an optimizer of tens of thousands of param groups, a folder of many Megatron
ranks. Each is refused by a bound checked before the per-entry work, or handled in time
proportional to its size, never in time quadratic in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tests.fuzz import time_limit

from sapper.checkpoint import inspect_paths, layout
from sapper.checkpoint.optim import param_names, trained_keys
from sapper.checkpoint.scan import OptimizerState, Scan
from sapper.checkpoint.source import TorchSource
from sapper.errors import InputError

#: Generous: the refusals take well under a second, the handled cases a few seconds. The
#: quadratic walks these replace took hours on the same inputs.
TIMEOUT_S = 240


def _sapper(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from sapper.cli.app import main; sys.argv[0] = 'sapper'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=TIMEOUT_S
    )


def test_index_of_200k_distinct_shard_files_is_refused_in_bounded_time(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {
        f"layers.{i}.weight": f"model-{i:06d}-of-200000.safetensors" for i in range(200_000)
    }
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for target in (index, tmp_path):  # the index itself, and the folder holding it
        res = _sapper("inspect", str(target))
        assert res.returncode == 2, res.stdout + res.stderr
        assert "Traceback" not in res.stderr
        assert f"more than {layout.MAX_SHARDS} distinct shard files" in res.stderr
        assert "model.safetensors.index.json" in res.stderr


def test_index_of_200k_entries_over_one_shard_is_read_in_bounded_time(tmp_path: Path) -> None:
    save_file({"w": torch.ones(4, 4), "b": torch.zeros(4)}, tmp_path / "model-1.safetensors")
    weight_map = {f"layers.{i}.weight": "model-1.safetensors" for i in range(200_000)}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    res = _sapper("inspect", str(index))
    assert res.returncode in (0, 1), res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_index_bounds_name_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {f"t{i}": "m.safetensors" for i in range(50)}}))
    monkeypatch.setattr(layout, "MAX_INDEX_ENTRIES", 40)
    with pytest.raises(InputError, match="too many tensors") as info:
        inspect_paths([index])
    assert "weight_map" in str(info.value) and "at most 40 entries" in str(info.value)
    monkeypatch.setattr(layout, "MAX_INDEX_ENTRIES", 1000)
    monkeypatch.setattr(layout, "MAX_SHARDS", 3)
    index.write_text(json.dumps({"weight_map": {f"t{i}": f"m{i}.safetensors" for i in range(9)}}))
    with pytest.raises(InputError, match="more than 3 distinct shard files") as info:
        inspect_paths([index])
    assert "weight_map.t3" in str(info.value) and "m3.safetensors" in str(info.value)


def test_unhashable_shard_names_are_refused_naming_the_entry(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    for bad in ([1, 2], {"a": 1}, 7, None):
        index.write_text(json.dumps({"weight_map": {"a": "m.safetensors", "b": bad}}))
        with pytest.raises(InputError, match="not a file in the index's folder") as info:
            inspect_paths([index])
        assert "weight_map.b" in str(info.value)


def test_too_many_megatron_rank_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    iteration = tmp_path / "iter_0000001"
    for rank in range(6):
        (iteration / f"mp_rank_{rank:02d}").mkdir(parents=True)
    monkeypatch.setattr(layout, "MAX_MEGATRON_RANKS", 5)
    with pytest.raises(InputError, match="too many Megatron rank folders") as info:
        inspect_paths([iteration])
    assert str(iteration) in str(info.value) and "at most 5" in str(info.value)


def test_optimizer_of_50k_param_groups_is_named_in_bounded_time() -> None:
    """One param group per parameter, each of its own shape: naming the parameters by
    shape is a bisection per group, not a walk over every weight per group."""
    n = 50_000
    # zero-size tensors: 50k distinct shapes without a value to store
    model = {f"layers.{i}.weight": torch.empty(0, i + 1) for i in range(n)}
    state = {i: {"step": 3, "exp_avg": torch.empty(0, i + 1)} for i in reversed(range(n))}
    groups = [{"params": [i], "lr": 1e-3} for i in range(n)]
    scan = Scan(layout.Layout(Path("last.pt"), "torch", weights_format="torch"),
                TorchSource(model, "last.pt"), "last.pt")  # fmt: skip
    opt = OptimizerState(state, groups, "last.pt")
    with time_limit(TIMEOUT_S):
        names = param_names(scan, opt)
        assert names == {i: f"layers.{i}.weight" for i in range(n)}
        assert trained_keys(Scan(scan.layout, scan.weights, "last.pt", [opt])) == set(model)
