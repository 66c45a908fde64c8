"""Faults the monitor used to see only through a symptom, or not at all, each injected into
a tiny real training run and named by its own code within a stated number of steps; the
healthy twins next to them must stay silent on that code.

| fault                                              | code | finding step |
| -------------------------------------------------- | ---- | ------------ |
| loader cycling 4 batches                           | R072 | 12 (pass 4)  |
| loader cycling 1 / 2 batches                       | R072 | 5 / 6        |
| the 4-batch cycle, eval loss rising (memorisation) | R072 | 50-60 (again)|
| the same, the plan's total_steps known             | R072 | 4            |
| the same, the plan's dataset size known            | R072 | 4            |
| GA=4, loss outside the model, not divided          | R080 | 1            |
| optimizer built on a model copy                    | R120 | 0            |
| every parameter frozen                             | R121 | 0            |
| optimizer holding only frozen parameters           | R121 | 0            |
| backward never called                              | R122 | 0            |
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tinytrain import FAST, Markov, Run, gpt2, llama, train

from sapper.monitor import Monitor, SapperHalt
from sapper.monitor.logits import ce_weight
from sapper.plan.schema import Plan
from sapper.runtime import DetectorSet
from sapper.runtime.detectors import default_detectors
from sapper.runtime.runlog import read_runlog


def _found(run: Run, code: str) -> list[str]:
    return [f.message for f in run.monitor.findings if f.code == code]


# ---- R072: the data repeats in a short cycle ------------------------------------------
def _four_batches() -> list[torch.Tensor]:
    data = Markov()
    return [next(data) for _ in range(4)]


class Epochs:
    """A real dataset of ``batches`` batches of 8, reshuffled every epoch."""

    def __init__(self, batches: int) -> None:
        self.rows = Markov().sample(8 * batches, 32)
        self.gen = torch.Generator().manual_seed(1)
        self.it: Iterator[torch.Tensor] = iter(())

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        try:
            return next(self.it)
        except StopIteration:
            perm = torch.randperm(len(self.rows), generator=self.gen)
            self.it = iter(self.rows[perm].split(8))
            return next(self.it)


def test_a_loader_cycling_a_few_batches_is_named() -> None:
    run = train(gpt2(), data=itertools.cycle(_four_batches()), steps=20)
    assert run.error is None
    warning = [f for f in run.monitor.findings if f.code == "R072"]
    assert len(warning) == 1 and warning[0].severity.value == "warning"
    # Each pass is 4 steps; pass 4 begins at step 12 (confirmed 3 steps later).
    assert warning[0].step == 12
    assert warning[0].message.startswith(
        "the data repeats in a short cycle: 32 distinct samples every 4 steps "
        "(4 distinct batches over the 16 steps fingerprinted since step 0)"
    )
    assert "R070" not in run.codes()


@pytest.mark.parametrize(("batches", "step"), [(1, 5), (2, 6)])
def test_cycles_shorter_than_the_confirmation_are_counted_by_length(
    batches: int, step: int
) -> None:
    # A data boundary is confirmed 3 steps after the first repeat, so a 1-2 batch cycle
    # passes several times per boundary: its passes are counted by its length.
    run = train(gpt2(), data=itertools.cycle(_four_batches()[:batches]), steps=12)
    assert run.first_step("R072") == step


@pytest.mark.parametrize(
    "plan",
    [
        {"schedule": {"total_steps": 500}},
        {"data": {"num_samples": 10_000}},
        {"data": {"num_tokens": 320_000}, "batch": {"seq_len": 32}},
    ],
    ids=["total-steps", "num-samples", "num-tokens"],
)
def test_the_plan_brings_the_short_cycle_forward(plan: dict) -> None:
    run = train(
        gpt2(),
        data=itertools.cycle(_four_batches()),
        steps=10,
        monitor={"plan": Plan.model_validate(plan)},
    )
    assert run.first_step("R072") == 4  # the first repeat
    assert "R071" not in run.codes()  # the warning replaces the info, not both


def test_memorisation_of_the_cycle_strengthens_it(tmp_path: Path) -> None:
    data = Markov()
    few = [next(data) for _ in range(4)]
    held_out = data.sample(16, 32)

    def evaluate(step: int, model: torch.nn.Module) -> torch.Tensor | None:
        if step % 10 != 9:
            return None
        with torch.no_grad():  # not a training forward: the monitor ignores it
            return model(input_ids=held_out, labels=held_out).loss

    log = tmp_path / "run.jsonl"
    run = train(
        gpt2(), data=itertools.cycle(few), steps=61, lr=1e-2, clip=None, evaluate=evaluate,
        monitor={"run_log": log},
    )
    found = [f for f in run.monitor.findings if f.code == "R072"]
    # The eval loss (same Markov chain, unseen samples) is lowest near step 40, then
    # rises while the training loss keeps falling.
    assert len(found) == 2 and found[0].step == 12 and 50 <= found[1].step <= 60
    assert found[1].message.startswith("memorisation confirmed: the eval loss rose from")
    # Each evaluation rides on a record: the step's own while it is unread, else the next
    # (records are read every 5 steps here, after steps 4, 9, 14 ...).
    records = read_runlog(log).steps
    assert [r.step for r in records if r.eval_loss is not None] == [10, 20, 30, 40, 50, 60]
    # Offline, the run log gives the same finding.
    offline = DetectorSet(default_detectors()).run(records)
    assert [f.step for f in offline if f.code == "R072"] == [f.step for f in found]


def test_real_epochs_stay_epochs() -> None:
    # 100 batches (a real dataset at this batch) over 2.2 epochs: R071, no warning.
    big = train(gpt2(), data=Epochs(100), steps=220, clip=None)
    assert big.first_step("R071") == 100 and "R072" not in big.codes()
    # A 3-epoch fine-tune over a small set: short, but not past its third pass.
    small = train(gpt2(), data=Epochs(8), steps=24)
    assert small.first_step("R071") == 8 and "R072" not in small.codes()


# ---- R080: GA not divided, loss computed outside the model ----------------------------
def test_undivided_accumulation_outside_the_model_is_named() -> None:
    run = train(llama(), ga=4, loss_outside=True, divide_loss=False, steps=6)
    assert run.error is None
    assert run.first_step("R080") == 1  # two steps of weight 1 (patience 2)
    (message,) = _found(run, "R080")
    assert "loss is computed outside the model" in message
    assert "weight 1 over 4 micro-batches" in message and "not divided" in message
    assert "clipping engaged on every step so far" in message
    rec = run.monitor.history[0]
    assert rec.extra["loss_weight_from"] == "logits" and rec.extra["grad_accum"] == 4


@pytest.mark.parametrize(
    "options",
    [
        {"ga": 4, "loss_outside": True},
        {"ga": 1, "loss_outside": True, "divide_loss": False},
        {"ga": 2, "loss_outside": True, "fp16": True},
    ],
    ids=["ga4-divided", "ga1", "ga2-fp16-scaler"],
)
def test_normalised_accumulation_outside_the_model_is_silent(options: dict) -> None:
    run = train(gpt2(), steps=6, **options)
    assert run.error is None and "R080" not in run.codes()
    weights = [r.extra["loss_weight"] for r in run.monitor.history if "loss_weight" in r.extra]
    assert weights and all(w == pytest.approx(1 / options["ga"], rel=1e-3) for w in weights)


def _logits_grad(loss_fn, rows: int = 24, vocab: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    logits = torch.randn(rows, vocab, requires_grad=True)
    target = torch.randint(0, vocab, (rows,))
    loss_fn(logits, target).backward()
    return logits.detach(), logits.grad


@pytest.mark.parametrize(
    ("loss_fn", "weight"),
    [
        (lambda z, y: torch.nn.functional.cross_entropy(z, y) / 4, 0.25),
        # padding: ignored labels have no gradient and do not count in the mean
        (lambda z, y: torch.nn.functional.cross_entropy(z, y.masked_fill(y < 20, -100)), 1.0),
        # a per-token sum over the step's 96 tokens (this micro-batch holds 24)
        (lambda z, y: torch.nn.functional.cross_entropy(z, y, reduction="sum") / 96, 0.25),
        (lambda z, y: torch.nn.functional.cross_entropy(z, y, label_smoothing=0.1), 1.0),
    ],
    ids=["mean-over-4", "ignored-labels", "sum-over-step", "label-smoothing"],
)
def test_the_logits_gradient_tells_the_loss_weight(loss_fn, weight: float) -> None:
    logits, grad = _logits_grad(loss_fn)
    idx = torch.arange(0, len(logits), 3)
    est = float(ce_weight(grad, idx, logits[idx].softmax(-1)))
    assert est == pytest.approx(weight, rel=0.1)


def test_a_gradient_that_is_not_a_cross_entropys_gives_no_weight() -> None:
    teacher = torch.randn(24, 50).softmax(-1)

    def distil(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.kl_div(z.log_softmax(-1), teacher, reduction="batchmean")

    for fn in (distil, lambda z, y: (z**2).mean()):
        logits, grad = _logits_grad(fn)
        idx = torch.arange(0, len(logits), 3)
        assert torch.isnan(ce_weight(grad, idx, logits[idx].softmax(-1))).all()


# ---- R120-R122: an optimizer that cannot change the model -----------------------------
def _freeze_all(model: torch.nn.Module) -> None:
    model.requires_grad_(False)


def _lora_like(model: torch.nn.Module) -> None:
    """Freeze the base, train the last block and the final norm (adapter-style)."""
    model.requires_grad_(False)
    model.transformer.h[-1].requires_grad_(True)
    model.transformer.ln_f.requires_grad_(True)


def test_an_optimizer_on_a_model_copy_is_named(tmp_path: Path) -> None:
    model = gpt2()
    log = tmp_path / "run.jsonl"
    run = train(model, optimizer_on=copy.deepcopy(model), steps=3, monitor={"run_log": log})
    (finding,) = [f for f in run.monitor.findings if f.code == "R120"]
    assert finding.step == 0 and finding.severity.value == "error"
    assert "none of them the model's" in finding.message
    assert [f.code for f in read_runlog(log).findings if f.code.startswith("R12")] == ["R120"]


def test_a_fully_frozen_model_is_named_before_backward_fails(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    run = train(gpt2(), freeze=_freeze_all, steps=3, monitor={"run_log": log})
    assert isinstance(run.error, RuntimeError)  # "element 0 of tensors does not require grad"
    assert run.first_step("R121") == 0
    assert "all 28 parameter tensors of the model are frozen" in _found(run, "R121")[0]
    assert "R121" in {f.code for f in read_runlog(log).findings}


def test_an_optimizer_holding_only_frozen_parameters_is_named() -> None:
    model = gpt2()
    run = train(
        model,
        freeze=lambda m: m.transformer.wte.requires_grad_(False),
        optimizer_on=model.transformer.wte,
        steps=3,
    )
    assert run.first_step("R121") == 0
    assert "the model's 27 trainable tensors are not in the optimizer" in _found(run, "R121")[0]
    assert not {"R120", "R122"} & run.codes()


def test_no_backward_is_named_at_the_first_step() -> None:
    run = train(gpt2(), backward=False, steps=3)
    assert run.first_step("R122") == 0
    assert "no gradient on any of its 28 parameter tensors" in _found(run, "R122")[0]
    # With halt_on="error" the loop stops at the first optimizer step.
    halted = train(gpt2(), backward=False, steps=3, monitor={"halt_on": ["error"]})
    assert isinstance(halted.error, SapperHalt) and halted.losses == []


@pytest.mark.parametrize(
    "options",
    [{"freeze": _lora_like}, {"loss_outside": True}, {"ga": 2}],
    ids=["lora-like-freeze", "loss-outside", "ga2"],
)
def test_healthy_setups_are_silent(options: dict) -> None:
    run = train(gpt2(), steps=4, **options)
    assert run.error is None and not {"R120", "R121", "R122"} & run.codes()


def test_master_weights_that_receive_gradients_are_not_foreign() -> None:
    # Mixed-precision style: the optimizer steps fp64 master copies, fed the model's
    # gradients before each step and copied back after it.
    model = gpt2()
    master = [p.detach().double().requires_grad_() for p in model.parameters()]
    opt = torch.optim.SGD(master, lr=1e-2)
    mon = Monitor(model, opt, console=False, detector_options=FAST, log_every=2)
    data = Markov()
    for _ in range(3):
        x = next(data)
        model(input_ids=x, labels=x).loss.backward()
        for m, p in zip(master, model.parameters(), strict=True):
            m.grad = p.grad.double()
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, model.parameters(), strict=True):
                p.copy_(m)
        model.zero_grad(set_to_none=True)
        opt.zero_grad(set_to_none=True)
        mon.step()
    assert not {"R120", "R121", "R122"} & {f.code for f in mon.close()}


def _trainer_run(tmp_path: Path, model: torch.nn.Module, optimizer=None):
    pytest.importorskip("accelerate")  # the Trainer needs it
    from transformers import Trainer, TrainingArguments

    from sapper.monitor.hf import SapperCallback

    rows = Markov(seed=5).sample(32, 32)
    dataset = [{"input_ids": r, "labels": r} for r in rows]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    cb = SapperCallback(console=False, detector_options=FAST, log_every=2)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        callbacks=[cb],
        optimizers=(optimizer, None) if optimizer is not None else (None, None),
    )
    trainer.train()
    assert cb.monitor is not None
    return {f.code: f.step for f in cb.monitor.findings if f.code.startswith("R12")}


def test_hf_trainer_setups(tmp_path: Path) -> None:
    # The Trainer's optimizer comes wrapped by accelerate; built on a copy, it is named.
    model = gpt2()
    on_copy = torch.optim.AdamW(copy.deepcopy(model).parameters(), lr=1e-3)
    # (At the Trainer's first step: global_step 1.)
    assert _trainer_run(tmp_path, model, on_copy) == {"R120": 1}
    # Adapter-style freezing: the Trainer's own optimizer takes the trainable part.
    partly = gpt2()
    _lora_like(partly)
    assert _trainer_run(tmp_path, partly) == {}


def test_the_first_forward_records_its_precision() -> None:
    """The weights' dtype and autocast's, when it is on around the forward."""
    from sapper.monitor.setup import forward_precision

    model = gpt2()
    params = list(model.parameters())
    assert forward_precision(params) == {"param_dtype": "fp32"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert forward_precision(params) == {"param_dtype": "fp32", "autocast_dtype": "bf16"}
    model.half()
    assert forward_precision(list(model.parameters())) == {"param_dtype": "fp16"}
    run = train(gpt2(), fp16=True, steps=2)
    first = run.monitor.history[0].extra
    assert (first["param_dtype"], first["autocast_dtype"]) == ("fp32", "fp16")
