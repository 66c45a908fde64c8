"""The hang analysis over per-rank faulthandler dumps (written here by real
faulthandler calls in child interpreters), and the step watch over run logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sapper.launch.hang import analyze_hang, read_stacks
from sapper.launch.supervise import StepWatch, exit_status

#: A child whose main thread waits in ``wait`` (a function of a module loaded from a
#: path) while another thread dumps every thread's stack, with one more thread alive.
#: The module's path decides whether the frame counts as a collective.
_CHILD = """
import faulthandler, importlib.util, sys, threading, time
spec = importlib.util.spec_from_file_location("waiter", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
out = open(sys.argv[2], "a")
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
def dump():
    faulthandler.dump_traceback(file=out, all_threads=True)
for _ in range(int(sys.argv[3])):
    mod.wait(dump)
"""


def _module(root: Path, rel: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    # The main thread sleeps in wait() while another thread dumps every stack, as the
    # bootstrap's trigger thread does while a rank is stuck.
    path.write_text(
        "import threading, time\n"
        "def wait(then):\n"
        "    threading.Thread(target=lambda: (time.sleep(0.2), then())).start()\n"
        "    time.sleep(1.0)\n"
    )
    return path


def _dump(stacks: Path, rank: int, module: Path, times: int = 1) -> None:
    out = stacks / f"rank{rank}-{1000 + rank}.txt"
    subprocess.run([sys.executable, "-c", _CHILD, str(module), str(out), str(times)],
                   check=True, timeout=60)


def test_the_rank_outside_the_collective_is_named(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    collective = _module(tmp_path, "site-packages/torch/distributed/distributed_c10d.py")
    elsewhere = _module(tmp_path, "project/data_loader.py")
    _dump(stacks, 0, collective)
    _dump(stacks, 1, elsewhere, times=2)  # SIGUSR1 after the trigger: two dumps
    _dump(stacks, 2, collective)
    ranks = read_stacks(stacks)
    assert sorted(ranks) == [0, 1, 2]
    assert ranks[0]["in_collective"] and not ranks[1]["in_collective"]
    assert ranks[1]["frame"].endswith("data_loader.py:4 in wait")
    assert ranks[1]["pid"] == 1001
    hang = analyze_hang(tmp_path, 12.0, {"rank0.jsonl": 7}, world_size=3)
    assert hang["suspects"] == [1]
    assert "rank 1 not in the collective" in hang["summary"]
    assert hang["missing_stacks"] == []
    json.dumps(hang)  # plain data for run.json


def test_a_rank_without_stacks_is_the_first_suspect(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    collective = _module(tmp_path, "torch/distributed/c10d.py")
    _dump(stacks, 0, collective)
    _dump(stacks, 1, collective)
    hang = analyze_hang(tmp_path, 5.0, {}, world_size=3)
    assert hang["missing_stacks"] == [2] and hang["suspects"] == [2]


def test_no_stacks_at_all(tmp_path: Path) -> None:
    hang = analyze_hang(tmp_path, 5.0, {}, world_size=2)
    assert hang["suspects"] == [] and hang["summary"] == "no rank wrote its stacks"


def _step_line(step: int) -> str:
    return json.dumps({"kind": "step", "step": step, "loss": 1.0}) + "\n"


def test_step_watch_moves_only_on_new_steps(tmp_path: Path) -> None:
    watch = StepWatch(tmp_path)
    assert watch.poll(now=0.0) is False and watch.stalled(now=5.0) is None  # not armed
    log = tmp_path / "rank0.jsonl"
    log.write_text(json.dumps({"kind": "meta", "version": 1}) + "\n" + _step_line(0))
    assert watch.poll(now=1.0) is True
    with log.open("a") as fh:  # a finding line grows the file but is no step progress
        fh.write(json.dumps({"kind": "finding", "code": "R001"}) + "\n")
    assert watch.poll(now=2.0) is False
    assert watch.stalled(now=4.0) == 3.0
    with log.open("a") as fh:
        fh.write(_step_line(1) + '{"kind": "step", "st')  # and a torn last line
    assert watch.poll(now=5.0) is True and watch.steps[log] == 1


def test_exit_status_is_the_shells() -> None:
    assert [exit_status(c) for c in (0, 3, -15, -9)] == [0, 3, 143, 137]
