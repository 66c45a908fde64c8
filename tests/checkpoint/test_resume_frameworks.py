"""A resume finding holds for the framework that wrote the checkpoint: nanoGPT and LitGPT
compute the LR from the saved ``iter_num``; DeepSpeed writes ``lr_scheduler: None`` and
Lightning ``lr_schedulers: []`` for a run that had no scheduler. Those resume exactly and
stay quiet; a scheduler that did exist and is gone is still K009."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ckptgen import Markov, llama
from test_deepspeed_checkpoints import _copy, deepspeed_names  # noqa: F401 - a fixture

from sapper.checkpoint import inspect_paths


def _k009(path: Path) -> list[str]:
    found = inspect_paths([path]).findings
    return [m for f in found if f.code == "K009" for m in f.data["missing"]]


def _nanogpt_checkpoint(path: Path, **drop: bool) -> None:
    """What nanoGPT's train.py saves every eval_interval (karpathy/nanoGPT, MIT):
    model, optimizer, model_args, iter_num, best_val_loss, config."""
    model = llama(layers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95))
    ids = torch.randint(0, 100, (2, 16))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "model_args": {"n_layer": 2, "n_head": 4, "n_embd": 32, "block_size": 16,
                       "bias": False, "vocab_size": 100, "dropout": 0.0},
        "iter_num": 2,
        "best_val_loss": torch.tensor(4.2),
        "config": {"learning_rate": 6e-4, "warmup_iters": 2000, "lr_decay_iters": 600000,
                   "min_lr": 6e-5, "decay_lr": True, "max_iters": 600000},
    }  # fmt: skip
    for key in drop:
        checkpoint.pop(key)
    torch.save(checkpoint, path)


def test_nanogpt_lr_follows_iter_num(tmp_path: Path) -> None:
    _nanogpt_checkpoint(tmp_path / "ckpt.pt")
    assert _k009(tmp_path / "ckpt.pt") == []
    _nanogpt_checkpoint(tmp_path / "no_step.pt", iter_num=True)  # nothing to resume the LR from
    assert _k009(tmp_path / "no_step.pt") == ["LR scheduler state (the schedule restarts)"]


def _set_lr_scheduler(root: Path, value: object) -> None:
    for path in (root / "global_step3").glob("*model_states.pt"):
        state = torch.load(path, weights_only=False)
        if value == "absent":
            state.pop("lr_scheduler")
        else:
            state["lr_scheduler"] = value
        torch.save(state, path)


def test_deepspeed_without_a_scheduler(tmp_path: Path, deepspeed_names) -> None:  # noqa: F811
    healthy = _copy("zero2-bf16-dp2", tmp_path / "with")
    assert _k009(healthy) == []
    none = _copy("zero2-bf16-dp2", tmp_path / "none")
    _set_lr_scheduler(none, None)  # engine.save_checkpoint with no scheduler given
    assert _k009(none) == []
    absent = _copy("zero2-bf16-dp2", tmp_path / "absent")
    _set_lr_scheduler(absent, "absent")
    assert _k009(absent) == ["LR scheduler state (the schedule restarts)"]


@pytest.mark.parametrize("with_scheduler", [False, True])
def test_lightning_with_and_without_a_scheduler(tmp_path: Path, with_scheduler: bool) -> None:
    lightning = pytest.importorskip("lightning")

    class Tiny(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = llama(layers=2)

        def training_step(self, batch, _):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            if not with_scheduler:
                return opt
            sched = torch.optim.lr_scheduler.StepLR(opt, 10)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    trainer = lightning.Trainer(
        max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), torch.utils.data.DataLoader(Markov(n=8), batch_size=4))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    assert _k009(tmp_path / "last.ckpt") == []
    if with_scheduler:  # a scheduler the run had, then lost, is still named
        state = torch.load(tmp_path / "last.ckpt", weights_only=False)
        state.pop("lr_schedulers")
        torch.save(state, tmp_path / "lost.ckpt")
        assert _k009(tmp_path / "lost.ckpt") == ["LR scheduler state (the schedule restarts)"]
