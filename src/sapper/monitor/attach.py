"""The monitor in a training program nobody edited: what ``sapper run``'s bootstrap does.

``sapper run`` starts the command with its bootstrap (``sapper/launch/site/
sitecustomize.py``) on the children's import path; the bootstrap calls :func:`imported`
as each module it waits for finishes importing. Here that becomes:

* **torch** (:func:`install`): the dump machinery (below) and three process-wide hooks
  for plain loops, each a pass-through: a global optimizer step pre-hook, a post-hook,
  and a wrapper of ``torch.autograd.backward`` (``Tensor.backward`` calls it) that keeps
  the scalar the loop differentiates, detached, without reading it.
* **transformers' Trainer** and **Lightning's Trainer**: ``__init__`` is wrapped (on the
  base class, so TRL's, LLaMA-Factory's, Axolotl's and Unsloth's subclasses get it
  through ``super().__init__``) to add sapper's callback (:mod:`sapper.monitor.hf`,
  :mod:`sapper.monitor.lightning`). From then on the callbacks own the monitor: the
  plain-loop hooks stand aside in that process.
* **A plain loop** (accelerate's ``Accelerator`` and DeepSpeed's engine step a torch
  optimizer too): at the first step of an optimizer no monitor watches, a
  :class:`~sapper.monitor.Monitor` is built on it. The model is the outermost
  ``nn.Module`` holding the optimizer's parameters, found once by one walk over the
  objects the garbage collector tracks (no hook on every module call, which would slow
  each forward pass); failing that, the module holding the optimizer (DeepSpeed's
  engine). The same walk finds the LR scheduler driving the optimizer, whose calls per
  step the monitor checks. After each step the monitor gets the step's loss: the model's own (the
  monitor reads it from the forward output) when the model returns one, else the sum of
  the scalars given to backward since the last step (``(loss / accumulation)`` per
  micro-batch sums to the step's mean), with a ``GradScaler``'s scaling undone. No value
  is read on the host here: the monitor reads them on its own cadence.
* **sapper's Monitor**: a program that builds its own (two lines, or a sapper callback)
  keeps it and gets nothing more: an auto monitor sharing its model is closed, none is
  added later, and a program monitor without a ``run_log`` writes the run folder's.

Every monitor writes ``$SAPPER_RUN_DIR/logs/rank{RANK}.jsonl`` (under torch.distributed
the process group's rank; otherwise the ``RANK`` variable, 0 by default).

**Dumps on request**, for the hang analysis: ``faulthandler`` writes every thread's
stack to ``$SAPPER_RUN_DIR/stacks/rank{R}-{pid}.txt`` on SIGUSR1 (unless the program
handles SIGUSR1 itself), and a daemon thread looks at ``$SAPPER_RUN_DIR/.sapper-dump``
once a second: when it appears or its mtime changes, the stacks go to the same file and,
under torch.distributed with the flight recorder on (``TORCH_FR_BUFFER_SIZE``), torch's
flight-recorder dump to ``$SAPPER_RUN_DIR/fr/rank_{R}``. The stack file exists (empty)
from the moment the process can answer: its name says which pids SIGUSR1 may be sent to.

Any failure here switches sapper off in the process with one line on stderr,
``sapper: bootstrap off (<reason>)``, and the program goes on; the monitor's own
failures are its own (R190).
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import json
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sapper.runtime.rundir import DUMP_TRIGGER, PLAN_FILE

__all__ = ["imported", "install", "run_log_path", "run_plan"]

#: Seconds between two looks at the trigger (one ``stat``).
POLL_S = 1.0
#: Scalars kept from backward between two optimizer steps (gradient accumulation).
_ROOTS_KEPT = 64
#: Training forward passes looked at to learn whether the model returns its loss.
_PROBE_FORWARDS = 4


class _State:
    """This process's attachment (one per process)."""

    def __init__(self) -> None:
        self.installed = False
        self.off: str | None = None
        self.run_dir: Path | None = None
        #: A HF or Lightning Trainer was built here: its callback owns the monitor.
        self.framework = False
        self.building = 0
        self.auto: weakref.WeakSet[Any] = weakref.WeakSet()
        self.decided: weakref.WeakSet[Any] = weakref.WeakSet()
        self.plain: Any = None
        self.plain_opt: weakref.ref[Any] | None = None
        self.stepped = False
        self.roots: list[torch.Tensor] = []
        self.scaled: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None
        self.scaler: weakref.ref[Any] | None = None
        self.model_loss: bool | None = None
        self.probe_seen = 0
        self.probe: Any = None
        self.handles: list[Any] = []
        self.patched: list[tuple[Any, str, Any]] = []
        self.stacks: Any = None
        self.stacks_path: Path | None = None
        self.stacks_rank: int | None = None
        #: faulthandler answers SIGUSR1 with the stacks (the program has not taken it).
        self.usr1 = False
        self.lock = threading.Lock()


