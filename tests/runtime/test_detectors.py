"""Each R rule over synthetic record streams: one stream where it must fire, one where it
must stay silent, sparse logs and the options API."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from sapper.errors import InputError
from sapper.plan.schema import Plan
from sapper.rules.registry import all_rules
from sapper.runtime import DetectorSet, StepRecord
from sapper.runtime.detectors import DETECTORS, default_detectors
from sapper.runtime.detectors.lr import expected_lr

Stream = list[StepRecord]


def _healthy(n: int = 200, every: int = 1, seed: int = 0) -> Stream:
    rng = random.Random(seed)
    out = []
    for s in range(0, n, every):
        out.append(
            StepRecord(
                step=s,
                loss=2.0 + 3.0 * math.exp(-s / 40) + rng.gauss(0, 0.03),
                grad_norm=0.5 + rng.gauss(0, 0.05),
                clip_threshold=1.0,
                lr=1e-3 * min(1.0, s / 20),
                loss_scale=65536.0,
                skipped=False,
                memory_allocated_gib=10 + rng.gauss(0, 0.01),
                memory_peak_gib=30.0,
                memory_limit_gib=80.0,
                step_time_s=0.2 + abs(rng.gauss(0, 0.005)),
                data_time_s=0.002,
                tokens=4096,
                samples=8,
                extra={"sample_hashes": [f"{rng.getrandbits(64):016x}" for _ in range(8)]},
            )
        )
    return out


def _run(stream: Stream, plan: Plan | None = None, **opts) -> set[str]:
    return {f.code for f in DetectorSet(default_detectors(plan, **opts)).run(stream)}


def _with(stream: Stream, fn: Callable[[StepRecord], None], start: int = 0) -> Stream:
    for r in stream:
        if r.step >= start:
            fn(r)
    return stream


def _warn(codes: set[str]) -> set[str]:
    rules = {r.code: r for r in all_rules()}
    return {c for c in codes if rules[c].severity.value != "info"}


def test_healthy_stream_is_quiet_dense_and_sparse() -> None:
    assert _warn(_run(_healthy())) == set()
    assert _warn(_run(_healthy(1000, every=10))) == set()


def _nan(r: StepRecord) -> None:
    r.loss = math.nan


def _spike(r: StepRecord) -> None:
    if r.step == 120:
        r.loss = 9.0


def _flat(r: StepRecord) -> None:
    r.loss = 5.5 + 0.01 * math.sin(r.step)


def _oscillate(r: StepRecord) -> None:
    r.loss = 3.0 * (1.5 if r.step % 2 else 0.6)


def _grad_nan(r: StepRecord) -> None:
    r.grad_norm = math.inf


def _saturated(r: StepRecord) -> None:
    r.grad_norm = 6.0 + (r.step % 3)


def _tiny(r: StepRecord) -> None:
    r.grad_norm = 1e-6


def _surge(r: StepRecord) -> None:
    if r.step == 150:
        r.grad_norm = 40.0


def _collapse(r: StepRecord) -> None:
    r.loss_scale = 65536.0 / 2 ** (r.step - 99)
    r.skipped = True


def _skips(r: StepRecord) -> None:
    r.skipped = r.step % 4 == 0


def _scaled(r: StepRecord) -> None:
    r.grad_norm = 30000.0 + r.step


def _leak(r: StepRecord) -> None:
    r.memory_allocated_gib = 10 + 0.02 * r.step


def _near(r: StepRecord) -> None:
    r.memory_peak_gib = 78.0


def _degrade(r: StepRecord) -> None:
    r.step_time_s = 0.2 * (1 + (r.step - 100) / 20)


def _data_wait(r: StepRecord) -> None:
    r.data_time_s = 0.15
    r.step_time_s = 0.35


def _constant_wait(r: StepRecord) -> None:
    r.data_time_s = 0.1
    r.step_time_s = 0.3


def _outlier(r: StepRecord) -> None:
    if r.step == 150:
        r.step_time_s = 5.0


def _dup_batch(r: StepRecord) -> None:
    if r.step == 101:
        r.extra["sample_hashes"] = list(_PREV[0])


_PREV: list[list[str]] = [[]]


def _remember(r: StepRecord) -> None:
    if r.step == 100:
        _PREV[0] = list(r.extra["sample_hashes"])


def _ga_not_divided(r: StepRecord) -> None:
    r.extra.update(grad_accum=4, loss_weight=1.0)


def _ga_uneven(r: StepRecord) -> None:
    r.extra.update(grad_accum=2, loss_weight=0.5, micro_tokens=[100, 900])


def _batch_changed(r: StepRecord) -> None:
    r.samples = 32


def _position(r: StepRecord) -> None:
    if r.step == 50:
        r.extra.update(max_position=2048, position_limit=1024, position_kind="learned")


def _wrapped(r: StepRecord) -> None:
    if r.step == 50:  # 2048-token sequences, ids wrapped into a 1024-row table
        r.extra.update(
            max_position=1023,
            position_limit=1024,
            position_kind="learned",
            position_seq_len=2048,
            position_reuse="wrapped",
        )


def _growth(r: StepRecord) -> None:
    if r.step == 0:
        r.extra.update(activation_std=[1.0, 4.0, 16.0, 64.0])


def _postln(r: StepRecord) -> None:
    r.lr = 1e-3
    if r.step == 0:
        r.extra.update(norm_placement="post", num_blocks=12)


def _origin(r: StepRecord) -> None:
    if r.step == 60:
        r.extra.update(nonfinite_module="h.1.mlp", nonfinite_module_input_finite=True)


def _dead(r: StepRecord) -> None:
    if r.step % 10 == 0:
        r.extra.update(grad_sampled=True, zero_grad_params=["h.0.mlp.weight"])


def _zero_share(r: StepRecord) -> None:
    if r.step % 10 == 0:
        r.extra.update(grad_sampled=True, grad_zero_share=0.6, compute_dtype="float16")


def _scaled_flag(r: StepRecord) -> None:
    r.extra.update(scaler_checked=True, scaled_grads_step=r.step == 30)


def _clip_flag(r: StepRecord) -> None:
    r.extra.update(scaler_checked=True, clip_before_unscale=r.step == 30)


def _per_micro(r: StepRecord) -> None:
    r.extra["scheduler_steps"] = 4


def _cosine_past_end(r: StepRecord) -> None:
    # warmup to step 20, cosine to 0 at step 120, then on past its total: back up
    s = r.step
    r.lr = 1e-3 * (s / 20 if s < 20 else 0.5 * (1 + math.cos(math.pi * (s - 20) / 100)))


CASES: dict[str, tuple[Callable[[StepRecord], None], int]] = {
    "R001": (_nan, 150),
    "R002": (_spike, 0),
    "R003": (_flat, 0),
    "R004": (_oscillate, 100),
    "R010": (_grad_nan, 150),
    "R011": (_saturated, 0),
    "R012": (_tiny, 0),
    "R013": (_surge, 0),
    "R020": (_origin, 0),
    "R021": (_dead, 0),
    "R022": (_zero_share, 0),
    "R030": (_collapse, 100),
    "R031": (_skips, 0),
    "R032": (_scaled_flag, 0),
    "R033": (_clip_flag, 0),
    "R042": (_per_micro, 0),
    "R044": (_cosine_past_end, 0),
    "R050": (_near, 0),
    "R051": (_leak, 0),
    "R061": (_degrade, 100),
    "R062": (_data_wait, 100),
    "R063": (_outlier, 0),
    "R064": (_constant_wait, 0),
    "R080": (_ga_not_divided, 0),
    "R081": (_ga_uneven, 0),
    "R082": (_batch_changed, 100),
    "R090": (_position, 0),
    "R091": (_wrapped, 0),
    "R100": (_growth, 0),
    "R101": (_postln, 0),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires_on_its_fault(code: str) -> None:
    fn, start = CASES[code]
    stream = _with(_healthy(), _remember)
    assert code in _run(_with(stream, fn, start))


def test_duplicate_batch_fires_and_epochs_do_not() -> None:
    stream = _with(_with(_healthy(), _remember), _dup_batch)
    assert "R070" in _run(stream)
    # A dataset of 40 samples cycled: every epoch repeats it (R071, not R070); 20 passes
    # over 5 steps' worth of samples is a short cycle (R072); 800 samples (100 steps) over
    # 3 epochs is a real dataset (R071 only).
    def cycled(n: int, steps: int) -> Stream:
        rng = random.Random(1)
        data = [f"{rng.getrandbits(64):016x}" for _ in range(n)]
        epochs = []
        for s in range(steps):
            i = (s * 8) % n
            if i == 0:
                rng.shuffle(data)
            epochs.append(StepRecord(step=s, extra={"sample_hashes": data[i : i + 8]}))
        return epochs

    codes = _run(cycled(40, 100))
    assert "R070" not in codes and {"R071", "R072"} <= codes
    codes = _run(cycled(800, 300))
    assert "R071" in codes and not {"R070", "R072"} & codes


def test_scaled_gradients_from_a_log_alone() -> None:
    # A GradScaler run (torch-amp): a norm of the order of the scale is the signature.
    assert "R032" in _run(_with(_healthy(), _scaled), framework="torch-amp")
    assert "R032" not in _run(_healthy(), framework="torch-amp")
    # Framework unknown: a falling loss means the updates work (Adam normalises a scale
    # away), so the ratio alone is not evidence; a loss that does not fall is.
    assert "R032" not in _run(_with(_healthy(), _scaled))
    stuck = _with(_healthy(), _scaled)
    for r in stuck:
        r.loss = 5.0 + 0.01 * (r.step % 7)
    assert "R032" in _run(stuck)
    # Frameworks that unscale themselves never get it from the ratio.
    for fw in ("megatron", "deepspeed", "hf-trainer", "lightning"):
        assert "R032" not in _run(stuck, framework=fw)


def test_lr_schedule_checks_against_the_plan() -> None:
    plan = Plan.model_validate(
        {
            "optimizer": {"lr": 1e-3},
            "schedule": {"type": "cosine", "warmup_steps": 20, "total_steps": 200},
            "batch": {"micro_batch_size": 2, "gradient_accumulation_steps": 4},
        }
    )

    def lr_at(s: int) -> float:
        return expected_lr(s, kind="cosine", peak=1e-3, warmup=20, total=200, min_lr=0.0) or 0.0

    good = _with(_healthy(), lambda r: setattr(r, "lr", lr_at(r.step)))
    assert _warn(_run(good, plan)) == set()
    no_warmup = _with(_healthy(), lambda r: setattr(r, "lr", 1e-3))
    assert "R041" in _run(no_warmup, plan)
    per_micro = _with(_healthy(), lambda r: setattr(r, "lr", lr_at(4 * r.step)))
    assert "R042" in _run(per_micro, plan)
    wrong = _with(_healthy(), lambda r: setattr(r, "lr", 0.5 * lr_at(r.step) + 1e-5))
    assert "R040" in _run(wrong, plan)


def test_throughput_below_expectation() -> None:
    codes = _run(_healthy(), throughput={"expected_tokens_per_s": 50_000})
    assert "R060" in codes
    assert "R060" not in _run(_healthy(), throughput={"expected_tokens_per_s": 20_000})


def test_records_without_fields_are_ignored() -> None:
    bare = [StepRecord(step=s) for s in range(300)]
    assert _run(bare) == set()
    gaps = [StepRecord(step=s, loss=3.0 - s / 1000) for s in (0, 5, 900, 901, 5000)]
    assert _warn(_run(gaps)) == set()


def test_options_are_validated() -> None:
    with pytest.raises(InputError, match="unknown detector name"):
        default_detectors(nope={})
    with pytest.raises(InputError, match="loss detector"):
        default_detectors(loss={"windw": 3})
    kinds = {type(d) for d in default_detectors(exclude=["data"])}
    assert kinds == {cls for name, cls in DETECTORS.items() if name != "data"}


def test_every_runtime_rule_has_docs_and_a_case() -> None:
    runtime = [r for r in all_rules() if r.code.startswith("R")]
    assert len(runtime) >= 30
    for rule in runtime:
        assert rule.why and rule.signs and rule.fix
        # every R rule states the framework whose mechanics it assumes (sapper explain)
        assert "Frameworks:" in rule.why, rule.code
    # R110/R111 (eval loss) are tested in tests/logs/test_eval_detector.py, R043/R045 (LR
    # schedule shape) in test_detector_lr.py.
    tested = set(CASES) | {"R040", "R041", "R043", "R045", "R060", "R070", "R071", "R110"}
    tested |= {"R111"}
    # R072 (short data cycle) above; R120-R122 (setup) in tests/monitor/test_setup_faults.py.
    tested |= {"R072", "R120", "R121", "R122"}
    assert {r.code for r in runtime} - tested <= {"R102", "R190", "R191", "R192"}


def test_state_dict_round_trip() -> None:
    dets = default_detectors()
    stream = _healthy(60)
    DetectorSet(dets).run(stream[:30])
    fresh = default_detectors()
    for a, b in zip(dets, fresh, strict=True):
        b.load_state_dict(a.state_dict())
    assert _warn({f.code for f in DetectorSet(fresh).run(stream[30:])}) == set()


def test_plan_sets_position_limit_and_declared_norm_placement() -> None:
    plan = Plan.model_validate(
        {
            "model": {
                "hidden_size": 64,
                "num_layers": 2,
                "num_heads": 2,
                "vocab_size": 256,
                "max_position_embeddings": 1024,
                "norm_placement": "post",
            }
        }
    )
    stream = [
        StepRecord(step=0, extra={"norm_placement": "pre", "num_blocks": 2}),
        StepRecord(step=1, extra={"max_position": 1500}),
    ]
    found = {f.code: f for f in DetectorSet(default_detectors(plan)).run(stream)}
    assert found["R090"].threshold == 1023
    assert found["R102"].severity.value == "warning" and "declares post" in found["R102"].message


def test_expected_throughput_comes_from_the_cost_model() -> None:
    from sapper.runtime.detectors import plan_options

    plan = Plan.model_validate(
        {
            "model": {
                "hidden_size": 2048,
                "num_layers": 16,
                "num_heads": 16,
                "vocab_size": 32000,
                "max_position_embeddings": 4096,
                "position_encoding": "rope",
            },
            "precision": {"dtype": "bf16"},
            "batch": {"micro_batch_size": 4, "seq_len": 2048, "gradient_accumulation_steps": 2},
            "hardware": {"gpu": "H100", "num_gpus": 8},
        }
    )
    opts = plan_options(plan)
    expected = opts["throughput"]["expected_tokens_per_s"]
    assert 1e3 < expected < 1e6  # tokens/s of one data-parallel replica (one H100)
    slow = [StepRecord(step=s, tokens=8192, step_time_s=8192 / (0.2 * expected)) for s in range(30)]
    assert "R060" in {f.code for f in DetectorSet(default_detectors(plan)).run(slow)}
