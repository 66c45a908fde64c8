"""The vectorised detectors (``sapper.logs.columnar.twins``) against the streaming ones:
identical findings on random streams (NaNs, gaps, missing fields, spikes, plateaus,
odd options) and on every example log. Also the columnar run-log reader against the
streaming reader, record for record."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapper.errors import InputError
from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.logs.columnar import columns_from_records, read_columnar, runlog
from sapper.logs.columnar.twins import engine
from sapper.logs.columnar.twins.engine import TWINS, run_columns, twin_for
from sapper.logs.detect import detect_format
from sapper.runtime.detector import FRAMEWORKS, DetectorSet
from sapper.runtime.detectors import default_detectors
from sapper.runtime.records import StepRecord
from sapper.runtime.runlog import RunLogWriter

ROOT = Path(__file__).resolve().parents[2]
LOG_DIRS = [ROOT / "examples" / "logs", ROOT / "tests" / "fixtures" / "logs"]


def _key(f: Any) -> str:
    return repr(
        (f.step, f.code, f.severity, f.message, f.value, f.threshold, sorted(f.data.items()))
    )


def _same(
    detectors: list[Any], records: list[StepRecord], *, keep_source: bool, warm: int = 0
) -> None:
    """The streaming run (the first ``warm`` records only as context, as a resumed
    attempt sees its history) against the columnar one."""
    dset = DetectorSet([copy.deepcopy(d) for d in detectors])
    for rec in records[:warm]:
        dset.update(rec)
    expected = dset.run(records[warm:])
    cols = columns_from_records(records)
    assert cols is not None
    if not keep_source:  # as the columnar reader builds them: extras only on their rows
        cols.source = None
    got = run_columns(
        cols, [copy.deepcopy(d) for d in detectors], proven_only=False, warm=warm, strict=True
    )
    assert got.failed == dset.failed
    assert sorted(map(_key, got.found)) == sorted(map(_key, expected))
    assert got.unevaluated == dset.unevaluated()


def _curve(rng: np.random.Generator, n: int, base: float, noise: float) -> np.ndarray:
    kind = rng.integers(0, 4)
    t = np.arange(n)
    if kind == 0:  # a falling training curve
        y = base * (1 + 3 * np.exp(-t / max(1, n / 5)))
    elif kind == 1:  # flat
        y = np.full(n, base)
    elif kind == 2:  # rising
        y = base * (1 + t / max(1, n))
    else:  # oscillating
        y = base * (1 + 0.5 * (-1.0) ** t)
    y = y + rng.normal(0, noise * base, n)
    spikes = rng.random(n) < rng.choice([0.0, 0.01, 0.05])
    y[spikes] *= rng.choice([3.0, 10.0, 100.0])
    return y


def _lr_curve(rng: np.random.Generator, n: int) -> np.ndarray:
    """Flat with odd values, or a warmup (short or long) then a cosine that decays to 0,
    stays there or comes back up (a schedule stepped past its end)."""
    if rng.random() < 0.4:
        return np.where(rng.random(n) < 0.97, 1e-4, rng.choice([1e-4, 3e-4, 0.0]))
    t = np.arange(n, dtype=float)
    warm = max(1, int(n * rng.choice([0.0001, 0.05, 0.3])))
    total = max(warm + 1, int(n * rng.choice([0.5, 1.0])))
    frac = np.clip((t - warm) / (total - warm), 0.0, 1.0 if rng.random() < 0.5 else 2.0)
    lr = 3e-4 * np.where(t < warm, (t + 1) / warm, 0.5 * (1 + np.cos(np.pi * frac)))
    return np.round(lr, 8)


def _stream(seed: int, n: int) -> list[StepRecord]:
    rng = np.random.default_rng(seed)
    gaps = rng.choice([1, 1, 1, 2, 10, 500], size=n)
    steps = np.cumsum(gaps) + int(rng.integers(0, 3))
    fields: dict[str, np.ndarray] = {
        "loss": _curve(rng, n, float(rng.choice([0.01, 2.0, 10.0])), 0.02),
        "grad_norm": _curve(rng, n, float(rng.choice([1e-4, 0.5, 1.0, 5.0])), 0.1),
        "clip_threshold": np.full(n, float(rng.choice([0.0, 1.0, 2.0]))),
        "lr": _lr_curve(rng, n),
        "memory_allocated_gib": 10 + np.cumsum(rng.random(n) * rng.choice([0.0, 0.01, 0.1])),
        "memory_peak_gib": 20 + rng.random(n) * rng.choice([1.0, 60.0]),
        "memory_limit_gib": np.full(n, 80.0),
        "rss_gib": 5 + rng.random(n),
        "step_time_s": np.abs(_curve(rng, n, 0.2, 0.05)),
        "data_time_s": np.abs(_curve(rng, n, float(rng.choice([0.001, 0.1])), 0.1)),
        "tokens": rng.choice([1024, 4096, 4500, 16384], size=max(1, n // 20 + 1)).repeat(20)[:n],
        "tokens_per_s": np.abs(_curve(rng, n, 3e5, 0.05)),
        "samples_per_s": np.abs(_curve(rng, n, 30.0, 0.05)),
        "eval_loss": _curve(rng, n, 2.0, 0.05),
        "loss_scale": 2.0 ** rng.integers(0, 16, n),
    }
    present = {name: rng.random() for name in fields}
    present["eval_loss"] = rng.choice([0.0, 0.02, 0.2])
    present["samples_per_s"] = rng.choice([0.0, 0.5])
    present["loss_scale"] = rng.choice([0.0, 1.0])
    bad = rng.choice([0.0, 0.01, 0.1])  # share of non-finite values
    layers = rng.choice([0.0, 0.02, 0.5])  # share of records with per-layer norms
    waits = rng.choice([0.0, 0.3, 1.0])  # share of records with a CPU wait (live monitor)
    records = []
    for i in range(n):
        rec = StepRecord(step=int(steps[i]))
        for name, values in fields.items():
            if rng.random() < present[name] * (0.7 if rng.random() < 0.3 else 1.0):
                value = float(values[i])
                if rng.random() < bad:
                    value = float(rng.choice([math.nan, math.inf, -math.inf, 0.0, -1.0]))
                if name == "tokens":
                    if not math.isfinite(value):
                        continue
                    value = int(value)
                setattr(rec, name, value)
        if rng.random() < 0.05:
            rec.skipped = bool(rng.random() < 0.5)
        if rng.random() < layers:
            rec.extra["grad_norm_layers"] = {
                "a": float(rng.random() * rng.choice([1.0, 1.0, 1.0, 1000.0])),
                "b": 2.0,
                "c": float(rng.random()),
            }
        if rng.random() < waits:
            t = rec.step_time_s if rec.step_time_s is not None else 0.2
            rec.extra["cpu_wait_s"] = float(
                rng.choice([0.0, 0.5 * t, 0.9 * t, t, 2 * t, -0.1, math.nan])
            )
        if rng.random() < 0.05:
            rec.extra["grad_accum"] = 4
            rec.extra["loss_weight"] = float(rng.choice([0.25, 1.0]))
            rec.extra["micro_tokens"] = [int(v) for v in rng.integers(1, 100, 4)]
        records.append(rec)
    return records


@st.composite
def options(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    """Detector options from the defaults to small windows that short streams fill."""
    small = draw(st.booleans())
    if not small:
        return {}
    return {
        "loss": {
            "window": draw(st.integers(1, 60)),
            "min_history": draw(st.integers(1, 20)),
            "spike_k": draw(st.sampled_from([0.5, 3.0, 6.0])),
            "spike_rel": draw(st.sampled_from([0.0, 0.05, 0.1, 1.5])),
            "warmup_steps": draw(st.sampled_from([0, 50])),
            "flat_steps": draw(st.integers(0, 120)),
            "flat_horizon": draw(st.integers(0, 400)),
            "osc_window": draw(st.integers(2, 40)),
            "osc_flips": draw(st.sampled_from([0.0, 0.5, 0.7])),
            "osc_amplitude": draw(st.sampled_from([0.0, 0.05, 0.25])),
            "cold_ratio": draw(st.sampled_from([1.2, 1.5, 3.0])),
            "cold_min_jump": draw(st.sampled_from([0.0, 0.5])),
            "osc_min_swing": draw(st.sampled_from([0.0, 0.05])),
        },
        "gradnorm": {
            "clip_threshold": draw(st.sampled_from([None, 0.0, 0.5, 1.0])),
            "warmup_steps": draw(st.sampled_from([0, 30])),
            "skip_first": draw(st.integers(0, 20)),
            "saturate_window": draw(st.integers(1, 30)),
            "saturate_share": draw(st.sampled_from([0.0, 0.5, 0.8])),
            "saturate_ratio": draw(st.sampled_from([0.0, 1.0, 2.0])),
            "tiny": draw(st.sampled_from([1e-3, 0.5, 2.0])),
            "tiny_window": draw(st.integers(1, 30)),
            "surge_window": draw(st.integers(1, 60)),
            "surge_min_history": draw(st.integers(1, 15)),
            "surge_k": draw(st.sampled_from([0.5, 6.0])),
            "surge_ratio": draw(st.sampled_from([1.0, 1.5, 3.0])),
            "cold_ratio": draw(st.sampled_from([3.0, 10.0])),
            "cold_ratio_start": draw(st.sampled_from([5.0, 100.0])),
            "run_start_steps": draw(st.sampled_from([0, 100, 10_000])),
            "layer_window": draw(st.integers(1, 30)),
            "layer_min_history": draw(st.integers(0, 8)),
            "layer_ratio": draw(st.sampled_from([1.5, 10.0])),
        },
        "memory": {
            "limit_gib": draw(st.sampled_from([None, 0.0, 30.0, 80.0])),
            "near": draw(st.sampled_from([0.5, 0.92])),
            "warmup_steps": draw(st.sampled_from([0, 20])),
            "window": draw(st.integers(2, 70)),
            "growth_min_points": draw(st.integers(2, 10)),
            "growth_min_steps": draw(st.sampled_from([0, 20])),
            "growth_min_gib": draw(st.sampled_from([0.0, 0.1])),
        },
        "lr": {
            "warmup_min_share": draw(st.sampled_from([0.0002, 0.5])),
            "overrun_floor": draw(st.sampled_from([0.02, 0.9])),
            "overrun_rise": draw(st.sampled_from([0.0, 0.05])),
            "zero_records": draw(st.integers(1, 6)),
            "zero_share": draw(st.sampled_from([0.0, 0.02])),
            "total_steps": draw(st.sampled_from([None, 100, 100_000])),
        },
        "accumulation": {
            "patience": draw(st.integers(0, 4)),
            "batch_change": draw(st.sampled_from([1.05, 1.5, 3.0])),
            "lr_kept": draw(st.sampled_from([0.0, 0.15, 10.0])),
        },
        "throughput": {
            "expected_tokens_per_s": draw(st.sampled_from([None, 1e5, 5e5])),
            "expected_samples_per_s": draw(st.sampled_from([None, 50.0])),
            "below": draw(st.sampled_from([0.5, 0.7, 1.0])),
            "warmup_steps": draw(st.sampled_from([0, 5, 100])),
            "window": draw(st.integers(1, 60)),
            "min_records": draw(st.integers(1, 12)),
            "degrade": draw(st.sampled_from([0.7, 1.0])),
            "degrade_window": draw(st.integers(1, 60)),
            "data_share": draw(st.sampled_from([0.0, 0.25, 0.5])),
            "outlier_k": draw(st.sampled_from([1.0, 10.0])),
            "outlier_ratio": draw(st.sampled_from([1.0, 3.0])),
            "outlier_cooldown": draw(st.sampled_from([0, 50])),
            "smooth": draw(st.integers(1, 12)),
            "sustain_records": draw(st.integers(1, 60)),
            "sustain_s": draw(st.sampled_from([0.0, 1.0, 600.0])),
            "sustain_share": draw(st.sampled_from([0.0, 0.25])),
            "onset_records": draw(st.integers(1, 5)),
            "loader_must_keep_up": draw(st.booleans()),
            "run_start_steps": draw(st.sampled_from([0, 100, 10_000])),
        },
    }


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 600),
    opts=options(),
    keep_source=st.booleans(),
    warm=st.sampled_from([0, 0, 1, 30, 200]),
    framework=st.sampled_from(FRAMEWORKS),
)
def test_random_streams(
    seed: int, n: int, opts: dict[str, Any], keep_source: bool, warm: int, framework: str
) -> None:
    records = _stream(seed, n)
    detectors = default_detectors(**opts)
    for det in detectors:  # as sapper analyze tells them the log's framework
        det.set_framework(framework)
    # an attempt has at least one record of its own after its history
    _same(detectors, records, keep_source=keep_source, warm=min(warm, max(0, n - 1)))


def test_every_twin_accepts_the_default_detectors() -> None:
    dets = {type(d): d for d in default_detectors()}
    for cls in TWINS:
        assert twin_for(dets[cls], proven_only=False) is not None, cls.__name__


def test_twins_are_proven_against_the_current_detectors() -> None:
    """A detector changed since its twin was proven: the twin is not used (analyze
    stays right, only slower) until this test and the equivalence tests pass again."""
    stale = [
        cls.__name__ for cls, twin in TWINS.items() if twin_for(cls(), proven_only=True) is None
    ]
    assert not stale, f"re-prove and update engine.FINGERPRINTS for {stale}"


EXAMPLES: list[Path] = []


def _readable(path: Path) -> bool:
    try:
        read_log(path)
    except InputError:
        return False
    return True


def _example_logs() -> list[Path]:
    """Every log under the example and fixture folders (an HF output folder whole)."""
    out: list[Path] = []

    def walk(folder: Path) -> None:
        for p in sorted(folder.iterdir()):
            if p.is_dir() and not (p / "trainer_state.json").is_file():
                walk(p)
            elif p.suffix not in (".py", ".md") and _readable(p):
                out.append(p)

    for folder in LOG_DIRS:
        if folder.is_dir():
            walk(folder)
    return out


EXAMPLES = _example_logs()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_logs(path: Path) -> None:
    log = read_log(path)
    _same(default_detectors(), list(log.records), keep_source=True)
    _same(default_detectors(), list(log.records), keep_source=False)


def _nan_equal(fields: dict[str, Any]) -> dict[str, Any]:
    """A record's fields with each NaN spelled "nan": two NaN objects compare unequal."""
    return {k: "nan" if isinstance(v, float) and v != v else v for k, v in fields.items()}


