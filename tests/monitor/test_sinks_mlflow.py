"""The MLflow sink. mlflow cannot be installed in this environment, so these tests use
a stand-in module put in ``sys.modules["mlflow"]``: it keeps the calls the sink makes
(``active_run``, ``set_tag``, ``log_text``) and the training script's ``log_metric``,
writing them where mlflow's file store would (``mlruns/<exp>/<run>/tags``, ``metrics``,
``artifacts``), so sapper's MLflow reader can read the run back. What the real mlflow
does with the same calls is not tested here."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tinytrain import gpt2, train

from sapper.logs import read_log
from sapper.logs.mlflow import runs_in
from sapper.monitor.trackers import MlflowSink


class FakeMlflow(types.ModuleType):
    """The few mlflow calls in play, writing a file-store run."""

    def __init__(self, root: Path) -> None:
        super().__init__("mlflow")
        # transformers and accelerate look for mlflow with importlib.util.find_spec
        self.__spec__ = importlib.machinery.ModuleSpec("mlflow", None)
        self.run_dir = root / "mlruns" / "0" / ("f" * 32)
        (self.run_dir / "metrics").mkdir(parents=True)
        (self.run_dir / "meta.yaml").write_text(
            f"run_id: {'f' * 32}\nexperiment_id: '0'\nstatus: 1\nlifecycle_stage: active\n"
        )
        (root / "mlruns" / "0" / "meta.yaml").write_text("experiment_id: '0'\nname: Default\n")
        self.active = True
        self.calls: list[str] = []

    def active_run(self) -> Any:
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="f" * 32)) \
            if self.active else None

    def set_tag(self, key: str, value: str) -> None:
        self.calls.append(f"set_tag {key}")
        path = self.run_dir / "tags" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(value))

    def log_text(self, text: str, artifact_file: str) -> None:
        self.calls.append(f"log_text {artifact_file}")
        path = self.run_dir / "artifacts" / artifact_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def log_metric(self, key: str, value: float, step: int = 0) -> None:
        path = self.run_dir / "metrics" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(f"1700000000000 {value} {step}\n")


@pytest.fixture
def mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeMlflow:
    fake = FakeMlflow(tmp_path)
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    return fake


def _poison(step: int, model: torch.nn.Module) -> None:
    if step == 10:
        with torch.no_grad():
            model.transformer.h[1].mlp.c_fc.weight.fill_(float("inf"))


def test_findings_reach_the_active_run_and_read_back(mlflow: FakeMlflow, tmp_path: Path) -> None:
    def evaluate(step: int, model: torch.nn.Module) -> None:
        mlflow.log_metric("train/loss", 1.0 / (step + 1), step=step)

    result = train(gpt2(), inject=_poison, steps=20, evaluate=evaluate)
    assert any(isinstance(s, MlflowSink) for s in result.monitor.sinks)  # auto: run active
    codes = {f.code for f in result.monitor.findings}
    assert "R001" in codes
    (run,) = runs_in(tmp_path)
    log = read_log(run)
    assert log.format == "mlflow" and [r.step for r in log.records] == list(range(20))
    assert {f.code for f in log.findings} == codes, log.notes
    tags = log.meta["mlflow"]["tags"]
    assert tags["sapper.R001"].startswith("error: ")
    assert tags["sapper.findings"] == str(len(result.monitor.findings))
    text = (run / "artifacts" / "sapper" / "findings.txt").read_text()
    assert "R001 error at step" in text and "fix:" in text


def test_no_active_run_adds_no_sink(mlflow: FakeMlflow) -> None:
    mlflow.active = False
    result = train(gpt2(), steps=5)
    assert not any(isinstance(s, MlflowSink) for s in result.monitor.sinks)


def test_artifacts_are_rate_limited(mlflow: FakeMlflow) -> None:
    from sapper.runtime.detectors.internal import MONITOR_ERROR

    sink = MlflowSink(artifact_every_s=3600)
    for step in range(5):
        sink.findings([MONITOR_ERROR.finding(f"at {step}", step=step)])
    assert mlflow.calls.count("log_text sapper/findings.json") == 1
    sink.close()  # the last findings are written at the end
    assert mlflow.calls.count("log_text sapper/findings.json") == 2
    assert mlflow.calls.count("set_tag sapper.R190") == 1


def test_a_failing_mlflow_never_breaks_training(mlflow: FakeMlflow) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("tracking server unreachable")

    mlflow.set_tag = broken  # type: ignore[method-assign]
    result = train(gpt2(), inject=_poison, steps=15)
    assert result.error is None
    notes = [f.message for f in result.monitor.findings if f.code == "R190"]
    assert len(notes) == 1 and "mlflow sink failed" in notes[0]
    assert "unreachable" in notes[0]


def test_mlflow_named_but_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    result = train(gpt2(), inject=_poison, steps=15, monitor={"sinks": ["mlflow"]})
    notes = [f.message for f in result.monitor.findings if f.code == "R190"]
    assert len(notes) == 1 and "pip install 'sapper[mlflow]'" in notes[0]


class _Flaky(FakeMlflow):
    """Each call fails with the given chance, with an error of any kind."""

    def __init__(self, root: Path, rng: Any) -> None:
        super().__init__(root)
        self.rng = rng

    def _maybe(self) -> None:
        if self.rng.random() < 0.3:
            raise self.rng.choice(
                [ConnectionError("down"), KeyError("x"), TypeError("v"), RuntimeError("?")]
            )

    def active_run(self) -> Any:
        self._maybe()
        return super().active_run()

    def set_tag(self, key: str, value: str) -> None:
        self._maybe()
        super().set_tag(key, value)

    def log_text(self, text: str, artifact_file: str) -> None:
        self._maybe()
        super().log_text(text, artifact_file)


@pytest.mark.parametrize("seed", range(30))
def test_any_failure_is_reported_once_and_never_raises(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    from sapper.runtime.detectors.internal import MONITOR_ERROR

    rng = random.Random(seed)
    monkeypatch.setitem(sys.modules, "mlflow", _Flaky(tmp_path, rng))
    said: list[str] = []
    sink = MlflowSink(on_error=said.append, artifact_every_s=0)
    for step in range(20):
        sink.findings([MONITOR_ERROR.finding(f"at {step}", step=step)])
    sink.close()
    assert len(said) <= 1
    assert sink.failed == bool(said)
