"""The Monitor's contract: two lines in a loop, no host sync between reads, the same
records whatever the call pattern, a halt policy, errors that never reach the loop, and
the run log / TensorBoard outputs."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tinytrain import FAST, Markov, gpt2, train

import sapper
from sapper.errors import InputError
from sapper.monitor import Monitor, SapperHalt
from sapper.monitor.syncs import HostSyncCounter
from sapper.runtime.runlog import read_runlog


def _loop(model, opt, mon, steps, data, *, syncs=None, per_micro=False, ga=1):
    for step in range(steps):
        with syncs if syncs is not None else _Null():
            for _ in range(ga):
                x = next(data)
                out = model(input_ids=x, labels=x)
                (out.loss / ga).backward()
                if per_micro:
                    mon.step(out.loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if not per_micro:
                mon.step(out.loss)
        yield step


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_no_host_sync_between_reads() -> None:
    model = gpt2()
    # SGD: torch's Adam reads its (CPU) step counters with .item(), which the counter
    # would count although it is no device sync.
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    # flush_every_s=None: this checks the step cadence alone (a loaded machine could make
    # 10 steps outlast the time cadence).
    mon = Monitor(model, opt, log_every=10, sample_every=7, console=False, flush_every_s=None)
    counter = HostSyncCounter()
    per_step = []
    for _ in _loop(model, opt, mon, 30, Markov(), syncs=counter):
        per_step.append(counter.total)
        counter.reset()
    # The loop itself never syncs; the monitor syncs only on the steps where it reads.
    reads = [i for i, n in enumerate(per_step) if n]
    assert reads == [9, 19, 29]
    assert all(per_step[i] <= 2 for i in reads)  # one copy per device and dtype
    assert len(mon.history) == 30
    mon.close()


def test_per_step_and_per_micro_batch_calls_give_the_same_records() -> None:
    records = []
    for per_micro in (False, True):
        model = gpt2()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon = Monitor(model, opt, log_every=4, console=False)
        list(_loop(model, opt, mon, 8, Markov(seed=3), per_micro=per_micro, ga=3))
        mon.close()
        records.append(list(mon.history))
    a, b = records
    assert [r.step for r in a] == [r.step for r in b] == list(range(8))
    for x, y in zip(a, b, strict=True):
        assert x.extra["grad_accum"] == y.extra["grad_accum"] == 3
        assert x.samples == y.samples == 24
        assert math.isclose(x.grad_norm, y.grad_norm, rel_tol=1e-5)
        assert math.isclose(x.extra["loss_weight"], 1 / 3, rel_tol=1e-5)
    # per step: the last micro-batch's loss; per micro-batch: the mean of the three.
    assert all(r.loss is not None and math.isfinite(r.loss) for r in a + b)


def test_without_optimizer_each_call_is_a_step() -> None:
    model = gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon = Monitor(model, log_every=3, console=False)
    list(_loop(model, opt, mon, 6, Markov()))
    mon.close()
    assert [r.step for r in mon.history] == list(range(6))
    assert all(r.loss is not None and r.tokens == 256 for r in mon.history)


def test_halt_policy_raises_from_step() -> None:
    def poison(step, model):
        if step == 6:
            with torch.no_grad():
                model.transformer.wte.weight.fill_(float("nan"))

    run = train(gpt2(), inject=poison, steps=20, monitor={"halt_on": ["error"]})
    assert isinstance(run.error, SapperHalt)
    assert run.error.findings[0].code == "R001" and run.error.findings[0].step == 6
    assert len(run.losses) <= 10  # stopped at the next read (log_every=5)


class _BrokenConsole:
    def print(self, *args, **kwargs):
        raise OSError("terminal went away")


def test_monitor_errors_are_reported_once_and_never_propagate() -> None:
    class WeirdOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = gpt2()

        def forward(self, input_ids, labels):
            return self.inner(input_ids=input_ids, labels=labels)

    run = train(WeirdOutput(), steps=12, lr=0.1, monitor={"console": _BrokenConsole()})
    assert run.error is None and len(run.losses) == 12
    errors = [f for f in run.monitor.findings if f.code == "R190"]
    assert len(errors) == 1 and "sinks" in errors[0].message


def test_run_log_and_tensorboard(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    tb = tmp_path / "tb"
    run = train(gpt2(), lr=1e-7, steps=35, monitor={"run_log": log, "tensorboard": tb})
    data = read_runlog(log)
    assert data.meta["model"] == "GPT2LMHeadModel" and data.meta["log_every"] == 5
    assert [s.step for s in data.steps] == list(range(35))
    assert {f.code for f in data.findings} == run.codes()
    assert data.steps[3].extra["sample_hashes"] and data.steps[0].extra["norm_placement"] == "pre"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = acc.Tags()
    assert {"train/loss", "train/grad_norm", "train/lr"} <= set(tags["scalars"])
    assert len(acc.Scalars("train/loss")) == 35
    assert any(t.startswith("sapper/R003") for t in tags["tensors"])


def test_close_restores_everything() -> None:
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    original_clip = torch.nn.utils.clip_grad_norm_
    original_with_norm = torch.nn.utils.clip_grads_with_norm_
    mon = Monitor(model, opt, scaler=scaler, scheduler=sched, console=False)
    assert torch.nn.utils.clip_grad_norm_ is not original_clip
    assert torch.nn.utils.clip_grads_with_norm_ is not original_with_norm
    assert "step" in vars(scaler)
    # the scheduler is read, not wrapped: its state_dict (its __dict__) still pickles
    assert "step" not in vars(sched)
    torch.save(sched.state_dict(), io.BytesIO())
    mon.close()
    mon.close()
    assert torch.nn.utils.clip_grad_norm_ is original_clip
    assert torch.nn.utils.clip_grads_with_norm_ is original_with_norm
    assert "step" not in vars(scaler) and "step" not in vars(sched)
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not opt._optimizer_step_pre_hooks


def test_clipping_in_two_calls_is_seen_once() -> None:
    """accelerate (and so the HF Trainer) clips with get_total_norm + clip_grads_with_norm_,
    not clip_grad_norm_: the threshold and the norm it measured are recorded the same."""
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Markov(batch=2, seq=16)
    norms = []
    with Monitor(model, opt, console=False, log_every=1) as mon:
        for _ in range(3):
            x = next(data)
            out = model(input_ids=x, labels=x)
            out.loss.backward()
            params = [p for p in model.parameters() if p.grad is not None]
            total = torch.nn.utils.get_total_norm([p.grad for p in params])
            torch.nn.utils.clip_grads_with_norm_(params, 0.5, total)
            norms.append(float(total))
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.step(out.loss)
    assert [r.clip_threshold for r in mon.history] == [0.5, 0.5, 0.5]
    assert [r.grad_norm for r in mon.history] == pytest.approx(norms)


def test_clipping_sees_every_form_of_the_parameters_and_passes_them_on() -> None:
    """The clipping patch reads the parameters only up to the first tensor (to find its
    monitor): a generator goes on to torch as a generator, so torch walks the model once
    and still warns when it is empty; a one-shot iterator loses nothing."""
    model = gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Markov(batch=2, seq=16)
    forms = [
        lambda: model.parameters(),
        lambda: iter(list(model.parameters())),
        lambda: filter(lambda p: p.grad is not None, model.parameters()),
        lambda: tuple(model.parameters()),
    ]
    norms = []
    with Monitor(model, opt, console=False, log_every=1) as mon:
        for form in forms:
            x = next(data)
            out = model(input_ids=x, labels=x)
            out.loss.backward()
            want = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            got = torch.nn.utils.clip_grad_norm_(form(), 1e-3)
            norms.append(float(want))
            assert float(got) == pytest.approx(float(want))
            # every gradient was clipped: the walk reached the last parameter
            clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            assert float(clipped) == pytest.approx(1e-3, rel=1e-3)
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.step(out.loss)
        with pytest.warns(UserWarning, match="empty generator"):
            torch.nn.utils.clip_grad_norm_((p for p in []), 1.0)
    assert [r.grad_norm for r in mon.history] == pytest.approx(norms)
    assert [r.clip_threshold for r in mon.history] == [1e-3] * len(forms)


def test_bad_options_are_input_errors() -> None:
    with pytest.raises(InputError, match="log_every"):
        Monitor(gpt2(), log_every=0)
    with pytest.raises(InputError, match="unknown detector name"):
        Monitor(gpt2(), detector_options={"losss": {}})


def test_plan_drives_the_detectors() -> None:
    plan = sapper.Plan.model_validate(
        {
            "optimizer": {"lr": 1e-3},
            "schedule": {"type": "cosine", "warmup_steps": 20, "total_steps": 100},
        }
    )
    # The plan declares a warmup; the loop runs at the peak LR from step 0.
    run = train(gpt2(), steps=10, monitor={"plan": plan, "detector_options": FAST})
    assert "R041" in run.codes()


def test_import_sapper_stays_light_and_exports_monitor() -> None:
    code = (
        "import sys, sapper; light = 'torch' not in sys.modules; "
        "m = sapper.Monitor; print(light, m.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "sapper.monitor.monitor"]


def test_a_failing_detector_is_reported_once() -> None:
    from sapper.runtime.detector import Detector

    class Boom(Detector):
        def update(self, record):
            raise ZeroDivisionError("bad arithmetic")

    run = train(gpt2(), steps=12, monitor={"detectors": [Boom()]})
    assert run.error is None
    errors = [f for f in run.monitor.findings if f.code == "R190"]
    assert len(errors) == 1 and "Boom" in errors[0].message
