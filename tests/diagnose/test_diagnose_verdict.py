"""The verdict of ``diagnose`` by margin and coverage (sapper.diagnose.reason): a cause
with solid support that no cause of another topic explains as much of is named "most
likely" with its rival not excluded; two causes that explain the run equally, or thin
evidence, stay ``unknown`` (never a confident wrong cause); a consequence of the named
cause is no rival; problems the first cause leaves unexplained get their own; warnings
that nothing points at are told, not diagnosed; pre-flight findings weigh for the
causes they predict, a clean item against."""

from __future__ import annotations

from sapper.diagnose.evidence import CONFIG, LOG, ConfigEvidence, Evidence
from sapper.diagnose.reason import SOLID, rank_causes
from sapper.rules.model import Severity

W, E = Severity.WARNING, Severity.ERROR


def ev(code: str, step: int | None, severity: Severity = W, kind: str = LOG,
       size: float | None = None) -> Evidence:
    return Evidence(code, step, "run.log", f"{code} at {step}", severity, kind, size=size)


def rank(log: list[Evidence], config: ConfigEvidence | None = None,
         precision: str | None = "fp32"):
    return rank_causes(sorted(log, key=lambda e: (e.step is None, e.step or 0)), config, [],
                       precision)


def test_the_one_cause_that_explains_the_evidence_is_named_most_likely() -> None:
    # Wrapped position ids from step 5 (a strong precursor) and a throughput drop at
    # step 50 that no cause's sign points at: positions explains half of the problems,
    # so its score stays under 0.5; no other cause explains as much: it is named.
    r = rank([ev("R091", 5, E), ev("R061", 50)])
    assert r.named is not None and r.named.cause.id == "positions"
    assert r.basis == "most likely" and r.named.confidence < 0.5


def test_two_causes_that_explain_the_run_equally_stay_unknown() -> None:
    # A short data cycle and a scheduler stepped per micro-batch, both from step 4, and a
    # loss that does not fall: each explains the stall, nothing tells them apart.
    r = rank([ev("R072", 4), ev("R042", 4), ev("R003", 30)])
    assert r.named is None and "about equally" in r.undecided
    assert {c.cause.id for c in r.candidates[:2]} == {"data-repeat", "lr-schedule"}


def test_thin_evidence_stays_unknown() -> None:
    # A gradient-norm surge with a spike: a weak sign of a too-high LR, no more.
    r = rank([ev("R013", 100), ev("R002", 101)])
    assert r.named is None and "thin" in r.undecided
    assert r.candidates[0].support < SOLID
    # A scale collapse logged at the very step of the spike may be one more symptom.
    r = rank([ev("R002", 200), ev("R030", 200, E)], precision="fp16")
    assert r.named is None


def test_a_consequence_of_the_named_cause_is_no_rival() -> None:
    # The data repeat from step 4; the eval loss turned up at step 60 (memorisation):
    # the repeats explain it, so the memorisation is not a rival cause.
    r = rank([ev("R072", 4), ev("R110", 60, size=1.4)])
    assert r.named is not None and r.named.cause.id == "data-repeat"
    assert r.rival is None or r.rival.cause.id != "overfitting"


def test_a_small_eval_rise_is_no_sign_of_memorisation() -> None:
    assert rank([ev("R110", 60, size=1.05)]).named is None
    assert rank([ev("R110", 60, size=1.3)]).named.cause.id == "overfitting"


def test_what_the_first_cause_leaves_unexplained_gets_its_own() -> None:
    r = rank([ev("R051", 20), ev("R110", 60, size=1.4)])
    named = [x.named.cause.id for x in (r, *r.more) if x.named is not None]
    assert sorted(named) == ["memory", "overfitting"]


def test_warnings_nothing_points_at_are_told_not_diagnosed() -> None:
    r = rank([ev("R004", 300), ev("R002", 310)])
    assert r.named is None and r.candidates == []


def _config(findings: list[Evidence], evaluated: set[str]) -> ConfigEvidence:
    return ConfigEvidence(findings, frozenset(evaluated), "plan.yaml")


def test_a_pre_flight_error_is_evidence_for_the_cause_it_predicts() -> None:
    # fp16 without loss scaling (N102, an error) and a NaN: the config predicted it.
    config = _config([ev("N102", None, E, CONFIG)], {"N102", "N103", "N104"})
    r = rank([ev("R001", 40, E)], config, precision="fp16")
    assert r.named is not None and r.named.cause.id == "loss-scaling"
    # Without the config the same NaN names nothing.
    assert rank([ev("R001", 40, E)], precision="fp16").named is None


def test_a_clean_item_weighs_against_but_not_over_what_the_run_measured() -> None:
    log = [ev("R080", 1, E)]
    clean = _config([], {"C101", "C102"})
    plain, checked = rank(log).candidates[0], rank(log, clean).candidates[0]
    assert plain.cause.id == checked.cause.id == "accumulation"
    assert checked.support == plain.support - 0.1  # half the penalty: a measured sign
    assert rank(log, clean).named is not None
    # a cause resting on weak signs only loses the full weight
    weak = [ev("R013", 100), ev("R002", 101)]
    ran = _config([], {"D105"})
    assert rank(weak, ran).candidates[0].support == rank(weak).candidates[0].support - 0.2


def test_of_two_equal_causes_the_one_whose_evidence_began_first_leads() -> None:
    from sapper.diagnose.diagnosis import Diagnosis

    # wrapped positions from step 5 and a short data cycle from step 6, both explaining
    # the flat loss: the first cause leads, the other is named for what it alone shows
    r = rank([ev("R091", 5, E), ev("R072", 6), ev("R003", 60)])
    assert r.named is not None and r.named.cause.id == "positions"
    assert [x.named.cause.id for x in r.more if x.named is not None] == ["data-repeat"]
    doc = Diagnosis(r, ["run.log"], None, "fp32").to_json()
    assert [c["cause"] for c in doc["causes"]] == ["positions", "data-repeat"]
    assert "data-repeat" not in {c["cause"] for c in doc["considered"]}
