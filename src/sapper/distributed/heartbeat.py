"""A lost rank named wherever the others are blocked: a heartbeat thread per rank.

sapper's exchange notices a lost rank only when the others reach the exchange. A rank
that crashes or hangs elsewhere — in the forward, in DDP's gradient all-reduce — leaves
the others blocked inside the training's own collective until *its* timeout (minutes),
and under torchrun the agent kills the survivors a fraction of a second after a child
dies: nothing would say which rank it was. So every rank runs a daemon thread that
writes a small beat to the job's key-value store every ``interval_s``:
``"<seq> <step> <phase> <progress>"`` — a counter, the optimizer steps done, where the
rank is (data, forward, backward, optimizer, sapper's exchange) and a counter of phase
changes. The watcher (rank 0; rank 1 watches rank 0 and takes over if it goes) reads all
beats with one ``multi_get`` and names:

* a **crash** — the beats stopped for ``lost_after_s`` (process gone, or frozen while
  holding the interpreter);
* a **hang** — the beats go on but the rank has not moved for ``hang_after_s`` while
  other ranks are further on (waiting for it), with the phase it is stuck in.

Findings go to a callback at once (the monitor writes them through to the run log), from
the thread: host work only. On SIGTERM — how torchrun stops the survivors — the watcher
is woken through the signal wake-up file descriptor even while the main thread sits in a
C collective, takes one quick look (a rank whose beat does not advance within 1.2 beat
intervals is gone), reports, and lets the termination proceed; so the cause is on disk
before the job is torn down.

**Dumps before the teardown** (for ``sapper diagnose`` over the dumps, docs/hangs.md):
when the watcher names a lost or stuck rank it touches ``$SAPPER_RUN_DIR/.sapper-dump``,
the trigger every rank's ``sapper run`` bootstrap polls once a second (each then writes
its flight-recorder dump to ``fr/rank_<R>`` and its ``faulthandler`` stacks to
``stacks/rank<R>-<pid>.txt``), and writes its own at once. On SIGTERM or an uncaught error
every rank writes its own before going down (the poll could come too late): into the run
folder under ``sapper run``; otherwise, when the user turned the recorder on, where
torch's own timeout dump goes (``TORCH_FR_DUMP_TEMP_FILE`` or
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, + rank) with the stacks beside it
(``<prefix><rank>.stacks``). Never when the user set the recorder off
(``TORCH_FR_BUFFER_SIZE``/``TORCH_NCCL_TRACE_BUFFER_SIZE`` = 0); :func:`recorder_env` is
what a launcher adds to turn it on where the user set neither (recent torch keeps 2000
entries by default). The recorder's cost: one entry per collective in a ring of 2000
(not measurable next to a 30 µs gloo all-reduce on a CPU; ~250 kB per process). A dump:
~0.1 s without the entries' C++/Python stacks (what the SIGTERM path writes: the
faulthandler stacks say where the rank is), 3-4 s with them (the watcher's), measured with
torch 2.13 on a loaded CPU.

Cost: one store write per rank per interval (keep it ≥ 1 s; it grows with the world as
``max(1 s, world / 4096 s)`` by default, so the store sees at most ~4k writes/s), and one
``multi_get`` of ``world`` short keys per interval on the watcher (≈ 30 bytes a rank:
0.5 MB/s at 16k ranks). Each rank opens one extra client connection to the store so the
thread never waits behind the training's own store calls.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sapper.distributed.rules import RANK_LOST
from sapper.rules.model import Finding
from sapper.runtime.rundir import DUMP_TRIGGER

__all__ = ["PHASES", "Heartbeat", "dump_local", "job_store", "recorder_env"]

#: Where a rank can be, in the order a step goes through them.
PHASES = ("start", "data", "forward", "backward", "optimizer", "exchange", "done")
_WORDS = {
    "start": "start-up",
    "data": "data loading / the loop between steps",
    "forward": "the forward",
    "backward": "the backward (or DDP's gradient all-reduce)",
    "optimizer": "the optimizer step",
    "exchange": "sapper's exchange",
    "done": "its end (monitor closed or interpreter exiting)",
}
_instances = 0


def job_store(timeout_s: float = 30.0) -> tuple[Any, bool]:
    """A client of the job's store for the heartbeat thread alone, and whether rank 0's
    process hosts it (outside torchrun's agent store it dies with rank 0). A fresh
    connection to MASTER_ADDR:MASTER_PORT when the launcher set them, else the default
    process group's store (shared with the training's own calls)."""
    import torch.distributed as dist

    hosted_by_rank0 = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        with contextlib.suppress(Exception):
            store = dist.TCPStore(
                addr, int(port), is_master=False, timeout=timedelta(seconds=timeout_s)
            )
            return store, hosted_by_rank0
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store(), hosted_by_rank0


#: Entries of the flight recorder's ring when a launcher turns it on.
RECORDER_ENTRIES = 2000
_RECORDER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def recorder_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What to add to a job's environment to turn the flight recorder on: nothing when
    the user set either buffer variable (to any value, 0 included: off for a reason)."""
    env = os.environ if environ is None else environ
    if any(k in env for k in _RECORDER_VARS):
        return {}
    return {"TORCH_FR_BUFFER_SIZE": str(RECORDER_ENTRIES)}


