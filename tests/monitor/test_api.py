"""What a user does from the docs: plan= in every form sapper check reads, the with
statement and atexit closing the monitor, losses in any output shape, a time cadence that
keeps the run log close behind, and an unwritable run log said out loud (R191)."""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import time
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import sapper
from sapper.errors import InputError
from sapper.monitor import Monitor
from sapper.plan.schema import Plan
from sapper.runtime.runlog import read_runlog

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples"


def _regression(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-2)


def _steps(model, opt, mon, n, loss_form=lambda loss, i: loss, sleep: float = 0.0):
    for i in range(n):
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step(loss_form(loss, i))
        if sleep:
            time.sleep(sleep)


# ---- plan= ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("plan", "check"),
    [
        ("plans/healthy-llama-7b.yaml", lambda p: p.model is not None and p.batch is not None),
        ("deepspeed/zero2-bf16.json", lambda p: p.framework == "deepspeed"),
        ("hf/gpt2-xl.json", lambda p: p.model.max_position_embeddings == 1024),
        (
            ["hf/gpt2-xl.json", "deepspeed/zero2-bf16.json"],
            lambda p: p.framework == "deepspeed" and p.model.max_position_embeddings == 1024,
        ),
    ],
)
def test_plan_takes_the_files_sapper_check_reads(plan, check) -> None:
    paths = [EXAMPLES / p for p in plan] if isinstance(plan, list) else EXAMPLES / plan
    model, opt = _regression()
    with Monitor(model, opt, plan=paths, console=False) as mon:
        assert isinstance(mon.plan, Plan) and check(mon.plan)
    # A plain string works as well as a Path.
    single = str(paths[0] if isinstance(paths, list) else paths)
    with Monitor(model, opt, plan=single, console=False) as mon:
        assert isinstance(mon.plan, Plan)


def test_plan_takes_a_loaded_plan_and_a_plan() -> None:
    loaded = sapper.load_plan(EXAMPLES / "plans/healthy-llama-7b.yaml")
    model, opt = _regression()
    for form in (loaded, loaded.plan):
        with Monitor(model, opt, plan=form, console=False) as mon:
            assert mon.plan == loaded.plan


def test_a_bad_plan_is_an_input_error_naming_the_file(tmp_path: Path) -> None:
    model, opt = _regression()
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InputError, match=r"nope\.yaml"):
        Monitor(model, opt, plan=missing, console=False)
    odd = tmp_path / "odd.json"
    odd.write_text('{"foo": 1}')
    with pytest.raises(InputError, match=r"odd\.json.*not a config sapper can read"):
        Monitor(model, opt, plan=odd, console=False)
    broken = tmp_path / "ds.json"
    broken.write_text('{"train_batch_size": ')
    with pytest.raises(InputError, match=r"ds\.json.*malformed JSON"):
        Monitor(model, opt, plan=broken, console=False)
    with pytest.raises(InputError, match="plan: not a plan"):
        Monitor(model, opt, plan=42, console=False)
    # Nothing was attached by the failed constructors.
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_framework_callbacks_refuse_a_bad_plan_when_built(tmp_path: Path) -> None:
    from sapper.monitor.hf import SapperCallback

    with pytest.raises(InputError, match=r"nope\.json"):
        SapperCallback(plan=tmp_path / "nope.json")
    cb = SapperCallback(plan=EXAMPLES / "deepspeed/zero2-bf16.json")
    assert isinstance(cb.plan, Plan)


# ---- closing -------------------------------------------------------------------------
def test_with_statement_closes_even_on_an_exception(tmp_path: Path) -> None:
    model, opt = _regression()
    log = tmp_path / "run.jsonl"
    with pytest.raises(RuntimeError, match="boom"), Monitor(
        model, opt, run_log=log, console=False
    ) as mon:
        _steps(model, opt, mon, 7)
        raise RuntimeError("boom")
    assert mon._closed and not model._forward_hooks
    assert [r.step for r in read_runlog(log).steps] == list(range(7))


