"""Observe the optimizer, the loss scaler, the LR scheduler and clipping, in call order.

The optimizer's step pre-hook marks the end of a step (the gradients are final there,
still on the parameters); the scaler's ``scale``/``unscale_``/``step`` and
``clip_grad_norm_`` are wrapped to see the order of calls, which is how GradScaler
misuse is recognised without touching a gradient: the optimizer stepping while gradients
are still scaled, or clipping measuring scaled gradients. Everything observed here is a
host-side flag or a device tensor kept for later; nothing is synchronised.

Wrappers are set on the scaler's instance and removed by :meth:`close`; a scheduler's
calls are read from its own step counter (wrapped only when it has none);
``torch.nn.utils.clip_grad_norm_`` and ``clip_grads_with_norm_`` are patched
process-wide while at least one monitor is open, and pass every call through unchanged.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import GeneratorType
from typing import Any, Protocol

import torch

__all__ = ["TrainingObserver", "unwrap_optimizer"]


class _Listener(Protocol):
    def on_optimizer_step(self, grad_norm: torch.Tensor | None, skipped: bool) -> None: ...
    def on_optimizer_stepped(self) -> None: ...
    def guard(self, part: str, fn: Callable[..., Any], *args: Any) -> Any: ...


def unwrap_optimizer(opt: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside framework wrappers (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer), which may subclass Optimizer without its state."""
    for _ in range(5):
        inner = getattr(opt, "optimizer", None)
        if inner is None or inner is opt:
            break
        opt = inner
    ok = isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "_optimizer_step_pre_hooks")
    return opt if ok else None


# ---- process-wide clipping patches ----------------------------------------------------
# Two public ways to clip by norm: ``clip_grad_norm_`` (norm and clip in one call) and,
# from torch 2.6, ``get_total_norm`` + ``clip_grads_with_norm_`` (what accelerate, and so
# the HF Trainer, calls). ``clip_grad_norm_`` calls the private ``_clip_grads_with_norm_``,
# so patching the public name sees each clip once.
_OBSERVERS: weakref.WeakSet[TrainingObserver] = weakref.WeakSet()
_ORIGINAL: dict[tuple[str, str], Callable[..., Any]] = {}
_NORM_CLIPS = (
    ("torch.nn.utils", "clip_grad_norm_"),
    ("torch.nn.utils.clip_grad", "clip_grad_norm_"),
)
_WITH_NORM_CLIPS = (("torch.nn.utils", "clip_grads_with_norm_"),)


def _owners(parameters: Any) -> tuple[Any, list[TrainingObserver]]:
    """The parameters to pass on, and the observers owning the first one. Only the
    parameters up to the first tensor are read here: a generator (``model.parameters()``,
    the usual argument) goes on as a generator resuming where this left off, so torch
    walks the module tree once, as it does without sapper, and still warns when it is
    empty."""
    if isinstance(parameters, torch.Tensor):
        first: Any = parameters
        params: Any = parameters
    elif isinstance(parameters, (list, tuple)):
        first = next((p for p in parameters if isinstance(p, torch.Tensor)), None)
        params = parameters
    else:
        it = iter(parameters)
        head: list[Any] = []
        first = None
        for p in it:
            head.append(p)
            if isinstance(p, torch.Tensor):
                first = p
                break
        params = _resume(head, it) if isinstance(parameters, GeneratorType) else [*head, *it]
    if first is None:
        return params, []
    return params, [o for o in list(_OBSERVERS) if o.owns(first)]


def _resume(head: list[Any], rest: Iterator[Any]) -> Iterator[Any]:
    """``head`` then the rest of the iterator it came from (a generator, as given)."""
    yield from head
    yield from rest


def _patched_norm_clip(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any):
        params, owners = _owners(parameters)
        for o in owners:
            o.listener.guard("clip", o.before_clip)
        total = original(params, max_norm, *args, **kwargs)
        for o in owners:
            o.listener.guard("clip", o.after_clip, total, max_norm)
        return total

    clip_grad_norm_.__sapper_patch__ = True  # type: ignore[attr-defined]
    return clip_grad_norm_