_S = _State()


# ---- entry points ---------------------------------------------------------------------
def imported(name: str, module: Any) -> None:
    """``name`` finished importing (called by the bootstrap): attach what it needs."""
    if _S.off:
        return
    try:
        install()
        if _S.off:
            return
        if name == "transformers.trainer":
            _wrap_init(module.Trainer, _after_hf_trainer)
        elif name in ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"):
            _wrap_init(module.Trainer, _after_lightning_trainer)
        elif name == "sapper.monitor.monitor":
            _wrap_monitor(module.Monitor)
    except Exception as exc:
        _off(exc)


def install(run_dir: str | Path | None = None) -> bool:
    """Set up this process once torch is imported: the dumps and the plain-loop hooks.
    Idempotent; False when sapper is off here (no run folder, or a failure said so)."""
    if _S.installed or _S.off:
        return _S.installed and not _S.off
    with _S.lock:
        if _S.installed:
            return not _S.off
        _S.installed = True
        where = run_dir if run_dir is not None else os.environ.get("SAPPER_RUN_DIR")
        if not where:
            _S.off = "SAPPER_RUN_DIR is not set"
            return False
        try:
            _S.run_dir = Path(where).absolute()
            _start_dumps(_S.run_dir)
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            _S.handles.append(register_optimizer_step_pre_hook(_before_step))
            _S.handles.append(register_optimizer_step_post_hook(_after_step))
            _patch(torch.autograd, "backward", _backward_wrapper)
            for cls in _scaler_classes():
                _patch(cls, "scale", _scale_wrapper)
        except Exception as exc:
            _off(exc)
            return False
    return True


def run_plan() -> Any:
    """The plan ``sapper run`` checked before the launch (``plan.json`` in the run
    folder), for the detectors of the monitors attached here; None when the launch had
    none or it cannot be read (the monitor then runs without one, as it would in code)."""
    if _S.run_dir is None:
        return None
    path = _S.run_dir / PLAN_FILE
    try:
        raw = json.loads(path.read_text())
        from sapper.plan.schema import Plan

        return Plan.model_validate(raw)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged file costs the detectors their plan, nothing more
        print(f"sapper: the run's plan ({path}) is not used ({exc.__class__.__name__})",
              file=sys.stderr)
        return None


def run_log_path() -> str:
    """This process's run log in the run folder: ``logs/rank{rank}.jsonl`` (the monitor
    fills in the process group's rank under torch.distributed)."""
    assert _S.run_dir is not None
    name = "rank{rank}.jsonl" if _distributed() else f"rank{_env_rank()}.jsonl"
    return str(_S.run_dir / "logs" / name)


# ---- switching off --------------------------------------------------------------------
def _off(reason: BaseException | str) -> None:
    """One line, then out of the way: hooks removed, patched functions restored."""
    if _S.off:
        return
    text = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
    _S.off = text
    try:
        sys.stderr.write(f"sapper: bootstrap off ({text})\n")
        sys.stderr.flush()
    except Exception:
        pass
    for handle in _S.handles:
        with contextlib.suppress(Exception):
            handle.remove()
    _S.handles.clear()
    for owner, attr, original in reversed(_S.patched):
        with contextlib.suppress(Exception):
            setattr(owner, attr, original)
    _S.patched.clear()
    _S.roots.clear()
    _S.scaled = None


def _guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """Run sapper's part of a hook; a failure switches sapper off, never reaches the
    program."""
    if _S.off:
        return None
    try:
        return fn(*args)
    except Exception as exc:
        _off(exc)
        return None


