"""Short excerpts (cold start), "could not evaluate" and framework semantics of the spike
and scaler detectors, on record streams and on real public log excerpts
(tests/fixtures/SOURCES.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sapper.errors import InputError
from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.logs.framework import framework_of, framework_of_format
from sapper.runtime import DetectorSet, StepRecord
from sapper.runtime.detectors import (
    GradNormDetector,
    LossDetector,
    ScalerDetector,
    default_detectors,
)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _codes(detector, records: list[StepRecord]) -> list[str]:
    return [f.code for f in DetectorSet([detector]).run(records)]


def _losses(values: list[float], start: int = 0, every: int = 1) -> list[StepRecord]:
    return [StepRecord(step=start + i * every, loss=v) for i, v in enumerate(values)]


def test_cold_start_loss_spike_fires_on_a_short_excerpt() -> None:
    excerpt = _losses([2.31, 2.29, 2.30, 2.28, 5.9, 4.1], start=41_000, every=10)
    found = DetectorSet([LossDetector()]).run(excerpt)
    spikes = [f for f in found if f.code == "R002"]
    assert [f.step for f in spikes] == [41_040]
    assert spikes[0].data["cold_start"] is True
    assert "cold start" in spikes[0].message


@pytest.mark.parametrize(
    "values",
    [
        # the first steps of a run from step 0: Adam starting, the loss wobbles at ln(V)
        [10.98, 11.31, 10.72, 9.85, 10.4, 8.7, 8.9],
        # a low fine-tuning loss with small-batch noise: ×1.7 but 0.2 nats
        [0.31, 0.52, 0.28, 0.45, 0.33],
        # a loss that fell fast and bounced back a little
        [6.0, 3.0, 2.5, 3.4, 2.9],
        # a first logged loss of 0.0 (some trainers log 0 before the first step)
        [0.0, 2.3, 2.2, 2.1],
    ],
)
def test_cold_start_loss_stays_quiet_on_noise(values: list[float]) -> None:
    assert "R002" not in _codes(LossDetector(), _losses(values))


def test_cold_start_grad_norm_surge() -> None:
    def norms(values: list[float]) -> list[StepRecord]:
        return [StepRecord(step=start + i, grad_norm=v) for i, v in enumerate(values)]

    start = 0
    assert _codes(GradNormDetector(), norms([1.2, 0.9, 1.1, 250.0])) == ["R013"]
    # From step 0 the first norms are the largest; ×8 between steps is normal there.
    assert _codes(GradNormDetector(), norms([40.0, 8.0, 3.0, 1.1, 9.0, 0.8])) == []
    # In an excerpt from the middle of a run ×10 over the short history's median is a surge.
    start = 52_000
    assert _codes(GradNormDetector(), norms([1.2, 0.9, 1.1, 12.5])) == ["R013"]
    assert _codes(GradNormDetector(), norms([1.2, 0.9, 1.1, 6.0])) == []


def test_cold_start_loss_scale_halving_in_an_excerpt() -> None:
    scales = [65536.0, 32768.0, 16384.0, 8192.0, 4096.0]
    excerpt = [StepRecord(step=52_000 + i, loss_scale=s) for i, s in enumerate(scales)]
    assert _codes(ScalerDetector(), excerpt) == ["R030"]
    # The same halvings at a run's start are the scaler calibrating (2^32 → fit).
    calib = [StepRecord(step=i, loss_scale=2.0 ** (32 - i)) for i in range(17)]
    calib += [StepRecord(step=17 + i, loss_scale=2.0**15) for i in range(200)]
    assert "R030" not in _codes(ScalerDetector(), calib)


def test_collapse_after_calibration_still_fires() -> None:
    # Calibrated, grew once, then halves on every step for 10 steps: a collapse.
    stream = [StepRecord(step=i, loss_scale=2.0**16) for i in range(150)]
    stream[120].loss_scale = 2.0**17
    stream += [StepRecord(step=150 + i, loss_scale=2.0 ** (16 - i)) for i in range(10)]
    assert "R030" in _codes(ScalerDetector(), stream)


def test_bigscience_tr1_13b_spike_excerpt() -> None:
    """The tr1-13B chronicle's "huge lm loss spike" (8 records): R002 at 29050 and, as the
    fp16 scale falls 65536 → 8192 → 4096 (four halvings in two records), R030, both by
    the cold-start paths."""
    log = read_log(LOGS / "bigscience/tr1-13B-spike-29050.log")
    assert framework_of(log) == "megatron"
    analysis = analyze_log(log, default_detectors(framework=framework_of(log)))
    assert [(f.code, f.step) for f in analysis.findings] == [("R002", 29050), ("R030", 29060)]
    assert any(line.startswith("R002") and "robust test" in line for line in analysis.unevaluated)
    assert any(line.startswith("R003") and "29020" in line for line in analysis.unevaluated)


def test_unevaluated_names_the_missing_input() -> None:
    dset = DetectorSet(default_detectors())
    dset.run([StepRecord(step=s, lr=1e-4) for s in range(5)])
    lines = dset.unevaluated()
    assert any(line.startswith("R001-R004") and "no loss" in line for line in lines)
    assert any(line.startswith("R010-R013") and "grad_norm" in line for line in lines)
    assert any(line.startswith("R030-R031") and "loss_scale" in line for line in lines)
    # A detector that saw enough says nothing.
    loss = LossDetector()
    DetectorSet([loss]).run(_losses([3.0 - 0.001 * i for i in range(200)]))
    assert loss.unevaluated() == []


# ---- framework semantics ---------------------------------------------------------------


def _megatron_fp16(n: int = 200, scale: float = 65536.0) -> list[StepRecord]:
    """Megatron fp16: the logged norm is unscaled (1-10) under a scale of 65536."""
    return [
        StepRecord(
            step=s,
            loss=2.5 + 0.01 * math.sin(s),
            grad_norm=1.0 + 9.0 * ((s * 7) % 10) / 10,
            loss_scale=scale,
        )
        for s in range(1000, 1000 + n)
    ]


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "unknown", None])
def test_megatron_fp16_norms_are_not_gradscaler_misuse(framework: str | None) -> None:
    found = DetectorSet(default_detectors(framework=framework)).run(_megatron_fp16())
    assert not {f.code for f in found} & {"R030", "R031", "R032", "R033"}


def test_low_scale_under_megatron_is_not_read_as_scaled_gradients() -> None:
    # A scale that fell to 1024 with norms of 200 (ratio 0.2): Megatron's norm is unscaled,
    # so only a torch-amp run reads this as gradients applied before unscale_.
    stream = [
        StepRecord(step=s, loss=3.0, grad_norm=200.0 + s % 3, loss_scale=1024.0)
        for s in range(500, 540)
    ]
    assert "R032" not in _codes(ScalerDetector(framework="megatron"), stream)
    assert "R032" in _codes(ScalerDetector(framework="torch-amp"), stream)
    # Unknown framework: the loss is flat and finite over 40 steps, unambiguous.
    assert "R032" in _codes(ScalerDetector(), stream)
    assert any("R032-R033" in line for line in ScalerDetector(framework="megatron").unevaluated())


def test_live_flags_still_fire_under_any_framework() -> None:
    rec = StepRecord(step=5, extra={"scaler_checked": True, "clip_before_unscale": True})
    assert _codes(ScalerDetector(framework="lightning"), [rec]) == ["R033"]


def test_megatron_fp16_real_logs_raise_no_scaler_rule() -> None:
    for name in ("megatron-345m-fp16-5000it.log", "megatron-345m-fp16-2000it.log"):
        name = f"megatron-examples/{name}"
        log = read_log(LOGS / name)
        analysis = analyze_log(log, default_detectors(framework=framework_of(log)))
        codes = {f.code for f in analysis.findings}
        assert not codes & {"R030", "R031", "R032", "R033"}, name
        assert not [f for f in analysis.findings if f.severity.value == "error"], name


def test_framework_from_format_and_meta() -> None:
    assert framework_of_format("megatron") == "megatron"
    assert framework_of_format("trainer_state") == "hf-trainer"
    assert framework_of_format("csv") == "unknown"
    assert framework_of_format("megatron+csv") == "unknown"
    with pytest.raises(InputError):
        ScalerDetector(framework="jax")


@pytest.mark.parametrize(
    ("name", "spikes"),
    [
        ("bigscience/tr8-104B-exp11-spike-11448.log", [11448]),  # 3 records: 3.11 → 7.71
        ("bigscience/tr8-104B-exp12-spike-8741.log", [8741]),  # 6 records: 3.68 → 7.27
        ("bigscience/tr8-104B-exp1-glitch2-6900.log", [6940]),  # a climb 6.4 → 10.2, no jump
    ],
)
def test_bigscience_tr8_104b_excerpts(name: str, spikes: list[int]) -> None:
    """Megatron-DeepSpeed fp16 excerpts of the tr8-104B chronicle: grad norms of 1e4-3e6
    under loss scales of 4096-65536 (DeepSpeed ZeRO-1/2 then logged the norm of the
    scaled gradients, and stepped on unscaled ones: not GradScaler misuse). No R032
    error, whatever the framework is taken to be; the spikes are R002."""
    log = read_log(LOGS / name)
    for framework in ("megatron", "unknown"):
        found = analyze_log(log, default_detectors(framework=framework)).findings
        assert [f.step for f in found if f.code == "R002"] == spikes, framework
        assert not [f for f in found if f.code in ("R032", "R033")], framework


def test_unevaluated_codes_and_select() -> None:
    from sapper.runtime.detector import unevaluated_codes

    assert unevaluated_codes("R030-R031 loss scaling: not evaluated") == ["R030", "R031"]
    assert unevaluated_codes("R040-R042, R045 LR: x") == ["R040", "R041", "R042", "R045"]
    assert unevaluated_codes("R020, R022: not evaluated") == ["R020", "R022"]
    assert unevaluated_codes("something else") == []
    log = read_log(LOGS / "megatron-examples/megatron-345m-fp16-5000it.log")
    only = analyze_log(log, default_detectors(framework="megatron"), select=["R03"])
    assert only.unevaluated and all(u.startswith("R03") for u in only.unevaluated)
    none = analyze_log(log, default_detectors(framework="megatron"), ignore=["R"])
    assert none.unevaluated == []


def test_oscillation_needs_a_swing_in_absolute_terms_too() -> None:
    # A fine-tuning loss near 0.01 doubling and halving between logs: batch noise.
    tiny = _losses([0.01 * (1.6 if i % 2 else 0.6) for i in range(60)])
    assert "R004" not in _codes(LossDetector(), tiny)
    large = _losses([3.0 * (1.6 if i % 2 else 0.6) for i in range(60)])
    assert "R004" in _codes(LossDetector(), large)


def _scales(values: list[float], start: int, every: int = 10, **extra) -> list[StepRecord]:
    return [
        StepRecord(step=start + i * every, loss=2.3, loss_scale=v, **extra)
        for i, v in enumerate(values)
    ]


@pytest.mark.parametrize("start", [41_200, 0])
def test_an_excerpt_that_begins_inside_a_scale_collapse_names_it(start: int) -> None:
    """A pasted excerpt of an fp16 run whose scaler has long been backing off: the scale
    starts far below 1 and halves on every record. No scaler starts there."""
    found = DetectorSet([ScalerDetector()]).run(_scales([0.5, 0.25, 0.125], start))
    collapse = [f for f in found if f.code == "R030"]
    assert [f.step for f in collapse] == [start + 10]
    assert "still falling" in collapse[0].message


@pytest.mark.parametrize(
    "values",
    [
        [65536.0] * 6,  # healthy fp16: the scale holds
        [65536.0, 32768.0, 16384.0, 8192.0, 8192.0, 8192.0],  # calibration at the start
        [0.5, 0.5, 0.5, 1.0],  # a low but steady (then growing) scale: not falling
    ],
)
def test_a_scale_that_is_not_sinking_below_the_floor_stays_quiet(values: list[float]) -> None:
    assert "R030" not in _codes(ScalerDetector(), _scales(values, 0, every=1))


def _skipping(start: int, n: int) -> list[StepRecord]:
    """Every step skipped: the skip counter climbs by the logging interval each record."""
    return [
        StepRecord(step=start + i * 10, loss=2.3, loss_scale=1.0, skipped_total=1000 + i * 10)
        for i in range(n)
    ]


def test_an_excerpt_that_begins_inside_a_skip_storm_names_it() -> None:
    found = DetectorSet([ScalerDetector()]).run(_skipping(52_000, 21))
    assert [f.step for f in found if f.code == "R031"] == [52_200]
    # at a run's start the first 20 steps are the scaler's first overflows: grace
    first_overflows = [
        StepRecord(step=i, loss=2.3, loss_scale=65536.0 / 2**i, skipped_total=i)
        for i in range(1, 12)
    ]
    at_start = DetectorSet([ScalerDetector()]).run(first_overflows)
    assert "R031" not in [f.code for f in at_start]
