"""The live monitor: two lines in a plain PyTorch loop.

    mon = sapper.Monitor(model, optimizer, scaler=scaler, scheduler=scheduler)
    for batch in loader:
        ...forward, backward, (unscale_, clip), optimizer.step(), scheduler.step()...
        mon.step(loss)            # once per step (or once per micro-batch)

The model's forward hooks see each micro-batch (data wait, tokens, sample fingerprints,
positions, the loss and, through a tensor hook, the weight it enters backward with); the
optimizer's step pre-hook closes a step (gradient norm, LR, loss scale, call order of the
scaler and clipping). Values stay on the device; every ``log_every`` steps, or once
``flush_every_s`` seconds have passed (so at most two host syncs a second, and the run
log never further behind), :class:`~sapper.monitor.collect.StepCollector` copies them
to the host in one transfer, the records go through the same detectors the offline
analyzer uses, and findings go to the console, the run log and TensorBoard.
``Monitor.step`` never syncs otherwise. Why a time cadence and not a read every step on
a CPU (where a read is no sync): a read has a fixed cost (packing, building records);
on the benchmark's smallest GPT-2 a read per step more than doubled the monitor's own
time (210 → 480 µs a step), past the 2% budget, while bounding reads by time bounds both
that cost and what a crash loses.

Or, closed for you however the block ends:

    with sapper.Monitor(model, optimizer, plan="plan.yaml", run_log="run.jsonl") as mon:
        for batch in loader:
            ...
            mon.step(loss)

Without ``close()`` or a ``with`` block, the monitor is closed at interpreter exit
(atexit). What the run log keeps when the process ends badly (SIGTERM, ``kill -9``, a
hang) is in :mod:`sapper.monitor.durable`: at most ``flush_every_s`` seconds of steps are
lost on ``kill -9``, none on SIGTERM.

The monitor's own failures are caught, reported once (R190) and switch the failing part
off; only :class:`SapperHalt`, raised on purpose by the halt policy, reaches the loop. A
run log that cannot be written is a warning (R191) naming the path; training goes on.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sapper.distributed.bridge import MonitorBridge
from sapper.monitor import durable
from sapper.monitor.checkpoints import CheckpointWatch
from sapper.monitor.collect import StepCollector, StepSlot
from sapper.monitor.cpuwait import StepWaits
from sapper.monitor.dtensor import global_norm
from sapper.monitor.faults import GradStats, Localiser
from sapper.monitor.fingerprint import fingerprint_rows
from sapper.monitor.halt import HaltPolicy, SapperHalt
from sapper.monitor.inputs import BatchView, batch_from_user, find_loss, holds_tensors, read_batch
from sapper.monitor.logits import find_logits, watch_logits
from sapper.monitor.plan_input import PlanLike, resolve_plan
from sapper.monitor.positions import PositionWatch
from sapper.monitor.setup import SetupProbe
from sapper.monitor.sinks import ConsoleSink, RunLogSink, Sink, TensorBoardSink
from sapper.monitor.structure import StructureProbe
from sapper.monitor.system import MemoryReader, flops_per_token, peak_flops
from sapper.monitor.trackers import check_sinks, tracker_sinks
from sapper.monitor.training import TrainingObserver
from sapper.plan.schema import Plan
from sapper.rules.model import Finding, Severity
from sapper.runtime.detector import Detector, DetectorSet
from sapper.runtime.detectors import default_detectors
from sapper.runtime.detectors.internal import MONITOR_ERROR, MONITOR_MISUSE, OUTPUT_UNWRITABLE
from sapper.runtime.detectors.position import POSITION_OVERFLOW
from sapper.runtime.detectors.setup import NO_TRAINABLE
from sapper.runtime.records import StepRecord
from sapper.version import __version__

__all__ = ["Monitor"]

#: After this many ``step()`` calls without an observed optimizer step, each call is one
#: step (the optimizer is not a torch optimizer, or another one is stepped).
_FALLBACK_CALLS = 256


class Monitor:
    """Watches one training loop; see the module docstring for the two lines to add.

    Args:
        model: the module whose forward is called once per micro-batch.
        optimizer: the torch optimizer (framework wrappers are unwrapped); ``None``
            makes every :meth:`step` call one step.
        scaler: the ``torch.amp.GradScaler``, to check its use and read the scale.
        scheduler: the LR scheduler, to count its ``step()`` calls per optimizer step.
        plan: the declared job (schedule, clipping, GPU, positions), for the detectors:
            a :class:`~sapper.plan.Plan`, a :class:`~sapper.plan.LoadedPlan`
            (``sapper.load_plan("plan.yaml")``), or any file ``sapper check`` reads: a
            plan YAML, a Hugging Face ``config.json``, a DeepSpeed JSON, or a list of
            them (:mod:`sapper.monitor.plan_input`). A bad file is an
            :class:`~sapper.errors.InputError` naming it, raised here.
        log_every: most steps between reads of the device values (the only host syncs).
        flush_every_s: most seconds between reads, so the run log is never more than
            this far behind (what a ``kill -9`` can lose). Each read is one host sync on
            an accelerator: at most 1/``flush_every_s`` a second, whatever the step
            time. ``None``: read every ``log_every`` steps only.
        sample_every: steps between per-parameter gradient statistics.
        localise_every: steps between forward/backward finiteness hooks on every
            module (they are also armed for one step after a fault).
        run_log: path of the JSONL run log to append to (missing folders are
            created); each read is written through at once. If it cannot be written,
            a warning (R191) names the path and training goes on. Under
            torch.distributed a path with ``{rank}`` ("logs/rank{rank}.jsonl") is
            written by every rank with its own numbers, for ``sapper analyze logs/``
            to run the cross-rank checks offline; otherwise rank 0 writes it.
        tensorboard: a TensorBoard log directory for scalars and findings.
        console: print findings on stderr (rate-limited), or a ``rich`` Console.
        sinks: trackers that get the findings too: ``"wandb"`` (the run summary, a tag
            per code, alerts), ``"mlflow"`` (tags and a findings artifact), or ``Sink``
            objects; None (the default) adds one for each of W&B and MLflow whose run is
            active when the monitor starts, ``[]`` none (see sapper.monitor.trackers).
        inspect_on_save: scan each checkpoint :meth:`checkpoint_saved` is told of (the HF
            callback tells it at every save) off the training thread, for what makes it
            unfit to resume from: NaN/Inf (K001), a collapsed loss scale (K006), values at
            the dtype's limit (K011) (sapper.monitor.checkpoints).
        halt_on: severities ("error") and/or codes or prefixes ("R001", "R03") that raise
            :class:`SapperHalt` from :meth:`step`.
        detectors: detectors to run instead of :func:`default_detectors`.
        detector_options: per-detector options for :func:`default_detectors`.
        framework: the training framework driving the loop (``hf-trainer``,
            ``lightning`` ...; see :data:`sapper.runtime.detector.FRAMEWORKS`); by default
            ``torch-amp`` when a GradScaler is passed, else ``torch``. Framework-specific
            rules (R032/R033) apply only where they belong; the run log records it.
        hash_samples: fingerprint every sample to find duplicated data.
        flops_per_token: training FLOPs per token for MFU (default: 6·N + attention).
        peak_flops: the device's peak FLOP/s for MFU (default: sapper's GPU table).
        start_step: number of the first step (when resuming).
        rank: global rank stamped on findings in distributed runs.
        step_on_call: every :meth:`step` call closes one step, whether or not the
            optimizer stepped (for framework callbacks called once per optimizer step,
            where a loss scaler may skip ``optimizer.step()``).
        distributed: cross-rank checks when a process group of 2+ ranks is initialized
            (:mod:`sapper.distributed`; options such as ``{"timeout_s": 60}``), or False.
            Only rank 0 prints and writes the run log and TensorBoard. The exchange runs
            every ``log_every`` steps, or about every ``min_interval_s`` seconds (1)
            when steps are quicker, up to 5 × ``log_every`` steps
            (:mod:`sapper.distributed.bridge`); ``{"min_interval_s": 0}`` keeps it at
            exactly ``log_every``.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any = None,
        scaler: Any = None,
        scheduler: Any = None,
        plan: PlanLike = None,
        *,
        log_every: int = 20,
        flush_every_s: float | None = 0.5,
        sample_every: int = 50,
        localise_every: int = 500,
        run_log: str | Path | None = None,
        tensorboard: str | Path | None = None,
        console: bool | Any = True,
        halt_on: Iterable[str | Severity] = (),
        detectors: Iterable[Detector] | None = None,
        detector_options: dict[str, dict[str, Any]] | None = None,
        framework: str | None = None,
        hash_samples: bool = True,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        start_step: int = 0,
        rank: int | None = None,
        step_on_call: bool = False,
        distributed: bool | dict[str, Any] = True,
        sinks: Iterable[str | Sink] | None = None,
        inspect_on_save: bool = False,
    ) -> None:
        for field, value in (
            ("log_every", log_every),
            ("sample_every", sample_every),
            ("localise_every", localise_every),
        ):
            if not isinstance(value, int) or value < 1:
                from sapper.errors import InputError

                raise InputError(
                    "must be a positive number of steps",
                    field=field,
                    value=value,
                    expected="an integer ≥ 1",
                )
        if flush_every_s is not None and not (
            isinstance(flush_every_s, (int, float)) and 0 < flush_every_s < math.inf
        ):
            from sapper.errors import InputError

            raise InputError(
                "must be a positive number of seconds",
                field="flush_every_s",
                value=flush_every_s,
                expected="a number > 0, or None",
            )
        trackers = check_sinks(sinks)
        plan = resolve_plan(plan)
        self.model = model
        self.plan = plan
        self.log_every = log_every
        self.sample_every = sample_every
        self.localise_every = localise_every
        #: Steps between memory readings: every step on CUDA (allocator counters are
        #: free), a few per read interval for the process RSS (a file read).
        self.memory_every = 1
        self.hash_samples = hash_samples
        self.rank = rank
        self.halt = HaltPolicy(halt_on)
        self.findings: list[Finding] = []
        #: The most recent records, without their sample fingerprints (the run log keeps
        #: everything).
        self.history: deque[StepRecord] = deque(maxlen=10_000)
        self._failed_reported: set[str] = set()
        self.next_step = start_step
        self._first_step = start_step
        self.collector = StepCollector()
        self.framework = framework or ("torch-amp" if scaler is not None else "torch")
        self.detectors = DetectorSet(
            list(detectors)
            if detectors is not None
            else default_detectors(plan, framework=self.framework, **(detector_options or {}))
        )
        self._disabled: set[str] = set()
        self.sinks: list[Sink] = []
        self._closed = False
        self._bucket = StepSlot()
        self._sealed: list[StepSlot] = []
        self._events = 0
        self._calls_since_event = 0
        self._call_based = optimizer is None or step_on_call
        self._last_event_t: float | None = None
        # each step's wait for a CPU, from the training thread's run-queue delay, read
        # every step on a busy machine and every few on a quiet one (cpuwait.py)
        self._waits = StepWaits()
        self._ready_t: float | None = None
        self._force_read = False
        self._localise_pending = False
        self._arm_reason = ""
        self._fault_arms = 0
        self._first_forward = True
        # -- crash safety (sapper.monitor.durable): reads are also due by time; the lock
        # serialises the training thread, the stall flusher and exit flushes.
        self.flush_every_s = flush_every_s
        self._lock = threading.RLock()
        self._busy = 0
        self._owner: int | None = None
        self._last_read_t = time.monotonic()
        self._last_call_t = self._last_read_t
        self._held_found: list[Finding] = []
        self._arm_later: list[tuple[StepRecord, list[Finding]]] = []
        self._checkpoints = CheckpointWatch() if inspect_on_save else None
        self._noted: set[str] = set()
        self._attaching = True
        self._undo_exit: Callable[[], None] | None = None

        params = [p for p in model.parameters()]
        first = next(iter(params), None)
        self.device = first.device if first is not None else torch.device("cpu")
        observer = self.guard(
            "optimizer",
            lambda: TrainingObserver(
                self, optimizer, scaler=scaler, scheduler=scheduler, param_ids=map(id, params)
            ),
        )
        self.observer = observer or TrainingObserver(self, None, param_ids=map(id, params))
        if self.observer.optimizer is None:
            self._call_based = True
        opt_params = (
            [p for g in self.observer.optimizer.param_groups for p in g["params"]]
            if self.observer.optimizer is not None
            else [p for p in params if p.requires_grad]
        )
        self._opt_params = opt_params
        # sapper.monitor.setup: the first step's parameter and gradient counts (R120-R122)
        self.setup = SetupProbe(model, opt_params if self.observer.optimizer is not None else None)
        self._setup_stepped = False
        self.structure = StructureProbe(model, self.guard)
        groups = (
            [i for i, g in enumerate(self.observer.optimizer.param_groups) for _ in g["params"]]
            if self.observer.optimizer is not None
            else None
        )
        self.grad_stats = GradStats(model, opt_params, self.structure.prefix, groups)
        self.localiser = Localiser(model, self.guard)
        self.memory = MemoryReader(self.device)
        if not self.memory.cuda:
            self.memory_every = max(1, log_every // 4)
        declared = plan.model.max_position_embeddings if plan and plan.model else None
        self.positions = self.guard(
            "positions", PositionWatch, model, declared, self._position_facts, self.guard
        )
        self._flops_per_token = flops_per_token
        self._peak_flops = peak_flops
        if peak_flops is None:
            gpu = plan.gpu.name if plan and plan.gpu else None
            dtype = _compute_dtype(plan, model)
            self._peak_flops = self.guard("system", _peak, self.device, dtype, gpu)
        self._handles = [
            model.register_forward_pre_hook(self._forward_pre, with_kwargs=True),
            model.register_forward_hook(self._forward_post, with_kwargs=True),
        ]
        # -- sapper.distributed: the cross-rank half (None on one process); rank 0 reports.
        # A run log named with "{rank}" is written by every rank, each with its own numbers.
        per_rank = run_log is not None and "{rank}" in str(run_log)
        dist_opts = distributed if isinstance(distributed, dict) else None
        if per_rank:
            dist_opts = {"aggregate": False, **(dist_opts or {})}
        self.dist = MonitorBridge.attach(
            model, plan, every=log_every, start_step=start_step, options=dist_opts,
        ) if distributed is not False else None
        main = self.dist is None or self.dist.is_main
        if console and main:
            self.sinks.append(ConsoleSink(None if console is True else console))
        if run_log is not None and (main or per_rank):
            meta = self._meta(log_every, sample_every)
            if per_rank:
                run_log = str(run_log).format(rank=self.dist.rank if self.dist else 0)
            self.sinks.append(RunLogSink(run_log, meta, on_error=self._unwritable))
        if tensorboard is not None and main:
            tb = self.guard("tensorboard", TensorBoardSink, tensorboard)
            if tb is not None:
                self.sinks.append(tb)
        if main:  # sapper.monitor.trackers: W&B / MLflow, named or with an active run
            added = self.guard("trackers", tracker_sinks, trackers, self._tracker_failed)
            self.sinks.extend(added or [])
        self._attaching = False
        if self.findings:  # problems met while attaching
            for sink in self.sinks:
                self.guard("sinks", sink.findings, list(self.findings))
        if self.dist is not None:  # sapper.distributed: findings made between reads
            self.dist.listen(self._dispatch_now)
        self._undo_exit = durable.attach(self)

    # ---- public API ---------------------------------------------------------------
    def step(
        self, loss: Any = None, batch: Any = None, *, skipped: bool | None = None
    ) -> list[Finding]:
        """Call once per optimizer step (after ``optimizer.step()``), or once per
        micro-batch; ``loss`` is the step's loss (a tensor is fine: it is not read now),
        ``batch`` the inputs when the model's forward does not receive token ids.
        Returns the findings raised by this call (usually none: they arrive every
        ``log_every`` steps). ``skipped`` tells that a loss scaler the monitor does not
        see skipped this step's update. Raises :class:`SapperHalt` when the halt policy
        says so."""
        if self._closed:
            return []
        with self._lock:
            self._busy += 1
            self._owner = threading.get_ident()
            try:
                found = self.guard("step", self._step, loss, batch, skipped) or []
                if self._held_found or self._arm_later:
                    found = self._take_background() + found
                if self._checkpoints is not None:
                    found = self._take_checkpoints() + found
            finally:
                self._busy -= 1
                self._last_call_t = time.monotonic()
        if durable.pending():  # a signal arrived during the read above
            durable.redeliver()
        self.halt.check(found)
        return found

    def batch_ready(self) -> None:
        """The loop has its next batch in hand: the time since the last step ended was
        spent waiting for data. Optional: without it the wait runs until the next forward
        pass, which also counts the loop's own work in between (framework callbacks)."""
        if not self._closed:
            self.guard("inputs", self._batch_ready)

    def _batch_ready(self) -> None:
        if self._ready_t is not None:
            self._bucket.data_time_s += max(0.0, time.perf_counter() - self._ready_t)
            self._ready_t = None

    def eval_loss(self, loss: Any, name: str | None = None) -> None:
        """An evaluation's loss (a number, a tensor, or the model's output), for the
        overfitting and plateau rules (R110/R111) and the memorisation evidence of a short
        data cycle (R072). ``name`` tells one eval set of several apart. It is read now
        (evaluations are rare: one sync is nothing beside them) and lands on the record
        of the step just trained if that is not yet read, else on the next one."""
        if self._closed:
            return
        with self._lock:
            self.guard("eval", self._eval_loss, loss, name)

    def _eval_loss(self, loss: Any, name: str | None) -> None:
        value = self._loss_value(loss)
        if value is None:
            return
        number = float(value)
        if self.collector.ready:
            slot = self.collector.ready[-1]
        elif self._sealed:
            slot = self._sealed[-1]
        else:
            slot = self._bucket
        if name is None:
            slot.host["eval_loss"] = number
        else:
            slot.extra.setdefault("eval_losses", {})[str(name)] = number

    def flush(self) -> list[Finding]:
        """Read the pending device values now (a host sync) and run the detectors."""
        if self._closed:
            return []
        with self._lock:
            self._busy += 1
            self._owner = threading.get_ident()
            try:
                found = self.guard("read", self._read) or []
            finally:
                self._busy -= 1
        if durable.pending():
            durable.redeliver()
        self.halt.check(found)
        return found

    def close(self) -> list[Finding]:
        """Read what is pending, finish the detectors, remove every hook; returns all
        findings of the run. Safe to call twice."""
        if self._checkpoints is not None and not self._closed:
            self._checkpoints.wait()  # a checkpoint scan still running: its findings count
        with self._lock:
            self._busy += 1
            self._owner = threading.get_ident()
            try:
                found = self._close(read=True)
            finally:
                self._busy -= 1
        if durable.pending():  # a signal that arrived during the final read
            durable.redeliver()
        return found

    def _close(self, *, read: bool) -> list[Finding]:
        if self._closed:
            return self.findings
        self._closed = True
        if self._undo_exit is not None:
            self._undo_exit()
        for h in self._handles:
            h.remove()
        self.structure.disarm()
        if self.positions is not None:
            self.positions.close()
        self.localiser.disarm()
        self.observer.close()
        self._seal_evaluation()
        self._seal_pending()
        if read:
            self.guard("read", self._read)
        if self._checkpoints is not None:
            self._take_checkpoints()
        self._dispatch(self.detectors.finish())
        for sink in self.sinks:
            self.guard("sinks", sink.close)
        self.memory.close()
        self._waits.close()
        if self.dist is not None:  # sapper.distributed: remove its hooks
            self.dist.close()
        return self.findings

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def host_transfers(self) -> int:
        """Host copies of device values so far (each a sync on an accelerator)."""
        return self.collector.transfers

    # ---- the guard ------------------------------------------------------------------
    def guard(self, part: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn``; on error switch ``part`` off and report it once (R190)."""
        if part in self._disabled:
            return None
        try:
            return fn(*args)
        except SapperHalt:
            raise
        except Exception as exc:
            self._disabled.add(part)
            message = (
                f"monitor part '{part}' failed and was switched off: {type(exc).__name__}: {exc}"
            )
            finding = MONITOR_ERROR.finding(message, step=self.next_step, rank=self.rank)
            if part != "sinks":
                self._dispatch([finding], check_halt=False)
            else:
                self.findings.append(finding)
            return None

    # ---- forward hooks ----------------------------------------------------------------
    def _forward_pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]):
        if not (module.training and torch.is_grad_enabled()):
            return None
        self.guard("inputs", self._on_inputs, args, kwargs)
        return None

    def _on_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        b = self._bucket
        self._batch_ready()
        b.micro += 1
        if self._first_forward:
            self._first_forward = False
            self.guard("setup", self._setup_facts, b, self.setup.forward_facts)
            self.guard("structure", self.structure.arm)
        if not self.localiser.armed and self._run_step() % self.localise_every == 0:
            self.guard("localise", self.localiser.arm)
            self._arm_reason = "sampled"
        if self.localiser.armed:
            self.localiser.bind(b)
        self._observe_batch(b, read_batch(args, kwargs))

    def _observe_batch(self, b: StepSlot, view: BatchView) -> None:
        if view.samples:
            b.samples += view.samples
            b.tokens += view.samples * (view.seq_len or 1)
            b.host["_saw_batch"] = True
        if view.normalised:
            b.extra["loss_normalised"] = True
        if self.hash_samples and view.ids is not None:
            ids = view.ids
            b.add_i("sample_hash", fingerprint_rows(ids))
            # rows and each row's length from the shape (indexing a row is a torch op)
            rows = ids.shape[0] if ids.dim() > 1 else 1
            length = math.prod(ids.shape[1:]) if ids.dim() > 1 else ids.numel()
            b.host.setdefault("_hash_lengths", []).append((rows, length))
        if self.positions is not None and view.seq_len:
            self.guard("positions", self.positions.on_inputs, b, view)
        if view.labels is not None and self._sampled(self.next_step):
            b.add_i("micro_tokens", (view.labels != -100).sum())

    def _position_facts(self, facts: dict[str, Any]) -> None:
        # Host-known overflow: report now, before the embedding runs past its table, to
        # the position detectors only (the others see the step's full record later).
        b = self._bucket
        b.extra.update(facts)
        rec = StepRecord(step=self.next_step, extra=facts)
        self._dispatch(self.detectors.update_firing(rec, POSITION_OVERFLOW.code))

    def _forward_post(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        if self.positions is not None:
            self.guard("positions", self.positions.after_forward)
        self.guard("outputs", self._on_output, output)

    def _on_output(self, output: Any) -> None:
        b = self._bucket
        if (
            self.structure.blocks is not None
            and "norm_placement" not in b.extra
            and self.structure.armed
        ):
            self.structure.disarm()
            placement, stds = self.structure.result()
            b.extra.update(norm_placement=placement, num_blocks=self.structure.num_blocks)
            if stds:
                b.add_f("activation_std", torch.stack(stds))
                b.decoders.append(_decode_stds)
        loss = find_loss(output)
        if loss is None:
            # A loss computed outside the model: its weight is read at the logits
            # (sapper.monitor.logits), on the same steps as below.
            logits = find_logits(output) if self._weighed() else None
            if logits is not None:
                watch_logits(logits, self._on_logits_weight)
            return
        b.add_f("model_loss", loss)
        # The weight each micro-batch loss enters backward with (GA normalisation) is
        # measured on the first steps and on sampled steps: a loop's normalisation does
        # not change from step to step.
        if loss.requires_grad and self._weighed():
            loss.register_hook(self._on_loss_grad)

    def _weighed(self) -> bool:
        """The loss weight is measured on the monitor's first steps and on sampled ones."""
        return self._run_step() < 8 or self._sampled(self.next_step)

    def _on_loss_grad(self, grad: torch.Tensor) -> None:
        self.guard("accumulation", self._bucket.add_f, "loss_grad", grad)

    def _on_logits_weight(self, weight: torch.Tensor) -> None:
        self.guard("accumulation", self._bucket.add_f, "logits_weight", weight)

    # ---- optimizer boundary ----------------------------------------------------------
    def on_optimizer_step(self, clip_norm: torch.Tensor | None, skipped: bool) -> None:
        """A step ends: seal the current slot with what the optimizer sees (or, when steps
        are closed by calls, record it into the step in progress)."""
        now = time.perf_counter()
        slot = self._bucket if self._call_based else self._seal(now)
        obs = self.observer
        if not self._setup_stepped:
            self._setup_stepped = True
            self.guard("setup", self._setup_facts, slot, self.setup.step_facts)
        slot.skipped = skipped if obs.scaler is not None else None
        if clip_norm is not None:
            slot.add_f("grad_norm", clip_norm)
            slot.clip_threshold = obs.clip_max
        elif not skipped:
            self.guard("gradnorm", self._grad_norm, slot)
        if obs.scaler is not None:
            slot.extra["scaler_checked"] = True
            scale = obs.loss_scale()
            if scale is not None:
                slot.add_f("loss_scale", scale)
            if obs.scaled_grads_step():
                slot.extra["scaled_grads_step"] = True
            if obs.clip_before_unscale:
                slot.extra["clip_before_unscale"] = True
        if obs.scheduler is not None and self.next_step > 1 and not self._call_based:
            slot.extra["scheduler_steps"] = obs.scheduler_calls
        self._lrs(slot, obs.lrs())
        armed = self.localiser.armed
        number = slot.step if slot.step >= 0 else self.next_step
        sampled = self._sampled(number) and not skipped  # the same step on every rank
        if armed or sampled:
            self.guard("gradstats", self.grad_stats.measure, slot, armed, sampled)
        obs.reset()
        if not self._call_based:
            self._sealed.append(slot)

    def _setup_facts(self, slot: StepSlot, read: Callable[[], dict[str, Any]]) -> None:
        """Record host-side setup counts into the step and report at once what they
        show (the detector fires each rule once; the record at the next read repeats
        nothing)."""
        facts = read()
        slot.extra.update(facts)
        step = slot.step if slot.step >= 0 else self.next_step
        rec = StepRecord(step=step, extra=dict(slot.extra))
        self._dispatch(self.detectors.update_firing(rec, NO_TRAINABLE.code))

    def on_optimizer_stepped(self) -> None:
        self._ready_t = time.perf_counter()

    def _seal(self, now: float) -> StepSlot:
        slot, self._bucket = self._bucket, StepSlot()
        slot.step = self.next_step
        self.next_step += 1
        self._events += 1
        self._calls_since_event = 0
        if self._last_event_t is not None:
            slot.step_time_s = now - self._last_event_t
        self._last_event_t = now
        self._waits.on_step(slot)
        slot.time = time.time()
        if slot.step % self.memory_every == 0:
            slot.host.update(self.guard("memory", self.memory.read) or {})
        if self.localiser.armed:
            self._localise_pending = True
        return slot

    def _grad_norm(self, slot: StepSlot) -> None:
        grads = [p.grad for p in self._opt_params if p.grad is not None and not p.grad.is_sparse]
        if grads:  # global under FSDP2/TP (sapper.monitor.dtensor), in float64
            slot.add_f("grad_norm", global_norm(grads).to(self.device))

    def _lrs(self, slot: StepSlot, lrs: list[Any]) -> None:
        if any(isinstance(lr, torch.Tensor) and lr.device.type != "cpu" for lr in lrs):
            for lr in lrs:
                slot.add_f("lr", torch.as_tensor(lr, device=self.device).reshape(1))
            return
        slot.lrs = [float(lr) for lr in lrs if lr is not None]

    # ---- step / read ---------------------------------------------------------------
    def _run_step(self) -> int:
        """Steps since this monitor's first: sampling counts from the first step it sees
        (0 in a plain loop, the Trainer's step 1, a resumed run's first step)."""
        return self.next_step - self._first_step

    def _sampled(self, step: int) -> bool:
        return (step - self._first_step) % self.sample_every == 0

    def _step(self, loss: Any, batch: Any, skipped: bool | None) -> list[Finding]:
        self._calls_since_event += 1
        if not self._call_based and self._events == 0 and self._calls_since_event > _FALLBACK_CALLS:
            self._call_based = True
        if batch is not None and not self._bucket.host.get("_saw_batch"):
            target = self._sealed[-1] if self._sealed and self._bucket.micro == 0 else self._bucket
            if not target.host.get("_saw_batch"):
                if not holds_tensors(batch):
                    self._misuse(
                        "batch",
                        f"step(batch=...) got a value of type {type(batch).__name__} holding "
                        "no tensors; pass the step's inputs as a dict, a tensor or a "
                        "tuple/list of tensors",
                    )
                else:
                    self._observe_batch(target, batch_from_user(batch))
        if skipped is not None and not isinstance(skipped, bool):
            self._misuse(
                "skipped",
                f"step(skipped=...) got a value of type {type(skipped).__name__}; pass True "
                "when a loss scaler the monitor does not see skipped this step's update, "
                "else False",
            )
            skipped = None
        if loss is not None:
            target = self._sealed[-1] if self._sealed and self._bucket.micro == 0 else self._bucket
            value = self._loss_value(loss)
            if value is not None:
                target.add_f("user_loss", value)
        if self._call_based:
            slot = self._seal(time.perf_counter())
            if not slot.lrs and "lr" not in slot.dev_f:
                self._lrs(slot, self.observer.lrs())
            if skipped is not None:
                slot.skipped = skipped
            self._sealed.append(slot)
        for slot in self._sealed:
            slot.host.pop("_saw_batch", None)
            self.collector.add(slot)
        self._sealed.clear()
        if self._localise_pending:
            self._localise_pending = False
            self.localiser.disarm()
            self._force_read = self._force_read or self._arm_reason == "fault"
        found: list[Finding] = []
        # sapper.distributed: every rank reads at the same step boundary to exchange.
        crossing = self.dist is not None and self.dist.due(self.next_step)
        pending = len(self.collector)
        if (
            self._force_read
            or crossing
            or pending >= self.log_every
            or (
                pending
                and self.flush_every_s is not None
                and time.monotonic() - self._last_read_t >= self.flush_every_s
            )
        ):
            found = self._read()
        self._ready_t = time.perf_counter()
        return found

    def _seal_evaluation(self) -> None:
        """An evaluation after the last step trained (the usual final one) has no later
        record to ride on: it becomes a record of its own, numbered after that step."""
        b = self._bucket
        if b.micro or not ("eval_loss" in b.host or "eval_losses" in b.extra):
            return
        slot = StepSlot(step=self.next_step, time=time.time())
        slot.host["eval_loss"] = b.host.pop("eval_loss", None)
        if "eval_losses" in b.extra:
            slot.extra["eval_losses"] = b.extra.pop("eval_losses")
        self.next_step += 1
        self._sealed.append(slot)

    def _seal_pending(self) -> None:
        for slot in self._sealed:
            slot.host.pop("_saw_batch", None)
            self.collector.add(slot)
        self._sealed.clear()

    def _loss_value(self, loss: Any) -> torch.Tensor | None:
        """The step's loss as a device scalar, read from a tensor, a number, or what a
        model returns (``ModelOutput.loss``, ``{"loss": ...}``, a tuple holding a 0-d
        tensor) on every call, without a sync. Something else is one R192 note (the
        caller's mistake, not the monitor's), and the next call is read again: one odd
        value never switches loss reading off."""
        value = loss if isinstance(loss, torch.Tensor) else find_loss(loss)
        if value is None:
            raw = loss.get("loss") if isinstance(loss, dict) else getattr(loss, "loss", loss)
            if isinstance(raw, torch.Tensor):
                value = raw
            elif isinstance(raw, (int, float)) or hasattr(raw, "__float__"):
                try:
                    value = torch.tensor(float(raw))
                except (TypeError, ValueError, OverflowError):
                    value = None
        if value is None or value.numel() == 0:
            self._misuse(
                "loss",
                f"step(loss=...) got a value of type {type(loss).__name__} without a readable "
                "loss; pass a tensor, a number, or the model's output (.loss / 'loss')",
            )
            return None
        if value.device.type == "meta" or value.is_complex():
            kind = (
                "a complex loss" if value.is_complex() else "a loss on the meta device (no values)"
            )
            self._misuse(
                f"loss:{kind}",
                f"step(loss=...) got {kind}; pass the real-valued loss the forward pass "
                "computed on the model's device",
            )
            return None
        value = value.detach()
        if value.dim() == 0 and value.is_floating_point():
            return value  # the usual case: no further op
        if not value.is_floating_point():
            value = value.float()
        # A per-sample loss vector: its mean, what the backward pass usually reduces to.
        return value.reshape(()) if value.numel() == 1 else value.mean()

    def _note(self, key: str, message: str) -> None:
        """One R190 note per ``key`` that switches nothing off."""
        if key not in self._noted:
            self._noted.add(key)
            finding = MONITOR_ERROR.finding(message, step=self.next_step, rank=self.rank)
            self._dispatch([finding], check_halt=False)

    def _misuse(self, key: str, message: str) -> None:
        """The caller passed something the monitor cannot read: one R192 per ``key``,
        nothing switched off (the next call may pass the right thing)."""
        if f"misuse:{key}" not in self._noted:
            self._noted.add(f"misuse:{key}")
            finding = MONITOR_MISUSE.finding(message, step=self.next_step, rank=self.rank)
            self._dispatch([finding], check_halt=False)

    def _tracker_failed(self, message: str) -> None:
        """A tracker sink (W&B, MLflow) failed: one R190 note; training goes on."""
        self._note(f"tracker:{message}", message)

    def _unwritable(self, message: str) -> None:
        """The run log cannot be opened or written (R191): said once, loudly."""
        if "runlog" in self._noted:
            return
        self._noted.add("runlog")
        text = f"{message}; training goes on without its run log"
        finding = OUTPUT_UNWRITABLE.finding(text, step=self.next_step, rank=self.rank)
        if not any(isinstance(s, ConsoleSink) for s in self.sinks):
            warnings.warn(f"sapper R191: {text}", RuntimeWarning, stacklevel=2)
        if self._attaching:  # the sinks are not all built: replayed when they are
            self.findings.append(finding)
        else:
            self._dispatch([finding], check_halt=False)

    # ---- exit paths (sapper.monitor.durable) -----------------------------------------
    def _flush_stalled(self, stall_s: float) -> None:
        """From the flusher thread: write the complete records when ``step()`` has been
        silent for ``stall_s`` (host values only; the flusher runs on CPU monitors)."""
        if self._closed or not len(self.collector):
            return
        if time.monotonic() - self._last_call_t < stall_s:
            return
        if not self._lock.acquire(blocking=False):
            return
        self._busy += 1
        self._owner = threading.get_ident()
        try:
            if not self._closed:
                self._held_found.extend(self.guard("read", self._read, True) or [])
        finally:
            self._busy -= 1
            self._lock.release()

    def _flush_for_exit(self, *, final: bool) -> None:
        """From a signal handler (main thread): write everything complete. ``final``: the
        process ends now, so close too. Device values are read only if the device is
        idle, so a hung accelerator cannot hold the exit."""
        if self._closed or not self._lock.acquire(timeout=durable.EXIT_WAIT_S):
            return
        self._busy += 1
        self._owner = threading.get_ident()
        try:
            if final:
                self._seal_pending()
            devices = {
                t.device
                for slot in self.collector.ready
                for table in (slot.dev_f, slot.dev_i)
                for ts in table.values()
                for t in ts
            }
            idle = durable.device_idle(devices)
            if final:
                self._close(read=idle)
            elif idle:
                self._held_found.extend(self.guard("read", self._read, True) or [])
        finally:
            self._busy -= 1
            self._lock.release()

    def checkpoint_saved(self, path: str | Path) -> None:
        """A checkpoint of this run was just written at ``path``: with
        ``inspect_on_save``, scan it in the background (the findings arrive with a later
        step); otherwise nothing."""
        if self._checkpoints is not None and not self._closed:
            step = max(self.next_step - 1, 0)
            self.guard("checkpoint", self._checkpoints.saved, path, step)

    def _take_checkpoints(self) -> list[Finding]:
        """The finished scans' findings, dispatched from the training thread."""
        assert self._checkpoints is not None
        found, errors = self._checkpoints.take()
        for error in errors:
            self._note(f"inspect:{error}", error)
        if found:
            self._dispatch(found, check_halt=False)
        return found

    def _take_background(self) -> list[Finding]:
        """Findings of reads done off the training thread (they halt here), and the
        localiser arming they asked for (hooks are only touched from this thread)."""
        found, self._held_found = self._held_found, []
        later, self._arm_later = self._arm_later, []
        for rec, new in later:
            self._maybe_arm(rec, new)
        return found

    def _read(self, background: bool = False) -> list[Finding]:
        """Read and process the pending records. ``background``: off the training loop
        (stall flusher, signal handler): no cross-rank exchange, no step-time credit, no
        hooks touched."""
        self._force_read = False
        if not background:  # the CPU wait of the steps about to become records
            self._waits.settle()
        records = self.collector.read()  # note: this is a CPU-GPU sync point
        self._last_read_t = time.monotonic()
        if not records:
            return []
        # The host work below (detectors, sinks) is the monitor's, not the step's: it is
        # left out of the next step's time. The wait in the copy above is not: on an
        # accelerator it is queued training work catching up.
        started = time.perf_counter()
        mark = self._waits.mark() if not background else None
        try:
            return self._process(records, background)
        finally:
            if self._last_event_t is not None and not background:
                self._last_event_t += time.perf_counter() - started
            self._waits.leave_out(mark)

    def _process(self, records: list[StepRecord], background: bool = False) -> list[Finding]:
        found: list[Finding] = []
        if self.dist is not None and not background:  # sapper.distributed: the exchange
            found.extend(
                self.guard("distributed", self.dist.on_records, records, self.next_step) or []
            )
        for rec in records:
            self._enrich(rec)
        # detector by detector over the read's records (each one's state stays hot); the
        # same findings, per record and in the same order, as record by record
        for rec, new in zip(records, self.detectors.update_batch(records), strict=True):
            found.extend(new)
            self.history.append(rec)
            if background:
                self._arm_later.append((rec, new))
            else:
                self._maybe_arm(rec, new)
        for sink in self.sinks:
            self.guard("sinks", sink.records, records)
        for rec in records:
            rec.extra.pop("sample_hashes", None)  # bounded memory: they are in the run log
        found.extend(self._detector_failures())
        self._dispatch(found, check_halt=False)
        return found

    def _detector_failures(self) -> list[Finding]:
        """A detector that raised is skipped from then on; say so once."""
        out = []
        for name, error in self.detectors.failed.items():
            if name not in self._failed_reported:
                self._failed_reported.add(name)
                message = f"detector {name} failed and was switched off: {error}"
                out.append(MONITOR_ERROR.finding(message, step=self.next_step, rank=self.rank))
        return out

    def _enrich(self, rec: StepRecord) -> None:
        if self.rank is not None:
            rec.extra.setdefault("rank", self.rank)
        if rec.tokens_per_s and self._peak_flops:
            fpt = self._flops_per_token
            if fpt is None and rec.tokens and rec.samples:
                fpt = flops_per_token(self.model, rec.tokens // max(1, rec.samples))
                self._flops_per_token = fpt
            if fpt:
                rec.mfu = fpt * rec.tokens_per_s / self._peak_flops

    def _maybe_arm(self, rec: StepRecord, found: list[Finding]) -> None:
        """Arm the localiser for the next step after a non-finite value that was applied
        (or a scaler that keeps skipping), a few times per run at most."""
        bad_loss = rec.loss is not None and not math.isfinite(rec.loss)
        bad_grad = rec.grad_norm is not None and not math.isfinite(rec.grad_norm)
        scaler = any(f.code in ("R030", "R031") for f in found)
        if not (bad_loss or (bad_grad and not rec.skipped) or scaler) or self._fault_arms >= 3:
            return
        if self._arm_reason == "fault" and self.localiser.armed:
            return
        self._fault_arms += 1
        if not self.localiser.armed:
            self.guard("localise", self.localiser.arm)
        self._arm_reason = "fault"
        self._bucket.extra.setdefault("nonfinite_first_step", rec.step)

    def _dispatch_now(self, findings: list[Finding]) -> None:
        """sapper.distributed's findings made outside a read (X006 at start, X005 from the
        lost-rank watcher thread): written through the sinks at once, so they are on disk
        before a launcher tears the job down. Host work only; never raises."""
        if self._closed:
            return
        self._dispatch(findings, check_halt=False)

    def _dispatch(self, findings: list[Finding], *, check_halt: bool = True) -> None:
        if not findings:
            return
        if self.rank is not None:
            findings = [
                f if f.rank is not None else f.model_copy(update={"rank": self.rank})
                for f in findings
            ]
        self.findings.extend(findings)
        for sink in self.sinks:
            self.guard("sinks", sink.findings, findings)
        if check_halt:
            self.halt.check(findings)

    def _meta(self, log_every: int, sample_every: int) -> dict[str, Any]:
        return {
            "source": "sapper.Monitor",
            "sapper": __version__,
            "torch": torch.__version__,
            "model": type(self.model).__name__,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "device": str(self.device),
            "log_every": log_every,
            "sample_every": sample_every,
            "rank": self.rank,
            "framework": self.framework,
            "plan": self.plan.model_dump(mode="json") if self.plan is not None else None,
        }


def _decode_stds(slot: StepSlot, f: dict, ints: dict, rec: StepRecord) -> None:
    if f.get("activation_std"):
        rec.extra["activation_std"] = [float(v) for v in f["activation_std"]]


def _compute_dtype(plan: Plan | None, model: nn.Module) -> str:
    if plan is not None:
        return plan.precision.dtype
    first = next(model.parameters(), None)
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(
        first.dtype if first is not None else torch.float32, "bf16"
    )


def _peak(device: torch.device, dtype: str, gpu: str | None) -> float | None:
    return peak_flops(device, dtype, gpu)
