"""Healthy runs stay quiet on a shared CPU: every healthy twin run of the monitor tests,
idle and under competing load, with the default detector settings and the tests' FAST
windows; the count and codes of its warnings (target: zero everywhere; infos are fine).

Runs (tests/monitor/tinytrain.py ``train()`` with no fault): tiny GPT-2 and Llama in a
plain loop, with gradient accumulation and an LR warmup, with fp16 autocast and a CPU
GradScaler, a deep Post-LN stack with warmup, long runs clipped at 1.0 (the norm sits near
the threshold), one without clipping, a toy dataset that really is slow to build (the
data wait is a large share of every step), and a transformers Trainer run when
``accelerate`` is installed.

Loads (tests/monitor/loadgen.py): ``idle``; ``busy``, one process spinning per core for
the whole run; ``bursts``, one process per core spinning 0.4 s and pausing 0.4 s,
staggered: a load that comes and goes, so the throughput dips and recovers.

    python benchmarks/healthy_under_load.py [--loads idle,busy,bursts] [--runs gpt2,...]
        [--procs N] [--settings fast,default]

Exit status 1 when any run raised a warning or an error.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "monitor"))

from loadgen import SlowMarkov, competing_load
from test_integrations import _hf_trainer as hf_trainer_run
from test_integrations import _Tokens
from tinytrain import FAST, Run, gpt2, llama, post_ln, train

from sapper.rules.model import Finding, Severity

Maker = Callable[[dict[str, Any]], list[Finding]]


def _loop(make: Callable[..., Run], **kw: Any) -> Maker:
    def run(options: dict[str, Any]) -> list[Finding]:
        result = make(monitor={"detector_options": options}, **kw)
        if result.error is not None:
            raise result.error
        return list(result.monitor.findings)

    return run


def _warmup(steps: int) -> Callable[[int], float]:
    return lambda s: min(1.0, (s + 1) / steps)


def _hf_trainer(options: dict[str, Any]) -> list[Finding]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        contextlib.redirect_stdout(io.StringIO()),  # the Trainer prints its logs
    ):
        _, cb = hf_trainer_run(
            Path(tmp), _Tokens(128), max_steps=40, logging_steps=10, detector_options=options
        )
    assert cb.monitor is not None
    return list(cb.monitor.findings)


def runs() -> dict[str, Maker]:
    """The healthy twins, by name."""
    out: dict[str, Maker] = {
        "gpt2": _loop(lambda **kw: train(gpt2(), **kw)),
        "llama": _loop(lambda **kw: train(llama(), **kw)),
        "gpt2-fp16-scaler": _loop(lambda **kw: train(gpt2(), fp16=True, **kw)),
        "llama-ga2-warmup": _loop(
            lambda **kw: train(llama(), ga=2, schedule=_warmup(10), steps=30, **kw)
        ),
        "postln-warmup": _loop(
            lambda **kw: train(post_ln(), schedule=lambda s: min(1.0, s / 20), **kw)
        ),
        "gpt2-200-clip": _loop(lambda **kw: train(gpt2(), steps=200, **kw)),
        "llama-200-clip": _loop(lambda **kw: train(llama(), steps=200, **kw)),
        "gpt2-no-clip": _loop(lambda **kw: train(gpt2(), clip=None, steps=100, **kw)),
        "gpt2-slow-dataset": _loop(
            lambda **kw: train(gpt2(), data=SlowMarkov(0.008), steps=100, **kw)
        ),
    }
    try:
        import accelerate  # noqa: F401  (the Trainer needs it)

        out["hf-trainer"] = _hf_trainer
    except ImportError:
        pass
    return out


SETTINGS: dict[str, dict[str, Any]] = {"fast": FAST, "default": {}}


def _cell(found: list[Finding]) -> str:
    loud = sorted({f.code for f in found if f.severity != Severity.INFO})
    n = sum(1 for f in found if f.severity != Severity.INFO)
    return f"{n}" + (f" ({','.join(loud)})" if loud else "")


def _infos(found: list[Finding]) -> set[str]:
    return {
        f.code
        for f in found
        if f.severity == Severity.INFO and f.code.startswith(("R01", "R06"))
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", default="idle,busy,bursts")
    ap.add_argument("--runs", default="", help="comma-separated names (default: all)")
    ap.add_argument("--settings", default="fast,default")
    ap.add_argument("--procs", type=int, default=None, help="load processes (default: cores)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the tests: intra-op threads on a shared box are noise
    table = runs()
    names = [n for n in args.runs.split(",") if n] or list(table)
    loads = [x for x in args.loads.split(",") if x]
    settings = [x for x in args.settings.split(",") if x]
    cells: dict[tuple[str, str, str], str] = {}
    infos: dict[tuple[str, str], set[str]] = {}
    took: dict[str, float] = {}
    bad = False
    for load in loads:
        started = time.perf_counter()
        with competing_load(load, args.procs):
            for name in names:
                for setting in settings:
                    try:
                        found = table[name](SETTINGS[setting])
                        cells[name, setting, load] = _cell(found)
                        infos.setdefault((name, setting), set()).update(_infos(found))
                        bad |= any(f.severity != Severity.INFO for f in found)
                    except Exception as exc:  # a run that fails is reported, not hidden
                        cells[name, setting, load] = f"error: {type(exc).__name__}"
                        bad = True
        took[load] = time.perf_counter() - started
    width = max(len(n) for n in names) + 10
    print(f"{'run':{width}}" + "".join(f"{x:>14}" for x in loads) + "   infos (R01x/R06x)")
    for name in names:
        for setting in settings:
            row = f"{name + ' [' + setting + ']':{width}}"
            row += "".join(f"{cells[name, setting, x]:>14}" for x in loads)
            print(row + "   " + ",".join(sorted(infos.get((name, setting), ()))))
    print("warnings per run and load (count, codes); seconds per load: " + ", ".join(
        f"{x} {took[x]:.0f}" for x in loads
    ))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
