"""How often the watcher reads a log a job writes all the time: once per poll interval.

A Megatron log holds its newest step back until the next step's line, so after a poll
the watcher may wake early to release it once the writer has gone quiet. While the
writer keeps writing, that early wake only asks the file (``Follower.pending``) and
sleeps on to the regular poll; when the writer stops, the held step still comes out
within the settle time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from watchkit import Recorder, Running

from sapper.watch import FileFollower, Watcher

POLL = 0.4


def _line(step: int, loss: str = "2.500000E+00") -> str:
    return (
        f" iteration {step:8d}/  100000 | consumed samples: {16 * step:12d} | elapsed time per "
        f"iteration (ms): 250.0 | learning rate: 1.000000E-04 | global batch size:    16 | "
        f"lm loss: {loss} | loss scale: 1.0 | grad norm: 0.400 | number of skipped "
        "iterations:   0 | number of nan iterations:   0 |\n"
    )


class _Writer(threading.Thread):
    """Appends one line every 20 ms until stopped (a job logging every iteration)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.step, self.halt = path, 0, threading.Event()

    def run(self) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            while not self.halt.is_set():
                self.step += 1
                fh.write(_line(self.step))
                fh.flush()
                time.sleep(0.02)


def test_a_steady_writer_is_read_once_per_poll_and_the_last_step_settles(tmp_path: Path):
    log = tmp_path / "train.log"
    log.write_text(_line(0))
    writer = _Writer(log)
    writer.start()
    watcher = Watcher(FileFollower(log), poll=POLL, idle_timeout=0, sinks=[rec := Recorder()])
    ticks: list[float] = []
    tick = watcher.tick

    def counted() -> float:
        ticks.append(time.monotonic())
        return tick()

    watcher.tick = counted  # type: ignore[method-assign]
    run = Running(watcher)
    time.sleep(8 * POLL)
    steady = len(ticks)
    # one read per poll interval (a read at each settle deadline was about four per poll)
    assert steady <= 8 + 3, ticks
    # the writer stops after a NaN line: it is the last step, held back, then released
    writer.halt.set()
    writer.join()
    with log.open("a", encoding="utf-8") as fh:
        fh.write(_line(writer.step + 1, "nan"))
    written = time.monotonic()
    assert run.wait_for(lambda: rec.seen and rec.seen[-1].step == writer.step + 1, timeout=5)
    assert time.monotonic() - written <= POLL + watcher.settle_s + 0.5
    result = run.stop()
    assert result.records == writer.step + 2  # steps 0 … the NaN line, none lost
    assert any(f.code == "R001" and f.step == writer.step + 1 for f in result.findings)