def test_atexit_closes_an_unclosed_monitor(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    script = (
        "import torch, sapper\n"
        "model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        f"mon = sapper.Monitor(model, opt, run_log={str(log)!r}, console=False)\n"
        "for _ in range(5):\n"
        "    loss = model(torch.randn(8, 4)).pow(2).mean(); loss.backward()\n"
        "    opt.step(); opt.zero_grad(); mon.step(loss)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    assert [r.step for r in read_runlog(log).steps] == list(range(5))


def test_the_exit_registration_keeps_no_monitor_alive() -> None:
    model, opt = _regression()
    mon = Monitor(model, opt, console=False)
    ref = weakref.ref(mon)
    del model, opt, mon
    gc.collect()
    assert ref() is None
    closed, opt2 = _regression()
    mon2 = Monitor(closed, opt2, console=False)
    mon2.close()
    from sapper.monitor import durable

    assert mon2 not in durable._live


def test_monitor_is_in_dir_sapper() -> None:
    assert "Monitor" in dir(sapper) and "load_plan" in dir(sapper)
    assert sapper.Monitor is Monitor


# ---- losses ----------------------------------------------------------------------------
def test_dict_losses_are_read_every_step_and_a_nan_one_is_r001() -> None:
    model, opt = _regression()
    mon = Monitor(model, opt, console=False, log_every=4)

    def form(loss: torch.Tensor, i: int):
        if i == 3:
            return "not a loss"  # one unreadable value: a note, nothing switched off
        if i == 14:
            return {"loss": torch.tensor(math.nan), "aux": loss}
        return {"loss": loss, "aux": torch.ones(3)} if i % 2 else (torch.ones(2), loss)

    _steps(model, opt, mon, 18, form)
    mon.close()
    losses = [r.loss for r in mon.history]
    assert losses[3] is None and all(x is not None for i, x in enumerate(losses) if i != 3)
    assert math.isnan(losses[14])
    assert [f.step for f in mon.findings if f.code == "R001"] == [14]
    notes = [f for f in mon.findings if f.code == "R192"]  # the caller's mistake
    assert len(notes) == 1 and "str" in notes[0].message
    assert "step" not in mon._disabled and not [f for f in mon.findings if f.code == "R190"]


# ---- cadence -----------------------------------------------------------------------------
def test_slow_steps_are_read_by_time_not_only_every_log_every_steps() -> None:
    model, opt = _regression()
    mon = Monitor(model, opt, console=False, log_every=1000, flush_every_s=0.2)
    _steps(model, opt, mon, 6, sleep=0.1)
    assert len(mon.history) >= 3  # read at least every 0.2 s, not after 1000 steps
    mon.close()
    model, opt = _regression()
    mon = Monitor(model, opt, console=False, log_every=1000, flush_every_s=None)
    _steps(model, opt, mon, 4, sleep=0.1)
    assert len(mon.history) == 0
    mon.close()
    with pytest.raises(InputError, match="flush_every_s"):
        Monitor(model, opt, flush_every_s=0)


# ---- an unwritable run log ---------------------------------------------------------------
def _refused(path: Path) -> bool:
    try:
        path.open("a").close()
    except OSError:
        return True
    path.unlink()
    return False


def _r191(mon: Monitor) -> list:
    return [f for f in mon.findings if f.code == "R191"]


def test_missing_folders_are_created(tmp_path: Path) -> None:
    model, opt = _regression()
    log = tmp_path / "a" / "b" / "run.jsonl"
    with Monitor(model, opt, run_log=log, console=False) as mon:
        _steps(model, opt, mon, 3)
    assert not _r191(mon) and len(read_runlog(log).steps) == 3


@pytest.mark.parametrize("where", ["folder", "read-only", "full disk"])
def test_an_unwritable_run_log_is_a_warning_naming_the_path(tmp_path: Path, where) -> None:
    if where == "folder":
        path = tmp_path / "logs"
        path.mkdir()
        reason = "Is a directory"
    elif where == "read-only":
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        path = ro / "run.jsonl"
        if os.geteuid() == 0:  # root writes through permissions: a read-only file system
            path = Path("/sys/sapper-run.jsonl")
            if os.access("/sys", os.W_OK) and not _refused(path):
                pytest.skip("no read-only location for root here")
        reason = "Permission denied" if os.geteuid() else ""
    else:
        if not Path("/dev/full").exists():
            pytest.skip("no /dev/full")
        path, reason = Path("/dev/full"), "No space left on device"
    model, opt = _regression()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = Monitor(model, opt, run_log=path, console=False)
    (finding,) = _r191(mon)
    assert finding.severity.value == "warning"
    assert str(path) in finding.message and reason in finding.message
    assert any("R191" in str(w.message) for w in caught)  # console off: a Python warning
    _steps(model, opt, mon, 5)  # training goes on
    mon.close()
    assert len(mon.history) == 5 and len(_r191(mon)) == 1


def test_a_disk_that_fills_mid_run_is_said_once(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    model, opt = _regression()
    log = tmp_path / "run.jsonl"
    mon = Monitor(model, opt, run_log=log, console=False, log_every=2)
    _steps(model, opt, mon, 4)
    writer = mon.sinks[0].writer
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, writer._file.fileno())  # the disk is full from here on
    os.close(full)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _steps(model, opt, mon, 10)
    mon.close()
    (finding,) = _r191(mon)
    assert str(log) in finding.message and "No space left" in finding.message
    assert len(mon.history) == 14


def test_the_example_runs_with_a_plan_loaded_in_python(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_train", EXAMPLES / "monitor/train.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    log = tmp_path / "run.jsonl"
    findings = example.main(str(log))
    run = read_runlog(log)
    assert [r.step for r in run.steps] == list(range(120))
    assert run.meta["plan"]["schedule"]["warmup_steps"] == 10
    # The loop does what its plan says: nothing about LR, clipping or data is wrong.
    assert not {f.code for f in findings} & {"R040", "R041", "R042", "R043", "R070", "R020"}


def test_a_signal_during_a_read_is_handled_once_the_read_is_over(tmp_path: Path) -> None:
    """SIGINT arriving mid-read (here: sent by a detector) is held until the read and
    its writes are done, then handed on: KeyboardInterrupt leaves mon.step(), nothing
    half-written, no monitor part switched off."""
    import signal

    from sapper.runtime.detector import Detector

    class Interrupts(Detector):
        def update(self, record):
            if record.step == 4:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the Python handler runs here, inside the read
            return []

    model, opt = _regression()
    log = tmp_path / "run.jsonl"
    mon = Monitor(model, opt, run_log=log, console=False, log_every=1, detectors=[Interrupts()])
    with pytest.raises(KeyboardInterrupt):
        _steps(model, opt, mon, 10)
    assert [r.step for r in read_runlog(log).steps] == list(range(5))
    assert not mon._disabled and not [f for f in mon.findings if f.code == "R190"]
    mon.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