@pytest.mark.parametrize("torn", [False, True])
@pytest.mark.parametrize("block", [None, 3000])
def test_columnar_reader_matches_streaming_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: bool, block: int | None
) -> None:
    """Plain lines, extras, non-finite strings, meta and finding lines, blank and bad
    lines, a torn last line, in one block or many: the same records, notes, meta and
    findings as the streaming reader."""
    monkeypatch.setattr(runlog, "SPECIAL_SHARE", 1.0)  # the columnar path, whatever the mix
    if block is not None:
        monkeypatch.setattr(runlog, "BLOCK_BYTES", block)
    path = tmp_path / "run.jsonl"
    records = _stream(7, 400)
    writer = RunLogWriter(path, meta={"run": "t"})
    writer.write_steps(records[:200])
    writer.close()
    with path.open("a") as fh:
        if torn:
            fh.write("this is not json\n")
        fh.write('{"kind": "step", "step": 100000, "loss": 1, "unknown_key": 3}\n')
        fh.write('{"kind": "step", "step": 100001, "loss": null}\n\n   \n')
        fh.write('{"kind": "step", "step": 100002, "loss": 2.5, "grad_norm": 1.5}\n')
        fh.write('{"step": 100003, "kind": "step", "lr":1e-4,"loss":3.0}\n')
    writer = RunLogWriter(path, meta={"run": "t2"})
    for rec in records[200:]:
        rec.step += 200000
    writer.write_steps(records[200:])
    writer.close()
    if torn:
        with path.open("a") as fh:
            fh.write('{"kind": "step", "step": 9999999, "lo')
    assert detect_format(path) == "sapper"
    expected = read_log(path)
    got = read_columnar(path, "sapper", min_bytes=0)
    assert got is not None
    assert [_nan_equal(r.__dict__) for r in got.records] == [
        _nan_equal(r.__dict__) for r in expected.records
    ]
    assert [{k: type(v) for k, v in r.__dict__.items()} for r in got.records] == [
        {k: type(v) for k, v in r.__dict__.items()} for r in expected.records
    ]
    assert got.notes == expected.notes
    assert got.meta == expected.meta
    assert got.findings == expected.findings


