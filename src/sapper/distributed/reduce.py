"""sapper's own collective: one small all-gather every N steps that can never hang training.

Every per-rank number the cross-rank detectors need is packed into one float64 vector
and all-gathered at once (not one collective per metric), on a gloo group of sapper's own
created with a timeout. The gather is started with ``async_op=True`` and waited on with a
bound, so a rank that crashed or hangs costs the others at most ``timeout_s`` once: the
missing ranks are named from heartbeats in the job's key-value store, and the channel
closes for good (no further cross-rank traffic, training goes on).

Because the group is gloo on CPU, it works the same beside NCCL training on GPUs: the
vector is copied to the host once per exchange (the one sync point, every N steps).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ChannelLost", "SideChannel"]

_instances = 0


@dataclass
class ChannelLost:
    """Why the side channel closed, and which ranks were missing."""

    step: int
    reason: str
    #: Ranks that had not reached this exchange (crashed, hung or far behind).
    missing: list[int] = field(default_factory=list)
    #: The last exchange step each rank announced (-1: never), when the store answered.
    last_seen: dict[int, int] = field(default_factory=dict)
    timed_out: bool = False
    waited_s: float = 0.0


class SideChannel:
    """A gloo process group used only by sapper; every call is bounded by ``timeout_s``.

    Collective on construction: every rank of ``group`` must create it, at the same point.
    """

    def __init__(
        self,
        timeout_s: float,
        group: dist.ProcessGroup | None = None,
        backend: str = "gloo",
    ) -> None:
        global _instances
        _instances += 1
        self.timeout_s = float(timeout_s)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        ranks = None if group is None else dist.get_process_group_ranks(group)
        if backend == "auto":  # the job's own backend: NCCL's tree/ring on GPUs
            backend = str(dist.get_backend(group))
        self.backend = backend
        #: Where the collectives' tensors live: the current GPU under NCCL, else the host.
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        self.group = dist.new_group(
            ranks=ranks, backend=backend, timeout=timedelta(seconds=self.timeout_s)
        )
        # keys of an earlier attempt (torchrun restarts keep the agent's store) never match
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._prefix = f"sapper/{attempt}/{_instances}/hb/"
        self._lost_key = f"sapper/{attempt}/{_instances}/lost"
        self._store = _default_store()
        self.lost: ChannelLost | None = None
        self._beat: int | None = None

    @property
    def open(self) -> bool:
        return self.lost is None

    def all_gather(self, vector: torch.Tensor, step: int) -> torch.Tensor | None:
        """Gather ``vector`` (1-D) from every rank into a ``(world, n)`` float64 table;
        None once the channel is lost (see :attr:`lost`)."""
        if self.lost is not None:
            return None
        local = vector.detach().to("cpu", torch.float64).contiguous()
        self._heartbeat(step)
        out = [torch.empty_like(local) for _ in range(self.world_size)]
        start = time.monotonic()
        try:
            work = dist.all_gather(out, local, group=self.group, async_op=True)
            assert work is not None
            told = self._wait(work, start)
            if told is not None:  # another rank saw the loss first: agree with it
                self.lost = told
                return None
            work.wait()  # completed: returns at once, or raises the peer's failure
        except Exception as exc:  # a peer crashed, hung or closed its socket
            self._lose(step, exc, time.monotonic() - start)
            return None
        return torch.stack(out)

    def all_reduce(
        self, parts: list[tuple[torch.Tensor, Any]], step: int
    ) -> list[torch.Tensor] | None:
        """All-reduce each ``(tensor, op)`` in place on the channel's device, all started
        before any is waited on (they pipeline), bounded like :meth:`all_gather`; None
        once the channel is lost."""
        if self.lost is not None:
            return None
        self._heartbeat(step)
        tensors = [t.detach().to(self.device, torch.float64).contiguous() for t, _ in parts]
        start = time.monotonic()
        try:
            works = [
                dist.all_reduce(t, op=op, group=self.group, async_op=True)
                for t, (_, op) in zip(tensors, parts, strict=True)
            ]
            for work in works:
                assert work is not None
                told = self._wait(work, start)
                if told is not None:
                    self.lost = told
                    return None
                work.wait()
        except Exception as exc:
            self._lose(step, exc, time.monotonic() - start)
            return None
        return tensors

    #: Seconds of waiting after which the store is asked whether a peer was lost.
    ASK_AFTER_S = 0.05

    def _wait(self, work: Any, start: float) -> ChannelLost | None:
        """Wait for ``work`` with backoff polling, bounded by the timeout. A rank next to
        a crashed peer fails at once, but in a ring the others may wait for peers that
        gave up: once the wait is long, ask the store whether a loss was announced."""
        delay = 0.00002  # a small collective answers in well under a millisecond
        while not work.is_completed():
            waited = time.monotonic() - start
            if waited > self.timeout_s:
                raise TimeoutError(f"no answer within {self.timeout_s:g} s")
            if waited > self.ASK_AFTER_S:
                told = self._announced()
                if told is not None:
                    told.waited_s = waited
                    return told
            time.sleep(delay)
            delay = min(delay * 1.5, 0.002 if waited < self.ASK_AFTER_S else 0.05)
        return None

    def _announced(self) -> ChannelLost | None:
        if self._store is None:
            return None
        try:
            if not self._store.check([self._lost_key]):
                return None
            data = json.loads(self._store.get(self._lost_key))
        except Exception:
            return None
        return ChannelLost(
            step=int(data["step"]),
            reason=str(data["reason"]),
            missing=[int(r) for r in data["missing"]],
            last_seen={int(k): int(v) for k, v in data["last_seen"].items()},
            timed_out=bool(data["timed_out"]),
        )

    def gather_objects(self, obj: Any, step: int = -1) -> list[Any] | None:
        """All-gather a small picklable object (node info at start), bounded the same way."""
        if self.lost is not None:
            return None
        self._heartbeat(step)
        out: list[Any] = [None] * self.world_size
        start = time.monotonic()
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except Exception as exc:
            self._lose(step, exc, time.monotonic() - start)
            return None
        return out

    # ---- liveness ------------------------------------------------------------------
    def _heartbeat(self, step: int) -> None:
        if self._store is None or step == self._beat:  # one write per exchange
            return
        self._beat = step
        try:
            self._store.set(self._prefix + str(self.rank), str(step))
        except Exception:  # the store's host is gone; missing ranks will read "unknown"
            self._store = None

    def _last_seen(self) -> dict[int, int] | None:
        if self._store is None:
            return None
        seen: dict[int, int] = {}
        try:
            for r in range(self.world_size):
                key = self._prefix + str(r)
                seen[r] = int(self._store.get(key)) if self._store.check([key]) else -1
        except Exception:
            return None
        return seen

    def _lose(self, step: int, exc: BaseException, waited: float) -> None:
        text = _short(str(exc))
        # gloo words its own timeout as "Timed out waiting ...ms" or, when the wait ends
        # the pair first, "Application timeout caused pair closure": both are no answer.
        lower = text.lower()
        timed_out = isinstance(exc, TimeoutError) or "timed out" in lower or "timeout" in lower
        # A crash is seen at once; give live ranks that are a little behind a moment to
        # announce this step, so only the really missing ones are named.
        grace = max(0.0, min(self.timeout_s, 5.0) - (waited if timed_out else 0.0))
        deadline = time.monotonic() + grace
        seen = self._last_seen()
        settled = time.monotonic()
        while seen is not None and time.monotonic() < deadline:
            if all(s >= step for r, s in seen.items() if r != self.rank):
                break
            if time.monotonic() - settled > 0.5:  # nobody moved for a while: settled
                break
            time.sleep(0.05)
            now = self._last_seen()
            if now is None:  # the store went away meanwhile: keep what was read
                break
            if now != seen:
                settled = time.monotonic()
            seen = now
        missing = sorted(r for r, s in (seen or {}).items() if s < step and r != self.rank)
        self.lost = ChannelLost(
            step=step,
            reason=text[:300] or type(exc).__name__,
            missing=missing,
            last_seen=seen or {},
            timed_out=timed_out,
            waited_s=waited,
        )
        if self._store is not None and seen is not None:
            try:  # let ranks still waiting in the ring agree at once
                self._store.set(
                    self._lost_key,
                    json.dumps(
                        {
                            "step": step,
                            "reason": self.lost.reason,
                            "missing": missing,
                            "last_seen": {str(k): v for k, v in seen.items()},
                            "timed_out": timed_out,
                        }
                    ),
                )
            except Exception:
                pass


def _short(message: str) -> str:
    """The first sentence of a backend error, without its source-file prefix."""
    text = " ".join(message.split())
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text)
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")


def _default_store() -> Any:
    """The job's key-value store (torchrun's agent store, or the init_method's), if the
    installed torch exposes it; heartbeats are skipped without one."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None
