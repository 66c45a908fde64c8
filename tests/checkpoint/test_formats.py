"""Every format read by the library that writes it, on CPU: the same tensors come out,
healthy files stay silent, and a planted NaN is found wherever it is stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ckptgen import Markov, llama
from safetensors.torch import save_file

from sapper.checkpoint import inspect_paths
from sapper.checkpoint.layout import detect


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in llama(seed=seed).state_dict().items()}


def test_safetensors_single_file_stats_match_torch(tmp_path: Path) -> None:
    sd = _state()
    save_file(sd, tmp_path / "m.safetensors")
    rep = inspect_paths([tmp_path / "m.safetensors"]).checkpoints[0]
    assert rep.kind == "safetensors"
    stats = {s.key: s for s in rep.weights}
    assert set(stats) == set(sd)
    for key, t in sd.items():
        assert stats[key].abs_max == pytest.approx(float(t.abs().max()))
        assert stats[key].rms == pytest.approx(float(t.double().pow(2).mean().sqrt()), rel=1e-5)


def test_sharded_safetensors_from_save_pretrained(tmp_path: Path) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    index = next((tmp_path / "sharded").glob("*.safetensors.index.json"))
    layout = detect(index)
    assert layout.kind == "safetensors-sharded" and len(layout.weights) > 1
    for target in (index, tmp_path / "sharded"):
        result = inspect_paths([target])
        assert result.findings == []
        assert len(result.checkpoints[0].weights) == len(dict(model.named_parameters()))


def test_jobs_over_shards_give_the_same_result(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sapper.cli.app import _register_commands, app

    model = llama()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    shard = sorted((tmp_path / "sharded").glob("model-*.safetensors"))[1]
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(shard), framework="pt") as handle:
        key = sorted(handle.keys())[0]
    sd = load_file(shard)
    sd[key].view(-1)[2] = float("nan")
    save_file(sd, shard, metadata={"format": "pt"})
    one = inspect_paths([tmp_path / "sharded"]).to_json()
    two = inspect_paths([tmp_path / "sharded"], jobs=2).to_json()
    assert one == two
    assert [f["tensor"] for f in one["findings"]] == [key]
    _register_commands()
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "sharded"), "-j", "2", "-f", "json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["findings"][0]["tensor"] == key


def test_large_tensor_is_reduced_in_chunks(tmp_path: Path, monkeypatch) -> None:
    import sapper.checkpoint.safefile as safefile

    monkeypatch.setattr(safefile, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(safefile, "REMAP_BYTES", 5000)  # a fresh mapping for each tensor
    t = torch.randn(70, 33)
    t[51, 7] = float("nan")
    big = torch.randn(3, 2500)  # eight pieces, the non-finite value in the last
    big[2, 2400] = float("-inf")
    save_file({"w": t, "b": big}, tmp_path / "m.safetensors")
    result = inspect_paths([tmp_path / "m.safetensors"])
    hits = {f.data["tensor"]: f.data["first_index"] for f in result.findings if f.code == "K001"}
    assert hits == {"w": [51, 7], "b": [2, 2400]}
    w = next(s for s in result.checkpoints[0].weights if s.key == "w")
    finite = torch.nan_to_num(t, nan=0.0)
    assert w.rms == pytest.approx(float(finite.double().pow(2).sum().div(t.numel() - 1).sqrt()))
    # pages given back after each piece fault in again from the file, unchanged
    twice = inspect_paths([tmp_path / "m.safetensors", tmp_path / "m.safetensors"])
    assert [c.relative for c in twice.changes] == [0.0, 0.0]
    assert [s.rms for s in twice.checkpoints[1].weights] == [
        s.rms for s in result.checkpoints[0].weights
    ]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "weights.pt", "ckpt.pth", "no_extension"])
def test_torch_save_state_dict(tmp_path: Path, name: str) -> None:
    sd = _state()
    torch.save(sd, tmp_path / name)
    assert inspect_paths([tmp_path / name]).findings == []
    sd["model.layers.1.self_attn.k_proj.weight"][0, 0] = float("nan")
    torch.save(sd, tmp_path / name)
    (hit,) = inspect_paths([tmp_path / name]).findings
    assert hit.code == "K001" and hit.data["tensor"] == "model.layers.1.self_attn.k_proj.weight"


def test_legacy_torch_format_is_read_without_mmap(tmp_path: Path) -> None:
    sd = _state()
    sd["model.norm.weight"][1] = float("-inf")
    torch.save(sd, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    (hit,) = inspect_paths([tmp_path / "old.bin"]).findings
    assert (hit.code, hit.data["tensor"], hit.data["neginf"]) == ("K001", "model.norm.weight", 1)
    # read twice (a diff against itself): tensors in memory are never given back to the OS
    assert [
        c.relative
        for c in inspect_paths([tmp_path / "old.bin"] * 2).changes
        if c.key != "model.norm.weight"
    ] == [0.0] * (len(sd) - 1)


def test_custom_loop_checkpoint_with_wrapped_names(tmp_path: Path) -> None:
    """A plain loop's {"model", "optimizer", "scheduler", "step"} file of a compiled/DDP
    model: the _orig_mod./module. prefixes are understood and Adam's state is named."""
    model = llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    batch = Markov(n=8)[0]["input_ids"].unsqueeze(0)
    for _ in range(2):
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    sd = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    torch.save(
        {"model": sd, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": 2},
        tmp_path / "ckpt.pt",
    )
    rep = inspect_paths([tmp_path / "ckpt.pt"]).checkpoints[0]
    assert rep.findings == []
    assert rep.steps == {"optimizer": 2.0, "scheduler": 2.0}
    names = {u.name for u in rep.updates}
    assert "module._orig_mod.model.layers.3.mlp.down_proj.weight" in names


def test_lightning_checkpoint(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")

    class Tiny(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"hidden": 32})
            self.model = llama()

        def training_step(self, batch, _):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            sched = torch.optim.lr_scheduler.StepLR(opt, 10)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    trainer = lightning.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = torch.utils.data.DataLoader(Markov(n=16), batch_size=4)
    trainer.fit(Tiny(), loader)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    result = inspect_paths([tmp_path / "last.ckpt"])
    rep = result.checkpoints[0]
    assert result.findings == [], [f.message for f in result.findings]
    assert rep.kind == "lightning"
    assert rep.steps["optimizer"] == rep.steps["trainer"] == 3.0
    assert {u.name for u in rep.updates} >= {"model.model.layers.0.mlp.up_proj.weight"}
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=False)
    ckpt["optimizer_states"][0]["state"][0]["exp_avg"].fill_(float("inf"))
    torch.save(ckpt, tmp_path / "bad.ckpt")
    hits = [f for f in inspect_paths([tmp_path / "bad.ckpt"]).findings if f.code == "K001"]
    assert [f.data["tensor"] for f in hits] == ["model.model.embed_tokens.weight.exp_avg"]


def test_distributed_checkpoint_folder(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    sd = _state()
    dcp.save(sd, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    rep = inspect_paths([tmp_path / "dcp"]).checkpoints[0]
    assert rep.kind == "torch-dcp" and rep.findings == []
    assert {s.key for s in rep.weights} == set(sd)
    sd["model.norm.weight"][3] = float("nan")
    dcp.save(sd, checkpoint_id=str(tmp_path / "dcp2"), no_dist=True)
    hits = inspect_paths([tmp_path / "dcp2"]).findings
    assert [(f.code, f.data["tensor"]) for f in hits] == [("K001", "model.norm.weight")]