def _recorder_set() -> bool | None:
    """True when the user set a buffer above 0, False when to 0, None when unset."""
    values = [(os.environ.get(k) or "").strip() for k in _RECORDER_VARS if k in os.environ]
    if not values:
        return None
    return any(v.isdigit() and int(v) > 0 for v in values)


def dump_local(rank: int, entry_stacks: bool = True) -> list[str]:
    """This process's Python stacks (every thread, ``faulthandler``) and, unless the
    recorder is off, its flight-recorder dump (with each entry's stack when
    ``entry_stacks``), written where the hang analysis looks (see the module's
    docstring); the paths written. Never raises."""
    written: list[str] = []
    run_dir = os.environ.get("SAPPER_RUN_DIR")
    prefix = next((os.environ[k] for k in _PREFIX_VARS if os.environ.get(k)),
                  "/tmp/nccl_trace_rank_")  # fmt: skip
    if run_dir:
        stacks = os.path.join(run_dir, "stacks", f"rank{rank}-{os.getpid()}.txt")
        recorder = os.path.join(run_dir, "fr", f"rank_{rank}")
    elif _recorder_set():  # no run folder: only for a user who turned the recorder on
        stacks, recorder = f"{prefix}{rank}.stacks", f"{prefix}{rank}"
    else:
        return written
    with contextlib.suppress(Exception):
        os.makedirs(os.path.dirname(stacks) or ".", exist_ok=True)
        with open(stacks, "a") as out:
            faulthandler.dump_traceback(out, all_threads=True)
        written.append(stacks)
    if _recorder_set() is not False:
        with contextlib.suppress(Exception):
            import torch

            c10d = getattr(torch._C, "_distributed_c10d", None)
            # torch >= 2.7 names it _dump_fr_trace; 2.4-2.6 _dump_nccl_trace (NCCL only)
            dump = getattr(c10d, "_dump_fr_trace", None) or getattr(
                c10d, "_dump_nccl_trace", None)
            if dump is not None:
                try:
                    data = bytes(dump(includeStackTraces=entry_stacks))
                except TypeError:  # a torch without the keyword
                    data = bytes(dump())
                os.makedirs(os.path.dirname(recorder) or ".", exist_ok=True)
                tmp = f"{recorder}.{os.getpid()}.tmp"
                with open(tmp, "wb") as out:
                    out.write(data)
                os.replace(tmp, recorder)
                written.append(recorder)
    return written


@dataclass
class _Seen:
    """What the watcher knows of one rank (monotonic times of the watcher's clock)."""

    seq: int
    step: int
    phase: str
    progress: int
    beat_at: float
    moved_at: float


