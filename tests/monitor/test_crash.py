"""The run log keeps the records that explain a crash: real training processes killed
with SIGKILL at random steps lose at most ~1 s of records, SIGTERM loses none (and still
ends the process as it would have, through the previous handler), and a stalled loop's
records reach the disk within ~1 s. One fork server (crashrun.py) pays the imports once.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sapper.runtime.runlog import read_runlog

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and signals")

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"


class Server:
    """Drives crashrun.py: start a trial, follow its printed steps, signal it."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE)])}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "crashrun.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=HERE,
            env=env,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.split())

    def start(self, **spec: object) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        kind, _, pid = self.next(60)
        assert kind == "P"
        return int(pid)

    def next(self, timeout: float = 30) -> list[str]:
        return self.lines.get(timeout=timeout)

    def follow(self) -> Iterator[list[str]]:
        while True:
            parts = self.next()
            yield parts
            if parts[0] == "X":
                return

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def _trial(server: Server, path: Path, sig: int, at: int, **spec: object) -> dict:
    """Run a child, send ``sig`` once it printed step ``at``; its printed steps (step ->
    time), exit code and the run log's steps."""
    pid = server.start(id=path.stem, run_log=str(path), **spec)
    printed: dict[int, float] = {}
    code = None
    sent = False
    for parts in server.follow():
        if parts[0] == "S":
            printed[int(parts[2])] = float(parts[3])
            if int(parts[2]) >= at and not sent:
                os.kill(pid, sig)
                sent = True
        elif parts[0] == "X":
            code = int(parts[2])
    logged = [r.step for r in read_runlog(path).steps]
    return {"printed": printed, "code": code, "logged": logged}


def test_kill_9_loses_at_most_a_second_of_records(server: Server, tmp_path: Path) -> None:
    rng = random.Random(15)
    rows = []
    for trial in range(4):
        at = rng.randint(8, 45)
        sleep = rng.choice([0.0, 0.02, 0.04])  # fast steps (log_every rules), slow (time)
        out = _trial(server, tmp_path / f"k{trial}.jsonl", signal.SIGKILL, at, sleep=sleep)
        assert out["code"] == -signal.SIGKILL
        printed, logged = out["printed"], out["logged"]
        assert logged == list(range(len(logged)))  # in order, none torn or doubled
        last = max(printed)
        kept = logged[-1] if logged else None
        base = printed[kept] if kept is not None else min(printed.values())
        span = printed[last] - base  # the time covered by the records lost
        rows.append((at, sleep, last, kept, last - (kept if kept is not None else -1), span))
        assert span <= 1.0, rows
    print("\nkill -9: (kill after step, sleep/step, last printed, last logged, lost, lost s)")
    for row in rows:
        print("  ", row)


def test_sigterm_loses_nothing_and_still_terminates(server: Server, tmp_path: Path) -> None:
    out = _trial(server, tmp_path / "term.jsonl", signal.SIGTERM, 17, sleep=0.01)
    assert out["code"] == -signal.SIGTERM  # the default action ran after the flush
    assert out["logged"][-1] >= max(out["printed"])
    assert out["logged"] == list(range(len(out["logged"])))


def test_sigterm_chains_to_the_users_handler(server: Server, tmp_path: Path) -> None:
    path = tmp_path / "user.jsonl"
    out = _trial(server, path, signal.SIGTERM, 9, sleep=0.01, user_handler=True)
    assert out["code"] == 3  # the user's handler ran (and exited 3)
    assert out["logged"][-1] >= max(out["printed"])
    assert read_runlog(path).findings is not None


def test_a_stall_writes_the_records_within_a_second_or_two(
    server: Server, tmp_path: Path
) -> None:
    path = tmp_path / "stall.jsonl"
    pid = server.start(id="stall", run_log=str(path), stall_after=12)
    for parts in server.follow():
        if parts[0] == "Z":
            break
    stalled = time.monotonic()
    seen: list[int] = []
    while time.monotonic() - stalled < 3.0:
        if path.exists() and path.stat().st_size:
            seen = [r.step for r in read_runlog(path).steps]
            if seen and seen[-1] == 12:
                break
        time.sleep(0.05)
    waited = time.monotonic() - stalled
    os.kill(pid, signal.SIGKILL)
    for _ in server.follow():
        pass
    assert seen == list(range(13)), seen
    assert waited <= 2.0
