"""``sapper watch`` on a run of a format whose reader opens its own files (read_mode
"poll", the W&B / MLflow layout): named with --log-format, or recognised by its folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.logs.test_registry import TOY, _toy_run

from sapper.logs import registry
from sapper.watch import PollFollower, open_follower


@pytest.fixture
def toy(monkeypatch) -> None:
    formats = (*registry.log_formats(), TOY)
    monkeypatch.setattr(registry, "log_formats", lambda: formats)


def test_a_named_poll_format_is_followed_as_it_grows(toy, tmp_path: Path) -> None:
    run = _toy_run(tmp_path / "run-a", [3.0, 2.5])
    fol = open_follower(run, fmt="toy")
    assert isinstance(fol, PollFollower)
    assert [r.step for r in fol.poll()] == [1]  # step 2 waits for a later step
    with open(run / "metrics.toy", "a") as fh:
        fh.write("3 2.0\n")
    assert [r.step for r in fol.poll()] == [2]
    assert fol.format == "toy" and fol.last_data is not None
    assert [r.step for r in fol.close()] == [3]


def test_a_run_folder_is_recognised_once_it_appears(toy, tmp_path: Path) -> None:
    run = tmp_path / "run-b"
    run.mkdir()
    fol = open_follower(run)
    assert fol.poll() == [] and fol.format is None  # nothing to recognise yet
    (run / "metrics.toy").write_text("TOY1\n1 2.0\n2 1.9\n")
    assert [r.step for r in fol.poll()] == [1]
    assert fol.format == "toy"
