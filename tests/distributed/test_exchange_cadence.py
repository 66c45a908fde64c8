"""The cross-rank exchange's cadence inside the monitor: every ``every`` steps, put off
on quick steps to about one per ``min_interval_s`` (bounded), decided from the exchanged
step times so that every rank lands on the same step; real 2-rank jobs (gloo) keep
finding a rank's NaN with the stretched cadence."""

from __future__ import annotations

from typing import Any

import pytest

from sapper.distributed import DIST_KEY, RankTable
from sapper.distributed.bridge import DEFAULT_MIN_INTERVAL_S, MonitorBridge
from sapper.distributed.table import COLUMNS
from sapper.errors import InputError


class _Tracker:
    """What the bridge reads of its tracker: the table of the last exchange."""

    def __init__(self) -> None:
        self.last_table: RankTable | None = None
        self.exchanges: list[int] = []
        self.active = True

    def add_records(self, records: Any) -> None:
        pass

    def exchange(self, record: Any = None) -> list:
        self.exchanges.append(record)
        return []


def _table(step_times: list[float | None]) -> RankTable:
    world = len(step_times)
    cols: dict[str, list[float | None]] = {name: [None] * world for name in COLUMNS}
    cols["step"] = [20.0] * world
    cols["step_time_s"] = step_times
    everyone = [list(range(world))]
    return RankTable(step=20, columns=cols, data_groups=everyone, param_groups=everyone,
                     prev_step=0)


def _next_after_exchange(step_times: list[float | None] | None, min_s: float) -> int:
    tracker = _Tracker()
    bridge = MonitorBridge(tracker, every=20, min_interval_s=min_s)  # type: ignore[arg-type]
    tracker.last_table = _table(step_times) if step_times is not None else None
    assert bridge.due(20) and not bridge.due(19)
    bridge.on_records([], 20)
    assert len(tracker.exchanges) == 1
    return bridge.interval


def test_slow_steps_keep_the_step_cadence() -> None:
    assert _next_after_exchange([1.0, 1.2], 0.5) == 20


def test_quick_steps_exchange_about_once_per_interval_from_the_slowest_rank() -> None:
    # 10 ms steps (the slowest rank's): 0.5 s is 50 steps
    assert _next_after_exchange([0.004, 0.010], 0.5) == 50


def test_the_default_floor_is_one_exchange_a_second_on_quick_steps() -> None:
    # 20 ms steps: one exchange a second is 50 steps (the step cadence alone would be 20)
    tracker = _Tracker()
    bridge = MonitorBridge(tracker, every=20)  # type: ignore[arg-type]
    assert bridge.min_interval_s == DEFAULT_MIN_INTERVAL_S == 1.0
    tracker.last_table = _table([0.020, 0.018])
    bridge.on_records([], 20)
    assert bridge.interval == 50
    assert not bridge.due(69) and bridge.due(70)


def test_the_stretch_is_bounded() -> None:
    # a window of very quick steps must not leave the next slow ones unchecked for long
    assert _next_after_exchange([1e-5, 1e-5], 0.5) == 20 * MonitorBridge.MAX_STRETCH


def test_no_floor_or_no_step_times_keep_the_step_cadence() -> None:
    assert _next_after_exchange([0.001, 0.001], 0.0) == 20
    assert _next_after_exchange([None, None], 0.5) == 20
    assert _next_after_exchange(None, 0.5) == 20


def test_a_bad_floor_is_an_input_error_naming_the_option(monkeypatch: Any) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    with pytest.raises(InputError) as err:
        MonitorBridge.attach(None, options={"min_interval_s": "soon"})
    assert "min_interval_s" in str(err.value) and "soon" in str(err.value)


@pytest.mark.slow
def test_a_rank_nan_is_still_found_with_the_stretched_cadence(job: Any) -> None:
    # quick steps: the time floor stretches the cadence past `every`; X001 still names the
    # rank whose loss went NaN first, at the later exchange
    j = job(2, {"steps": 40, "every": 3, "monitor": True, "nan_rank": 1, "nan_step": 4,
                "min_interval_s": 0.5})
    assert j.returncodes == [0, 0], j.explain()
    x = [f for f in j.rank(0)["findings"] if f["code"].startswith("X")]
    assert [(f["code"], f["rank"], f["step"]) for f in x] == [("X001", 1, 4)], j.explain()
    assert not [f for f in j.rank(1)["findings"] if f["code"].startswith("X")]
    logged = [r["step"] for r in j.rank(0)["records"] if DIST_KEY in r.get("extra", {})]
    assert logged[0] == 2 and logged[1] - logged[0] > 3  # stretched past every 3 steps
