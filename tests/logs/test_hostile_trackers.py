"""Property tests: a W&B record file or an MLflow run, however damaged, is read into
records and notes or refused with one InputError; never a traceback, never a hang.

W&B cases mutate the bytes of the real offline runs in tests/fixtures/logs/wandb
(written by wandb 0.31.0): flipped bytes, cuts, NUL blocks, repeated and swapped
stretches, over the chunk headers too. MLflow cases write a run whose metric lines are
mutated by :func:`tests.logs.hostile.mutate_line` (NaN, 5000-digit numbers, terminal
escapes, bidi overrides, NULs, cut lines). Both then go through ``sapper analyze``
in-process (:func:`tests.logs.hostile.run_cli` checks the invariant)."""

from __future__ import annotations

import importlib.util
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import time_limit
from tests.logs.hostile import fast_settings, mutate_line, run_cli

from sapper.errors import InputError
from sapper.logs import read_log
from sapper.logs.wandb import runs_in

#: The .wandb record files are read with the wandb package (sapper[wandb]).
needs_wandb = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None, reason="needs the wandb package"
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs" / "wandb"
RECORD_FILES = sorted(FIXTURES.glob("*/wandb/*/*.wandb"))
SEEDS = [p.read_bytes() for p in RECORD_FILES]


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        kind = rng.randrange(6)
        at = rng.randrange(len(out)) if out else 0
        span = rng.choice((1, 2, 7, 64, 1000, 40000))
        if kind == 0:  # flipped bytes
            for i in range(at, min(len(out), at + span)):
                out[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # cut
            del out[at:]
        elif kind == 2:  # a NUL block
            out[at:at] = b"\x00" * span
        elif kind == 3:  # a stretch repeated
            out[at:at] = out[at : at + span]
        elif kind == 4:  # a stretch lost
            del out[at : at + span]
        else:  # random bytes
            out[at : at + span] = rng.randbytes(min(span, 5000))
    return bytes(out)


@needs_wandb
@fast_settings(60)
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_record_files_never_crash(seed: int) -> None:
    rng = random.Random(seed)
    data = _mutate_bytes(rng, rng.choice(SEEDS))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "wandb" / "offline-run-20240101_000000-mutated1"
        run.mkdir(parents=True)
        (run / "run-mutated1.wandb").write_bytes(data)
        with time_limit(20):
            try:
                log = read_log(run)
            except InputError as exc:
                assert "\n" not in str(exc)
            else:
                assert all(r.step >= 0 for r in log.records)
        if rng.random() < 0.2:
            run_cli("analyze", str(run))


@fast_settings(40)
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_mlflow_runs_never_crash(seed: int) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "mlruns" / "0" / ("a" * 32)
        (run / "metrics" / "train").mkdir(parents=True)
        (run / "meta.yaml").write_text(f"run_id: {'a' * 32}\nstatus: 3\n")
        for name in ("train/loss", "train/grad_norm", "learning_rate"):
            lines = [f"{1700000000000 + s} {1.0 / (s + 1)} {s}" for s in range(60)]
            text = "\n".join(mutate_line(rng, line, json_like=False) for line in lines)
            (run / "metrics" / name).write_text(text, encoding="utf-8", errors="surrogatepass")
        with time_limit(20):
            try:
                read_log(run)
            except InputError as exc:
                assert "\n" not in str(exc)
        run_cli("analyze", str(run.parent.parent))


@needs_wandb
def test_seeds_are_the_real_runs() -> None:
    assert len(SEEDS) == 2 and all(s.startswith(b":W&B") for s in SEEDS)
    assert all(runs_in(p.parent.parent) for p in RECORD_FILES)
