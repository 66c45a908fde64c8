"""The W&B sink against the real ``wandb`` package in offline mode: a tiny monitored
training run with a planted fault writes its findings to the run, and sapper's own W&B
reader (:mod:`sapper.logs.wandb`) finds them in the ``.wandb`` file afterwards. Offline
runs write only local files (``WANDB_MODE=offline``): nothing here reaches a network."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tinytrain import gpt2, train

from sapper.errors import InputError
from sapper.logs import read_log
from sapper.logs.wandb import WandbParser, runs_in
from sapper.monitor import Monitor
from sapper.monitor.trackers import WandbSink
from sapper.rules.model import Severity

wandb = pytest.importorskip("wandb")


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def finished_run(root: Path, timeout_s: float = 20.0) -> Path:
    """The one run folder under ``root``, once its ``.wandb`` file holds the exit record.
    wandb-core writes the file from its own process: ``run.finish()`` can return before
    the last bytes are on disk (seen with 0.31: a 7-byte file, read at once)."""
    (folder,) = runs_in(root)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parser = WandbParser(folder)
        parser.poll()
        parser.finish()
        if "exit_code" in parser.meta["wandb"]:
            break
        time.sleep(0.1)
    return folder


def _poison(step: int, model: torch.nn.Module) -> None:
    if step == 10:  # every weight of layer 1's MLP becomes inf: the loss is NaN from here
        with torch.no_grad():
            model.transformer.h[1].mlp.c_fc.weight.fill_(float("inf"))


def _logging_loop(run: Any) -> Any:
    """The user's own wandb.log per step, as a training script does."""

    def evaluate(step: int, model: torch.nn.Module) -> None:
        run.log({"train/global_step": step, "train/loss": 1.0 / (step + 1)})

    return evaluate


def test_finding_reaches_the_run_and_reads_back(offline: Path) -> None:
    run = wandb.init(project="sapper-test", dir=str(offline), config={"lr": 1e-3})
    try:
        result = train(gpt2(), inject=_poison, steps=20, evaluate=_logging_loop(run))
        codes = {f.code for f in result.monitor.findings}
        assert any(isinstance(s, WandbSink) for s in result.monitor.sinks)  # auto: run active
    finally:
        run.finish()
    assert "R001" in codes
    log = read_log(finished_run(offline))
    assert log.format == "wandb"
    read = {f.code for f in log.findings}
    assert "R001" in read and read <= codes
    r001 = next(f for f in log.findings if f.code == "R001")
    assert r001.step is not None and r001.step >= 10
    assert "sapper:R001" in log.meta["wandb"]["tags"]
    titles = [a["title"] for a in log.meta["wandb"].get("alerts", [])]
    assert any(t.startswith("sapper R001") for t in titles)
    assert log.meta["summary"]["sapper/errors"] >= 1
    # the user's own metrics are the records; the sink moved no step of theirs
    assert [r.step for r in log.records] == list(range(20))
    assert log.records[3].loss == pytest.approx(0.25)


def test_opt_in_sink_waits_for_the_run(offline: Path) -> None:
    """sinks=["wandb"] before wandb.init: findings are held and sent once a run exists."""
    sink = WandbSink()
    found = []
    sink.on_error = found.append
    from sapper.runtime.detectors.internal import MONITOR_ERROR

    sink.findings([MONITOR_ERROR.finding("held while no run", step=1)])
    run = wandb.init(project="sapper-test", dir=str(offline))
    try:
        run.log({"loss": 1.0})
        sink.close()
    finally:
        run.finish()
    assert found == []
    assert [f.message for f in read_log(finished_run(offline)).findings] == ["held while no run"]


def test_no_run_at_close_is_said_once(offline: Path) -> None:
    from sapper.runtime.detectors.internal import MONITOR_ERROR

    said: list[str] = []
    sink = WandbSink(on_error=said.append)
    sink.findings([MONITOR_ERROR.finding("x", step=1)])
    sink.close()
    sink.close()
    assert len(said) == 1 and "no wandb run was active" in said[0]


class _BrokenRun:
    """A run whose every call fails, as a tracker of another version might."""

    tags: tuple[str, ...] = ()

    @property
    def summary(self) -> Any:
        raise RuntimeError("summary is gone")

    def alert(self, **kwargs: Any) -> None:
        raise RuntimeError("no alerts offline")


def test_a_failing_tracker_never_breaks_training(offline: Path) -> None:
    result = train(
        gpt2(), inject=_poison, steps=15, monitor={"sinks": [WandbSink(_BrokenRun())]}
    )
    assert result.error is None
    messages = [f.message for f in result.monitor.findings if f.code == "R190"]
    assert len(messages) == 1 and "wandb sink failed" in messages[0]
    assert "R001" in {f.code for f in result.monitor.findings}


class _NoAlerts:
    """A run that keeps the summary and tags but refuses alerts (an offline server)."""

    def __init__(self) -> None:
        self.summary: dict[str, Any] = {}
        self.tags: tuple[str, ...] = ()

    def alert(self, **kwargs: Any) -> None:
        raise ConnectionError("offline")


