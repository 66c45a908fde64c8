"""X001's per-rank window peak: values are kept per event and folded once per window;
the fold must say what an event-by-event reading would (largest value before the first
non-finite event, and where each was), also when the kept values overflow into the
carried result."""

from __future__ import annotations

import math
import random

import pytest
import torch

from sapper.distributed.evidence import LocalGradNorm, OutputMax, WindowPeak


def _expected(values: list[float], first_step: int, steps: int) -> dict[str, float]:
    """The window's numbers, read one event at a time on the host."""
    peak, peak_at, first_bad = 0.0, 0, -1
    for i, v in enumerate(values):
        if not math.isfinite(v):
            first_bad = i
            break
        if i == 0 or v > peak:
            peak, peak_at = v, i
    steps, n = max(steps, 1), len(values)
    return {
        "peak": peak,
        "peak_step": first_step + peak_at * steps // n,
        "nonfinite_step": -1.0 if first_bad < 0 else first_step + first_bad * steps // n,
    }


@pytest.fixture(params=[True, False], ids=["host fold", "tensor fold"])
def host_fold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every fold test runs both folds: floats for CPU values, tensor ops elsewhere."""
    monkeypatch.setattr(WindowPeak, "HOST_FOLD", request.param)
    return bool(request.param)


@pytest.mark.parametrize("keep", [1, 3, 1024])
def test_the_window_fold_matches_an_event_by_event_reading(keep: int, host_fold: bool) -> None:
    rng = random.Random(keep)
    for _ in range(60):
        values = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            values.append(
                math.nan if r < 0.05 else math.inf if r < 0.08 else rng.choice([rng.random(), 2.0])
            )
        values = torch.tensor(values).tolist()  # the float32 values the device holds
        peak = WindowPeak()
        peak.KEEP = keep
        for v in values:
            peak.add(torch.tensor(v))
        first, steps = rng.randint(0, 50), rng.randint(1, 8)
        got = {k: float(t) for k, t in peak.take(first, steps).items()}
        assert got == _expected(values, first, steps), (values, keep)


def test_an_event_keeps_its_value_without_running_a_kernel(host_fold: bool) -> None:
    # the per-step cost is a list append: nothing is computed until take()
    peak = WindowPeak()
    v = torch.tensor(3.0)
    peak.add(v)
    assert peak.peak is None and peak.events == 1
    assert float(peak.take(10, 1)["peak"]) == 3.0
    assert peak.take(11, 1) == {}  # a new, empty window


class _Out(torch.nn.Module):
    """A module whose forward returns what it is given (the hook sees that output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _window(values: list[torch.Tensor]) -> tuple[OutputMax, dict[str, float]]:
    module = _Out()
    watch = OutputMax(module)
    for v in values:
        module(v.requires_grad_(True))  # a training forward (grad enabled)
    return watch, {k: float(t) for k, t in watch.take(100, len(values)).items()}


def test_output_nonfinite_is_found_on_every_forward_and_the_peak_on_the_cadence(
    host_fold: bool,
) -> None:
    every = OutputMax.MAGNITUDE_EVERY
    outs = [torch.full((3, 5), float(i + 1)) for i in range(2 * every)]
    outs[every + 3] = outs[every + 3].clone()
    outs[every + 3][1, 2] = math.nan  # a forward without a magnitude reading
    _, got = _window(outs)
    assert got["nonfinite_step"] == 100 + every + 3  # exact, off the cadence
    assert got["peak"] == every + 1  # the last forward read before it (forward `every`)
    assert got["peak_step"] == 100 + every
    # an infinity, and huge negative values, are found the same way
    outs = [torch.ones(4) for _ in range(3)]
    outs[2] = torch.tensor([1.0, -math.inf, 0.0, 0.0])
    _, got = _window(outs)
    assert got["nonfinite_step"] == 102 and got["peak"] == 1.0
    outs = [torch.tensor([-5.0, 2.0]), torch.ones(2)]
    _, got = _window(outs)
    assert got == {"peak": 5.0, "peak_step": 100.0, "nonfinite_step": -1.0}


def test_a_window_without_a_magnitude_reading_reports_no_peak(host_fold: bool) -> None:
    module = _Out()
    watch = OutputMax(module)
    module(torch.ones(2, requires_grad=True))  # forward 0: read
    watch.take(0, 1)
    for _ in range(OutputMax.MAGNITUDE_EVERY - 1):  # forwards 1..7: none read
        module(torch.full((2,), 7.0, requires_grad=True))
    got = watch.take(1, OutputMax.MAGNITUDE_EVERY - 1)
    assert "peak" not in got and float(got["nonfinite_step"]) == -1.0
    with torch.no_grad():  # evaluation forwards are not counted
        module(torch.full((2,), math.nan))
    assert watch.take(8, 1) == {}


class _Bucket:
    def __init__(self, values: torch.Tensor, last: bool) -> None:
        self._values, self._last = values, last

    def buffer(self) -> torch.Tensor:
        return self._values

    def is_last(self) -> bool:
        return self._last


def test_the_local_gradient_norm_is_the_buckets_norm_before_the_all_reduce(host_fold: bool) -> None:
    # the communication hook's own path, with the all-reduce replaced by a record of it
    state = LocalGradNorm.__new__(LocalGradNorm)
    WindowPeak.__init__(state)
    state._buckets, state.process_group = [], None
    reduced: list[torch.Tensor] = []
    state._allreduce = lambda _group, bucket: reduced.append(bucket.buffer())
    torch.manual_seed(0)
    backwards = [
        [torch.randn(1000), torch.randn(300)],
        [torch.randn(1000) * 30, torch.randn(300).bfloat16()],  # a half-precision bucket
        [torch.randn(1300)],
    ]
    for buckets in backwards:
        for i, b in enumerate(buckets):
            LocalGradNorm._hook(state, _Bucket(b, last=i == len(buckets) - 1))
    assert len(reduced) == 5  # every bucket still goes to the all-reduce
    norms = [
        float(torch.linalg.vector_norm(torch.cat([b.float() for b in bs])))
        for bs in backwards
    ]
    got = state.take(10, 3)
    assert float(got["peak"]) == pytest.approx(max(norms), rel=1e-5)
    assert float(got["peak_step"]) == 11.0 and float(got["nonfinite_step"]) == -1.0
    LocalGradNorm._hook(state, _Bucket(torch.tensor([1.0, math.inf]), last=True))
    assert float(state.take(13, 1)["nonfinite_step"]) == 13.0


def test_an_event_maps_to_its_step_in_integers(host_fold: bool) -> None:
    # 22 backwards over 26 steps: backward 11 is step 11 * 26 // 22 = 13 (a float32
    # product, 11 * (26 / 22), lands just under 13)
    peak = WindowPeak()
    for i in range(22):
        peak.add(torch.tensor(math.nan if i == 11 else 1.0))
    assert float(peak.take(100, 26)["nonfinite_step"]) == 113.0


def _events(rng: random.Random) -> list[torch.Tensor | tuple[torch.Tensor, ...]]:
    """Kept output values: sums alone, or (min, max, sum) on magnitude forwards, in
    float32, bfloat16 and float64, some non-finite."""
    out: list[torch.Tensor | tuple[torch.Tensor, ...]] = []
    for _ in range(rng.randint(1, 40)):
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float64])
        x = (torch.randn(6, generator=torch.Generator().manual_seed(rng.randint(0, 999)))
             * rng.choice([1.0, 1e3, 1e-3])).to(dtype)
        r = rng.random()
        if r < 0.06:
            x[rng.randint(0, 5)] = rng.choice([math.nan, math.inf, -math.inf])
        total = x.sum(dtype=torch.float32) if x.element_size() < 4 else x.sum()
        out.append((*torch.aminmax(x), total) if rng.random() < 0.3 else total)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_the_host_and_tensor_folds_agree(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    outputs = _events(rng)
    backwards: list[torch.Tensor | list[torch.Tensor]] = []
    for _ in range(rng.randint(1, 40)):
        buckets = [torch.randn(50) * rng.choice([1.0, 1e4]) for _ in range(rng.choice([1, 2, 3]))]
        if rng.random() < 0.05:
            buckets[-1][0] = math.nan
        squares = [torch.dot(b, b) for b in buckets]
        backwards.append(squares[0] if len(squares) == 1 else squares)
    first, steps = rng.randint(0, 50), rng.randint(1, 30)
    got = {}
    for host in (True, False):
        monkeypatch.setattr(WindowPeak, "HOST_FOLD", host)
        out_peak = OutputMax.__new__(OutputMax)
        WindowPeak.__init__(out_peak)
        out_peak._measured = 1
        norm = LocalGradNorm.__new__(LocalGradNorm)
        WindowPeak.__init__(norm)
        for v in outputs:
            out_peak.add(v)
        for v in backwards:
            norm.add(v)
        got[host] = (out_peak.take(first, steps), norm.take(first, steps))
    for host_got, tensor_got in zip(got[True], got[False], strict=True):
        assert set(host_got) == set(tensor_got)
        for key, value in host_got.items():
            assert isinstance(value, float), key  # CPU values: host numbers, no tensors
            want = float(tensor_got[key])
            if key == "peak":
                assert value == pytest.approx(want, rel=1e-6), (seed, key)
            else:
                assert value == want, (seed, key)