class Heartbeat:
    """One rank's beat, and the watcher on ranks ``< watchers``. ``mark`` and
    ``step_done`` are called on the training thread (plain attribute writes)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        report: Callable[[list[Finding]], None],
        *,
        interval_s: float | None = None,
        lost_after_s: float = 30.0,
        hang_after_s: float = 300.0,
        start_step: int = 0,
        watchers: int = 2,
        store_hosted_by_rank0: bool = False,
        grace_s: float = 3.0,
    ) -> None:
        global _instances
        _instances += 1
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"sapper/{attempt}/{_instances}/beat/"
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.report = report
        self.interval_s = interval_s if interval_s else max(1.0, world_size / 4096)
        self.lost_after_s = lost_after_s
        self.hang_after_s = hang_after_s
        self.start_step = start_step
        self.watching = rank < min(watchers, world_size)
        self.store_hosted_by_rank0 = store_hosted_by_rank0
        self.grace_s = grace_s
        self.phase = "start"
        self.steps = 0
        self.progress = 0
        self.seq = 0
        #: Ranks named lost (by this watcher, or by the exchange through ``named``).
        self.named: set[int] = set()
        self.seen: dict[int, _Seen] = {}
        self._stop = threading.Event()
        self._terminated = threading.Event()
        self._sweep_lock = threading.Lock()
        self._store_down_since: float | None = None
        self._thread: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._old_wakeup = -1
        self._prev_term: Any = None
        self._exit_on_term = False
        self._swept = False
        self._sweeping: int | None = None
        self._term_pending: tuple[int, Any] | None = None
        self._handles: list[Any] = []
        self._prev_excepthook: Any = None
        #: Paths this rank's dumps went to (written once).
        self.dumped: list[str] | None = None

    # ---- the training thread -----------------------------------------------------
    def mark(self, phase: str) -> None:
        self.phase = phase
        self.progress += 1

    def step_done(self) -> None:
        self.steps += 1
        self.mark("data")

    def hook_module(self, module: Any) -> None:
        """Follow the forward (pre-hook) and the backward (after the forward) of
        ``module``, and every optimizer's step (torch's global optimizer hooks)."""
        self._handles.append(module.register_forward_pre_hook(lambda *_: self.mark("forward")))
        self._handles.append(module.register_forward_hook(lambda *_: self.mark("backward")))
        with contextlib.suppress(Exception):
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._handles.append(
                register_optimizer_step_pre_hook(lambda *_: self.mark("optimizer"))
            )
            self._handles.append(register_optimizer_step_post_hook(lambda *_: self.step_done()))

    def start(self) -> None:
        """Write the first beat now (so peers find the key), then beat in a thread."""
        self._beat()
        atexit.register(self._done)  # a clean exit is no crash (os._exit skips this)
        if threading.current_thread() is threading.main_thread():
            self._install_signal()
            self._prev_excepthook = sys.excepthook
            sys.excepthook = self._excepthook
        self._thread = threading.Thread(
            target=self._run, name=f"sapper-heartbeat-{self.rank}", daemon=True
        )
        self._thread.start()

    def _done(self) -> None:
        if self.phase != "done":
            self.mark("done")
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1.0)
        self._done()
        atexit.unregister(self._done)
        for h in self._handles:
            h.remove()
        self._handles = []
        if threading.current_thread() is threading.main_thread():
            self._uninstall_signal()
            if sys.excepthook == self._excepthook and self._prev_excepthook is not None:
                sys.excepthook = self._prev_excepthook

    # ---- the thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if self._wait(self.interval_s):
                self._on_sigterm_seen()
                continue
            self._beat()
            if self.watching:
                try:
                    self._watch()
                except Exception:  # never let the watcher take the process down
                    pass

    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` (or until stopped); True when a SIGTERM woke us."""
        if self._wake is None:
            self._stop.wait(seconds)
            return False
        try:
            ready, _, _ = select.select([self._wake[0]], [], [], seconds)
            if ready:
                data = self._wake[0].recv(64)
                return bytes([signal.SIGTERM]) in data
        except (OSError, ValueError):
            self._stop.wait(seconds)
        return False

    def _beat(self) -> None:
        self.seq += 1
        value = f"{self.seq} {self.start_step + self.steps} {self.phase} {self.progress}"
        try:
            self.store.set(self.prefix + str(self.rank), value)
        except Exception:
            pass  # the store's host is gone: the watcher below will say so

    def _targets(self) -> list[int]:
        """Rank 0 watches everyone; a backup watcher watches the watchers below it until
        they are all lost, then everyone."""
        lower = [r for r in range(self.rank) if r not in self.named]
        if lower:
            return lower
        return [r for r in range(self.world_size) if r != self.rank]

    def _read(self, ranks: list[int]) -> dict[int, tuple[int, int, str, int]]:
        keys = [self.prefix + str(r) for r in ranks]
        if self.store.check(keys):
            values = self.store.multi_get(keys)
            pairs = list(zip(ranks, values, strict=True))
        else:  # some rank has not written its first beat yet
            pairs = [(r, self.store.get(k)) for r, k in zip(ranks, keys, strict=True)
                     if self.store.check([k])]
        out = {}
        for r, raw in pairs:
            seq, step, phase, progress = bytes(raw).decode().split()
            out[r] = (int(seq), int(step), phase, int(progress))
        return out

    def _update(self, beats: dict[int, tuple[int, int, str, int]], now: float) -> None:
        for r, (seq, step, phase, progress) in beats.items():
            old = self.seen.get(r)
            if old is None:
                self.seen[r] = _Seen(seq, step, phase, progress, now, now)
                continue
            if seq != old.seq:
                old.seq, old.beat_at = seq, now
            if progress != old.progress or step != old.step:
                old.moved_at = now
            old.step, old.phase, old.progress = step, phase, progress

    def _watch(self) -> None:
        now = time.monotonic()
        try:
            beats = self._read(self._targets())
        except Exception:
            self._store_down(now)
            return
        self._store_down_since = None
        self._update(beats, now)
        found = []
        for r, s in sorted(self.seen.items()):
            if r in self.named or s.phase == "done":
                continue
            if now - s.beat_at > self.lost_after_s:
                found.append(self._crash(r, s, now - s.beat_at, None))
            elif now - s.moved_at > self.hang_after_s and self._behind(r):
                found.append(self._hang(r, s, now - s.moved_at))
        self._say(found)

    def _store_down(self, now: float) -> None:
        if self._store_down_since is None:
            self._store_down_since = now
            return
        if (
            self.rank != 0
            and self.store_hosted_by_rank0
            and 0 not in self.named
            and now - self._store_down_since > self.lost_after_s
        ):
            msg = (
                "rank 0 is gone: the job's store, which its process hosts (outside "
                f"torchrun's agent store), stopped answering {now - self._store_down_since:.1f}"
                " s ago; seen by rank 1's heartbeat watcher"
            )
            self._say([self._finding(0, msg, "crash", None, now - self._store_down_since)])

    def _position(self, s: _Seen) -> tuple[int, int]:
        return s.step, PHASES.index(s.phase) if s.phase in PHASES else 0

    def _behind(self, r: int) -> bool:
        """Other live ranks are further on: they wait for ``r``."""
        mine = self._position(self.seen[r])
        others = [self._position(s) for o, s in self.seen.items() if o != r and o not in self.named]
        if self.rank not in self.seen:
            others.append((self.start_step + self.steps, PHASES.index(self.phase)))
        return any(p > mine for p in others)

    def _where_others(self, r: int) -> str:
        parts = {}
        me = _Seen(0, self.start_step + self.steps, self.phase, 0, 0.0, 0.0)
        for o, s in [*self.seen.items(), (self.rank, me)]:
            if o != r and o not in self.named:
                parts.setdefault(f"{_WORDS.get(s.phase, s.phase)} of step {s.step}", []).append(o)
        return "; ".join(
            f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, sorted(rs)))} in {w}"
            for w, rs in sorted(parts.items(), key=lambda kv: min(kv[1]))
        )

    def _crash(self, r: int, s: _Seen, age: float, why: str | None) -> Finding:
        msg = (
            f"rank {r} stopped: its heartbeat ended {age:.1f} s ago, last seen in "
            f"{_WORDS.get(s.phase, s.phase)} of step {s.step} (its process is gone, or "
            f"frozen holding the interpreter){why or ''}; the others wait: "
            f"{self._where_others(r)}"
        )
        return self._finding(r, msg, "crash", s, age)

    def _hang(self, r: int, s: _Seen, age: float) -> Finding:
        msg = (
            f"rank {r} hangs: alive (its heartbeat goes on) but stuck for {age:.1f} s in "
            f"{_WORDS.get(s.phase, s.phase)} of step {s.step}, while the others wait: "
            f"{self._where_others(r)}"
        )
        return self._finding(r, msg, "hang", s, age)

    def _finding(self, r: int, msg: str, kind: str, s: _Seen | None, age: float) -> Finding:
        limit = self.hang_after_s if kind == "hang" else self.lost_after_s
        return RANK_LOST.finding(
            msg,
            step=s.step if s is not None else None,
            rank=r,
            value=round(age, 3),
            threshold=limit,
            ranks=[r],
            kind=kind,
            phase=s.phase if s is not None else None,
            world_size=self.world_size,
            source="heartbeat",
        )

    def _say(self, found: list[Finding]) -> None:
        found = [f for f in found if f.rank not in self.named]
        if not found:
            return
        self.named.update(f.rank for f in found if f.rank is not None)
        if self.rank != 0 and 0 not in self.named:
            return  # rank 0 is alive and reports; a backup only speaks for it
        self.report(found)
        self._request_dumps()  # after the report: a dump with stacks takes seconds

    # ---- dumps for the hang analysis --------------------------------------------------
    def _request_dumps(self) -> None:
        """Every rank of a ``sapper run`` dumps (the trigger file); this one at once."""
        run_dir = os.environ.get("SAPPER_RUN_DIR")
        if run_dir:
            with contextlib.suppress(OSError):
                with open(os.path.join(run_dir, DUMP_TRIGGER), "a"):
                    pass
                os.utime(os.path.join(run_dir, DUMP_TRIGGER))
        self._dump_once(entry_stacks=True)

    def _dump_once(self, entry_stacks: bool = False) -> None:
        if self.dumped is None:
            self.dumped = dump_local(self.rank, entry_stacks)

    # ---- SIGTERM ---------------------------------------------------------------------
    def sweep(self, why: str) -> None:
        """A quick look before the job goes down: ranks whose beat does not advance within
        1.2 intervals are named (once; from the signal handler, the excepthook or the
        thread, whichever comes first)."""
        if not self.watching or not self._sweep_lock.acquire(timeout=2 * self.interval_s + 1):
            return
        try:
            if self._swept:  # the other thread looked already
                return
            self._swept = True
            self._sweeping = threading.get_ident()
            start = time.monotonic()
            first = self._read(self._targets())
            self._update(first, start)
            deadline = start + 1.2 * self.interval_s + 0.1
            stale = set(first)
            while stale and time.monotonic() < deadline:
                time.sleep(0.1)
                now = self._read(sorted(stale))
                stale = {r for r in stale if r in now and now[r][0] == first[r][0]}
            self._update(self._read(self._targets()), time.monotonic())
            now = time.monotonic()
            self._say(
                [self._crash(r, self.seen[r], now - self.seen[r].beat_at, why)
                 for r in sorted(stale) if r in self.seen and self.seen[r].phase != "done"]
            )
        except Exception:
            pass
        finally:
            self._sweeping = None
            self._sweep_lock.release()
        pending, self._term_pending = self._term_pending, None
        if pending is not None:  # SIGTERM came while this thread was looking
            self._terminate(*pending)

    def _install_signal(self) -> None:
        prev = signal.getsignal(signal.SIGTERM)
        if prev is signal.SIG_IGN or prev is None:
            return
        self._prev_term = prev
        self._exit_on_term = prev == signal.SIG_DFL
        signal.signal(signal.SIGTERM, self._on_term)
        with contextlib.suppress(Exception):
            a, b = socket.socketpair()
            a.setblocking(False)
            b.setblocking(False)
            old = signal.set_wakeup_fd(b.fileno(), warn_on_full_buffer=False)
            if old != -1:  # someone else's (an event loop): leave it theirs
                signal.set_wakeup_fd(old)
                a.close()
                b.close()
            else:
                self._wake = (a, b)

    def _uninstall_signal(self) -> None:
        if self._wake is not None:
            with contextlib.suppress(Exception):
                signal.set_wakeup_fd(-1)
            for s in self._wake:
                s.close()
            self._wake = None
        if self._prev_term is not None and signal.getsignal(signal.SIGTERM) == self._on_term:
            signal.signal(signal.SIGTERM, self._prev_term)
        self._prev_term = None

    def _on_term(self, signum: int, frame: Any) -> None:
        """The main thread got to the signal: look, then terminate as before."""
        if self._sweeping == threading.get_ident():
            self._term_pending = (signum, frame)  # inside this thread's look: finish it
            return
        self._dump_once()
        self.sweep("; the launcher is stopping the job (SIGTERM)")
        self._terminate(signum, frame)

    def _terminate(self, signum: int, frame: Any) -> None:
        self._terminated.set()
        prev = self._prev_term
        if callable(prev):
            prev(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _excepthook(self, kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        """The training died of an uncaught error — often a collective failing because a
        peer is gone ("connection reset by peer"): name the peer while the monitor is
        still open (before the interpreter's exit handlers close it)."""
        with contextlib.suppress(Exception):
            self._dump_once()
            text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", " ".join(str(exc).split()))
            text = text[:200]
            self.sweep(f"; this rank then failed with {kind.__name__}: {text}")
        hook = self._prev_excepthook or sys.__excepthook__
        hook(kind, exc, tb)

    def _on_sigterm_seen(self) -> None:
        """The thread saw SIGTERM while the main thread may sit in a C collective: look
        now; if nothing else would end the process, end it as SIGTERM would have."""
        self._dump_once()
        self.sweep("; the launcher is stopping the job (SIGTERM)")
        if self._terminated.wait(self.grace_s) or not self._exit_on_term:
            return
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)