def test_failed_alerts_fall_back_to_the_summary(offline: Path) -> None:
    from sapper.runtime.detectors.internal import MONITOR_ERROR

    run = _NoAlerts()
    said: list[str] = []
    sink = WandbSink(run, on_error=said.append)
    error = MONITOR_ERROR.finding("first", step=1).model_copy(update={"severity": Severity.ERROR})
    sink.findings([error])
    sink.findings([error.model_copy(update={"code": "R002"})])
    assert len(said) == 1 and "alerts could not be sent" in said[0]
    assert [f["code"] for f in run.summary["sapper/findings"]] == ["R190", "R002"]
    assert set(run.tags) == {"sapper:R190", "sapper:R002"}


class _Recorded(_NoAlerts):
    """A run that keeps what it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, Any]] = []

    def alert(self, **kwargs: Any) -> None:
        self.sent.append(kwargs)


def test_alerts_are_rate_limited(offline: Path) -> None:
    from sapper.runtime.detectors.internal import MONITOR_ERROR

    run = _Recorded()
    sent = run.sent
    sink = WandbSink(run, max_alerts=3)
    error = MONITOR_ERROR.finding("again", step=1).model_copy(update={"severity": Severity.ERROR})
    for i in range(10):
        sink.findings([error.model_copy(update={"step": i})])
    assert len(sent) == 1  # one per code per alert_every_s
    for code in ("R002", "R003", "R004", "R005"):
        sink.findings([error.model_copy(update={"code": code})])
    assert len(sent) == 3  # max_alerts in all
    assert len(run.summary["sapper/findings"]) == 14
    assert run.summary["sapper/errors"] == 14


def test_unknown_sink_name_is_refused() -> None:
    with pytest.raises(InputError, match="unknown sink"):
        Monitor(gpt2(), None, sinks=["wandbb"], console=False)


@pytest.mark.slow
def test_hf_trainer_reporting_to_wandb_gets_the_findings(offline: Path) -> None:
    """A Trainer with ``report_to=["wandb"]`` and SapperCallback: the run is active when
    the monitor attaches (transformers' WandbCallback logs into the run the script
    started, as here, or starts one itself in ``on_train_begin``, before the user's
    callbacks), so the monitor finds it by itself; a planted inf weight at step 8 is on
    the W&B run next to the Trainer's own ``train/loss`` rows. The run is started here
    with ``dir=``: wandb reads WANDB_DIR once per process."""
    pytest.importorskip("accelerate")  # the Trainer needs it
    from tinytrain import FAST, Markov
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from sapper.monitor.hf import SapperCallback

    class Poison(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 8:
                _poison(10, kwargs["model"])

    data = Markov()
    rows = [{"input_ids": x, "labels": x} for batch in (next(data) for _ in range(20))
            for x in batch]
    args = TrainingArguments(
        output_dir=str(offline / "out"), max_steps=16, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=["wandb"],
        run_name="hf-sapper", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    )
    sapper = SapperCallback(console=False, log_every=4, detector_options=FAST)
    trainer = Trainer(model=gpt2(), args=args, train_dataset=rows, callbacks=[Poison(), sapper])
    wandb.init(project="sapper-test", name="hf-sapper", dir=str(offline))
    try:
        trainer.train()
    finally:
        wandb.finish()
    assert any(isinstance(s, WandbSink) for s in sapper.monitor.sinks)
    live = {f.code for f in sapper.monitor.findings}
    assert "R001" in live
    log = read_log(finished_run(offline))
    assert {f.code for f in log.findings} == live
    assert log.meta["wandb"]["display_name"] == "hf-sapper"
    assert [r.step for r in log.records][:3] == [1, 2, 3]  # train/global_step
    assert any(t == "sapper:R001" for t in log.meta["wandb"]["tags"])


class _FlakySummary(dict):
    def __init__(self, rng: Any) -> None:
        super().__init__()
        self.rng = rng

    def __setitem__(self, key: str, value: Any) -> None:
        if self.rng.random() < 0.1:
            raise self.rng.choice([ConnectionError("down"), ValueError("v"), OSError(28, "x")])
        super().__setitem__(key, value)


class _FlakyRun(_NoAlerts):
    """Every call may fail: the summary, the tags, alerts."""

    def __init__(self, rng: Any) -> None:  # not _NoAlerts.__init__: it sets the tags
        self.rng = rng
        self._tags: tuple[str, ...] = ()
        self.summary = _FlakySummary(rng)

    @property
    def tags(self) -> tuple[str, ...]:
        return self._tags

    @tags.setter
    def tags(self, value: tuple[str, ...]) -> None:
        if self.rng.random() < 0.2:
            raise RuntimeError("tags are read-only here")
        self._tags = value

    def alert(self, **kwargs: Any) -> None:
        if self.rng.random() < 0.5:
            raise ConnectionError("offline")


@pytest.mark.parametrize("seed", range(30))
def test_any_failure_is_reported_at_most_twice_and_never_raises(seed: int) -> None:
    """Once for alerts (the sink goes on without them), once for the sink itself."""
    import random

    from sapper.runtime.detectors.internal import MONITOR_ERROR

    rng = random.Random(seed)
    said: list[str] = []
    sink = WandbSink(_FlakyRun(rng), on_error=said.append, alert_every_s=0)
    for step in range(20):
        code = rng.choice(["R001", "R002", "R003"])
        f = MONITOR_ERROR.finding(f"at {step}", step=step)
        sink.findings([f.model_copy(update={"code": code, "severity": Severity.ERROR})])
    sink.close()
    assert len(said) <= 2
    assert sum("sink failed" in s for s in said) == int(sink.failed)