def _patch(owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    if getattr(original, "__sapper_attach__", False):
        return
    wrapper = make(original)
    wrapper.__sapper_attach__ = True
    _S.patched.append((owner, attr, original))
    setattr(owner, attr, wrapper)


@contextlib.contextmanager
def _building() -> Iterator[None]:
    """Monitors built inside are sapper's own (not the program's)."""
    _S.building += 1
    try:
        yield
    finally:
        _S.building -= 1


# ---- ranks and paths ------------------------------------------------------------------
def _env_rank() -> int:
    value = os.environ.get("RANK", "0").strip()
    return int(value) if value.isdigit() else 0


def _distributed() -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _rank() -> int:
    return torch.distributed.get_rank() if _distributed() else _env_rank()


# ---- is it watched already? -----------------------------------------------------------
def _observers() -> list[Any]:
    from sapper.monitor.training import _OBSERVERS

    return list(_OBSERVERS)


def _first_param(optimizer: Any) -> torch.Tensor | None:
    for group in getattr(optimizer, "param_groups", None) or ():
        for p in group.get("params", ()):
            return p
    return None


def _watched(model: Any = None, optimizer: Any = None) -> bool:
    """An open monitor already watches this optimizer or this model's parameters."""
    from sapper.monitor.training import unwrap_optimizer

    opt = unwrap_optimizer(optimizer) if optimizer is not None else None
    first = _first_param(opt) if opt is not None else None
    if first is None and isinstance(model, nn.Module):
        first = next(model.parameters(), None)
    for o in _observers():
        if (opt is not None and o.optimizer is opt) or (first is not None and o.owns(first)):
            return True
    return False


# ---- plain loops ----------------------------------------------------------------------
def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _S.stepped = True
    if not (_S.framework or _S.off):
        _guarded(_decide, optimizer)


def _decide(optimizer: Any) -> None:
    """The first step of each optimizer decides whether it gets a monitor."""
    if optimizer not in _S.decided:
        _S.decided.add(optimizer)
        _attach_plain(optimizer)


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    roots, _S.roots = _S.roots, []
    mon = _S.plain
    if mon is None or _S.plain_opt is None or _S.plain_opt() is not optimizer:
        return
    loss = None if _S.model_loss or not roots else _guarded(_step_loss, roots)
    _guarded(mon.step, loss)


def _step_loss(roots: list[torch.Tensor]) -> torch.Tensor:
    """The loss the step optimised: the one scalar given to backward, or their sum over
    the micro-batches (a device op, no read)."""
    if len(roots) == 1:
        return roots[0]
    try:
        return torch.stack([r.reshape(()).float() for r in roots]).sum()
    except RuntimeError:  # scalars on different devices: the last one speaks for the step
        return roots[-1]


def _attach_plain(optimizer: Any) -> None:
    if _S.plain is not None or _watched(optimizer=optimizer):
        return
    model, scheduler = _model_of(optimizer)
    if model is None:
        _off(
            f"no torch.nn.Module holds the parameters the {type(optimizer).__name__} "
            "optimizer steps; the monitor is not attached"
        )
        return
    from sapper.monitor.monitor import Monitor

    scaler = _S.scaler() if _S.scaler is not None else None
    _rename_stacks()
    rank = torch.distributed.get_rank() if _distributed() else None
    with _building():
        mon = Monitor(
            model, optimizer, scaler=scaler, scheduler=scheduler, run_log=run_log_path(),
            rank=rank, plan=run_plan(),
        )
    _S.plain, _S.plain_opt = mon, weakref.ref(optimizer)
    _S.auto.add(mon)
    _S.probe = model.register_forward_hook(_probe_model_loss)


def _model_of(optimizer: Any) -> tuple[nn.Module | None, Any]:
    """The outermost module holding most of the optimizer's parameters (a DDP, FSDP or
    compiled wrapper, whose forward the loop calls), else one holding the optimizer; and
    the LR scheduler driving the optimizer, if there is one (its calls per step are
    checked). One walk over the objects the garbage collector tracks, once per run."""
    from sapper.monitor.training import unwrap_optimizer

    ids = {id(p) for g in optimizer.param_groups for p in g.get("params", ())}
    base = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or getattr(
        torch.optim.lr_scheduler, "_LRScheduler", None
    )
    modules, scheduler = [], None
    for o in gc.get_objects():
        kind = type(o)
        if issubclass(kind, nn.Module):
            modules.append(o)
        elif base is not None and issubclass(kind, base) and scheduler is None:
            if getattr(o, "optimizer", None) is optimizer:
                scheduler = o
    inner = {
        id(child)
        for m in modules
        for child in (getattr(m, "_modules", None) or {}).values()
        if child is not None
    }
    best, most = None, 0
    roots = [m for m in modules if id(m) not in inner]
    for m in roots:
        try:
            held = sum(1 for p in m.parameters() if id(p) in ids)
        except Exception:  # a module half-built or in an odd state: not the model
            continue
        if held > most:
            best, most = m, held
    if best is None:  # the optimizer steps flat copies (DeepSpeed ZeRO): its engine
        best = next(
            (m for m in roots if unwrap_optimizer(getattr(m, "optimizer", None)) is optimizer),
            None,
        )
    return best, scheduler


def _probe_model_loss(module: nn.Module, args: Any, output: Any) -> None:
    """Learn, from the first training forward passes, whether the model returns its
    loss (then the monitor reads it there, and backward's scalars are not needed)."""
    if not (module.training and torch.is_grad_enabled()):
        return
    from sapper.monitor.inputs import find_loss

    _S.probe_seen += 1
    if find_loss(output) is not None:
        _S.model_loss = True
    if _S.model_loss or _S.probe_seen >= _PROBE_FORWARDS:
        _S.model_loss = bool(_S.model_loss)
        if _S.probe is not None:
            _S.probe.remove()
            _S.probe = None


def _keep_root(tensors: Any) -> None:
    if _S.framework or len(_S.roots) >= _ROOTS_KEPT:
        return
    if isinstance(tensors, (list, tuple)) and len(tensors) == 1:
        tensors = tensors[0]
    if not (
        isinstance(tensors, torch.Tensor)
        and tensors.requires_grad
        and tensors.is_floating_point()
        and tensors.numel() == 1
    ):
        return
    scaled = _S.scaled
    if scaled is not None and scaled[0]() is tensors:
        _S.roots.append(scaled[1])  # the loss before GradScaler multiplied it
        _S.scaled = None
    else:
        _S.roots.append(tensors.detach())


def _backward_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if not _S.off:
            _guarded(_keep_root, args[0] if args else kwargs.get("tensors"))
        return original(*args, **kwargs)

    return backward


def _scale_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def scale(self: Any, outputs: Any) -> Any:
        out = original(self, outputs)
        if not _S.off:
            _guarded(_note_scaled, self, outputs, out)
        return out

    return scale


def _note_scaled(scaler: Any, outputs: Any, out: Any) -> None:
    if isinstance(outputs, torch.Tensor) and isinstance(out, torch.Tensor) and out is not outputs:
        _S.scaled = (weakref.ref(out), outputs.detach())
        _S.scaler = weakref.ref(scaler)


def _scaler_classes() -> list[type]:
    """GradScaler's classes that define ``scale`` (torch.cuda.amp's is its own before
    torch 2.3, a subclass after)."""
    found: list[type] = []
    for owner, name in ((torch, "amp"), (torch, "cuda")):
        ns = getattr(owner, name, None)
        if name == "cuda":
            ns = getattr(ns, "amp", None)
        cls = getattr(ns, "GradScaler", None)
        if isinstance(cls, type) and "scale" in cls.__dict__ and cls not in found:
            found.append(cls)
    return found


# ---- trainers -------------------------------------------------------------------------
def _wrap_init(cls: type, after: Callable[[Any], None]) -> None:
    def make(original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            _guarded(after, self)

        return __init__

    _patch(cls, "__init__", make)


def _after_hf_trainer(trainer: Any) -> None:
    from sapper.monitor.hf import SapperCallback

    _S.framework = True
    handler = getattr(trainer, "callback_handler", None)
    if handler is None or any(isinstance(cb, SapperCallback) for cb in handler.callbacks):
        return
    trainer.add_callback(_auto_class("AutoHFCallback")())


def _after_lightning_trainer(trainer: Any) -> None:
    from sapper.monitor.lightning import SapperCallback

    # sapper's callback is a ``lightning`` one: a ``pytorch_lightning`` Trainer next to an
    # installed ``lightning`` would refuse it; its loop is then watched as a plain one.
    base = SapperCallback.__mro__[1].__module__.split(".")[0]
    if type(trainer).__module__.split(".")[0] != base:
        return
    _S.framework = True
    callbacks = getattr(trainer, "callbacks", None)
    if not isinstance(callbacks, list) or any(isinstance(c, SapperCallback) for c in callbacks):
        return
    callbacks.append(_auto_class("AutoLightningCallback")())


def _auto_class(name: str) -> type:
    return getattr(sys.modules[__name__], name)


def _start_monitor(callback: Any, start: Callable[[], None], model: Any, optimizer: Any) -> None:
    """Build an auto callback's monitor unless the program's own watches the model."""
    if callback.monitor is not None or _S.off or _watched(model, optimizer):
        return
    callback.options["run_log"] = run_log_path()
    if callback.plan is None:
        callback.plan = run_plan()
    _rename_stacks()
    try:
        with _building():
            start()
    except Exception as exc:
        callback.monitor = None
        _off(exc)
        return
    if callback.monitor is not None:
        _S.auto.add(callback.monitor)


def _make_hf_callback() -> type:
    from sapper.monitor.hf import SapperCallback

    class AutoHFCallback(SapperCallback):
        """sapper's Trainer callback, added by ``sapper run`` (the program had none)."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            def start() -> None:
                SapperCallback.on_train_begin(self, args, state, control, **kwargs)

            _start_monitor(self, start, kwargs.get("model"), kwargs.get("optimizer"))

    return AutoHFCallback


def _make_lightning_callback() -> type:
    from sapper.monitor.lightning import SapperCallback

    class AutoLightningCallback(SapperCallback):
        """sapper's Lightning callback, added by ``sapper run`` (the program had none)."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            optimizers = list(getattr(trainer, "optimizers", None) or [])

            def start() -> None:
                SapperCallback.on_train_start(self, trainer, pl_module)

            _start_monitor(self, start, pl_module, optimizers[0] if optimizers else None)

    return AutoLightningCallback


_LAZY_CLASSES = {
    "AutoHFCallback": _make_hf_callback,
    "AutoLightningCallback": _make_lightning_callback,
}


def __getattr__(name: str) -> Any:
    """The auto callbacks subclass the framework's callback, so they are built on first
    use (importing this module must not import transformers or Lightning); defined as
    this module's attributes, they pickle (Lightning's spawn strategies)."""
    make = _LAZY_CLASSES.get(name)
    if make is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = make()
    cls.__module__, cls.__qualname__ = __name__, name
    globals()[name] = cls
    return cls


# ---- the program's own monitor --------------------------------------------------------
def _wrap_monitor(cls: type) -> None:
    def make(original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def __init__(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:
            if not _S.building and not _S.off:
                kwargs = _guarded(_programs_monitor, model, kwargs) or kwargs
            original(self, model, *args, **kwargs)

        return __init__

    _patch(cls, "__init__", make)


def _programs_monitor(model: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The program builds its own monitor: it replaces any of sapper's on the same
    model, and writes the run folder's log unless it names one."""
    own = {id(p) for p in model.parameters()} if isinstance(model, nn.Module) else set()
    for mon in list(_S.auto):
        theirs = getattr(mon, "model", None)
        if isinstance(theirs, nn.Module) and any(id(p) in own for p in theirs.parameters()):
            mon.close()
            if mon is _S.plain:
                _S.plain = None
    if kwargs.get("run_log") is None and _S.run_dir is not None:
        kwargs = {**kwargs, "run_log": run_log_path()}
    return kwargs


# ---- dumps on request -----------------------------------------------------------------
def _start_dumps(run_dir: Path) -> None:
    if _launcher():
        return
    folder = run_dir / "stacks"
    folder.mkdir(parents=True, exist_ok=True)
    rank = _env_rank()
    _S.stacks_path, _S.stacks_rank = folder / f"rank{rank}-{os.getpid()}.txt", rank
    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is not None and signal.getsignal(usr1) in (signal.SIG_DFL, None):
        # The empty file says "SIGUSR1 writes my stacks": only while the handler is ours.
        _S.stacks = open(_S.stacks_path, "a")  # held open: faulthandler writes to it
        faulthandler.register(usr1, file=_S.stacks, all_threads=True)
        _S.usr1 = True
    trigger = run_dir / DUMP_TRIGGER
    threading.Thread(
        target=_watch_trigger,
        args=(trigger, _mtime(trigger)),
        name="sapper-dump-watch",
        daemon=True,
    ).start()


def _check_usr1() -> None:
    """The program installed its own SIGUSR1 handler (Lightning's SLURM requeue) over
    faulthandler's: stop offering SIGUSR1, so no one sends it expecting stacks."""
    usr1 = getattr(signal, "SIGUSR1", None)
    if not _S.usr1 or usr1 is None or signal.getsignal(usr1) in (signal.SIG_DFL, None):
        return
    # (no faulthandler.unregister: it would put back the handler it replaced, over the
    # program's)
    _S.usr1 = False
    if _S.stacks is not None and _S.stacks_path is not None and _S.stacks.tell() == 0:
        with contextlib.suppress(Exception):
            _S.stacks.close()
        with contextlib.suppress(OSError):
            _S.stacks_path.unlink()
        _S.stacks = None


#: The launchers' own processes (``torchrun``, ``python -m torch.distributed.run``,
#: ``deepspeed``, ``accelerate launch``) import torch but train nothing: no stacks of
#: theirs to take for a rank's, no SIGUSR1 for them.
_LAUNCHER_NAMES = frozenset(("torchrun", "deepspeed", "accelerate", "accelerate-launch"))
_LAUNCHER_FILES = (
    "torch/distributed/run.py",
    "torch/distributed/launch.py",
    "deepspeed/launcher/runner.py",
    "deepspeed/launcher/launch.py",
    "accelerate/commands/launch.py",
)


def _launcher() -> bool:
    argv0 = (sys.argv[0] if sys.argv else "").replace("\\", "/")
    return os.path.basename(argv0) in _LAUNCHER_NAMES or argv0.endswith(_LAUNCHER_FILES)


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _watch_trigger(trigger: Path, seen: int | None) -> None:
    time.sleep(POLL_S)
    if _launcher():  # ``python -m torch.distributed.run``: argv is known only now
        _stop_dumps()
        return
    while True:
        _check_usr1()
        now = _mtime(trigger)
        if now is not None and now != seen:
            seen = now
            if _answers():
                with contextlib.suppress(Exception):  # a failed dump must not end the thread
                    _dump()
        time.sleep(POLL_S)


def _stop_dumps() -> None:
    """A launcher's process after all: no stack file, no SIGUSR1 handler of sapper's."""
    usr1 = getattr(signal, "SIGUSR1", None)
    with contextlib.suppress(Exception):
        if usr1 is not None and _S.usr1 and signal.getsignal(usr1) in (signal.SIG_DFL, None):
            faulthandler.unregister(usr1)
    _S.usr1 = False
    if _S.stacks is not None:
        with contextlib.suppress(Exception):
            _S.stacks.close()
        with contextlib.suppress(OSError):
            if _S.stacks_path is not None:
                _S.stacks_path.unlink()
    _S.stacks = _S.stacks_path = None


def _answers() -> bool:
    """A training process answers the trigger; a worker the training spawned (a data
    loader's, a compiler's) that never stepped stays quiet, so its stack is not taken
    for its rank's."""
    if _S.stepped or _S.plain is not None or _S.framework or _distributed():
        return True
    mp = sys.modules.get("multiprocessing")
    return mp is None or mp.parent_process() is None


def _rename_stacks() -> None:
    """Under torch.distributed the stack file carries the process group's rank (a
    program spawning its ranks itself sets no RANK variable)."""
    if _S.stacks_path is None or not _distributed():
        return
    rank = torch.distributed.get_rank()
    if rank != _S.stacks_rank:
        new = _S.stacks_path.with_name(f"rank{rank}-{os.getpid()}.txt")
        if _S.stacks is not None:
            os.replace(_S.stacks_path, new)  # the open file (faulthandler's) follows it
        _S.stacks_path, _S.stacks_rank = new, rank


def _dump() -> None:
    _rename_stacks()
    if _S.stacks_path is not None:
        if _S.stacks is None:
            _S.stacks = open(_S.stacks_path, "a")
        faulthandler.dump_traceback(file=_S.stacks, all_threads=True)
        _S.stacks.flush()
    if _S.run_dir is None or not _dist_initialized() or not _recorder_on():
        return
    final = _S.run_dir / "fr" / f"rank_{torch.distributed.get_rank()}"
    # First without the collectives' Python stacks (a fraction of a millisecond), then
    # with them: torch symbolises them through torch._dynamo, seconds to import in a
    # process that has not, and a supervisor ending a hung job may not wait that long.
    _write_recorder(final, stacks=False)
    _write_recorder(final, stacks=True)


def _recorder_on() -> bool:
    """The flight recorder keeps entries (its buffer size is set, > 0)."""
    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = (os.environ.get(key) or "").strip()
        if value.isdigit() and int(value) > 0:
            return True
    return False


def _write_recorder(final: Path, *, stacks: bool) -> None:
    """torch's flight-recorder dump (the pickle its own timeout dump writes) to
    ``final``, atomically; the call's name changed in torch 2.7."""
    c10d = getattr(torch._C, "_distributed_c10d", None)
    dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return
    data = bytes(dump(includeStackTraces=stacks))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, final)


def _dist_initialized() -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())
