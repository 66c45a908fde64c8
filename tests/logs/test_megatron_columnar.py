"""The columnar Megatron reader (``sapper.logs.columnar.megatron``) against the streaming
one (``MegatronParser`` through ``read_log``): the same records, notes, meta and
attempts, and the same analysis, on generated logs with planted events (a loss spike, a
NaN, a loss-scale collapse, a restart, validation and memory lines, the line forms the
forks print), on every Megatron log in the repository, at any read size, and on
damaged and hostile logs. Correctness only: speed is benchmarks/analyze_speed.py's."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.logs.hostile import mutate_lines

from sapper.logs import LogData, read_log
from sapper.logs import limits as log_limits
from sapper.logs import source as log_source
from sapper.logs.analysis import analyze_log
from sapper.logs.columnar import ColumnarLog, read_columnar
from sapper.logs.columnar import megatron as columnar_megatron
from sapper.logs.columnar.frame import READ_EXTRA_PREFIXES, READ_EXTRAS
from sapper.logs.columnar.megatron import COLUMN_EXTRAS, column_extra, read_megatron_columnar
from sapper.logs.columnar.twins import engine
from sapper.pipeline.logs import analyses_json, analyze_logs, load_logs
from sapper.runtime.detectors import default_detectors

ROOT = Path(__file__).resolve().parents[2]
MEGATRON_LOGS = sorted(
    [
        ROOT / "examples" / "logs" / "megatron-gpt345m-fp16.log",
        *(ROOT / "tests" / "fixtures" / "logs").glob("megatron-*/*.log"),
        *(ROOT / "tests" / "fixtures" / "logs" / "bigscience").glob("*.log"),
    ]
)

HEADER = """using world size: 64, data-parallel size: 8, tensor-model-parallel size: 4
------------------------ arguments ------------------------
  fp16 .................................... True
  log_interval ............................ 1
  train_iters ............................. 200000
