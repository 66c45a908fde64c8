"""One truth across ``sapper plan`` and ``sapper check``: no layout the planner proposes is
flagged by the checks (layout errors or warnings, memory without 10% headroom), on real
public model configs across cluster sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapper.checks.engine import NotEvaluated
from sapper.checks.memory import check_fits
from sapper.parallel import search, validate
from sapper.plan.load import load_plan
from sapper.plan.sources import PlanSource
from sapper.rules.model import Severity

HF = Path(__file__).parents[1] / "fixtures" / "hf"

GRID = [
    ("llama-2-7b.json", 8, "A100-80GB", 4096),
    ("llama-2-7b.json", 64, "H100", 4096),
    ("llama-2-70b.json", 64, "H100", 4096),
    ("llama-2-70b.json", 512, "A100-80GB", 4096),
    ("mixtral-8x7b-v0.1.json", 64, "H100", 4096),
    ("gpt2-xl.json", 16, "A100-40GB", 1024),
    ("bloom-560m.json", 32, "A100-80GB", 2048),  # ALiBi: no context parallelism
    ("falcon-40b.json", 128, "H100", 2048),
]


def _plan(config: str, gpus: int, gpu: str, seq: int):
    src = PlanSource(name="test")
    for path, value in {
        "hardware.num_gpus": gpus, "hardware.gpu": gpu, "batch.seq_len": seq,
        "batch.global_batch_size": 4 * gpus, "precision.dtype": "bf16",
    }.items():
        src.set(path, value)
    return load_plan(hf_config=HF / config, overrides=src).plan


@pytest.mark.parametrize(("config", "gpus", "gpu", "seq"), GRID)
def test_planner_top_five_pass_the_checks(config: str, gpus: int, gpu: str, seq: int) -> None:
    plan = _plan(config, gpus, gpu, seq)
    result = search(plan, top=5, explain=False)
    assert result.top, result.notes
    for cand in result.top:
        chosen = cand.layout.apply(plan)
        flagged = [f"{x.code}: {x.message}" for x in validate(chosen)
                   if x.severity != Severity.INFO]
        memory = [f"{f.code}: {f.message}" for f in check_fits(chosen)
                  if not isinstance(f, NotEvaluated) and f.severity != Severity.INFO]
        assert not flagged + memory, cand.layout.describe()


def test_alibi_model_never_gets_context_parallelism() -> None:
    plan = _plan("bloom-560m.json", 32, "A100-80GB", 2048)
    assert all(c.layout.cp == 1 for c in search(plan, top=5, explain=False).top)
