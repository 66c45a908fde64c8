"""The targets of ``sapper diagnose`` on its labelled cases
(tests/fixtures/diagnose/LABELS.yaml and benchmarks/data/diagnose/CASES.yaml, scored by
benchmarks/diagnose_accuracy.py): the right cause first on ≥ 90 % of the planted faults
(with and without their plan) and of all named cases, its onset within 5 % of the run's
length, no cause on a healthy run, and never a named cause where the inputs cannot tell
or where the cause is another — where the baseline (the first loud finding of
``analyze``) does worse, on the public logs too; each of the three questions (a blow-up,
a loss that does not go down, a slow run) and memory has cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "diagnose_accuracy.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("diagnose_accuracy", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module, module.run_cases()


def test_the_labelled_set_covers_every_kind_of_answer(bench) -> None:
    _, cases = bench
    kinds = {c.expect for c in cases}
    assert {"healthy", "cannot-tell"} <= kinds
    assert len(kinds - {"healthy", "cannot-tell"}) >= 10  # distinct causes named
    assert {"blow-up", "not-learning", "slow", "memory"} <= {c.question for c in cases}
    planted = [c for c in cases if c.group == "planted" and c.expect != "healthy"]
    assert any(c.plan for c in planted) and any(not c.plan for c in planted)
    assert sum(c.expect == "cannot-tell" and c.group == "planted" for c in cases) >= 2


def test_diagnose_meets_its_targets(bench) -> None:
    module, cases = bench
    s = module.score(cases, "sapper")
    planted = module.score([c for c in cases if c.group == "planted"], "sapper")
    assert planted.top1_rate >= module.NAMED_TARGET, module.table(cases)
    assert s.top1_rate >= module.NAMED_TARGET, module.table(cases)
    with_plan = module.score([c for c in cases if c.group == "planted" and c.plan], "sapper")
    assert with_plan.top1_rate >= module.NAMED_TARGET, module.table(cases)
    assert s.worst_onset <= module.ONSET_TARGET, module.table(cases)
    assert s.false_alarms == 0 and s.confident_wrong == 0, module.table(cases)
    # Calibrated: a named cause is right at least as often as its confidence says.
    conf = [p for p, _ in s.confidences]
    assert sum(r for _, r in s.confidences) / len(conf) >= sum(conf) / len(conf)


def test_the_baseline_does_worse_on_the_same_cases(bench) -> None:
    module, cases = bench
    ours, base = module.score(cases, "sapper"), module.score(cases, "baseline")
    assert ours.top1 > base.top1
    assert base.confident_wrong > ours.confident_wrong
    public = [c for c in cases if c.group == "public"]
    assert module.score(public, "sapper").top1 >= module.score(public, "baseline").top1
