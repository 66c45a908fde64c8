"""Two checkpoints of one HF Trainer run: the layer that jumped, and where NaN appears."""

from __future__ import annotations

from pathlib import Path

import torch
from ckptgen import plant_weights

from sapper.checkpoint import inspect_paths


def test_consecutive_healthy_checkpoints_are_silent(hf_run: list[Path]) -> None:
    result = inspect_paths(hf_run)
    assert result.findings == []
    assert result.diff is not None and result.diff["compared"] == len(result.changes) > 30
    assert all(0 < c.relative < 0.5 for c in result.changes if c.key.endswith("proj.weight"))


def test_layer_that_moved_far_more_is_named(hf_run, copy_of) -> None:
    later = copy_of(hf_run[-1])
    key = "model.layers.1.mlp.gate_proj.weight"

    def jump(sd: dict) -> None:
        w = sd[key]
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * 0.5 * w.std())

    plant_weights(later, jump)
    result = inspect_paths([hf_run[0], later])
    assert [(f.code, f.data["tensor"]) for f in result.findings] == [("K020", key)]
    ranked = result.diff["largest_changes"]
    assert ranked[0]["tensor"] == key


def test_where_nonfinite_values_first_appear(hf_run, copy_of) -> None:
    earlier, later = copy_of(hf_run[0]), copy_of(hf_run[-1])
    plant_weights(
        earlier, lambda sd: sd["model.layers.0.self_attn.v_proj.weight"].fill_(float("nan"))
    )
    plant_weights(
        later, lambda sd: sd["model.layers.0.self_attn.v_proj.weight"].fill_(float("nan"))
    )
    plant_weights(
        later, lambda sd: sd["model.layers.3.mlp.down_proj.weight"][0].fill_(float("inf"))
    )
    result = inspect_paths([earlier, later])
    appeared = [f.data["tensor"] for f in result.findings if f.code == "K021"]
    assert appeared == ["model.layers.3.mlp.down_proj.weight"]
    assert result.exit_code() == 1


def test_tensor_that_did_not_move_is_named(hf_run, copy_of) -> None:
    from safetensors.torch import load_file

    later = copy_of(hf_run[-1])
    key = "model.layers.3.self_attn.k_proj.weight"
    earlier = load_file(hf_run[0] / "model.safetensors")[key]
    plant_weights(later, lambda sd: sd[key].copy_(earlier))
    result = inspect_paths([hf_run[0], later])
    assert [(f.code, f.data["tensor"]) for f in result.findings] == [("K022", key)]
    # the same checkpoint twice: nothing moved, nothing is singled out
    assert inspect_paths([hf_run[0], hf_run[0]]).findings == []
