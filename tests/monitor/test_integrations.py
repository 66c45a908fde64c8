"""The framework adapters feed the same monitor: a transformers Trainer callback and a
Lightning callback, each on a tiny real run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tinytrain import FAST, Markov, gpt2

from sapper.runtime.runlog import read_runlog


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, duplicate_from: int | None = None) -> None:
        rows = Markov(batch=n, seq=32, seed=5).sample(n, 32)
        if duplicate_from is not None:  # a broken shard list: the tail repeats the head
            rows[duplicate_from:] = rows[: n - duplicate_from]
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _hf_trainer(
    tmp_path: Path,
    dataset,
    eval_dataset=None,
    *,
    max_steps: int = 16,
    logging_steps: int = 4,
    **callback_options,
):
    """A real Trainer run with SapperCallback (the tests' short detector windows unless
    ``detector_options`` is given); the healthy-under-load benchmark runs it too."""
    pytest.importorskip("accelerate")  # the Trainer needs it
    from transformers import Trainer, TrainingArguments

    from sapper.monitor.hf import SapperCallback

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        logging_steps=logging_steps,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        max_grad_norm=1.0,
        eval_strategy="steps" if eval_dataset is not None else "no",
        eval_steps=4,
    )
    callback_options.setdefault("detector_options", FAST)
    cb = SapperCallback(console=False, log_every=4, **callback_options)
    trainer = Trainer(
        model=gpt2(),
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        callbacks=[cb],
    )
    trainer.train()
    return trainer, cb


def test_hf_trainer_callback_records_every_step(tmp_path: Path) -> None:
    trainer, cb = _hf_trainer(tmp_path, _Tokens(128), run_log=tmp_path / "run.jsonl")
    mon = cb.monitor
    assert mon is not None
    steps = [r.step for r in mon.history]
    assert steps == list(range(1, 17))
    rec = mon.history[5]
    assert rec.extra["grad_accum"] == 2 and rec.samples == 8
    assert rec.grad_norm is not None and rec.clip_threshold == 1.0 and rec.lr is not None
    # Step numbers are the Trainer's global_step: its log_history entry at step s covers
    # the records numbered s-3..s, and their losses agree.
    by_step = {r.step: r for r in read_runlog(tmp_path / "run.jsonl").steps}
    assert sorted(by_step) == list(range(1, 17))
    logged = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    assert sorted(logged) == [4, 8, 12, 16]
    for step, loss in logged.items():
        ours = sum(by_step[s].loss for s in range(step - 3, step + 1)) / 4
        assert loss == pytest.approx(ours, rel=0.05), step
    assert trainer.state.global_step == max(by_step)
    assert {f.code for f in mon.findings if f.severity.value != "info"} == set()


def test_hf_callback_numbers_a_resumed_run_from_the_trainers_step() -> None:
    """After resume_from_checkpoint the Trainer's state starts at the saved global_step
    (before on_train_begin); the first record carries global_step + 1."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from sapper.monitor.hf import SapperCallback

    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to=[])
    state, control = TrainerState(global_step=100), TrainerControl()
    cb = SapperCallback(console=False)
    cb.on_train_begin(args, state, control, model=model, optimizer=opt)
    data = Markov(batch=2, seq=16)
    for _ in range(3):
        x = next(data)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
        state.global_step += 1  # the Trainer's order: count, then on_step_end
        cb.on_step_end(args, state, control)
    cb.on_train_end(args, state, control)
    assert cb.monitor is not None
    assert [r.step for r in cb.monitor.history] == [101, 102, 103]


@pytest.mark.parametrize("named", [False, True])
def test_hf_trainer_callback_hands_over_each_evaluation(tmp_path: Path, named: bool) -> None:
    held_out = _Tokens(8)
    evals = {"a": held_out, "b": _Tokens(8)} if named else held_out
    trainer, _ = _hf_trainer(tmp_path, _Tokens(), evals, run_log=tmp_path / "run.jsonl")
    logged = [h for h in trainer.state.log_history if any(k.endswith("_loss") for k in h)]
    records = read_runlog(tmp_path / "run.jsonl").steps
    if named:
        got = [r.extra["eval_losses"] for r in records if "eval_losses" in r.extra]
        by_step: dict[int, dict[str, float]] = {}  # the Trainer logs each set apart
        for h in logged:
            for name in ("a", "b"):
                if f"eval_{name}_loss" in h:
                    by_step.setdefault(h["step"], {})[name] = h[f"eval_{name}_loss"]
        want = [by_step[s] for s in sorted(by_step)]
    else:
        got = [r.eval_loss for r in records if r.eval_loss is not None]
        want = [h["eval_loss"] for h in logged if "eval_loss" in h]
    # Every evaluation at steps 4, 8, 12, 16; the last, after the final step, on a record
    # of its own.
    assert len(want) == 4 and got == (want if named else pytest.approx(want))
    assert records[-1].step == 17 and records[-1].loss is None


def test_hf_trainer_callback_names_duplicated_data(tmp_path: Path) -> None:
    _, cb = _hf_trainer(tmp_path, _Tokens(128, duplicate_from=64))
    assert cb.monitor is not None and "R070" in {f.code for f in cb.monitor.findings}


