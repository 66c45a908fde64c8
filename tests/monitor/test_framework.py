"""The framework the live monitor tells its detectors and writes to the run log, and how
``sapper analyze`` reads it back."""

from __future__ import annotations

from pathlib import Path

import pytest
from tinytrain import gpt2, train

from sapper.errors import InputError
from sapper.logs import read_log
from sapper.logs.framework import framework_of


@pytest.mark.parametrize(("fp16", "expected"), [(True, "torch-amp"), (False, "torch")])
def test_monitor_framework_from_the_scaler(tmp_path: Path, fp16: bool, expected: str) -> None:
    log = tmp_path / "run.jsonl"
    run = train(gpt2(), fp16=fp16, steps=3, monitor={"run_log": log})
    assert run.monitor.framework == expected
    assert {d.framework for d in run.monitor.detectors.detectors} == {expected}
    read = read_log(log)
    assert read.meta["framework"] == expected and framework_of(read) == expected


def test_monitor_framework_given_and_checked() -> None:
    run = train(gpt2(), steps=2, monitor={"framework": "hf-trainer"})
    assert run.monitor.framework == "hf-trainer"
    with pytest.raises(InputError, match="unknown training framework"):
        train(gpt2(), steps=1, monitor={"framework": "jax"})
