"""Console logs (the HF Trainer's printed dicts, torchtitan, fairseq, nanoGPT lines) run
through the columnar detectors: their own numbers in ``extra`` (the epoch, perplexity,
TFLOPs) are columns no detector reads, so the vectorised twins serve them, with the
same analysis as record by record. Correctness only: speed is
benchmarks/analyze_speed.py's."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from sapper.logs import read_log
from sapper.logs.columnar import columns_from_records
from sapper.logs.columnar.twins import engine
from sapper.pipeline.logs import analyses_json, analyze_logs, load_logs
from sapper.runtime.records import StepRecord


def _curve(rng: random.Random, step: int, spike: int, nan: int) -> tuple[float, float, float]:
    loss = 2.1 + 6.0 * math.exp(-step / 300) + rng.gauss(0, 0.01)
    grad = 0.4 + math.exp(-step / 400) + abs(rng.gauss(0, 0.02))
    if step == spike:
        loss, grad = loss * 3, grad * 40
    if step == nan:
        loss = math.nan
    return loss, grad, 3e-4 * min(1.0, step / 200)


def hf_console(rng: random.Random, n: int, spike: int, nan: int) -> str:
    out = [f"***** Running training *****\n  Total optimization steps = {n}\n"]
    for step in range(1, n + 1):
        loss, grad, lr = _curve(rng, step, spike, nan)
        if step % 50 == 0:
            out.append(f" {100 * step // n:3d}%|###    | {step}/{n} [01:02<07:40,  1.62it/s]\r")
        out.append(
            f"{{'loss': {loss:.4f}, 'grad_norm': {grad:.6f}, 'learning_rate': {lr:.4e}, "
            f"'epoch': {step / 500:.2f}}}\n"
        )
        if step % 400 == 0:
            out.append(f"{{'eval_loss': {loss + 0.1:.4f}, 'eval_runtime': 3.2, 'epoch': "
                       f"{step / 500:.2f}}}\n")
    return "".join(out)


def torchtitan(rng: random.Random, n: int, spike: int, nan: int) -> str:
    out = []
    for step in range(1, n + 1):
        loss, grad, _ = _curve(rng, step, spike, nan)
        s = 1716100000 + step
        out.append(
            f"[rank0]:[titan] 2025-06-16 {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d},"
            f"735 - root - INFO - step: {step:5d}  loss: {loss:8.4f}  grad_norm: {grad:7.4f}  "
            f"memory: 49.66GiB(52.28%)  tps: {5856 + rng.randint(-50, 50):,}  tflops: "
            f"{339 + rng.random():.2f}  mfu: 34.29%\n"
        )
    return "".join(out)


def fairseq(rng: random.Random, n: int, spike: int, nan: int) -> str:
    out = []
    for step in range(1, n + 1):
        loss, grad, lr = _curve(rng, step, spike, nan)
        scale = 64.0 if step < n - 40 else 2.0 ** -(step - n + 40)
        out.append(
            f"| epoch {step // 300 + 1:03d} | loss {loss:.3f} | nll_loss {loss * 0.6:.3f} | ppl "
            f"{min(2 ** loss, 1e9):.2f} | wps 279460 | ups 3 | wpb 110529.673 | bsz 3780.211 | "
            f"num_updates {step} | lr {lr:.9f} | gnorm {grad:.3f} | clip 0.000 | oom 0.000 | "
            f"loss_scale {scale:.3f} | wall {step * 2} | train_wall {step * 2 - 1}\n"
        )
        if step % 500 == 0:
            out.append(f"| epoch {step // 300 + 1:03d} | valid on 'valid' subset | loss "
                       f"{loss + 0.2:.3f} | num_updates {step} | best_loss 9.1\n")
    return "".join(out)


def nanogpt(rng: random.Random, n: int, spike: int, nan: int) -> str:
    out = []
    for step in range(n):
        loss, _, _ = _curve(rng, step + 1, spike, nan)
        out.append(f"iter {step}: loss {loss:.4f}, time {560 + rng.random() * 5:.2f}ms, "
                   f"mfu {40 + rng.random():.2f}%\n")
    return "".join(out)


WRITERS: dict[str, Callable[[random.Random, int, int, int], str]] = {
    "hf_console": hf_console,
    "torchtitan": torchtitan,
    "fairseq": fairseq,
    "nanogpt": nanogpt,
}


def _json(path: Path) -> str:
    logs, failed = load_logs([path], None, {}, columnar=True)
    return json.dumps(analyses_json(analyze_logs(logs, None, [], []), failed), sort_keys=True,
                      default=str)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_console_logs_analyse_the_same_through_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, seed: int
) -> None:
    rng = random.Random(seed)
    path = tmp_path / "train.log"
    path.write_text(WRITERS[kind](rng, 2500, spike=900, nan=1700), encoding="utf-8")
    monkeypatch.setattr(engine, "MIN_RECORDS", 10**12)
    expected = _json(path)  # record by record
    monkeypatch.setattr(engine, "MIN_RECORDS", 0)
    log = read_log(path)
    cols = columns_from_records(list(log.records))
    assert cols is not None
    assert not cols.full, sorted(cols.full)[:5]  # their extras are no detector's
    assert _json(path) == expected
    assert '"R002"' in expected or '"R013"' in expected, expected[:2000]


def test_extras_kept_as_columns_come_back_in_records() -> None:
    records = [
        StepRecord(step=i, loss=2.0, extra={"epoch": i / 10, "ppl": 7.5, "n": i})
        for i in range(1, 20)
    ]
    cols = columns_from_records(records)
    assert cols is not None and not cols.full
    assert cols.int_extras == {"n"}
    cols.source = None
    for i, rec in enumerate(records):
        assert cols.record(i) == rec
        assert {k: type(v) for k, v in cols.record(i).extra.items()} == {
            "epoch": float, "ppl": float, "n": int
        }
        assert cols.partial(i, ("loss",)).extra == {}


@pytest.mark.parametrize(
    "extra",
    [
        {"sample_hashes": [1, 2]},  # read by the duplicate-data detector
        {"cpu_wait_s": 0.1},  # read by the throughput twin
        {"grad_norm_layers": {"a": 1.0}},
        {"nonfinite_params": ["w"]},
        {"flag": True},  # not a number
        {"big": 2**60},  # past float64's exact ints
        {"note": "text"},
    ],
)
def test_rows_with_extras_a_detector_may_read_stay_whole(extra: dict) -> None:
    records = [StepRecord(step=i, loss=2.0, extra={"epoch": 1.0}) for i in range(1, 6)]
    records[2].extra.update(extra)
    cols = columns_from_records(records)
    assert cols is not None
    assert 2 in cols.full
    if "sample_hashes" in extra:  # the epoch then restarts the window: every row whole
        assert sorted(cols.full) == [0, 1, 2, 3, 4]
    else:
        assert sorted(cols.full) == [2]


def test_a_name_that_is_an_int_here_and_a_float_there_stays_whole() -> None:
    records = [StepRecord(step=i, extra={"x": 1 if i % 2 else 1.5}) for i in range(1, 7)]
    cols = columns_from_records(records)
    assert cols is not None and sorted(cols.full) == list(range(6))
