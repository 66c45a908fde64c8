"""Property tests: no log, however damaged or hostile, makes ``sapper analyze`` or
``sapper report`` crash (exit 3), hang, print a traceback or print without bound.

Each case takes a window of a real log (examples/logs: a Megatron-LM log, a sapper run
log, a W&B history CSV, a Hugging Face trainer_state.json; the public Megatron logs,
trainer_state.json files and console logs (HF Trainer, nanoGPT, torchtitan) in
tests/fixtures/logs when present; the W&B panel export and the
JSON-lines table are the same numbers in those layouts; TensorBoard events are written
from the run log's records and their bytes mutated), mutates nearly every line (numbers
swapped for NaN, 5000-digit integers, objects, strings; NUL blocks, stray ``\\r``,
terminal escapes, bidi overrides, rich markup; cut lines, repeated lines) and runs both
commands in-process (see :mod:`tests.logs.hostile` for the invariant). The example
counts give at least ``MIN_MUTATED`` mutated records or lines per format per run;
``derandomize=True`` with no database, so every run draws the same cases.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.logs.hostile import (
    EXITS,
    LOGS,
    MUTATED,
    analyze_and_report,
    fast_settings,
    mutate_line,
    mutate_lines,
    window,
)

#: Mutated records or lines per format that one run promises.
MIN_MUTATED = 10_000
#: Lines per case: long enough for the detectors' windows, short enough for speed.
LINES = 70
#: Cases per format: LINES × EXAMPLES > MIN_MUTATED with the header kept.
EXAMPLES = 150

#: Real public logs collected for the reader tests (see tests/fixtures/SOURCES.md), when
#: the checkout has them: more seeds for the Megatron and trainer_state cases.
FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"


def _megatron_seeds() -> list[list[str]]:
    files = [LOGS / "megatron-gpt345m-fp16.log", *sorted(FIXTURES.glob("**/*.log"))]
    seeds = []
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        iterations = [line for line in lines if "iteration" in line]
        if len(iterations) >= 5:
            # A short excerpt is repeated up to a window's length: the repeats are a run
            # restarted from a checkpoint, as odd a log as any.
            seeds.append(iterations * (LINES // len(iterations) + 2))
    return seeds


def _state_seeds() -> list[dict[str, object]]:
    files = [LOGS / "hf-llama-sft" / "trainer_state.json",
             *sorted(FIXTURES.glob("**/*trainer_state*.json"))]
    seeds = []
    for path in files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("log_history"), list):
            if len(doc["log_history"]) >= LINES:
                seeds.append(doc)
    return seeds


def _console_seeds(folder: str, bar: bool) -> list[list[str]]:
    """The console fixtures of one reader (tests/fixtures/logs/<folder>), each repeated
    up to a window's length; with ``bar``, tqdm's training bar drawn before each dict
    (carriage returns and the blanks that clear it) as a captured stderr shows it."""
    seeds = []
    for path in sorted((FIXTURES / folder).glob("*.txt")):
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if bar:
            total = 10 * len(lines)
            lines = [
                f"\r {100 * i // len(lines):3d}%|##        | {10 * i}/{total} [00:{i:02d}<00:59,"
                f"  1.02it/s]\r{' ' * 40}\r{line}"
                for i, line in enumerate(lines, 1)
            ]
        if lines:
            seeds.append(lines * (LINES // len(lines) + 2))
    return seeds


MEGATRON_SEEDS = _megatron_seeds()
HF_CONSOLE_SEEDS = _console_seeds("hf_console", bar=False) + _console_seeds("hf_console", bar=True)
KEYVALUE_SEEDS = [
    *_console_seeds("nanogpt", bar=False), *_console_seeds("torchtitan", bar=False),
    *_console_seeds("lightning", bar=False),
]
STATE_SEEDS = _state_seeds()
RUNLOG = (LOGS / "sapper-gpt2-healthy.jsonl").read_text().splitlines()
WANDB = (LOGS / "wandb-history-lr-stuck.csv").read_text().splitlines()


def _table_rows() -> list[dict[str, str]]:
    header = WANDB[0].split(",")
    return [dict(zip(header, row.split(","), strict=False)) for row in WANDB[1:]]


def _jsonl_table() -> list[str]:
    """The W&B history as JSON lines (``wandb.Api().run.history()`` written out)."""
    out = []
    for row in _table_rows():
        obj = {k: float(v) for k, v in row.items() if v}
        out.append(json.dumps(obj))
    return out


def _wandb_export() -> list[str]:
    """The loss and learning rate as a W&B panel export: ``Step``, then per run the
    metric and its ``__MIN``/``__MAX`` band (two runs, the second a copy)."""
    cols = ["train/loss", "train/learning_rate"]
    header = ["Step"] + [
        f"{run} - {c}{band}" for run in ("gpt-a", "gpt-b") for c in cols
        for band in ("", "__MIN", "__MAX")
    ]
    lines = [",".join(f'"{h}"' for h in header)]
    for row in _table_rows():
        cells = [row["train/global_step"]]
        for _ in range(2):
            for c in cols:
                cells += [row[c]] * 3
        lines.append(",".join(cells))
    return lines


JSONL_TABLE = _jsonl_table()
WANDB_EXPORT = _wandb_export()


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="sapper-hostile-logs-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _write(work: Path, name: str, text: str | bytes) -> Path:
    for old in work.iterdir():
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    path = work / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def _text_case(work: Path, rng: random.Random, fmt: str, name: str, lines: list[str],
               keep: int, json_like: bool, header: list[str] | None = None) -> None:
    body = window(rng, lines[len(header or []):], LINES)
    mutated = mutate_lines(rng, (header or []) + body, fmt, keep=keep, json_like=json_like)
    newline = rng.choice(("\n", "\n", "\r\n"))
    analyze_and_report(_write(work, name, newline.join(mutated) + newline), fmt)


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_megatron_logs(work: Path, rng: random.Random) -> None:
    lines = window(rng, rng.choice(MEGATRON_SEEDS), LINES + 1)
    _text_case(work, rng, "megatron", "train.log", lines, keep=1, json_like=False)


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_sapper_run_logs(work: Path, rng: random.Random) -> None:
    _text_case(work, rng, "sapper", "run.jsonl", RUNLOG, keep=1, json_like=True,
               header=RUNLOG[:1])


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_csv_tables(work: Path, rng: random.Random) -> None:
    _text_case(work, rng, "csv", "history.csv", WANDB, keep=1, json_like=False,
               header=WANDB[:1])


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_wandb_exports(work: Path, rng: random.Random) -> None:
    _text_case(work, rng, "wandb", "export.csv", WANDB_EXPORT, keep=1, json_like=False,
               header=WANDB_EXPORT[:1])


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_jsonl_tables(work: Path, rng: random.Random) -> None:
    _text_case(work, rng, "jsonl", "history.jsonl", JSONL_TABLE, keep=1, json_like=True)


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_trainer_states(work: Path, rng: random.Random) -> None:
    """Each ``log_history`` entry is one record, mutated as JSON text; the document is
    reassembled around them (often no longer valid JSON: the salvage path runs)."""
    state = rng.choice(STATE_SEEDS)
    entries = window(rng, state["log_history"], LINES)  # type: ignore[arg-type]
    texts = [json.dumps(e, indent=rng.choice((None, 2))) for e in entries]
    mutated = [mutate_line(rng, t, json_like=True) for t in texts]
    MUTATED["trainer_state"] += len(mutated)
    head = {k: v for k, v in state.items() if k != "log_history"}
    if rng.random() < 0.3:
        key = rng.choice(sorted(head))
        head[key] = json.loads(rng.choice(("1e30", "null", "[1, 2]", '"x"', "-1")))
    text = json.dumps(head)[:-1] + ', "log_history": [' + ",\n".join(mutated) + "]}"
    analyze_and_report(_write(work, "out/trainer_state.json", text).parent, "trainer_state")


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_hf_console_logs(work: Path, rng: random.Random) -> None:
    """The Trainer's printed dicts, with and without its progress bar around them."""
    lines = window(rng, rng.choice(HF_CONSOLE_SEEDS), LINES + 1)
    _text_case(work, rng, "hf_console", "train.txt", lines, keep=1, json_like=False)


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_keyvalue_logs(work: Path, rng: random.Random) -> None:
    """nanoGPT, torchtitan and Lightning console lines (prefixes, units, bars)."""
    lines = window(rng, rng.choice(KEYVALUE_SEEDS), LINES + 1)
    _text_case(work, rng, "keyvalue", "train.txt", lines, keep=1, json_like=False)