-------------------- end of arguments ---------------------
> building GPT2BPETokenizer tokenizer ...
[before the start of training step] datetime: 2024-05-14 10:02:11
"""


def megatron_log(
    seed: int,
    iterations: int = 3000,
    *,
    spike: int = 700,
    nan: int = 1200,
    quiet_nan: int = 1300,
    collapse: int = 1800,
    restart: int = 2200,
    resume: int = 1950,
) -> str:
    """A Megatron-LM log of ``iterations`` iteration lines with planted events: a loss
    spike at iteration ``spike``, a NaN interval (the loss left out, the NaN counter 1)
    at ``nan``, a line without a loss whose counters read 0 at ``quiet_nan``, a run of
    overflows that halves the loss scale from ``collapse`` on, and a restart after
    iteration ``restart`` that resumes from ``resume``. Around them: validation and
    test-set lines, the memory report, timers, warnings, checkpoint lines, all-skipped
    intervals, and (by seed) the forms the forks print: launcher prefixes, time stamps,
    times in seconds, MoE and MTP losses, samples per second, CRLF line ends, colon-less
    early lines, a value that is not a number."""
    rng = random.Random(seed)
    prefix = rng.choice(["", "[default0]:", "0: "])
    stamped = rng.random() < 0.7
    seconds = rng.random() < 0.3
    moe = rng.random() < 0.3
    end = "\r\n" if rng.random() < 0.15 else "\n"
    out = [HEADER.replace("\n", end)]
    scale = 65536.0
    it = 0
    done = 0
    restarted = False
    clock = 1715680931
    while done < iterations:
        it += 1
        done += 1
        if not restarted and it == restart + 1:
            restarted = True
            it = resume
            out.append(f"WARNING: job restarted, loading checkpoint at iteration {it - 1}{end}")
            out.append(f"  successfully loaded checkpoint from /ckpt at iteration {it - 1}{end}")
        clock += rng.randint(1, 3)
        loss = 2.0 + 6.0 * math.exp(-it / 400) + rng.gauss(0, 0.01)
        grad = 0.4 + math.exp(-it / 500) + abs(rng.gauss(0, 0.02))
        if it == spike:
            loss, grad = loss * 3, grad * 30
        skipped = nan_count = 0
        if collapse <= it < collapse + 12:
            skipped = 1
            scale = max(1.0, scale / 2)
        elif rng.random() < 0.003:
            skipped = 1
            scale /= 2
        elif it % 200 == 0 and scale < 65536.0:
            scale *= 2
        if it == nan:
            nan_count = 1
        stamp = ""
        if stamped:
            day, rest = divmod(clock, 86400)
            stamp = f" [2024-05-{14 + day % 10:02d} {rest // 3600:02d}:{rest // 60 % 60:02d}:" \
                    f"{rest % 60:02d}]"
        parts = [f"{prefix}{stamp} iteration {it:8d}/  200000 | consumed samples: {it * 256:12d}"]
        if seconds:
            parts.append(f"elapsed time per iteration (s): {0.85 + rng.random() * 0.02:.4f}")
        else:
            parts.append(f"elapsed time per iteration (ms): {850 + rng.random() * 20:.1f}")
        parts.append(f"learning rate: {1.5e-4 * min(1.0, it / 300):.6E}")
        parts.append("global batch size:   256")
        has_loss = not skipped and it not in (nan, quiet_nan)
        if has_loss:
            parts.append(f"lm loss: {loss:.6E}")
            if moe:
                parts.append(f"load_balancing_loss: {0.01 + rng.random() * 0.001:.6E}")
        parts.append(f"loss scale: {scale:.1f}")
        if not skipped:
            parts.append(f"grad norm: {grad:.3f}")
        parts.append(f"num zeros: {rng.randint(0, 40)}.0")
        parts.append(f"number of skipped iterations: {skipped:3d}")
        parts.append(f"number of nan iterations: {nan_count:3d}")
        if seconds:
            parts.append(f"samples per second: {300 + rng.random():.3f}")
            parts.append(f"TFLOPs: {140 + rng.random():.2f}")
        line = " | ".join(parts) + " |"
        odd = rng.random()
        if odd < 0.004:  # a value that is not a number
            line = line.replace("grad norm: ", "grad norm: n/a ", 1)
        elif odd < 0.008:  # the early colon-less form
            line = line.replace("lm loss: ", "lm loss ").replace("loss scale: ", "loss scale ")
        elif odd < 0.010:  # a key twice
            line += f" lm loss: {loss:.6E} |"
        out.append(line + end)
        if it == 1:
            out.append(
                f"[Rank 0] (after 1 iterations) memory (MB) | allocated: 6518.5 | max allocated:"
                f" {21587.7 + rng.random():.1f} | reserved: 23412.0 | max reserved: 23412.0{end}"
            )
        if it % 50 == 0:
            out.append(f"time (ms) | forward-compute: 92.25 | backward-compute: 239.82{end}")
        if it % 250 == 0:
            value = loss + 0.05
            out.append("-" * 60 + end)
            out.append(
                f" validation loss at iteration {it} on validation set | lm loss value: "
                f"{value:.6E} | lm loss PPL: {math.exp(value):.6E} |{end}"
            )
            out.append(
                f" validation loss at iteration {it} on test set | lm loss value: 9.9E+00 |{end}"
            )
            out.append("-" * 60 + end)
            out.append(f"saving checkpoint at iteration {it:8d} to /ckpt{end}")
        if rng.random() < 0.003:
            out.append(f"UserWarning: None of the inputs have requires_grad=True{end}")
    return "".join(out)


def _dump(rec: Any) -> str:
    """A record as typed JSON: 1 and 1.0, True and 1 differ."""
    return json.dumps(rec.to_json(), sort_keys=True)


def _attempts(log: LogData) -> list[tuple[int, int, int, int, int]]:
    return [(a.number, a.start, a.stop, a.first_step, a.last_step) for a in log.attempts]


def assert_same_log(path: Path, *, plain: bool = True) -> ColumnarLog | None:
    """The columnar reader gives what the streaming reader gives (or leaves the log to
    it); returns the columnar log. ``plain``: every row is in the columns (no row needs
    a whole record)."""
    expected = read_log(path, fmt="megatron")
    got = read_megatron_columnar(path, min_bytes=0)
    if got is None:
        return None
    assert got.format == expected.format
    assert len(got.records) == len(expected.records)
    assert [_dump(r) for r in got.records] == [_dump(r) for r in expected.records]
    assert got.notes == expected.notes
    assert got.meta == expected.meta
    assert _attempts(got) == _attempts(expected)
    assert got.columns is not None
    assert not (plain and got.columns.full)
    return got


def _write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


@pytest.mark.parametrize("path", MEGATRON_LOGS, ids=lambda p: p.name)
def test_every_megatron_log_reads_the_same(path: Path) -> None:
    got = assert_same_log(path)
    assert got is not None


@pytest.mark.parametrize("seed", range(6))
def test_generated_log_reads_the_same(tmp_path: Path, seed: int) -> None:
    path = _write(tmp_path, megatron_log(seed))
    log = assert_same_log(path)
    assert log is not None
    assert len(log.attempts) == 2  # the restart
    by_step = {}
    for rec in log.records[: log.attempts[0].stop]:
        by_step[rec.step] = rec
    assert math.isnan(by_step[1200].loss)  # the NaN interval
    assert math.isnan(by_step[1300].loss)  # no loss, counters 0: a NaN too
    assert by_step[1800].skipped is True and by_step[1800].loss is None  # all skipped
    assert by_step[500].eval_loss is not None  # the validation line, not the test set's


@pytest.mark.parametrize("chunk", [4096, 65536, 1 << 20])
def test_any_read_size_gives_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Each read's complete lines are one batch for both readers: a validation line that
    comes after its step was emitted, a line torn by a read, are judged alike."""
    monkeypatch.setattr(log_source, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(columnar_megatron, "CHUNK_BYTES", chunk)
    path = _write(tmp_path, megatron_log(3, 2500))
    assert assert_same_log(path) is not None


def _findings(analyses: list[Any]) -> str:
    return json.dumps(analyses_json(analyses, []), sort_keys=True, default=str)


@pytest.mark.parametrize("seed", [0, 4])
def test_analysis_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Findings, notes and attempts of ``sapper analyze`` (and what diagnose reads) are
    the same when the log is read into columns and the detectors run over them, the
    resumed attempt's history included."""
    path = _write(tmp_path, megatron_log(seed))
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)  # columns for every attempt
    streaming, _ = load_logs([path], None, {}, columnar=False)
    monkeypatch.setattr(columnar_megatron, "MIN_BYTES", 0)
    columnar, _ = load_logs([path], None, {}, columnar=True)
    assert isinstance(columnar[0], ColumnarLog)
    expected = analyze_logs(streaming, None, [], [])
    got = analyze_logs(columnar, None, [], [])
    assert _findings(got) == _findings(expected)
    codes = {f.code for f in got[0].findings}
    assert {"R001", "R002", "R030", "R031"} <= codes, codes
    assert len(got[0].attempts) == 2


