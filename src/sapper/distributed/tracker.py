"""The per-rank side of the distributed monitor: cheap per step, one exchange every N.

Every rank runs a :class:`RankTracker`. Per step it only keeps device values (the loss,
the gradient norm, the batch's sample hashes) and host timers: no sync, no collective.
Every ``every`` steps :meth:`RankTracker.exchange` packs the window into one vector and
reduces it over sapper's bounded side channel (per-column statistics, the extreme ranks
and their rows: fixed-size all-reduces, see :mod:`sapper.distributed.stats`; up to
``detail_ranks`` ranks every row is all-gathered as well). Rank 0 runs the cross-rank
detectors on the resulting table, attaches it to the step record and replaces the
record's rank-local numbers with the job's (mean loss, slowest step, largest memory,
summed throughput) unless ``aggregate=False``. Other ranks return
no findings and write nothing; a lost rank is reported by the lowest surviving rank.

Usable alone (``step()``) or from the live monitor, which calls :meth:`observe` per step
and :meth:`exchange` at the point where it turns its accumulators into a record.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from sapper.distributed.checksum import ParamChecksum, mesh_replica_groups
from sapper.distributed.context import DistContext, discover, local_node_info
from sapper.distributed.detectors import (
    check_process_groups,
    check_world_size,
    default_distributed_detectors,
    lost_rank_finding,
    spike_suspects,
)
from sapper.distributed.evidence import LocalGradNorm, OutputMax
from sapper.distributed.exchange import reduce_buckets, reduce_window
from sapper.distributed.gradnorm import engine_grad_norm, is_deepspeed_engine, to_global
from sapper.distributed.heartbeat import Heartbeat, job_store
from sapper.distributed.reduce import ChannelLost, SideChannel
from sapper.distributed.sampling import sample_hashes, sample_ids
from sapper.distributed.stats import JobStats, SampleBuckets, default_buckets
from sapper.distributed.table import COLUMNS, DIST_KEY, RankTable, pack_row
from sapper.distributed.timing import ForwardTimer, unwrap_module
from sapper.plan.schema import Plan
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector, DetectorSet
from sapper.runtime.records import StepRecord

__all__ = ["RankTracker"]

T = TypeVar("T")
#: Sample hashes are cut to 52 bits so they survive the float64 exchange exactly.
_HASH_MASK = (1 << 52) - 1

#: Record fields a rank reports as it measured them (the monitor's values win).
_RECORD_FIELDS = (
    "loss",
    "grad_norm",
    "memory_peak_gib",
    "memory_reserved_gib",
    "tokens",
    "samples",
    "tokens_per_s",
    "samples_per_s",
)


class RankTracker:
    """Cross-rank monitoring for one rank. Construct it on every rank at the same point
    (it creates sapper's gloo side group and gathers every rank's node: collective)."""

    #: Up to this many sample buckets over the world (ranks × buckets), the all-gather
    #: of the rows carries each rank's buckets too (5 floats a bucket: 40 KiB a rank at
    #: 1,024 buckets), saving the buckets' own all-reduce: a collective round and its
    #: host work each exchange. Beyond it they are all-reduced (a fixed size per rank).
    GATHER_BUCKETS_MAX = 1 << 14

    def __init__(
        self,
        model: Any = None,
        *,
        plan: Plan | None = None,
        every: int = 10,
        timeout_s: float = 300.0,
        checksum: bool = True,
        detectors: Iterable[Detector] | None = None,
        group: dist.ProcessGroup | None = None,
        aggregate: bool = True,
        max_ranks_logged: int = 256,
        detail_ranks: int = 64,
        buckets: int | None = None,
        max_named: int = 32,
        backend: str | None = None,
        start_step: int = 0,
        on_finding: Callable[[list[Finding]], None] | None = None,
        evidence: bool = True,
        heartbeat: bool = True,
        heartbeat_s: float | None = None,
        lost_after_s: float = 30.0,
        hang_after_s: float = 300.0,
    ) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.every = int(every)
        self.timeout_s = float(timeout_s)
        self.aggregate = aggregate
        self.max_ranks_logged = max_ranks_logged
        #: Up to this world size every rank's row is also all-gathered (the run log keeps
        #: them); above it only the reduced statistics and the named ranks' rows travel.
        self.detail_ranks = int(detail_ranks)
        self.max_named = int(max_named)
        #: The side group's backend. None: gloo up to ``detail_ranks`` (the all-gather
        #: needs host tensors), beyond it the job's own ("auto": NCCL on GPUs, whose
        #: tree/ring keeps a few peers per rank where gloo connects every pair).
        self.backend = backend
        self.plan = plan
        self.ctx: DistContext = discover(plan, group)
        self._buckets = SampleBuckets(buckets or default_buckets(self.ctx.world_size))
        self._engine = model if is_deepspeed_engine(model) else None
        module = unwrap_module(model) if model is not None else None
        named = list(module.named_parameters()) if module is not None else []
        params = [p for _, p in named]
        self._timer = ForwardTimer(module) if module is not None else None
        self._checksum = ParamChecksum(named) if checksum and params else None
        self._drilled = False
        # X001's per-rank evidence, before the gradient all-reduce mixes the ranks
        self._output_max = OutputMax(module) if evidence and module is not None else None
        self._local_norm = LocalGradNorm.attach(model) if evidence else None
        self.layout = self._replica_layout(params)
        #: The window's sample hashes (device side) and how many (from shapes: no sync).
        self._window_hashes: torch.Tensor | None = None
        self._hashed = 0
        self.detectors = DetectorSet(
            default_distributed_detectors() if detectors is None else detectors
        )
        self.channel: SideChannel | None = None
        self.lost: ChannelLost | None = None
        self.startup_findings: list[Finding] = []
        self._pending: list[Finding] = []
        self._prev_step: int | None = None
        self.last_table: RankTable | None = None
        #: Exchanges done, and the wall time of the last one (seconds, this rank).
        self.exchanges = 0
        self.last_exchange_s = 0.0
        #: ... of which inside the all-gather (waiting for peers and the wire).
        self.last_gather_s = 0.0
        #: Errors met while measuring a window (the exchange went on without the values).
        self.errors: list[str] = []
        #: Rank 0's last record with the table attached (what the run log receives).
        self.last_record: StepRecord | None = None
        self._reset_window()
        self._last_end = time.perf_counter()
        self._last_step = -1
        #: Where findings go the moment they are made (the monitor's sinks), instead of
        #: waiting for the next exchange; may be called from sapper's watcher thread.
        self.on_finding = on_finding
        self.heartbeat: Heartbeat | None = None
        self._beat_opts = {
            "interval_s": heartbeat_s,
            "lost_after_s": lost_after_s,
            "hang_after_s": hang_after_s,
            "start_step": start_step,
        }
        self._module = module if heartbeat else None
        if self.ctx.is_main and self.ctx.distributed:  # X006 needs no peer: say it now
            self.startup_findings = check_world_size(self.ctx, plan, start_step)
            self.say_now(self.startup_findings)
        if self.ctx.distributed:
            self._connect(group)

    # ---- setup ----------------------------------------------------------------------
    def _replica_layout(self, params: list[Any]) -> Any:
        layout = self.ctx.layout
        groups = mesh_replica_groups(params)
        if groups is not None:
            what = "replicas from the device mesh" if groups else "parameters fully sharded"
            return layout.with_param_groups(groups, f"{layout.source}; {what}")
        stage = getattr(self._engine, "zero_optimization_stage", None)
        if callable(stage) and stage() >= 3:  # ZeRO-3 partitions the parameters
            return layout.with_param_groups([], layout.source + "; ZeRO-3 partitioned")
        return layout

    def _connect(self, group: dist.ProcessGroup | None) -> None:
        try:
            backend = self.backend or (
                "gloo" if self.ctx.world_size <= self.detail_ranks else "auto"
            )
            self.channel = SideChannel(self.timeout_s, group, backend=backend)
        except Exception as exc:  # the side group could not be formed in time
            self.lost = ChannelLost(step=-1, reason=" ".join(str(exc).split())[:300])
            self._pending.append(lost_rank_finding(self.lost, self.ctx.world_size, self.timeout_s))
            return
        if self._module is not None:
            self._start_heartbeat()  # before the gather: every beat key exists after it
        nodes = self.channel.gather_objects(local_node_info(), step=-1)
        if nodes is None:
            self._lose()
            return
        self.ctx = self.ctx.with_nodes(nodes)
        if self.ctx.is_main:
            found = check_process_groups(self.ctx, self.plan, world=False)
            self.startup_findings = [*self.startup_findings, *found]
            self.say_now(found)

    def _start_heartbeat(self) -> None:
        """The lost-rank watcher (sapper.distributed.heartbeat): a daemon thread per rank."""
        try:
            store, hosted = job_store(self.timeout_s)
            hb = Heartbeat(
                store,
                self.rank,
                self.ctx.world_size,
                self._heartbeat_found,
                store_hosted_by_rank0=hosted,
                **self._beat_opts,
            )
            hb.hook_module(self._module)
            hb.start()
        except Exception as exc:  # no store to beat through: the exchange still bounds
            self.errors.append(f"heartbeat: {type(exc).__name__}: {exc}")
            return
        self.heartbeat = hb

    def _heartbeat_found(self, findings: list[Finding]) -> None:
        """From the watcher thread: report now (host work only)."""
        if not self.ctx.is_main:  # rank 0 is gone; no run log here, say it on stderr
            for f in findings:
                print(f"sapper [rank {self.rank}] {f.code}: {f.message}", file=sys.stderr,
                      flush=True)
        self.say_now(findings)

    def say_now(self, findings: list[Finding]) -> None:
        """Report ``findings`` at once through :attr:`on_finding`, or keep them for the
        next exchange's return value when nobody listens."""
        if not findings:
            return
        if self.on_finding is None:
            self._pending.extend(findings)
            return
        self.on_finding(list(findings))

    def listen(self, on_finding: Callable[[list[Finding]], None]) -> None:
        """Send findings to ``on_finding`` from now on, starting with those kept so far."""
        self.on_finding = on_finding
        kept, self._pending = self._pending, []
        self.say_now(kept)

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def active(self) -> bool:
        """Cross-rank checks are running (world > 1 and no rank lost)."""
        return self.channel is not None and self.channel.open

    # ---- per step (no sync, no collective) --------------------------------------------
    def _reset_window(self) -> None:
        self._steps = 0
        self._window_first = 0
        self._step_time = 0.0
        self._timed_steps = 0
        self._data_time = 0.0
        self._data_timed = False
        self._batch_seen = False
        self._tokens = 0
        self._samples = 0
        #: (step, value) per step: device tensors or floats, folded at the exchange.
        self._losses: list[tuple[int, Any]] = []
        self._norms: list[tuple[int, Any]] = []
        self._hashes: list[torch.Tensor] = []
        #: Fingerprints the monitor read to the host (one tensor at the exchange).
        self._host_hashes: list[int] = []
        self._grad_norm: Any = None
        #: The samples of each step of the window, as the loop named them (X010 reads
        #: those of a spiking rank's step): step -> (kind, device tensors or host ids).
        self._step_samples: dict[int, tuple[str, list[Any]]] = {}
        self._batch_samples: tuple[str, list[Any]] | None = None

    def batch(self, batch: Any, wait_s: float | None = None) -> None:
        """A batch arrived: fingerprint its samples (device side) and, unless ``wait_s``
        is given, count the time since the last step ended as data wait."""
        if wait_s is None and not self._batch_seen:
            wait_s = time.perf_counter() - self._last_end
        if wait_s is not None:
            self._data_time += wait_s
            self._data_timed = True
        self._batch_seen = True
        hashes = sample_hashes(batch)
        named = sample_ids(batch)
        kind, got = ("ids", named) if named is not None else ("hashes", hashes)
        if got is not None:
            if self._batch_samples is None or self._batch_samples[0] != kind:
                self._batch_samples = (kind, [])
            self._batch_samples[1].append(got)  # kept as is: no sync
        if hashes is not None:
            self._hashes.append(hashes)
            self._samples += int(hashes.numel())
            ids = batch.get("input_ids") if isinstance(batch, dict) else batch
            if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point():
                self._tokens += int(ids.numel())

    def wrap(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader`` timing each ``next()`` as data wait and fingerprinting
        every batch (also under gradient accumulation)."""
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            self.batch(item, wait_s=time.perf_counter() - t0)
            yield item

    def observe(self, step: int, loss: Any = None, grad_norm: Any = None) -> None:
        """One optimizer step ended (call after ``optimizer.step()``). ``loss`` and
        ``grad_norm`` may be device tensors: they are only kept (no kernel, no sync)
        and examined together at the next exchange."""
        now = time.perf_counter()
        self._step_time += now - self._last_end
        self._timed_steps += 1
        self._last_end = now
        self._batch_seen = False
        if self._batch_samples is not None:
            self._step_samples[int(step)] = self._batch_samples
            self._batch_samples = None
        if self._steps == 0:
            self._window_first = int(step)
        self._steps += 1
        self._last_step = int(step)
        if grad_norm is None and self._engine is not None:
            grad_norm = engine_grad_norm(self._engine)
        if loss is not None:
            self._losses.append(
                (int(step), loss.detach() if isinstance(loss, torch.Tensor) else loss)
            )
        if grad_norm is not None:
            # a DTensor norm: its local part is non-finite exactly when the global one is
            local = grad_norm.to_local() if hasattr(grad_norm, "to_local") else grad_norm
            self._norms.append((int(step), local))
            self._grad_norm = grad_norm

    def add_records(self, records: Iterable[StepRecord]) -> None:
        """Feed steps the live monitor already read to the host (its seam): the same
        window as :meth:`observe` and :meth:`batch`, from host numbers."""
        for rec in records:
            if self._steps == 0:
                self._window_first = rec.step
            self._steps += 1
            self._last_step = rec.step
            if rec.step_time_s is not None:
                self._step_time += rec.step_time_s
                self._timed_steps += 1
            if rec.data_time_s is not None:
                self._data_time += rec.data_time_s
                self._data_timed = True
            self._tokens += rec.tokens or 0
            self._samples += rec.samples or 0
            if rec.loss is not None:
                self._losses.append((rec.step, rec.loss))
            if rec.grad_norm is not None:
                self._norms.append((rec.step, rec.grad_norm))
                self._grad_norm = rec.grad_norm
            hashes = rec.extra.get("sample_hashes")
            if hashes and rec.step not in self._step_samples:
                self._step_samples[rec.step] = ("fingerprints", [list(hashes)])
            if hashes:
                values = [int(h, 16) if isinstance(h, str) else int(h) for h in hashes]
                self._host_hashes.extend(v & _HASH_MASK for v in values)

    def _fold(self) -> dict[str, Any]:
        """The window's losses and norms as a few device scalars: the mean finite loss,
        the first step each went non-finite (-1: never), steps with either. Host numbers
        (what the live monitor read) are folded on the host: a few dozen floats, where
        tensor ops would cost more than the arithmetic."""
        if not any(
            isinstance(v, torch.Tensor) for series in (self._losses, self._norms) for _, v in series
        ):
            out = _fold_host(self._losses, self._norms, self._window_first, self._steps)
            self._window_hash_fold()
            return out
        out = {}
        bad_steps: torch.Tensor | None = None
        for name, series in (("loss", self._losses), ("grad", self._norms)):
            if not series:
                continue
            steps, vals = _stack(series)
            fin = torch.isfinite(vals)
            first = torch.where(fin, math.inf, steps).min()
            out[f"nonfinite_{name}_step"] = torch.where(torch.isinf(first), -1.0, first)
            if name == "loss":
                finite_abs = torch.where(fin, vals.abs(), 0.0)
                out["loss_peak"] = finite_abs.max()
                out["loss_peak_step"] = steps[finite_abs.argmax()]
                n = fin.sum()
                total = torch.where(fin, vals, 0.0).sum()
                out["loss"] = torch.where(n > 0, total / n.clamp(min=1), math.nan)
            bad = torch.zeros(self._steps + 1, dtype=torch.bool, device=vals.device)
            index = (steps - self._window_first).long().clamp(0, self._steps)
            bad = bad.index_put((index,), ~fin, accumulate=True)
            bad_steps = bad if bad_steps is None else bad_steps | bad.to(bad_steps.device)
        if bad_steps is not None:
            out["nonfinite_steps"] = bad_steps.sum().to(torch.float64)
        self._window_hash_fold()
        return out

    def _window_hash_fold(self) -> None:
        """The window's sample hashes as one tensor (device ones, and the host ones)."""
        if self._host_hashes:  # one tensor for the window, not one per record
            self._hashes.append(torch.tensor(self._host_hashes, dtype=torch.int64))
            self._host_hashes = []
        if self._hashes:
            dev = self._hashes[0].device
            self._window_hashes = torch.cat([h.to(dev) for h in self._hashes])
            self._hashed += int(self._window_hashes.numel())

    def due(self) -> bool:
        """The window is full: the next :meth:`exchange` is expected on every rank."""
        return self._steps >= self.every

    def step(self, step: int, loss: Any = None, grad_norm: Any = None) -> list[Finding]:
        """Standalone use: :meth:`observe`, and :meth:`exchange` every ``every`` steps."""
        self.observe(step, loss, grad_norm)
        return self.exchange() if self.due() else []

    # ---- every N steps ----------------------------------------------------------------
    def _window_values(self, record: StepRecord | None, step: int) -> dict[str, Any]:
        n = max(self._steps, 1)
        v: dict[str, Any] = {"step": step, "steps": self._steps, "time": time.time()}
        if record is not None:
            for name in _RECORD_FIELDS:
                value = getattr(record, name)
                if value is not None:
                    v[name] = value
        folded = self._fold()
        if "loss" not in v and "loss" in folded:
            v["loss"] = folded["loss"]
        if "grad_norm" not in v and self._grad_norm is not None:
            v["grad_norm"] = _norm_value(self._grad_norm)
        if self._timed_steps:
            v["step_time_s"] = self._step_time / self._timed_steps
        elif record is not None and record.step_time_s is not None:
            v["step_time_s"] = record.step_time_s
        if self._data_timed:
            v["data_time_s"] = self._data_time / n
        elif record is not None and record.data_time_s is not None:
            v["data_time_s"] = record.data_time_s
        if self._timer is not None:
            v["forward_time_s"] = self._timer.take() / n
        if "tokens" not in v and self._tokens:
            v["tokens"] = self._tokens
        if "samples" not in v and self._samples:
            v["samples"] = self._samples
        if "memory_peak_gib" not in v and torch.cuda.is_initialized() and torch.cuda.is_available():
            v["memory_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        for name in ("nonfinite_loss_step", "nonfinite_grad_step"):
            v[name] = folded.get(name, -1.0)
        v["nonfinite_steps"] = folded.get("nonfinite_steps", 0.0)
        if self._checksum is not None and self.layout.param_groups:
            v["checksum"] = self._checksum.compute()
        v["samples_hashed"] = self._hashed
        v.update(self._evidence(folded))
        return v

    def _evidence(self, folded: dict[str, Any]) -> dict[str, Any]:
        """X001's per-rank columns (device scalars, read with the row): the window's peak
        loss, max |output|, and the local gradient norm before the all-reduce."""
        out: dict[str, Any] = {}
        for name in ("loss_peak", "loss_peak_step"):
            if name in folded:
                out[name] = folded[name]
        for prefix, peak in (("output", self._output_max), ("local_grad", self._local_norm)):
            if peak is None:
                continue
            got = peak.take(self._window_first, self._steps)
            if "peak" in got:
                out["output_absmax" if prefix == "output" else "local_grad_norm"] = got["peak"]
                if prefix == "local_grad":
                    out["local_grad_peak_step"] = got["peak_step"]
            if got:
                out[f"{prefix}_nonfinite_step"] = got["nonfinite_step"]
        return out

    def exchange(self, record: StepRecord | None = None) -> list[Finding]:
        """Gather the window from every rank (one bounded collective) and run the
        cross-rank detectors on rank 0. Every rank must call it at the same step.

        With ``record`` (the monitor's record of this step) rank 0 attaches the table as
        ``record.extra["dist"]`` and, with ``aggregate``, turns the record's numbers into
        the job's. Returns the findings to report on this rank (none on other ranks)."""
        step = record.step if record is not None else self._last_step
        if not self.active:
            self._reset_window()
            self._window_hashes, self._hashed = None, 0
            out, self._pending = self._pending, []
            return out
        t0 = time.perf_counter()
        if self.heartbeat is not None:
            self.heartbeat.mark("exchange")
        first = self._window_first if self._steps else step
        try:
            values = self._window_values(record, step)
        except Exception as exc:  # still take part, or every other rank would wait
            self.errors.append(f"{type(exc).__name__}: {exc}")
            values = {"step": step, "steps": self._steps}
        head = pack_row(values, torch.zeros(0, dtype=torch.float64))
        hashes, self._window_hashes, self._hashed = self._window_hashes, None, 0
        step_samples = self._step_samples
        self._reset_window()
        assert self.channel is not None
        t1 = time.perf_counter()
        table = self._exchange(head, hashes, step)
        self.last_gather_s = time.perf_counter() - t1
        self.exchanges += 1
        self.last_exchange_s = time.perf_counter() - t0
        if self.heartbeat is not None:
            self.heartbeat.mark("data")
        if table is None:
            return self._lose()
        table.prev_step = self._prev_step if self._prev_step is not None else first - 1
        self._prev_step = step
        self.last_table = table
        self._replica_detail(table, step)
        self._spike_detail(table, step, step_samples)
        if not self.ctx.is_main:
            return []
        rec = record if record is not None else self._record_from(values, table)
        rec.extra[DIST_KEY] = table
        findings = self._pending + self.detectors.update(rec)
        self._pending = []
        if self.aggregate:
            _aggregate(rec, table.job(), table.data_groups)
        rec.extra[DIST_KEY] = table.to_extra(self.max_ranks_logged)
        self.last_record = rec
        return findings

    def _replica_detail(self, table: RankTable, step: int) -> None:
        """The first time replicas disagree, name the parameters: every rank sees the same
        gathered checksums and so takes this second, bounded gather at the same exchange
        (one float per parameter tensor, once per run)."""
        if self._checksum is None or self._drilled or not _replicas_disagree(table):
            return
        self._drilled = True
        try:
            per = self._checksum.per_param()
            mine = per.cpu().tolist() if per is not None else []
        except Exception as exc:  # still take part in the gather
            self.errors.append(f"{type(exc).__name__}: {exc}")
            mine = []
        assert self.channel is not None
        got = self.channel.gather_objects(mine, step)
        if got is not None:
            table.detail["replica_params"] = _differing_params(table, got, self._checksum.names)

    def _spike_detail(
        self, table: RankTable, step: int, step_samples: dict[int, tuple[str, list[Any]]]
    ) -> None:
        """When one rank's loss or local gradient norm stands out of the gathered rows
        (X010's cross-rank test, which every rank computes alike from the same rows), every
        rank hands over the samples of its own peak step: a second, small gather, taken
        only at such exchanges."""
        if table.sparse or not spike_suspects(table):
            return
        mine: dict[str, Any] = {}
        try:
            for col in ("loss_peak_step", "local_grad_peak_step"):
                at = table.col(col)[self.rank]
                if at is None or int(at) in mine.get("steps", {}):
                    continue
                got = step_samples.get(int(at))
                if got is not None:
                    mine.setdefault("steps", {})[int(at)] = _samples_text(*got)
        except Exception as exc:  # still take part in the gather
            self.errors.append(f"{type(exc).__name__}: {exc}")
            mine = {}
        assert self.channel is not None
        got_all = self.channel.gather_objects(mine, step)
        if got_all is not None:
            table.detail["spike_samples"] = {
                str(r): v["steps"] for r, v in enumerate(got_all) if v and v.get("steps")
            }

    def _group_index(self, groups: list[list[int]]) -> int:
        for g, ranks in enumerate(groups):
            if self.rank in ranks:
                return g
        return -1

    def _exchange(
        self, head: torch.Tensor, hashes: torch.Tensor | None, step: int
    ) -> RankTable | None:
        """The reduced rounds (every world size), then, up to :attr:`detail_ranks`, the
        all-gather of every row; None when the channel was lost."""
        assert self.channel is not None
        world = self.ctx.world_size
        buckets = self._buckets.local(
            hashes, self._group_index(self.layout.data_groups), self.rank, world
        )
        kw: dict[str, Any] = {
            "data_groups": self.layout.data_groups,
            "param_groups": self.layout.param_groups,
            "layout_source": self.layout.source,
        }
        if world <= self.detail_ranks:  # every row, and the statistics computed from them
            if world * self._buckets.size <= self.GATHER_BUCKETS_MAX:
                # small worlds: the buckets travel in the gathered row (one collective,
                # summed here) instead of an all-reduce of their own after the gather
                n = head.numel()
                row = torch.cat([head.to("cpu", torch.float64), SampleBuckets.flat(buckets)])
                got = self.channel.all_gather(row, step)
                if got is None:
                    return None
                table = RankTable.from_tensor(got[:, :n], **kw)
                table.job().buckets = SampleBuckets.fold_gathered(got[:, n:])
                return table
            gathered = self.channel.all_gather(head, step)
            summed = reduce_buckets(self.channel, buckets, step) if gathered is not None else None
            if gathered is None or summed is None:
                return None
            table = RankTable.from_tensor(gathered, **kw)
            table.job().buckets = summed
            return table
        got = reduce_window(
            self.channel,
            COLUMNS,
            head,
            buckets,
            step=step,
            param_group=self._group_index(self.layout.param_groups),
            n_groups=len(self.layout.param_groups),
            max_named=self.max_named,
        )
        if got is None:
            return None
        stats, rows = got
        return RankTable.from_rows(rows, world, stats, **kw)

    def _record_from(self, values: dict[str, Any], table: RankTable) -> StepRecord:
        """Standalone use: a record of this rank's own window (rank 0's)."""

        def num(name: str) -> float | None:
            v = values.get(name)
            return float(v) if v is not None else None

        tokens, samples = num("tokens"), num("samples")
        return StepRecord(
            step=table.step,
            **{
                name: num(name)
                for name in ("loss", "grad_norm", "step_time_s", "data_time_s", "memory_peak_gib")
            },
            tokens=int(tokens) if tokens is not None else None,
            samples=int(samples) if samples is not None else None,
            time=time.time(),
        )

    def _lose(self) -> list[Finding]:
        assert self.channel is not None and self.channel.lost is not None
        self.lost = self.channel.lost
        finding = lost_rank_finding(self.lost, self.ctx.world_size, self.timeout_s)
        named = self.heartbeat.named if self.heartbeat is not None else set()
        if self.lost.missing and set(self.lost.missing) <= named:
            out, self._pending = self._pending, []  # the watcher said it already
            return out if self.ctx.is_main else []
        if self.heartbeat is not None:  # the watcher need not say it again
            self.heartbeat.named.update(self.lost.missing)
        alive = sorted(set(range(self.ctx.world_size)) - set(self.lost.missing))
        reporters = {alive[0] if alive else self.rank}
        if not self.lost.last_seen:
            # No heartbeats to read: the store's host is gone, often with rank 0 (which
            # hosts it outside torchrun). Rank 1 speaks too, in case rank 0 cannot.
            reporters.add(1)
        if self.rank not in reporters:
            return []
        out, self._pending = [*self._pending, finding], []
        return out

    def close(self) -> None:
        """Remove the forward hooks (the side group goes with the process group)."""
        if self._timer is not None:
            self._timer.remove()
        if self._output_max is not None:
            self._output_max.remove()
        if self.heartbeat is not None:
            self.heartbeat.stop()


def _replicas_disagree(table: RankTable) -> bool:
    """Some replica group's checksums differ, from the reduced statistics every rank
    holds alike (the gathered rows or the all-reduced groups): every rank decides the
    same, so the drill-down gather that follows is taken by all or none."""
    return any(g and g["max"] != g["min"] for g in table.job().groups)


def _differing_params(
    table: RankTable, per_rank: list[Any], names: list[str], limit: int = 8
) -> dict[str, list[str]]:
    """rank -> the parameters whose checksum differs from the group's majority (from its
    lowest rank when there is none), at most ``limit`` names each."""
    out: dict[str, list[str]] = {}
    for group in table.param_groups:
        ranks = [r for r in group if r < len(per_rank) and len(per_rank[r] or []) == len(names)]
        if len(ranks) < 2:
            continue
        for i, name in enumerate(names):
            counts = Counter(per_rank[r][i] for r in ranks)
            top, n_top = counts.most_common(1)[0]
            ref = top if n_top * 2 > len(ranks) else per_rank[ranks[0]][i]
            for r in ranks:
                if per_rank[r][i] != ref and len(out.setdefault(str(r), [])) < limit:
                    out[str(r)].append(name)
    return out


#: At most this many samples of a step are named (the first ones of its batch).
MAX_SAMPLES_NAMED = 64


def _samples_text(kind: str, parts: list[Any]) -> dict[str, Any]:
    """The samples of one step for X010: the loop's own ids, or fingerprints (the
    tracker's hashes or the monitor's, as its run log keeps them)."""
    values: list[Any] = []
    for part in parts:
        if isinstance(part, torch.Tensor):
            values.extend(part.reshape(-1)[:MAX_SAMPLES_NAMED].tolist())
        else:
            values.extend(list(part)[:MAX_SAMPLES_NAMED])
        if len(values) >= MAX_SAMPLES_NAMED:
            break
    if kind == "hashes":
        values = [f"{int(v):013x}" for v in values]
    return {"kind": kind, "samples": values[:MAX_SAMPLES_NAMED]}


def _fold_host(
    losses: list[tuple[int, Any]], norms: list[tuple[int, Any]], first: int, steps: int
) -> dict[str, Any]:
    """:meth:`RankTracker._fold` of host numbers, in Python floats: the same values the
    tensor fold gives (the first largest finite |loss| and its step; 0 and the first
    step when none is finite)."""
    out: dict[str, Any] = {}
    bad: set[int] | None = None
    for name, series in (("loss", losses), ("grad", norms)):
        if not series:
            continue
        bad = bad if bad is not None else set()
        first_bad = math.inf
        peak, peak_step, total, n = 0.0, float(series[0][0]), 0.0, 0
        for step, value in series:
            v = float(value)
            if not math.isfinite(v):
                first_bad = min(first_bad, float(step))
                bad.add(min(max(int(step) - first, 0), steps))
                continue
            if name == "loss":
                total, n = total + v, n + 1
                if abs(v) > peak:
                    peak, peak_step = abs(v), float(step)
        out[f"nonfinite_{name}_step"] = -1.0 if math.isinf(first_bad) else first_bad
        if name == "loss":
            out["loss_peak"] = peak
            out["loss_peak_step"] = peak_step
            out["loss"] = total / n if n else math.nan
    if bad is not None:
        out["nonfinite_steps"] = float(len(bad))
    return out


def _stack(series: list[tuple[int, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps and values of a window as two float64 tensors on the values' device (one
    stack of the kept device scalars; host floats are converted on the host)."""
    tensors = [v for _, v in series if isinstance(v, torch.Tensor)]
    if not tensors:  # host numbers (what the live monitor read): one tensor, not one each
        vals = torch.tensor([float(v) for _, v in series], dtype=torch.float64)
        steps = torch.tensor([float(s) for s, _ in series], dtype=torch.float64)
        return steps, vals
    dev = tensors[0].device
    vals = torch.stack([_scalar(v).to(dev) for _, v in series])
    steps = torch.tensor([float(s) for s, _ in series], dtype=torch.float64, device=dev)
    return steps, vals


def _norm_value(norm: Any) -> torch.Tensor:
    """A DTensor norm (``clip_grad_norm_`` under FSDP2/TP): a replicated one is read
    locally; a pending (Partial) one needs its reduction, on the training mesh — the
    group every training step already waits on, so it adds no new way to hang."""
    placements = getattr(norm, "placements", None)
    if placements is None:
        return _scalar(norm)
    if all(p.is_replicate() for p in placements):
        return _scalar(norm.to_local())
    return _scalar(to_global(norm))


def _scalar(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        t = value.detach()
        return (t if t.dim() == 0 else t.float().mean()).to(torch.float64)
    return torch.tensor(float(value), dtype=torch.float64)


def _aggregate(rec: StepRecord, stats: JobStats, data_groups: list[list[int]]) -> None:
    """The job's numbers on the main record: mean loss, slowest times, largest memory,
    throughput summed over one data-parallel replica's worth of ranks (the world's sum
    scaled by the replica's share: exact when model-parallel peers count the same)."""
    loss = stats.col("loss")
    if loss.count:
        rec.loss = loss.mean if loss.nonfinite == 0 and loss.mean is not None else math.nan
    for name in ("step_time_s", "data_time_s", "memory_peak_gib", "memory_reserved_gib"):
        c = stats.col(name)
        if c.finite:
            setattr(rec, name, c.max)
    if rec.grad_norm is None:
        g = stats.col("grad_norm")
        if g.count:
            rec.grad_norm = g.mean if g.nonfinite == 0 and g.mean is not None else math.nan
    if data_groups and data_groups[0]:
        share = len(data_groups[0]) / max(stats.world_size, 1)
        for name in ("tokens", "samples"):
            c = stats.col(name)
            if c.finite:
                setattr(rec, name, round(c.sum * share))
        for name in ("tokens_per_s", "samples_per_s"):
            c = stats.col(name)
            if c.finite:
                setattr(rec, name, c.sum * share)
    rec.extra["world_size"] = stats.world_size