def test_columnar_reader_leaves_logs_of_mostly_extras_to_the_streaming_reader(
    tmp_path: Path,
) -> None:
    """A live monitor that logs extras on every step: the streaming reader is faster."""
    path = tmp_path / "run.jsonl"
    writer = RunLogWriter(path)
    writer.write_steps(
        StepRecord(step=s, loss=1.0, extra={"clip_coef": 0.5}) for s in range(1, 200)
    )
    writer.close()
    assert read_columnar(path, "sapper", min_bytes=0) is None


def test_columnar_reader_leaves_odd_values_to_the_streaming_reader(tmp_path: Path) -> None:
    """A number written as a string is the streaming detectors' to judge."""
    path = tmp_path / "run.jsonl"
    writer = RunLogWriter(path)
    writer.write_steps(StepRecord(step=s, loss=1.0) for s in (1, 2, 3))
    writer.close()
    with path.open("a") as fh:
        fh.write('{"kind": "step", "step": 4, "loss": "2.5"}\n')
    assert read_columnar(path, "sapper", min_bytes=0) is None


def _resumed_log(path: Path, n: int) -> None:
    """A run log resumed from checkpoints: the first attempt's last steps logged again by
    the next one (and once a step repeated exactly), finding lines in each attempt, a
    step with extras where an attempt starts (the streaming parser's line)."""
    from sapper.rules.model import Finding, Severity

    records = _stream(5, n)
    third, two_thirds = n // 3, (2 * n) // 3
    finding = Finding(
        code="R001", severity=Severity.ERROR, check="loss", title="t", message="m", fix="f", step=3
    )
    writer = RunLogWriter(path, meta={"run": "resumed"})
    writer.write_steps(records[:third])
    writer.write_finding(finding)
    writer.close()
    writer = RunLogWriter(path, meta={"run": "resumed", "resume": 1})
    again = [copy.deepcopy(r) for r in records[third - third // 4 : two_thirds]]
    again[0].extra["clip_coef"] = 0.5
    writer.write_steps(again)
    writer.write_finding(finding.model_copy(update={"step": int(again[5].step)}))
    writer.write_steps([copy.deepcopy(records[two_thirds - 1])])  # the same step again
    writer.write_steps(copy.deepcopy(r) for r in records[two_thirds:])
    writer.write_finding(finding.model_copy(update={"step": int(records[-1].step)}))
    writer.close()


@pytest.mark.parametrize("block", [None, 2500])
def test_columnar_reader_splits_a_resumed_log_into_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int | None
) -> None:
    """Steps that go back start a new attempt, as the streaming reader splits them; the
    stored findings name the attempt they were written in."""
    monkeypatch.setattr(runlog, "SPECIAL_SHARE", 1.0)
    if block is not None:
        monkeypatch.setattr(runlog, "BLOCK_BYTES", block)
    path = tmp_path / "run.jsonl"
    _resumed_log(path, 600)
    expected = read_log(path)
    got = read_columnar(path, "sapper", min_bytes=0)
    assert got is not None
    assert len(expected.attempts) == 3
    assert got.attempts == expected.attempts
    assert [_nan_equal(r.__dict__) for r in got.records] == [
        _nan_equal(r.__dict__) for r in expected.records
    ]
    assert got.findings == expected.findings
    assert [f.data.get("attempt") for f in got.findings] == [1, 2, 3]
    assert got.notes == expected.notes
    assert got.meta == expected.meta


def test_resumed_log_analysis_through_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed log read into columns and analyzed attempt by attempt (each with its
    history as rows of the same columns): the findings, attempts and notes the streaming
    reader and detectors give."""
    monkeypatch.setattr(runlog, "SPECIAL_SHARE", 1.0)
    path = tmp_path / "run.jsonl"
    _resumed_log(path, 1500)
    streaming = analyze_log(read_log(path), default_detectors())
    log = read_columnar(path, "sapper", min_bytes=0)
    assert log is not None and log.columns is not None
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)
    monkeypatch.setattr(engine, "EXTRAS_SHARE", 1.0)
    columnar = analyze_log(log, default_detectors())
    assert _analysis_key(columnar) == _analysis_key(streaming)
    assert any(f.data.get("attempt") == 3 for f in columnar.findings)


def _analysis_key(a: Any) -> tuple[Any, ...]:
    return (
        [_key(f) for f in a.findings],
        a.unevaluated,
        a.failed,
        a.interval,
        a.gaps,
        [s.to_json() for s in a.attempts],
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_analysis_through_columns(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``analyze_log`` gives the same analysis through columns as streaming, restarted
    logs included (each attempt with fresh detectors, its history as context)."""
    log = read_log(path)
    streaming = analyze_log(log, default_detectors())
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)
    monkeypatch.setattr(engine, "EXTRAS_SHARE", 1.0)
    columnar = analyze_log(log, default_detectors())
    assert _analysis_key(columnar) == _analysis_key(streaming)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_analysis_through_columns_without_proven_twins(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A twin whose proof is stale (or an install without sources) leaves its detector to
    the row-selecting fallback, which must give the streaming analysis too."""
    log = read_log(path)
    streaming = analyze_log(log, default_detectors())
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)
    monkeypatch.setattr(engine, "EXTRAS_SHARE", 1.0)
    monkeypatch.setattr(engine, "FINGERPRINTS", {})
    monkeypatch.setattr(engine, "_checked", {})
    columnar = analyze_log(log, default_detectors())
    assert _analysis_key(columnar) == _analysis_key(streaming)


def test_restarted_run_log_through_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run log that rolls back twice: three attempts, the same analysis either way."""
    path = tmp_path / "run.jsonl"
    records = _stream(3, 900)
    writer = RunLogWriter(path)
    writer.write_steps(records[:400])
    writer.write_steps(copy.deepcopy(r) for r in records[250:700])
    writer.write_steps(copy.deepcopy(r) for r in records[600:])
    writer.close()
    log = read_log(path)
    assert len(log.attempts) == 3
    streaming = analyze_log(log, default_detectors())
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)
    monkeypatch.setattr(engine, "EXTRAS_SHARE", 1.0)
    columnar = analyze_log(log, default_detectors())
    assert _analysis_key(columnar) == _analysis_key(streaming)
    assert any(f.data.get("attempt") == 3 for f in columnar.findings)