def test_analysis_with_whole_records_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows kept as whole records (an extra a detector might read) across a restart: the
    resumed attempt's history is taken from the columns with them."""
    text = megatron_log(5).replace(
        "num zeros", "nonfinite loss: 0.0 | num zeros", 40
    )
    path = _write(tmp_path, text)
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)
    monkeypatch.setattr(engine, "EXTRAS_SHARE", 1.0)
    streaming, _ = load_logs([path], None, {}, columnar=False)
    monkeypatch.setattr(columnar_megatron, "MIN_BYTES", 0)
    columnar, _ = load_logs([path], None, {}, columnar=True)
    assert isinstance(columnar[0], ColumnarLog) and columnar[0].columns is not None
    assert 0 < len(columnar[0].columns.full) < len(columnar[0].records)
    assert _findings(analyze_logs(columnar, None, [], [])) == _findings(
        analyze_logs(streaming, None, [], [])
    )


def test_analysis_of_every_example_through_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)
    for path in MEGATRON_LOGS:
        log = read_megatron_columnar(path, min_bytes=0)
        assert log is not None
        streaming = read_log(path, fmt="megatron")
        expected = analyze_log(streaming, default_detectors(framework="megatron"))
        got = analyze_log(log, default_detectors(framework="megatron"))
        key = [(f.code, f.step, f.message, sorted(f.data.items())) for f in expected.findings]
        assert [(f.code, f.step, f.message, sorted(f.data.items())) for f in got.findings] == key
        assert got.unevaluated == expected.unevaluated
        assert [a.to_json() for a in got.attempts] == [a.to_json() for a in expected.attempts]


def test_read_columnar_takes_megatron_logs_past_the_size(tmp_path: Path) -> None:
    path = _write(tmp_path, megatron_log(1, 400))
    assert read_columnar(path, "megatron") is None  # small: the streaming reader's
    assert isinstance(read_columnar(path, "megatron", min_bytes=0), ColumnarLog)


@given(seed=st.integers(0, 2**32 - 1))
@stable_settings(60, shrink=False)
def test_damaged_logs_read_the_same(tmp_path_factory: pytest.TempPathFactory, seed: int) -> None:
    """Lines mutated as tests/logs/hostile.py mutates them (hostile values and
    characters, lines cut short, NUL blocks, huge steps, repeated lines)."""
    rng = random.Random(seed)
    lines = megatron_log(seed % 5, 600, spike=100, nan=200, quiet_nan=250, collapse=300,
                         restart=450, resume=380).split("\n")
    share = rng.choice([0.02, 0.2, 1.0])
    head, body = lines[:8], lines[8:]
    mutated = [
        mutate_lines(rng, [line], "megatron", keep=0)[0] if rng.random() < share else line
        for line in body
    ]
    path = _write(tmp_path_factory.mktemp("damaged"), "\n".join(head + mutated))
    assert_same_log(path, plain=False)


