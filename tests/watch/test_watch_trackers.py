"""``sapper watch`` on a W&B run folder and an MLflow run while they are written: the
record file of the real plain-loop fixture (wandb 0.31.0, the loss NaN from step 25)
copied over in pieces, as the SDK appends it."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from sapper.errors import InputError
from sapper.watch import Watcher, open_follower
from sapper.watch.live import PlainView
from sapper.watch.poll import PollFollower

# the .wandb record files are read with the wandb package (sapper[wandb])
pytest.importorskip("wandb")

FIXTURE = next(
    (Path(__file__).parent.parent / "fixtures" / "logs" / "wandb" / "plain-loop").glob(
        "wandb/*/*.wandb"
    )
)


def _grow(data: bytes, parts: int) -> list[bytes]:
    step = len(data) // parts + 1
    return [data[i : i + step] for i in range(0, len(data), step)]


@pytest.mark.parametrize("given", ["project", "wandb", "run", "file"])
def test_watch_finds_the_nan_in_a_growing_wandb_run(tmp_path: Path, given: str) -> None:
    run = tmp_path / "wandb" / "offline-run-20240101_000000-live0001"
    target = run / "run-live0001.wandb"
    watched = {"project": tmp_path, "wandb": tmp_path / "wandb", "run": run, "file": target}
    if given != "file":
        tmp_path.joinpath("wandb").mkdir()
    out = io.StringIO()
    watcher = Watcher(open_follower(watched[given]), idle_timeout=0,
                      sinks=[PlainView(out, status_every=0)])
    watcher.tick()  # nothing there yet: waiting, no error
    run.mkdir(parents=True, exist_ok=True)
    for part in _grow(FIXTURE.read_bytes(), 7):
        with target.open("ab") as fh:
            fh.write(part)
        watcher.tick()
    result = watcher.close()
    assert result.format == "wandb" and result.records == 40
    assert ("R001", 25) in {(f.code, f.step) for f in result.findings}


def test_watch_an_mlflow_run(tmp_path: Path) -> None:
    run = tmp_path / "mlruns" / "3" / ("a" * 32)
    (run / "metrics").mkdir(parents=True)
    (run / "meta.yaml").write_text(f"run_id: {'a' * 32}\nstatus: 1\n")
    (tmp_path / "mlruns" / "3" / "meta.yaml").write_text("experiment_id: '3'\nname: x\n")
    follower = open_follower(tmp_path / "mlruns", fmt="mlflow")
    assert isinstance(follower, PollFollower)
    lines = [f"1700000000000 {2.0 if s < 12 else 'nan'} {s}\n" for s in range(20)]
    watcher = Watcher(follower, idle_timeout=0, sinks=[PlainView(io.StringIO(), status_every=0)])
    for i in range(0, 20, 5):
        with (run / "metrics" / "loss").open("a") as fh:
            fh.writelines(lines[i : i + 5])
        watcher.tick()
    result = watcher.close()
    assert result.format == "mlflow" and result.records == 20
    assert ("R001", 12) in {(f.code, f.step) for f in result.findings}


def test_several_runs_must_be_chosen(tmp_path: Path) -> None:
    for run_id in ("aaaa0001", "aaaa0002"):
        run = tmp_path / "wandb" / f"offline-run-2024010{run_id[-1]}_000000-{run_id}"
        run.mkdir(parents=True)
        shutil.copy(FIXTURE, run / f"run-{run_id}.wandb")
    with pytest.raises(InputError, match="holds 2 wandb runs"):
        open_follower(tmp_path / "wandb", fmt="wandb")
    (tmp_path / "wandb" / "latest-run").symlink_to(run)
    follower = open_follower(tmp_path / "wandb", fmt="wandb")
    assert follower.poll() and follower.format == "wandb"


def test_nothing_appeared(tmp_path: Path) -> None:
    follower = open_follower(tmp_path, fmt="wandb")
    assert follower.poll() == []
    with pytest.raises(InputError, match="no wandb run appeared"):
        follower.close()