def _events(records: list[dict[str, object]], rng: random.Random) -> bytes:
    """TFRecord bytes of scalar events, as a SummaryWriter writes them: some with
    hostile tags (markup, escapes, bidi) or values (NaN, inf) or steps."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    buf = io.BytesIO()
    writer = RecordWriter(buf)
    writer.write(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2")
                 .SerializeToString())
    tags = {"loss": "train/loss", "grad_norm": "train/grad_norm", "lr": "train/learning_rate"}
    for rec in records:
        step = int(rec["step"])  # type: ignore[call-overload]
        if rng.random() < 0.05:
            step = rng.choice((-1, 0, 2**63 - 1, -(2**63)))
        for key, tag in tags.items():
            value = float(rec.get(key, 0.0))  # type: ignore[arg-type]
            if rng.random() < 0.1:
                value = rng.choice((float("nan"), float("inf"), -float("inf"), 3.4e38))
            if rng.random() < 0.05:
                tag = rng.choice(("[bold red]x[/]", "\x1b[2J", "loss\u202e", "\x00", ""))
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]
            )
            writer.write(event_pb2.Event(wall_time=1.7e9 + step % 10**6, step=step,
                                         summary=summary).SerializeToString())
    return buf.getvalue()


@fast_settings(EXAMPLES)
@given(rng=st.randoms(use_true_random=False))
def test_tensorboard_events(work: Path, rng: random.Random) -> None:
    """Real event bytes, then damage: bytes flipped (in lengths, checksums, protobuf
    fields), frames cut, garbage inserted, the file cut short."""
    records = [json.loads(line) for line in window(rng, RUNLOG[1:], LINES)]
    data = bytearray(_events(records, rng))
    events = len(records) * 3
    for _ in range(rng.randrange(1, 12)):
        kind = rng.randrange(4)
        pos = rng.randrange(len(data))
        if kind == 0:
            data[pos] = rng.randrange(256)
        elif kind == 1:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        elif kind == 2:
            del data[pos : pos + rng.randrange(1, 32)]
        else:
            data[pos:pos] = b"\x00" * 64
    if rng.random() < 0.2:
        del data[rng.randrange(len(data)) :]
    MUTATED["tensorboard"] += events
    path = _write(work, "run/events.out.tfevents.1700000000.node1", bytes(data))
    analyze_and_report(path.parent, "tensorboard", "--log-format", "tensorboard")


def test_zz_enough_mutated_lines() -> None:
    """The promise of the module docstring; skipped when only some tests ran (-k)."""
    formats = ("megatron", "sapper", "csv", "wandb", "jsonl", "trainer_state", "tensorboard",
               "hf_console", "keyvalue")
    if any(MUTATED[f] == 0 for f in formats):
        pytest.skip("only some of the property tests ran")
    assert all(MUTATED[f] >= MIN_MUTATED for f in formats), dict(MUTATED)
    # Damage that every reader refused would test only the refusal: a good share of
    # the cases must get past it and be analyzed (a third: an event file damaged in its
    # first records has no steps, and TFRecord readers cannot resynchronize).
    for fmt in formats:
        read = EXITS[fmt][0] + EXITS[fmt][1]
        assert 3 * read >= sum(EXITS[fmt].values()), (fmt, dict(EXITS[fmt]))