def test_hostile_blocks_read_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line over the length limit (skipped and noted, kept out of memory), NUL blocks
    inside and between lines, a file that ends in a torn line."""
    monkeypatch.setattr(log_limits, "MAX_LINE_CHARS", 5000)
    monkeypatch.setattr(log_source, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(columnar_megatron, "CHUNK_BYTES", 4096)
    lines = megatron_log(2, 800).split("\n")
    lines.insert(300, "x" * 20_000)  # spans several reads
    lines.insert(400, lines[400][:50] + "\x00" * 9000 + lines[400][50:])
    lines.insert(500, "\x00" * 20_000)
    lines[600] = "y" * 4000 + lines[600]  # long, but under the limit
    text = "\n".join(lines)
    path = _write(tmp_path, text[: len(text) - 37])
    log = assert_same_log(path)
    assert log is not None
    assert any("1 line(s) longer than 5,000 characters" in n for n in log.notes), log.notes


def test_one_line_repeated_reads_the_same(tmp_path: Path) -> None:
    """The same iteration line over and over: every line a restart of its step."""
    line = megatron_log(0, 3).strip().split("\n")[-1]
    path = _write(tmp_path, (line + "\n") * 20_000)
    log = assert_same_log(path)
    assert log is not None and len(log.attempts) == 20_000


def test_a_file_without_iteration_lines_is_left_to_the_streaming_reader(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER * 50)
    assert read_megatron_columnar(path, min_bytes=0) is None


def test_utf16_is_left_to_the_streaming_reader(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(megatron_log(0, 50).encode("utf-16"))
    assert read_megatron_columnar(path, min_bytes=0) is None
    assert len(read_log(path, fmt="megatron").records) == 50


_IN_EXTRA = r"""["']([^"']+)["']\s+(?:not\s+)?in\s+(?:record\.|r\.|rec\.)?extra\b"""


def _extras_read() -> set[str]:
    """Every ``record.extra`` key the detectors, their twins and the diagnosis look up
    by name (``extra.get("k")``, ``extra["k"]``, ``"k" in extra``, setup's ``_count``)."""
    src = ROOT / "src" / "sapper"
    files = [
        *(src / "runtime" / "detectors").glob("*.py"),
        *(src / "logs" / "columnar" / "twins").glob("*.py"),
        *(src / "diagnose").glob("*.py"),
    ]
    read: set[str] = set()
    for file in files:
        text = file.read_text(encoding="utf-8")
        read |= set(re.findall(r"""extra(?:\.get\(|\[)\s*["']([^"']+)["']""", text))
        read |= set(re.findall(_IN_EXTRA, text))
        read |= set(re.findall(r"""_count\(extra,\s*["']([^"']+)["']""", text))
    for name in ("_FORWARD", "_STEP"):  # setup.py's key tuples
        found = re.search(rf"^{name} = \(([^)]*)\)", (src / "runtime" / "detectors" /
                          "setup.py").read_text(encoding="utf-8"), re.M)
        assert found, name
        read |= set(re.findall(r"""["']([^"']+)["']""", found.group(1)))
    assert len(read) > 20, "the scan found few keys: its patterns are out of date"
    return read


def test_extras_read_are_listed() -> None:
    """The extras the columns keep out of the detectors' records are those no detector
    reads: every key read is listed in ``READ_EXTRAS`` (or has a listed prefix)."""
    unlisted = sorted(
        k for k in _extras_read() if k not in READ_EXTRAS and not k.startswith(READ_EXTRA_PREFIXES)
    )
    assert not unlisted, f"add to sapper.logs.columnar.frame.READ_EXTRAS: {unlisted}"


def test_megatron_column_extras_are_none_a_detector_reads() -> None:
    for name in (*COLUMN_EXTRAS, "mtp_1_loss", "load_balancing_loss", "z_loss"):
        assert column_extra(name)
        assert name not in READ_EXTRAS and not name.startswith(READ_EXTRA_PREFIXES), name
    for name in _extras_read():
        assert not column_extra(name), name
    for prefix in ("nonfinite_", "huge_", "position_", "opt_"):
        assert not column_extra(prefix + "x_loss")


def test_a_loss_a_detector_might_read_is_kept_on_a_whole_record(tmp_path: Path) -> None:
    """An extra the columns do not keep (a name like what a detector reads) makes its
    row a whole record, the same as the streaming reader's."""
    text = megatron_log(0, 300).replace(
        "number of skipped iterations", "nonfinite loss: 1.0 | number of skipped iterations"
    )
    path = _write(tmp_path, text)
    expected = read_log(path, fmt="megatron")
    got = read_megatron_columnar(path, min_bytes=0)
    assert got is not None and got.columns is not None
    assert len(got.columns.full) == len(got.records)
    assert [_dump(r) for r in got.records] == [_dump(r) for r in expected.records]
