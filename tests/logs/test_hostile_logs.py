"""Each hostile or odd log that once crashed sapper (exit 3) or hung it now gives a
readable result or one error line (exit 2), fast.

Found by mutating real logs: a CSV with a stray ``\\r``, Megatron's ``number of nan
iterations: inf`` and ``skipped: nan``, a trainer_state step of 10^30, integers past
Python's 4300-digit limit, JSON nested 100,000 deep, ``sapper report`` on values
``sapper analyze`` accepted (10^400, ``{}``, ``[1,2]``, ``"abc"``), a FIFO and
``/dev/zero`` (both hung), a NUL block at the start of a log (refused as binary) and a
UTF-16 CSV (refused as binary).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tests.logs.hostile import LOGS, run_cli, runner

from sapper.cli.app import app
from sapper.logs import limits as log_limits
from sapper.logs import read_log
from sapper.report.html_data import Columns
from sapper.runtime.records import StepRecord

MEGATRON = [
    line for line in (LOGS / "megatron-gpt345m-fp16.log").read_text().splitlines()
    if " iteration " in line
][:40]
FAST_S = 5.0


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def both(path: Path, *codes: int) -> None:
    """``analyze`` and ``report`` exit with one of ``codes`` (0 or 1 by default)."""
    allowed = codes or (0, 1)
    assert run_cli("analyze", str(path)) in allowed
    assert run_cli("report", str(path), "-o", str(path.parent / "r.html")) in allowed


def runlog(*steps: dict[str, object]) -> str:
    lines = ['{"kind": "meta", "version": 1}']
    lines += [json.dumps({"kind": "step", **s}) for s in steps]
    return "\n".join(lines) + "\n"


def plain_steps(n: int = 12) -> list[dict[str, object]]:
    return [{"step": i, "loss": 2.0 - 0.01 * i, "grad_norm": 1.0, "tokens": 1000}
            for i in range(1, n + 1)]


# ---- CSV --------------------------------------------------------------------------------
def test_csv_with_a_stray_carriage_return(tmp_path: Path) -> None:
    text = "step,loss\r\n1,2.0\r\n2,\r3.0\r\n" + "".join(f"{i},2.0\r\n" for i in range(3, 12))
    path = write(tmp_path, "m.csv", text)
    both(path)
    log = read_log(path)
    assert [r.step for r in log.records] == [1, *range(3, 12)]
    assert any("malformed rows" in n and ": 3" in n for n in log.notes), log.notes


def test_csv_quoted_field_running_past_the_last_line(tmp_path: Path) -> None:
    """The csv module reads an open quote on to the end of the batch: one row for two
    lines, so the reader ran out of rows before the lines (once a StopIteration)."""
    path = write(tmp_path, "m.csv", "step,loss\n1,2.0\n2,\"3.0\n3,1.0\n")
    both(path)
    assert read_log(path).records[0].step == 1


def test_utf16_csv_with_bom_is_read(tmp_path: Path) -> None:
    text = "step,loss\n" + "".join(f"{i},{2.0 - i / 100}\n" for i in range(1, 15))
    path = write(tmp_path, "m.csv", ("\ufeff" + text).encode("utf-16"))
    both(path)
    log = read_log(path)
    assert len(log.records) == 14 and log.records[0].loss == pytest.approx(1.99)


def test_csv_step_of_5000_digits(tmp_path: Path) -> None:
    text = "step,loss\n" + "9" * 5000 + ",1.0\n" + "".join(f"{i},1.0\n" for i in range(1, 12))
    path = write(tmp_path, "m.csv", text)
    both(path)
    log = read_log(path)
    assert len(log.records) == 11
    assert any("step that is not an integer" in n for n in log.notes), log.notes


# ---- NUL blocks -------------------------------------------------------------------------
@pytest.mark.parametrize("name,body", [
    ("train.log", "\n".join(MEGATRON) + "\n"),
    ("m.csv", "step,loss\n" + "".join(f"{i},2.0\n" for i in range(1, 20))),
    ("run.jsonl", runlog(*plain_steps())),
])
def test_nul_block_at_the_start_is_skipped(tmp_path: Path, name: str, body: str) -> None:
    path = write(tmp_path, name, "\x00" * 4096 + body)
    both(path)
    assert len(read_log(path).records) >= 11


def test_file_of_only_nul_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, "train.log", b"\x00" * 8192)
    both(path, 2)


# ---- Megatron ---------------------------------------------------------------------------
@pytest.mark.parametrize("old,new", [
    ("number of nan iterations:   0", "number of nan iterations: inf"),
    ("number of skipped iterations:   0", "number of skipped iterations: nan"),
    ("number of skipped iterations:   0", "number of skipped iterations: -3"),
    ("global batch size:   256", "global batch size: 1e400"),
])
def test_megatron_counts_that_are_not_counts(tmp_path: Path, old: str, new: str) -> None:
    assert any(old in line for line in MEGATRON)
    path = write(tmp_path, "train.log", "\n".join(x.replace(old, new) for x in MEGATRON))
    both(path)
    log = read_log(path)
    assert len(log.records) == len(MEGATRON)
    assert any("were not numbers" in n for n in log.notes), log.notes


def test_megatron_iteration_of_5000_digits(tmp_path: Path) -> None:
    lines = list(MEGATRON)
    lines[3] = lines[3].replace("iteration       40/", f"iteration {'9' * 5000}/")
    path = write(tmp_path, "train.log", "\n".join(lines))
    both(path)
    assert len(read_log(path).records) == len(MEGATRON) - 1


# ---- trainer_state.json -----------------------------------------------------------------
def _state(tmp_path: Path, history: list[str], head: str = '"global_step": 12') -> Path:
    text = "{" + head + ', "log_history": [' + ", ".join(history) + "]}"
    return write(tmp_path, "out/trainer_state.json", text)


def _entries(n: int = 12) -> list[str]:
    return [json.dumps({"step": i, "loss": 2.0, "grad_norm": 1.0, "learning_rate": 1e-4})
            for i in range(1, n + 1)]


def test_trainer_state_step_of_10_to_the_30(tmp_path: Path) -> None:
    path = _state(tmp_path, [*_entries(), '{"step": 1' + "0" * 30 + ', "loss": 1.0}'],
                  head='"global_step": 1' + "0" * 30)
    both(path.parent)
    log = read_log(path)
    assert log.last_step == 12
    assert any("without an integer step" in n for n in log.notes), log.notes


@pytest.mark.parametrize("value", ["1" + "0" * 400, "9" * 5000, "{}", "[1, 2]", '"abc"', "true"])
def test_trainer_state_values_that_are_not_numbers(tmp_path: Path, value: str) -> None:
    history = _entries()
    history[5] = history[5].replace('"grad_norm": 1.0', f'"grad_norm": {value}')
    both(_state(tmp_path, history).parent)


def test_trainer_state_nested_100k_deep(tmp_path: Path) -> None:
    path = _state(tmp_path, [*_entries(), "[" * 100_000 + "]" * 100_000])
    line = run_cli("analyze", str(path))
    assert line == 2


# ---- JSON lines: sapper run log and tables ---------------------------------------------
HOSTILE_VALUES = ["1" + "0" * 400, "9" * 5000, "1e400", "{}", "[1, 2]", '"abc"', "true", "null"]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
@pytest.mark.parametrize("field", ["loss", "grad_norm", "tokens", "skipped", "lrs"])
def test_run_log_values_where_a_number_belongs(tmp_path: Path, field: str, value: str) -> None:
    lines = runlog(*plain_steps()).splitlines()
    lines[4] = lines[4][:-1] + f', "{field}": {value}' + "}"
    lines[5] = lines[5][:-1] + ', "extra": {"grad_norm_layers": ' + value + "}}"
    path = write(tmp_path, "run.jsonl", "\n".join(lines) + "\n")
    both(path)
    records = read_log(path).records
    assert len(records) == 12
    for rec in records:  # what reached the records is what the fields hold
        assert rec.loss is None or isinstance(rec.loss, float)
        assert rec.tokens is None or (type(rec.tokens) is int and rec.tokens < 2**63)
        assert isinstance(rec.extra.get("grad_norm_layers", {}), dict)


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_jsonl_table_values_where_a_number_belongs(tmp_path: Path, value: str) -> None:
    lines = [json.dumps({"step": i, "loss": 2.0, "tokens": 100}) for i in range(1, 13)]
    lines[3] = lines[3].replace('"loss": 2.0', f'"loss": {value}')
    lines[4] = lines[4].replace('"tokens": 100', f'"tokens": {value}')
    lines[5] = lines[5].replace('"step": 6', f'"step": {value}')
    both(write(tmp_path, "m.jsonl", "\n".join(lines) + "\n"))


@pytest.mark.parametrize("name,kind", [("run.jsonl", "sapper"), ("m.jsonl", "table")])
def test_json_nested_100k_deep(tmp_path: Path, name: str, kind: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    if kind == "sapper":
        lines = runlog(*plain_steps()).splitlines()
        lines.insert(3, '{"kind": "step", "step": 3, "x": ' + deep + "}")
    else:
        lines = [json.dumps({"step": i, "loss": 2.0}) for i in range(1, 13)]
        lines.insert(3, '{"step": 3, "loss": ' + deep + "}")
    path = write(tmp_path, name, "\n".join(lines) + "\n")
    both(path)
    assert len(read_log(path).records) == 12


def test_line_longer_than_the_limit_is_skipped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(log_limits, "MAX_LINE_CHARS", 500)
    lines = runlog(*plain_steps()).splitlines()
    lines.insert(4, '{"kind": "step", "step": 3, "pad": "' + "x" * 2000 + '"}')
    path = write(tmp_path, "run.jsonl", "\n".join(lines) + "\n")
    log = read_log(path)
    assert len(log.records) == 12
    assert any("1 line(s) longer than 500 characters" in n for n in log.notes), log.notes


# ---- not regular files ------------------------------------------------------------------
def _refused_fast(*args: str) -> None:
    handler = signal.getsignal(signal.SIGINT)
    begin = time.monotonic()
    assert run_cli(*args) == 2
    assert time.monotonic() - begin < FAST_S
    # A refused input leaves the process as it found it: Ctrl-C is still the caller's.
    assert signal.getsignal(signal.SIGINT) is handler


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("fmt", [None, "csv", "trainer_state", "tensorboard"])
@pytest.mark.parametrize("command", ["analyze", "report", "watch"])
def test_fifo_is_refused_at_once(tmp_path: Path, command: str, fmt: str | None) -> None:
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock() -> None:  # a safety net: a blocked open gets a writer and EOF
        if not done.wait(FAST_S):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    threading.Thread(target=unblock, daemon=True).start()
    args = [command, str(fifo), *(["--log-format", fmt] if fmt else [])]
    if command == "watch":
        args += ["--idle-timeout", "2", "--format", "plain"]
    try:
        _refused_fast(*args)
    finally:
        done.set()


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("command", ["analyze", "report", "watch"])
def test_dev_zero_is_refused_at_once(command: str) -> None:
    extra = ["--idle-timeout", "2", "--format", "plain"] if command == "watch" else []
    _refused_fast(command, "/dev/zero", *extra)


# ---- the report's data builder ---------------------------------------------------------
def test_columns_take_values_no_reader_should_hand_on() -> None:
    recs = [StepRecord(step=i) for i in range(4)]
    recs[0].loss, recs[1].loss, recs[2].loss = 10**400, "abc", {}  # type: ignore[assignment]
    recs[3].loss = 1.5
    cols = Columns(recs)
    values = cols.floats("loss")
    assert values[0] == np.inf and np.isnan(values[1]) and np.isnan(values[2])
    assert values[3] == 1.5 and cols.last("loss") == 1.5


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_in_a_tensorboard_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "events.out.tfevents.1.node")
    _refused_fast("analyze", str(run), "--log-format", "tensorboard")


def test_notes_on_one_log_are_bounded(tmp_path: Path) -> None:
    """A log that restarts on every other line gives a note per restart: a few are
    shown, the rest counted."""
    steps = [s for i in range(1, 400) for s in (i * 10, i * 10 - 5)]
    text = "step,loss\n" + "".join(f"{s},2.0\n" for s in steps)
    path = write(tmp_path, "m.csv", text)
    res = runner.invoke(app, ["analyze", str(path), "-f", "json"])
    notes = json.loads(res.stdout)["summary"]["logs"][0]["notes"]
    assert len(notes) <= 60 and "more notes on the log" in notes[-1]


def test_a_table_of_many_columns_keeps_a_bounded_number(tmp_path: Path, monkeypatch) -> None:
    from sapper.logs import table

    monkeypatch.setattr(table, "MAX_EXTRA_COLUMNS", 5)
    header = "step,loss," + ",".join(f"c{i}" for i in range(20))
    rows = [f"{s},2.0," + ",".join("1.0" for _ in range(20)) for s in range(1, 13)]
    log = read_log(write(tmp_path, "m.csv", "\n".join([header, *rows]) + "\n"))
    assert all(len(r.extra) == 5 for r in log.records)
    assert any("15 more columns" in n for n in log.notes), log.notes


def test_trainer_state_with_a_damaged_entry_keeps_the_others(tmp_path: Path) -> None:
    history = _entries(20)
    history[3] = history[3].replace('"loss": 2.0', '"loss": 2.0\x00,,')
    log = read_log(_state(tmp_path, history))
    assert [r.step for r in log.records] == [s for s in range(1, 21) if s != 4]
    assert any("1 damaged part(s) skipped" in n for n in log.notes), log.notes


def test_log_over_the_size_limit_is_refused_with_its_size(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    with path.open("wb") as fh:  # sparse: nothing actually written
        fh.write(("\n".join(MEGATRON) + "\n").encode())
        fh.truncate(log_limits.MAX_LOG_BYTES + (1 << 30))
    res = runner.invoke(app, ["analyze", str(path)])
    assert res.exit_code == 2
    assert "the file is 9.0 GiB, over the 8 GiB limit for a log" in " ".join(res.output.split())


def test_a_log_whose_steps_go_back_thousands_of_times_is_bounded(tmp_path: Path) -> None:
    """Steps that go back on every other line are not a thousand rollbacks: the attempts
    past MAX_ATTEMPTS are said to be not analyzed, and the report draws no more."""
    from sapper.logs.analysis import MAX_ATTEMPTS

    steps = [s for i in range(1, 2001) for s in (i * 10, i * 10 - 5)]
    path = write(tmp_path, "interleaved.csv", "step,loss\n" + "".join(f"{s},2.0\n" for s in steps))
    res = runner.invoke(app, ["analyze", str(path), "-f", "json"])
    assert res.exit_code in (0, 1), res.output
    log = json.loads(res.stdout)["summary"]["logs"][0]
    assert len(log["attempts"]) == MAX_ATTEMPTS
    assert any("not analyzed" in line for line in log["not_evaluated"])
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(path), "-o", str(out)])
    assert res.exit_code in (0, 1), res.output
    assert out.read_text().count("attempt ") < 20 * MAX_ATTEMPTS