def test_analyze_command_same_json_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sapper analyze --format json`` on a run log large enough for the columnar
    reader: the same output as with the columnar path switched off."""
    import json

    from typer.testing import CliRunner

    from sapper.cli.app import _register_commands, app

    _register_commands()

    monkeypatch.setattr(runlog, "SPECIAL_SHARE", 1.0)
    monkeypatch.setattr(engine, "EXTRAS_SHARE", 1.0)
    path = tmp_path / "run.jsonl"
    writer = RunLogWriter(path, meta={"run": "big"})
    writer.write_steps(_stream(11, 30_000))
    writer.close()
    assert path.stat().st_size > runlog.MIN_BYTES
    assert read_columnar(path, "sapper") is not None
    runner = CliRunner()
    fast = runner.invoke(app, ["analyze", str(path), "--format", "json"])
    monkeypatch.setattr(runlog, "MIN_BYTES", 1 << 40)
    monkeypatch.setattr(engine, "MIN_RECORDS", 1 << 40)
    slow = runner.invoke(app, ["analyze", str(path), "--format", "json"])
    assert fast.exit_code == slow.exit_code
    assert json.loads(fast.stdout) == json.loads(slow.stdout)


@pytest.mark.parametrize("budget", [1, 60, 10_000])
@pytest.mark.parametrize("seed", [3, 11, 29])
def test_twins_side_by_side_give_what_one_at_a_time_gives(
    seed: int, budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two detectors at once (as on a long log), whatever room the budget leaves them:
    the same findings, failures and unevaluated lines, in detector order."""
    monkeypatch.setattr(engine, "SCRATCH_BUDGET", budget)
    records = _stream(seed, 600)
    cols = columns_from_records(records)
    assert cols is not None
    cols.source = None
    one = run_columns(cols, default_detectors(), proven_only=False, workers=1, strict=True)
    two = run_columns(cols, default_detectors(), proven_only=False, workers=2, strict=True)
    assert list(map(_key, two.found)) == list(map(_key, one.found))
    assert two.failed == one.failed
    assert two.unevaluated == one.unevaluated


