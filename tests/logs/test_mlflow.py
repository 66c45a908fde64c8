"""MLflow file-store runs (``mlruns/``), read without the mlflow package.

mlflow is not installable in this environment, so the stores here are written by
:func:`write_store` in the layout of mlflow's ``mlflow/store/tracking/file_store.py``
(``FileStore``): ``meta.yaml`` files with the keys real stores hold (the run meta.yaml
of e.g. github.com/10padmapriya/LLM-Models-Train-Themselves-Using-the-Prompts,
``mlruns/977040650095363724/38737742e8da4097ae97cf21f7de93e6/meta.yaml``),
``metrics/<name>`` files of ``<timestamp ms> <value> <step>`` lines (nested folders for
names with ``/``), ``params/`` and ``tags/`` files holding the value."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from tests.logs.hostile import run_cli

from sapper.errors import InputError
from sapper.logs import LogSource, expand_paths, read_log
from sapper.logs.mlflow import MlflowParser, run_status, runs_in

T0 = 1_700_000_000_000


def write_run(
    exp: Path,
    run_id: str,
    metrics: dict[str, list[str]],
    *,
    status: int = 3,
    params: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
) -> Path:
    run = exp / run_id
    (run / "metrics").mkdir(parents=True)
    (run / "artifacts").mkdir()
    (run / "meta.yaml").write_text(
        f"artifact_uri: file://{run}/artifacts\nend_time: {T0 + 60_000}\n"
        f"entry_point_name: ''\nexperiment_id: '{exp.name}'\nlifecycle_stage: active\n"
        f"run_id: {run_id}\nrun_name: bright-owl-42\nrun_uuid: {run_id}\nsource_name: ''\n"
        f"source_type: 4\nsource_version: ''\nstart_time: {T0}\nstatus: {status}\n"
        "tags: []\nuser_id: alice\n"
    )
    for kind, values in (("params", params or {}), ("tags", tags or {})):
        for key, value in values.items():
            path = run / kind / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)
    for name, lines in metrics.items():
        path = run / "metrics" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))
    return run


def write_store(root: Path) -> Path:
    """A store with the default experiment (empty), one experiment of two training
    runs, a deleted experiment in .trash and a model registry folder."""
    store = root / "mlruns"
    default = store / "0"
    default.mkdir(parents=True)
    (default / "meta.yaml").write_text(
        f"artifact_location: file://{default}\ncreation_time: {T0}\nexperiment_id: '0'\n"
        f"last_update_time: {T0}\nlifecycle_stage: active\nname: Default\n"
    )
    exp = store / "412345"
    exp.mkdir()
    (exp / "meta.yaml").write_text(
        f"artifact_location: file://{exp}\ncreation_time: {T0}\nexperiment_id: '412345'\n"
        f"last_update_time: {T0}\nlifecycle_stage: active\nname: gpt-small\n"
    )
    steps = range(0, 100, 10)
    write_run(
        exp,
        "a" * 32,
        {
            "train/loss": [f"{T0 + s * 100} {4.0 / (1 + s / 10)} {s}" for s in steps],
            "train/grad_norm": [f"{T0 + s * 100} {0.9} {s}" for s in steps],
            "learning_rate": [f"{T0 + s * 100} {3e-4} {s}" for s in steps],
            "eval/loss": [f"{T0 + 5000} 3.5 50"],
            "epoch": [f"{T0 + s * 100} {s / 100} {s}" for s in steps],
        },
        params={"lr": "0.0003", "optimizer/name": "adamw"},
        tags={"mlflow.runName": "bright-owl-42", "mlflow.source.type": "LOCAL"},
    )
    write_run(exp, "b" * 32, {"loss": [f"{T0} nan 0", f"{T0 + 1} inf 1"]}, status=4)
    (store / ".trash" / "7" / ("c" * 32) / "metrics").mkdir(parents=True)
    (store / "models" / "my-model").mkdir(parents=True)
    return store


def test_run_maps_metric_names_and_steps(tmp_path: Path) -> None:
    store = write_store(tmp_path)
    log = read_log(store / "412345" / ("a" * 32))
    assert log.format == "mlflow" and log.notes == []
    assert [r.step for r in log.records] == list(range(0, 100, 10))
    by = {r.step: r for r in log.records}
    assert by[30].loss == pytest.approx(1.0)
    assert by[30].grad_norm == pytest.approx(0.9) and by[30].lr == pytest.approx(3e-4)
    assert by[50].eval_loss == pytest.approx(3.5) and by[40].eval_loss is None
    assert by[20].extra["epoch"] == pytest.approx(0.2)
    assert by[0].time == pytest.approx(T0 / 1000)
    info = log.meta["mlflow"]
    assert info["status"] == "FINISHED" and info["run_name"] == "bright-owl-42"
    assert info["tags"]["mlflow.runName"] == "bright-owl-42"
    assert log.meta["config"] == {"lr": "0.0003", "optimizer/name": "adamw"}


def test_failed_run_and_nonfinite_values(tmp_path: Path) -> None:
    log = read_log(write_store(tmp_path) / "412345" / ("b" * 32))
    assert log.meta["mlflow"]["status"] == "FAILED"
    assert math.isnan(log.records[0].loss) and math.isinf(log.records[1].loss)
    assert run_status(5) == "KILLED" and run_status("3") is None


def test_store_and_experiment_folders_list_runs(tmp_path: Path) -> None:
    store = write_store(tmp_path)
    runs = [store / "412345" / ("a" * 32), store / "412345" / ("b" * 32)]
    assert runs_in(store) == runs  # not .trash, not models, not the empty Default
    assert runs_in(store / "412345") == runs
    assert runs_in(tmp_path) == runs  # a project folder holding mlruns/
    assert runs_in(runs[0]) == [runs[0]]
    assert expand_paths([store]) == [(r, "mlflow") for r in runs]
    assert runs_in(tmp_path / "missing") == []


def test_cli_analyze_reads_a_store(tmp_path: Path) -> None:
    store = write_store(tmp_path)
    assert run_cli("analyze", str(store)) in (0, 1)
    assert run_cli("analyze", str(store / "412345" / ("b" * 32))) == 1  # NaN loss: R001


def test_two_field_lines_are_step_zero(tmp_path: Path) -> None:
    """Metric lines from before mlflow logged steps hold ``<timestamp> <value>``;
    mlflow reads them as step 0 (FileStore._get_metric_from_line)."""
    run = write_run(tmp_path / "1", "d" * 32, {"loss": [f"{T0} 2.5"]})
    assert read_log(run).records[0].step == 0


def test_poll_follows_growing_metric_files(tmp_path: Path) -> None:
    run = write_run(tmp_path / "1", "e" * 32, {"loss": [f"{T0} 3.0 0", f"{T0} 2.9 1"]})
    source = LogSource(run)
    assert [r.step for r in source.poll()] == [0]  # step 1 may still get values
    with (run / "metrics" / "loss").open("a") as fh:
        fh.write(f"{T0} 2.8 2\n{T0} 2.7 ")  # a torn last line waits
    (run / "metrics" / "lr").write_text(f"{T0} 1e-4 2\n")
    assert [r.step for r in source.poll()] == [1]
    with (run / "metrics" / "loss").open("a") as fh:
        fh.write("3\n")
    rest = source.poll() + source.close()
    assert [r.step for r in rest] == [2, 3]
    assert rest[0].lr == pytest.approx(1e-4) and rest[1].loss == pytest.approx(2.7)


# ---- hostile stores --------------------------------------------------------------------
def test_garbage_lines_cost_only_themselves(tmp_path: Path) -> None:
    lines = [
        f"{T0} 1.0 0",
        "not a metric line",
        f"{T0} 1.0 1 extra fields",
        f"{T0} abc 2",
        f"{T0} 1.0 -3",
        f"{T0} 1.0 {'9' * 5000}",
        f"{T0} {'9' * 5000} 4",
        "\x00" * 300,
        f"{T0} 0.5 5",
        f"{T0} 0.4 1.5",
        "\x1b[31m\u202e 1 2",
    ]
    run = write_run(tmp_path / "1", "f" * 32, {"train/loss": lines})
    log = read_log(run)
    # a 5000-digit value is refused as a number (sapper.logs.base.to_float), not read as inf
    assert [r.step for r in log.records] == [0, 5]
    (note,) = log.notes
    assert "train/loss" in note and "8 line(s)" in note


def test_nul_blocks_and_binary_metric_files(tmp_path: Path) -> None:
    run = write_run(tmp_path / "1", "g" * 32, {"loss": [f"{T0} 1.0 0", f"{T0} 0.9 1"]})
    with (run / "metrics" / "loss").open("ab") as fh:
        fh.write(b"\x00" * 65536 + f"{T0} 0.8 2\n".encode())
    (run / "metrics" / "junk").write_bytes(os.urandom(5000))
    log = read_log(run)
    assert [r.loss for r in log.records] == [1.0, 0.9, 0.8]
    assert any("junk" in n for n in log.notes)


def test_a_fifo_among_the_metrics_is_passed_over(tmp_path: Path) -> None:
    run = write_run(tmp_path / "1", "h" * 32, {"loss": [f"{T0} 1.0 0"]})
    os.mkfifo(run / "metrics" / "stuck")
    log = read_log(run)  # must not block on the FIFO
    assert len(log.records) == 1 and any("stuck" in n for n in log.notes)


def test_damaged_meta_yaml_is_a_note(tmp_path: Path) -> None:
    run = write_run(tmp_path / "1", "i" * 32, {"loss": [f"{T0} 1.0 0"]})
    (run / "meta.yaml").write_text("run_id: [unclosed\n" + "\x00" * 100)
    log = read_log(run, fmt="mlflow")
    assert any("meta.yaml" in n for n in log.notes)


def test_not_a_run_and_no_steps(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not an MLflow run"):
        MlflowParser(tmp_path)
    run = write_run(tmp_path / "1", "j" * 32, {"loss": ["garbage"]})
    with pytest.raises(InputError, match="no training steps"):
        read_log(run)


def test_too_many_metric_files_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sapper.logs.mlflow as reader

    monkeypatch.setattr(reader, "MAX_METRICS", 3)
    run = write_run(tmp_path / "1", "k" * 32, {f"m{i}": [f"{T0} {i} 0"] for i in range(10)})
    log = read_log(run)
    assert len(log.records[0].extra) == 3
    assert any("7 metric file(s)" in n for n in log.notes)


def test_deeply_nested_metric_names(tmp_path: Path) -> None:
    name = "/".join(["d"] * 150) + "/loss"
    run = write_run(tmp_path / "1", "l" * 32, {name: [f"{T0} 1.0 0"], "loss": [f"{T0} 2 0"]})
    log = read_log(run)
    assert log.records[0].loss == pytest.approx(2.0)
