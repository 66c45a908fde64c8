"""W&B run folders: runs written by the real wandb SDK (offline), read back.

The fixtures in tests/fixtures/logs/wandb/ were written by wandb 0.31.0 through
``tests/fixtures/make_wandb_runs.py`` (an HF Trainer with ``report_to="wandb"`` and a plain
loop); the other runs are written here, in offline mode, in about a second each."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from tests.logs.hostile import run_cli

from sapper.errors import InputError
from sapper.logs import LogSource, expand_paths, read_log
from sapper.logs.analysis import analyze_log
from sapper.logs.wandb import FORMAT, HEADER, RecordScanner, WandbParser, runs_in
from sapper.runtime.detectors import default_detectors

# the .wandb record files are read with the wandb package (sapper[wandb])
pytest.importorskip("wandb")

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs" / "wandb"
HF_RUN = FIXTURES / "hf-trainer"
PLAIN_RUN = FIXTURES / "plain-loop"


def _record_file(project: Path) -> Path:
    (run,) = runs_in(project)
    return next(run.glob("*.wandb"))


# ---- runs written by the real SDK ------------------------------------------------------
def test_hf_trainer_run_maps_the_callbacks_keys() -> None:
    (run,) = runs_in(HF_RUN)
    log = read_log(run)
    assert log.format == "wandb" and log.notes == []
    # train/global_step (the optimizer step) is the step, not _step (one per wandb.log)
    assert [r.step for r in log.records] == list(range(2, 41, 2))
    by = {r.step: r for r in log.records}
    assert all(r.loss is not None and r.grad_norm is not None for r in log.records)
    assert by[6].lr == pytest.approx(3e-3)  # the peak after 5 warmup steps
    assert by[2].lr < by[4].lr < by[6].lr > by[40].lr
    assert [s for s, r in by.items() if r.eval_loss is not None] == [10, 20, 30, 40]
    assert by[10].extra["train/epoch"] == pytest.approx(0.2)
    assert log.meta["wandb"]["display_name"] == "tiny-gpt2"
    assert log.meta["wandb"]["cli_version"] == "0.31.0"
    assert log.meta["config"]["learning_rate"] == pytest.approx(3e-3)
    assert log.meta["summary"]["train/global_step"] == 40


def test_plain_loop_nan_loss_is_found_offline() -> None:
    (run,) = runs_in(PLAIN_RUN / "wandb")
    log = read_log(run)
    assert [r.step for r in log.records] == list(range(40))
    assert math.isnan(log.records[25].loss) and not math.isnan(log.records[24].loss)
    assert log.records[0].lr == pytest.approx(2e-4)
    assert log.meta["config"] == {"lr": 1e-3, "batch_size": 8, "model": {"layers": 2}}
    assert "weights/_type" not in log.records[10].extra  # the histogram is no number
    found = analyze_log(log, default_detectors()).findings
    r001 = [f for f in found if f.code == "R001"]
    assert r001 and r001[0].step == 25


def test_record_file_and_folder_read_the_same() -> None:
    by_file = read_log(_record_file(PLAIN_RUN))
    by_folder = read_log(next(iter(runs_in(PLAIN_RUN))))
    assert by_file.format == "wandb"
    assert [r.loss for r in by_file.records][:25] == [r.loss for r in by_folder.records][:25]


def test_cli_analyzes_a_wandb_folder() -> None:
    assert run_cli("analyze", str(PLAIN_RUN / "wandb")) == 1  # R001 is an error


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    return wandb


def _finished(root: Path) -> Path:
    """The run under ``root`` once wandb-core has written its exit record (its process
    can still be writing when ``finish()`` returns)."""
    (run,) = runs_in(root)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        parser = WandbParser(run)
        parser.poll()
        parser.finish()
        if "exit_code" in parser.meta["wandb"]:
            break
        time.sleep(0.1)
    return run


def test_nested_dicts_and_large_rows(offline, tmp_path: Path) -> None:
    """``{"train": {"loss": x}}`` is ``train/loss``; a 3000-key row spans several 32 KiB
    blocks (FIRST, MIDDLE, LAST chunks) and is read whole."""
    run = offline.init(project="p", dir=str(tmp_path))
    for step in range(5):
        row = {"train": {"loss": 3.0 - step, "grad_norm": 1.5}, "trainer/global_step": 10 * step}
        if step == 3:
            row.update({f"layer_{i}/grad_norm": float(i) for i in range(3000)})
        run.log(row)
    run.finish()
    folder = _finished(tmp_path)
    assert os.path.getsize(next(folder.glob("*.wandb"))) > 2 * 32768
    log = read_log(folder)
    assert [r.step for r in log.records] == [0, 10, 20, 30, 40]
    assert log.records[2].loss == pytest.approx(1.0)
    assert log.records[2].grad_norm == pytest.approx(1.5)
    layers = log.records[3].extra["grad_norm_layers"]
    assert len(layers) == 3000 and layers["layer_2999"] == pytest.approx(2999.0)


def test_wandb_folder_lists_each_run_once(offline, tmp_path: Path) -> None:
    for name in ("first", "second"):
        run = offline.init(project="p", name=name, dir=str(tmp_path))
        run.log({"loss": 1.0})
        run.log({"loss": 0.5})
        run.finish()
    wandb_dir = tmp_path / "wandb"
    assert (wandb_dir / "latest-run").is_symlink()
    runs = runs_in(wandb_dir)
    assert len(runs) == 2 and runs == runs_in(tmp_path)
    assert [p for p, _ in expand_paths([wandb_dir])] == runs
    assert {fmt for _, fmt in expand_paths([tmp_path])} == {"wandb"}


def test_poll_follows_a_growing_record_file(tmp_path: Path) -> None:
    """The record file copied over in pieces, as the SDK appends it: each poll returns
    what is complete, a torn record waits, and the whole equals one read."""
    source = _record_file(PLAIN_RUN).read_bytes()
    run = tmp_path / "wandb" / "offline-run-20240101_000000-abcd1234"
    run.mkdir(parents=True)
    target = run / "run-abcd1234.wandb"
    target.write_bytes(b"")
    follower = None
    got = []
    for cut in range(0, len(source) + 1, 997):
        with target.open("ab") as fh:
            fh.write(source[target.stat().st_size : cut])
        if follower is None and cut >= len(HEADER):
            follower = LogSource(run)
        if follower is not None:
            got.extend(follower.poll())
    with target.open("ab") as fh:
        fh.write(source[target.stat().st_size :])
    got.extend(follower.poll())
    got.extend(follower.close())
    whole = read_log(run).records
    assert [r.step for r in got] == [r.step for r in whole] == list(range(40))
    assert follower.notes == []


# ---- the history jsonl of older SDKs, and the extra ------------------------------------
def _legacy_run(root: Path) -> Path:
    """The layout of SDKs before the record log (and of synced runs): one JSON object
    per ``wandb.log`` call in ``files/wandb-history.jsonl`` with ``_step``, ``_runtime``
    and ``_timestamp``; the summary in ``wandb-summary.json``; the config in
    ``config.yaml`` as ``key: {desc, value}``. The rows are the plain-loop fixture's."""
    run = root / "wandb" / "run-20200101_120000-legacy01"
    files = run / "files"
    files.mkdir(parents=True)
    rows = []
    for r in read_log(runs_in(PLAIN_RUN)[0]).records:
        row = {"_step": r.step, "_runtime": r.step * 0.5, "_timestamp": r.time,
               "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm}
        rows.append(json.dumps(row))  # NaN as the SDK wrote it, a bare NaN
    (files / "wandb-history.jsonl").write_text("\n".join(rows) + "\n")
    (files / "wandb-summary.json").write_text(json.dumps({"loss": None, "_step": 39}))
    (files / "config.yaml").write_text(
        "wandb_version: 1\n\n_wandb:\n  desc: null\n  value:\n    cli_version: 0.9.7\n"
        "lr:\n  desc: null\n  value: 0.001\n"
    )
    (files / "wandb-metadata.json").write_text(json.dumps({"host": "node-3", "gpu_count": 8}))
    return run


def test_history_jsonl_needs_no_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _legacy_run(tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails from here
    log = read_log(run)
    assert log.format == "wandb" and len(log.records) == 40
    assert math.isnan(log.records[30].loss)
    assert "_runtime" not in log.records[1].extra
    assert log.meta["config"] == {"lr": 0.001}
    assert log.meta["wandb"]["host"] == "node-3" and log.meta["wandb"]["gpu_count"] == 8
    assert runs_in(tmp_path / "wandb") == [run]
    history = run / "files" / "wandb-history.jsonl"
    assert FORMAT.recognise_text(history.read_text()[:1000], history) == 0.9
    assert FORMAT.recognise_text('{"loss": 1}', tmp_path / "metrics.jsonl") == 0.0
    from_file = read_log(history, fmt="wandb")
    assert len(from_file.records) == 40 and from_file.meta["config"] == {"lr": 0.001}


def test_record_file_without_wandb_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "offline-run-20240101_000000-abcd1234"
    shutil.copytree(_record_file(PLAIN_RUN).parent, run)
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "wandb.proto", None)
    with pytest.raises(InputError) as err:
        read_log(run)
    line = str(err.value)
    assert "\n" not in line and "sapper[wandb]" in line


# ---- damage --------------------------------------------------------------------------
def _damaged(tmp_path: Path, data: bytes) -> Path:
    run = tmp_path / "offline-run-20240101_000000-damaged1"
    run.mkdir(exist_ok=True)
    (run / "run-damaged1.wandb").write_bytes(data)
    return run


def test_truncated_record_file_is_read_up_to_the_cut(tmp_path: Path) -> None:
    data = _record_file(PLAIN_RUN).read_bytes()
    for cut in (len(data) // 3, len(data) // 2 + 5, len(data) - 3):
        log = read_log(_damaged(tmp_path, data[:cut]))
        assert 0 < len(log.records) <= 40
        assert any("incomplete record" in n for n in log.notes), log.notes


def test_corrupt_bytes_skip_to_the_next_block(tmp_path: Path) -> None:
    data = bytearray(_record_file(HF_RUN).read_bytes())
    assert len(data) > 32768
    data[100:4000] = os.urandom(3900)  # a damaged stretch in the first block
    log = read_log(_damaged(tmp_path, bytes(data)))
    assert any("damaged chunk" in n for n in log.notes), log.notes
    assert log.records and log.records[-1].step == 40  # the later blocks still read


def test_nul_block_is_damage_not_a_crash(tmp_path: Path) -> None:
    data = _record_file(PLAIN_RUN).read_bytes()
    nul = data[:9000] + b"\x00" * 20000 + data[29000:]
    log = read_log(_damaged(tmp_path, nul))
    assert any("damaged chunk" in n for n in log.notes)
    only_nul = _damaged(tmp_path, b"\x00" * 50000)
    with pytest.raises(InputError):
        read_log(only_nul)


def test_not_a_record_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a W&B record file"):
        read_log(_damaged(tmp_path, b"PK\x03\x04 a zip, renamed" * 10), fmt="wandb")
    future = HEADER[:6] + b"\x01" + _record_file(PLAIN_RUN).read_bytes()[7:]
    with pytest.raises(InputError, match="format version 1; sapper reads version 0"):
        read_log(_damaged(tmp_path, future))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no W&B run here"):
        read_log(empty, fmt="wandb")


def test_record_file_over_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sapper.logs.wandb as reader

    monkeypatch.setattr(reader, "MAX_LOG_BYTES", 10_000)
    with pytest.raises(InputError, match="limit"):
        read_log(_damaged(tmp_path, _record_file(PLAIN_RUN).read_bytes()))


def test_scanner_bounds_a_record_chain() -> None:
    """A FIRST chunk followed by MIDDLE chunks for ever is cut at MAX_RECORD_BYTES."""
    import struct
    import zlib

    import sapper.logs.wandb as reader

    def chunk(kind: int, data: bytes) -> bytes:
        crc = zlib.crc32(data, zlib.crc32(bytes([kind])))
        return struct.pack("<IHB", crc, len(data), kind) + data

    body = 32768 - 7
    stream = HEADER + chunk(2, b"x" * (body - 7))
    for _ in range(reader.MAX_RECORD_BYTES // body + 2):
        stream += chunk(3, b"y" * body)
    scanner = RecordScanner()
    out = []
    for i in range(0, len(stream), 1 << 20):
        out.extend(scanner.push(stream[i : i + 1 << 20]))
    assert out == [] and scanner.oversized == 1
    assert scanner.pending < 2 * 32768