def test_the_budget_holds_detectors_running_at_once_within_it() -> None:
    """A detector waits for room; one larger than the whole budget runs alone."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    budget = engine._Budget(100)
    seen: list[int] = []
    lock = threading.Lock()

    def job() -> Any:
        with lock:
            seen.append(budget.used)
        time.sleep(0.01)
        return [], {}, []

    needs = [60, 60, 30, 150, 10, 40, 100, 5]
    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(budget.run, need, job) for need in needs]:
            f.result()
    assert len(seen) == len(needs)
    assert max(seen) <= 100
    assert budget.used == 0


@pytest.mark.parametrize(("machine_s", "own_s", "free"), [(1.2, 1.0, True), (2.0, 0.9, False)])
def test_side_by_side_only_where_the_others_leave_a_core(
    machine_s: float, own_s: float, free: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over one second, the machine's CPU time less this process's own is what the
    others took: a fifth of a core leaves one free, a core does not."""
    samples = iter([(11.0, 100.0 + machine_s, 5.0 + own_s)])
    monkeypatch.setattr(engine, "_since", (10.0, 100.0, 5.0))
    monkeypatch.setattr(engine, "_cpu_sample", lambda: next(samples))
    assert engine._core_free() is free
    assert engine._since == (11.0, 100.0 + machine_s, 5.0 + own_s)  # the next span starts


def test_the_machines_cpu_sample_counts_up() -> None:
    first = engine._cpu_sample()
    if first is None:
        pytest.skip("no /proc/stat here")
    sum(i * i for i in range(200_000))
    later = engine._cpu_sample()
    assert later is not None
    assert later[0] > first[0] and later[1] >= first[1] and later[2] > first[2]