def _patched_with_norm_clip(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def clip_grads_with_norm_(
        parameters: Any, max_norm: float, total_norm: torch.Tensor, *args: Any, **kwargs: Any
    ) -> None:
        params, owners = _owners(parameters)
        for o in owners:
            o.listener.guard("clip", o.before_clip)
        original(params, max_norm, total_norm, *args, **kwargs)
        for o in owners:
            o.listener.guard("clip", o.after_clip, total_norm, max_norm)

    clip_grads_with_norm_.__sapper_patch__ = True  # type: ignore[attr-defined]
    return clip_grads_with_norm_


def _install_clip_patch() -> None:
    import importlib

    if _ORIGINAL:
        return
    for names, patch in (
        (_NORM_CLIPS, _patched_norm_clip),
        (_WITH_NORM_CLIPS, _patched_with_norm_clip),
    ):
        for module_name, attr in names:
            module = importlib.import_module(module_name)
            original = getattr(module, attr, None)
            if original is None:  # torch before 2.6 has no clip_grads_with_norm_
                continue
            _ORIGINAL[(module_name, attr)] = original
            setattr(module, attr, patch(original))


def _remove_clip_patch() -> None:
    import importlib

    if _OBSERVERS or not _ORIGINAL:
        return
    for (module_name, attr), original in _ORIGINAL.items():
        setattr(importlib.import_module(module_name), attr, original)
    _ORIGINAL.clear()


class TrainingObserver:
    """Hooks on one optimizer (and its scaler and scheduler) feeding a listener."""

    def __init__(
        self,
        listener: _Listener,
        optimizer: Any,
        *,
        scaler: Any = None,
        scheduler: Any = None,
        param_ids: Iterable[int] = (),
    ) -> None:
        self.listener = listener
        self.optimizer = unwrap_optimizer(optimizer)
        self.scaler = scaler if _scaler_enabled(scaler) else None
        self.scheduler = scheduler
        self.param_ids = set(param_ids)
        self._handles: list[Any] = []
        self._wrapped: list[tuple[Any, str]] = []
        # Call-order state of the current step.
        self.scaled = False
        self.unscaled = False
        self.in_scaler_step = False
        self.stepped_in_scaler = False
        self.clip_norm: torch.Tensor | None = None
        self.clip_max: float | None = None
        self.clip_before_unscale = False
        self._scheduler_calls = 0
        #: The scheduler's own step counter (torch's ``last_epoch``, DeepSpeed's
        #: ``last_batch_iteration``), read rather than wrapped where it has one: a wrapper
        #: set on the instance would land in ``state_dict()`` (torch's is the instance
        #: ``__dict__``) and break every checkpoint save.
        self._counter = _step_counter(scheduler)
        self._counted_from = self._count()
        self.closure = False
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._pre_step))
            self._handles.append(self.optimizer.register_step_post_hook(self._post_step))
        if self.scaler is not None:
            self._wrap(self.scaler, "scale", self._scale)
            self._wrap(self.scaler, "unscale_", self._unscale)
            self._wrap(self.scaler, "step", self._scaler_step)
        if (
            scheduler is not None
            and self._counter is None
            and callable(getattr(scheduler, "step", None))
        ):
            self._wrap(scheduler, "step", self._scheduler_step)
        _OBSERVERS.add(self)
        _install_clip_patch()

    # ---- wiring --------------------------------------------------------------------
    def _wrap(self, obj: Any, name: str, wrapper: Callable[..., Any]) -> None:
        original = getattr(obj, name)

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            return wrapper(original, *args, **kwargs)

        setattr(obj, name, call)
        self._wrapped.append((obj, name))

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for obj, name in self._wrapped:
            try:
                delattr(obj, name)
            except AttributeError:
                pass
        self._wrapped.clear()
        _OBSERVERS.discard(self)
        _remove_clip_patch()

    def owns(self, param: torch.Tensor) -> bool:
        return id(param) in self.param_ids

    # ---- observed calls --------------------------------------------------------------
    def _scale(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        self.scaled = True
        return out

    def _unscale(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        self.unscaled = True
        return out

    def _scaler_step(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.in_scaler_step, self.stepped_in_scaler = True, False
        try:
            return original(*args, **kwargs)
        finally:
            self.in_scaler_step = False
            if not self.stepped_in_scaler:  # found Inf/NaN: the scaler skipped the update
                self.listener.guard("optimizer", self._boundary, True)

    def _scheduler_step(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._scheduler_calls += 1
        return original(*args, **kwargs)

    def _count(self) -> int:
        value = getattr(self.scheduler, self._counter, 0) if self._counter else 0
        return value if isinstance(value, int) else 0

    @property
    def scheduler_calls(self) -> int:
        """``scheduler.step()`` calls since the last optimizer step."""
        if self._counter is not None:
            return self._count() - self._counted_from
        return self._scheduler_calls

    def before_clip(self) -> None:
        if self.scaler is not None and self.scaled and not self.unscaled:
            self.clip_before_unscale = True

    def after_clip(self, total: torch.Tensor, max_norm: float) -> None:
        self.clip_norm = total
        self.clip_max = float(max_norm)

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.stepped_in_scaler = self.in_scaler_step
        # optimizer.step(closure): forward and backward run inside the step (Lightning,
        # LBFGS); the gradients exist only after it, so the step ends at the post-hook.
        # (torch passes the optimizer itself as args[0].)
        given = args[1] if len(args) > 1 else kwargs.get("closure")
        self.closure = given is not None
        if not self.closure:
            self.listener.guard("optimizer", self._boundary, False)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.closure:
            self.closure = False
            self.listener.guard("optimizer", self._boundary, False)
        self.listener.on_optimizer_stepped()

    def _boundary(self, skipped: bool) -> None:
        self.listener.on_optimizer_step(self.clip_norm, skipped)

    # ---- what the monitor reads at the boundary --------------------------------------
    def scaled_grads_step(self) -> bool:
        """The optimizer is stepping on gradients still multiplied by the scale."""
        return (
            self.scaler is not None
            and self.scaled
            and not self.unscaled
            and not self.in_scaler_step
        )

    def loss_scale(self) -> torch.Tensor | None:
        scale = getattr(self.scaler, "_scale", None) if self.scaler is not None else None
        return scale.detach().clone() if isinstance(scale, torch.Tensor) else None

    def lrs(self) -> list[Any]:
        if self.optimizer is None:
            return []
        return [g.get("lr") for g in self.optimizer.param_groups]

    def reset(self) -> None:
        """Start the next step's call-order record."""
        self.scaled = self.unscaled = self.clip_before_unscale = False
        self.clip_norm, self.clip_max = None, None
        self._scheduler_calls = 0
        self._counted_from = self._count()


def _step_counter(scheduler: Any) -> str | None:
    """The attribute a scheduler counts its steps in, if it has one."""
    for name in ("last_epoch", "last_batch_iteration"):
        if isinstance(getattr(scheduler, name, None), int) and not isinstance(
            getattr(scheduler, name), bool
        ):
            return name
    return None


def _scaler_enabled(scaler: Any) -> bool:
    if scaler is None:
        return False
    enabled = getattr(scaler, "is_enabled", None)
    return bool(enabled()) if callable(enabled) else True
