"""Megatron-LM checkpoint folders, in the layout its checkpointing code writes
(``megatron/training/checkpointing.py``: ``latest_checkpointed_iteration.txt``,
``iter_{:07d}/mp_rank_{:02d}/model_optim_rng.pt`` holding ``args``, ``iteration``,
``model``, ``optimizer`` = {``optimizer``, ``grad_scaler``}, ``opt_param_scheduler``,
``rng_state``). Megatron itself does not run on this CPU machine; the files are written
with torch.save from a real model and optimizer after real steps."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from ckptgen import Markov, llama

from sapper.checkpoint import inspect_paths


def _save(root: Path, scale: float = 65536.0, nan_rank: int | None = None) -> Path:
    iteration = 2
    folder = root / f"iter_{iteration:07d}"
    for rank in range(2):  # two tensor-parallel ranks
        model = llama(seed=rank)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        batch = Markov(n=8)[0]["input_ids"].unsqueeze(0)
        for _ in range(iteration):
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()
            opt.zero_grad()
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if rank == nan_rank:
            sd["model.layers.1.mlp.up_proj.weight"][2, 3] = float("nan")
        (folder / f"mp_rank_{rank:02d}").mkdir(parents=True)
        torch.save({
            "args": argparse.Namespace(lr=1e-3, tensor_model_parallel_size=2),
            "checkpoint_version": 3.0,
            "iteration": iteration,
            "model": sd,
            "optimizer": {"optimizer": opt.state_dict(),
                          "grad_scaler": {"scale": torch.tensor(scale), "growth_tracker": 0,
                                          "hysteresis_tracker": 2}},
            "opt_param_scheduler": {"max_lr": 1e-3, "num_steps": 16, "warmup_steps": 0},
            "rng_state": [{"random_rng_state": (3, (1, 2), None),
                           "torch_rng_state": torch.get_rng_state()}],
        }, folder / f"mp_rank_{rank:02d}" / "model_optim_rng.pt")  # fmt: skip
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return root


def test_healthy_megatron_folder(tmp_path: Path) -> None:
    root = _save(tmp_path / "ckpt")
    for target in (
        root,
        root / "iter_0000002",
        root / "iter_0000002/mp_rank_00/model_optim_rng.pt",
    ):
        result = inspect_paths([target])
        rep = result.checkpoints[0]
        assert result.findings == [], [f.message for f in result.findings]
        assert rep.kind == "megatron"
        assert rep.steps == {"optimizer": 2.0, "trainer": 2.0}
        assert rep.pieces["scaler"] and rep.pieces["rng"] and rep.pieces["scheduler"]
    rep = inspect_paths([root]).checkpoints[0]
    assert "mp_rank_01/model.layers.0.mlp.up_proj.weight" in {s.key for s in rep.weights}
    # each rank's Adam state is named after that rank's weights
    names = [u.name for u in rep.updates]
    assert len(names) == len(set(names)) == 2 * 39
    assert {n.split("/")[0] for n in names} == {"mp_rank_00", "mp_rank_01"}


def test_megatron_nan_on_one_rank_and_collapsed_scaler(tmp_path: Path) -> None:
    root = _save(tmp_path / "ckpt", scale=1.0, nan_rank=1)
    findings = inspect_paths([root]).findings
    assert [(f.code, f.data.get("tensor")) for f in findings] == [
        ("K001", "mp_rank_01/model.layers.1.mlp.up_proj.weight"),
        ("K006", None),
    ]