def _lightning_module(lightning):  # type: ignore[no-untyped-def]
    """A LightningModule training a tiny GPT-2 (lightning is optional: built on demand)."""

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = gpt2()

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Module


def test_lightning_callback(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")

    from sapper.monitor.lightning import SapperCallback

    Module = _lightning_module(lightning)

    class Steps(lightning.Callback):
        """trainer.global_step after each optimizer step (every 2nd batch here)."""

        def __init__(self) -> None:
            self.seen: list[int] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if (batch_idx + 1) % 2 == 0:
                self.seen.append(trainer.global_step)

    loader = torch.utils.data.DataLoader(_Tokens(96), batch_size=4)
    cb = SapperCallback(console=False, detector_options=FAST, log_every=4)
    steps = Steps()
    trainer = lightning.Trainer(
        max_steps=10,
        accumulate_grad_batches=2,
        gradient_clip_val=1.0,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[cb, steps],
    )
    trainer.fit(Module(), loader)
    mon = cb.monitor
    assert mon is not None
    # Lightning's global_step, as the Trainer reports it once each step has run.
    assert [r.step for r in mon.history] == steps.seen == list(range(1, 11))
    rec = mon.history[4]
    assert rec.extra["grad_accum"] == 2 and rec.grad_norm is not None
    assert rec.loss is not None and rec.clip_threshold == 1.0
    assert {f.code for f in mon.findings if f.severity.value != "info"} == set()


def test_lightning_callback_hands_over_the_validation_loss(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")

    from sapper.monitor.lightning import SapperCallback

    class Module(_lightning_module(lightning)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[float] = []

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.model(**batch).loss)

        def on_validation_epoch_end(self) -> None:
            if not self.trainer.sanity_checking:
                self.seen.append(float(self.trainer.callback_metrics["val_loss"]))

    train = torch.utils.data.DataLoader(_Tokens(96), batch_size=4)
    val = torch.utils.data.DataLoader(_Tokens(8), batch_size=4)
    cb = SapperCallback(console=False, detector_options=FAST, log_every=4)
    trainer = lightning.Trainer(
        max_steps=12,
        val_check_interval=4,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[cb],
    )
    module = Module()
    trainer.fit(module, train, val)
    assert cb.monitor is not None
    got = [r.eval_loss for r in cb.monitor.history if r.eval_loss is not None]
    assert len(module.seen) == 3 and got == pytest.approx(module.seen)


def test_inspect_on_save_flags_a_poisoned_checkpoint(tmp_path: Path) -> None:
    """checkpoint-4 is written after a weight went Inf at step 3; the scan of checkpoint-2
    is clean. K001 names the checkpoint and reaches the run log. (Saving at all needs the
    scheduler's state to pickle: the monitor reads its step counter, it sets nothing on
    it.)"""
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from sapper.monitor.hf import SapperCallback

    class PoisonAtStep3(TrainerCallback):
        """One weight set to +inf after the optimizer step 3."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 3 and model is not None:
                with torch.no_grad():
                    model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("inf")

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=5, save_steps=2, logging_steps=1,
        per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    cb = SapperCallback(console=False, run_log=tmp_path / "run.jsonl", inspect_on_save=True,
                        detector_options=FAST)
    trainer = Trainer(model=gpt2(), args=args, train_dataset=_Tokens(64),
                      callbacks=[cb, PoisonAtStep3()])
    trainer.train()
    flagged = [f for f in cb.monitor.findings if f.code.startswith("K")]
    assert {f.code for f in flagged} == {"K001"}
    # checkpoint-2 is clean; checkpoint-4 (and the final one) hold the Inf
    assert min(f.step for f in flagged) == 4 and "checkpoint-4" in flagged[0].message
    assert not any("checkpoint-2" in f.message for f in flagged)
    logged = [f for f in read_runlog(tmp_path / "run.jsonl").findings if f.code == "K001"]
    assert logged and "checkpoint-4" in logged[0].message


def test_lightning_inspect_on_save_flags_a_poisoned_checkpoint(tmp_path: Path) -> None:
    """ModelCheckpoint saves every 2 steps; a weight goes Inf after step 3: the step-2
    file scans clean, the step-4 file is named with K001 in the monitor and its run log."""
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from sapper.monitor.lightning import SapperCallback

    Module = _lightning_module(lightning)

    class PoisonAtStep3(lightning.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                with torch.no_grad():
                    pl_module.model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("inf")

    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    cb = SapperCallback(console=False, run_log=tmp_path / "run.jsonl", inspect_on_save=True,
                        detector_options=FAST)  # fmt: skip
    trainer = lightning.Trainer(
        max_steps=5, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(tmp_path),
        callbacks=[cb, PoisonAtStep3(), saves],
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(_Tokens(64), batch_size=4)
    trainer.fit(Module(), loader)
    flagged = [f for f in cb.monitor.findings if f.code.startswith("K")]
    assert {f.code for f in flagged} == {"K001"}
    assert all("step=4" in f.message for f in flagged), [f.message for f in flagged]
    logged = [f for f in read_runlog(tmp_path / "run.jsonl").findings if f.code == "K001"]
    assert logged and "step=4" in logged[0].message
