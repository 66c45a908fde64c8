"""Whether resuming from the checkpoint continues the same run: the loss scaler (K006),
the step every piece believes it is at (K007), the learning rate the next step will use
(K008), and the pieces an exact resume needs (K009).

The HF Trainer steps its scheduler once per optimizer step, so ``scheduler.last_epoch``
equals ``trainer_state.global_step``; Adam's per-parameter ``step`` counts the steps the
optimizer really took, which under fp16 loss scaling is fewer (a step with an overflow is
skipped by the GradScaler) — so only an optimizer *ahead* of the trainer is an error
when a scaler is saved.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from sapper.checkpoint.numbers import MAX_COUNT, checked_number
from sapper.checkpoint.rules import (
    LOSS_SCALE_COLLAPSED,
    RESUME_INCOMPLETE,
    RESUME_LR_MISMATCH,
    RESUME_STEP_MISMATCH,
)
from sapper.checkpoint.scan import Scan
from sapper.rules.model import Finding, Severity

__all__ = ["LR_RTOL", "SCALE_FLOOR", "SCALE_LOW", "resume_findings", "steps_of"]

#: A loss scale at or below this is collapsed (error); below SCALE_LOW it is low (warning).
SCALE_FLOOR = 1.0
SCALE_LOW = 128.0
#: Relative tolerance between learning rates that must be the same number.
LR_RTOL = 1e-6


def _count(value: Any, file: str, field: str, low: int = 0) -> float | None:
    """A step, an iteration or another count read from ``file``: an integer in
    ``low … 2^63-1``; None where the file holds no number there."""
    return checked_number(value, file=file, field=field, low=low, high=MAX_COUNT, integer=True)


def scaler_findings(scan: Scan) -> list[Finding]:
    if scan.scaler is None:
        return []
    where = scan.scaler_file
    # DeepSpeed's loss scaler keeps its scale as cur_scale (copied to "scale")
    key = "cur_scale" if "cur_scale" in scan.scaler else "scale"
    scale = checked_number(scan.scaler.get(key), file=where, field=key)
    growth = _count(scan.scaler.get("_growth_tracker"), where, "_growth_tracker")
    if scale is None:
        return []
    if not math.isfinite(scale) or scale <= SCALE_FLOOR:
        return [
            LOSS_SCALE_COLLAPSED.finding(
                f"saved loss scale is {scale:g} (floor {SCALE_FLOOR:g}): fp16 gradients below "
                f"{6e-8 * 1 / max(scale, 1e-30):.3g} underflow to zero",
                value=scale,
                threshold=SCALE_FLOOR,
                source=where,
                growth_tracker=growth,
            )
        ]
    if scale < SCALE_LOW:
        return [
            LOSS_SCALE_COLLAPSED.finding(
                f"saved loss scale is {scale:g}, below {SCALE_LOW:g}: the run has been "
                "overflowing repeatedly",
                severity=Severity.WARNING,
                value=scale,
                threshold=SCALE_LOW,
                source=where,
            )
        ]
    return []


def steps_of(scan: Scan) -> dict[str, float]:
    """The step each piece records: optimizer, scheduler, trainer (only those present)."""
    steps: dict[str, float] = {}
    opt_steps = [
        _count(e.get("step"), o.file, f"state.{index}.step")
        for o in scan.optimizers
        for index, e in o.state.items()
        if isinstance(e, dict)
    ]
    known = [s for s in opt_steps if s is not None]
    if known:
        steps["optimizer"] = max(known)
    for sched in scan.schedulers[:1]:  # an LR scheduler's last_epoch starts at -1
        last = _count(sched.get("last_epoch"), scan.origin("scheduler"), "last_epoch", low=-1)
        if last is not None:
            steps["scheduler"] = last
    if scan.trainer_state is not None:
        where = str(scan.layout.trainer_state)
        gs = _count(scan.trainer_state.get("global_step"), where, "global_step")
        if gs is not None:
            steps["trainer"] = gs
    if scan.lightning is not None:
        gs = _count(scan.lightning.get("global_step"), scan.origin("lightning"), "global_step")
        if gs is not None:
            steps["trainer"] = gs
    if scan.megatron is not None:
        it = _count(scan.megatron.get("iteration"), scan.origin("megatron"), "iteration")
        if it is not None:
            steps["trainer"] = it
    if scan.deepspeed is not None and "trainer" not in steps:
        gs = _count(scan.deepspeed.get("global_steps"), scan.origin("deepspeed"), "global_steps")
        if gs is not None:  # the engine's step count, overflow-skipped steps included
            steps["trainer"] = gs
    return steps


def _step_findings(scan: Scan, steps: dict[str, float]) -> list[Finding]:
    out = []
    trainer = steps.get("trainer")
    opt = steps.get("optimizer")
    if trainer is not None and opt is not None:
        ahead = opt > trainer
        if ahead or (opt < trainer and scan.scaler is None):
            out.append(
                RESUME_STEP_MISMATCH.finding(
                    f"the optimizer's step is {opt:g} but the trainer's global_step is "
                    f"{trainer:g}: Adam's bias correction and the data position disagree",
                    value=opt,
                    threshold=trainer,
                    source=scan.optimizers[0].file,
                )
            )
    sched = steps.get("scheduler")
    if trainer is not None and sched is not None and scan.lightning is None and sched != trainer:
        out.append(
            RESUME_STEP_MISMATCH.finding(
                f"the scheduler's last_epoch is {sched:g} but the trainer's global_step is "
                f"{trainer:g}: the resumed LR comes from another point of the schedule",
                value=sched,
                threshold=trainer,
                source=str(scan.layout.scheduler or scan.layout.path),
            )
        )
    return out


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= LR_RTOL * max(abs(a), abs(b), 1e-30)


def _lr_findings(scan: Scan, steps: dict[str, float]) -> list[Finding]:
    out: list[Finding] = []
    if not scan.optimizers:
        return out
    opt = scan.optimizers[0]
    group_lrs = [
        checked_number(g.get("lr"), file=opt.file, field=f"param_groups.{i}.lr")
        for i, g in enumerate(opt.param_groups)
        if isinstance(g, dict)
    ]
    last = scan.schedulers[0].get("_last_lr") if scan.schedulers else None
    sched_lrs: list[Any] = list(last) if isinstance(last, (list, tuple)) else []
    for i, (g_lr, s_lr) in enumerate(zip(group_lrs, sched_lrs, strict=False)):
        s_val = checked_number(s_lr, file=scan.origin("scheduler"), field=f"_last_lr.{i}")
        if g_lr is not None and s_val is not None and not _close(g_lr, s_val):
            out.append(
                RESUME_LR_MISMATCH.finding(
                    f"param group {i}: the optimizer's lr is {g_lr:.6g} but the scheduler's "
                    f"last lr is {s_val:.6g}",
                    value=g_lr,
                    threshold=s_val,
                    source=opt.file,
                )
            )
    logged = _logged_lr(scan.trainer_state, steps.get("trainer"), str(scan.layout.trainer_state))
    if logged is not None and group_lrs and group_lrs[0] is not None:
        step, lr, tol = logged
        if abs(lr - group_lrs[0]) > tol + LR_RTOL * max(abs(lr), abs(group_lrs[0])):
            out.append(
                RESUME_LR_MISMATCH.finding(
                    f"trainer_state.json logged learning_rate {lr:.6g} at step {step:g}, but the "
                    f"optimizer's lr is {group_lrs[0]:.6g}, further than the schedule moves in "
                    f"the steps between ({tol:.3g})",
                    value=group_lrs[0],
                    threshold=lr,
                    source=str(scan.layout.trainer_state),
                )
            )
    return out


def _logged_lr(
    state: dict[str, Any] | None, global_step: float | None, file: str
) -> tuple[float, float, float] | None:
    """(step, lr, tolerance) of the last learning rate the trainer logged. Trainers log
    the LR of the step just taken or the one to come (versions differ), so the tolerance
    is the largest change per step the log shows, times the steps since that entry."""
    history = (state or {}).get("log_history")
    if not isinstance(history, list) or global_step is None:
        return None
    points = [
        (
            _count(e.get("step"), file, f"log_history.{i}.step"),
            checked_number(
                e.get("learning_rate"), file=file, field=f"log_history.{i}.learning_rate"
            ),
        )
        for i, e in enumerate(history)
        if isinstance(e, dict) and "learning_rate" in e
    ]
    points = [
        (s, lr)
        for s, lr in points
        if s is not None and lr is not None and math.isfinite(lr) and s <= global_step
    ]
    if not points:
        return None
    rate = max(
        (abs(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(points) if b[0] > a[0]),
        default=0.0,
    )
    step, lr = points[-1]
    return step, lr, rate * (global_step - step + 1)


def _missing(scan: Scan) -> list[str]:
    """The pieces an exact resume needs that this training checkpoint lacks."""
    if not scan.training:
        return []
    missing = []
    if not scan.optimizers:
        missing.append("optimizer state (Adam restarts its moments)")
    if not scan.schedulers and scan.schedule_without_state is None:
        missing.append("LR scheduler state (the schedule restarts)")
    if scan.lightning is not None:
        if "loops" not in scan.lightning:
            missing.append("Lightning loop state (the data position)")
        return missing
    if scan.megatron is not None and not scan.rng:
        missing.append("rng_state (dropout masks and data order)")
    if scan.layout.kind == "hf-trainer":
        if scan.trainer_state is None:
            missing.append("trainer_state.json (global step and data position)")
        if not scan.rng:
            missing.append("rng_state.pth (dropout masks and data order)")
    return missing


def resume_findings(scan: Scan) -> list[Finding]:
    steps = steps_of(scan)
    out = scaler_findings(scan) + _step_findings(scan, steps) + _lr_findings(scan, steps)
    missing = _missing(scan)
    if missing:
        out.append(
            RESUME_INCOMPLETE.finding(
                f"resume will not be equivalent: missing {'; '.join(missing)}",
                source=str(scan.layout.path),
                missing=missing,
            )
        )
    return out
