"""Run the smoke checks in order and collect their findings into one report.

Each check is a function ``SmokeContext -> list[Finding]``; this module only sequences
them, reseeds before each (so a check's result does not depend on which ran before it),
times them, and turns a crash inside a check into a finding of that check's rule rather
than an aborted run: a smoke test that dies on the user's code has found something.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sapper.errors import InputError, SapperError
from sapper.jsontext import finite_safe
from sapper.rules.model import Finding, Rule, Severity
from sapper.smoke import (
    accumulation,
    checkpointing,
    contract,
    data_parallel,
    init_health,
    measure,
    overfit,
    padding,
    precision,
)
from sapper.smoke import rules as R
from sapper.smoke.batches import BatchSource
from sapper.smoke.context import SmokeConfig, SmokeContext
from sapper.smoke.step import DefaultTrainStep, TrainStep
from sapper.smoke.toy import ModelFactory

__all__ = ["CHECKS", "CheckOutcome", "SmokeObserver", "SmokeReport", "run_smoke"]

CheckFn = Callable[[SmokeContext], list[Finding]]

#: name -> (check, the rule a crash of it is reported under), in run order.
CHECKS: dict[str, tuple[CheckFn, Rule]] = {
    "contract": (contract.run, R.STEP_CONTRACT),
    "overfit": (overfit.run, R.OVERFIT),
    "padding": (padding.run, R.PADDING_IN_LABELS),
    "accumulation": (accumulation.run, R.ACCUMULATION),
    "checkpointing": (checkpointing.run, R.CHECKPOINTING),
    "precision": (precision.run, R.PRECISION_AGREEMENT),
    "data_parallel": (data_parallel.run, R.DATA_PARALLEL),
    "init_health": (init_health.run, R.INIT_HEALTH),
    "measure": (measure.run, R.MEASURED_VS_ESTIMATE),
}


@dataclass
class CheckOutcome:
    name: str
    findings: list[Finding]
    seconds: float

    @property
    def status(self) -> str:
        order = {"pass": 0, "warn": 1, "fail": 2}
        statuses = [f.data.get("status", "fail") for f in self.findings]
        return max(statuses, key=lambda s: order.get(s, 2), default="pass")


@dataclass
class SmokeReport:
    model: str
    notes: list[str]
    num_params: int
    vocab_size: int
    config: SmokeConfig
    outcomes: list[CheckOutcome] = field(default_factory=list)
    #: Where the batches came from ("synthetic tokens", "loader mypkg:make", a file).
    data: str = "synthetic tokens"
    #: [sequences, tokens] of the first micro-batches the checks read, as the source gave
    #: them (a loader decides its own shapes; --micro-batch/--seq-len only shape synthetic
    #: tokens and token files).
    batch_shapes: list[list[int]] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for o in self.outcomes for f in o.findings]

    @property
    def errors(self) -> int:
        return sum(f.severity == Severity.ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == Severity.WARNING for f in self.findings)

    def exit_code(self, strict: bool = False) -> int:
        return 1 if self.errors or (strict and self.warnings) else 0

    def to_json(self) -> dict[str, Any]:
        """The stable JSON shape; non-finite floats become "nan"/"inf"/"-inf" strings (as in
        sapper's run logs), so the output stays valid JSON."""
        return finite_safe(self._payload())

    def _payload(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "model": {
                "description": self.model,
                "toy_changes": self.notes,
                "parameters": self.num_params,
                "vocab_size": self.vocab_size,
            },
            "config": {
                "steps": cfg.steps,
                "lr": cfg.lr,
                "seed": cfg.seed,
                "precisions": list(cfg.precisions),
                "grad_accum": cfg.grad_accum,
                "micro_batch": cfg.micro_batch,
                "seq_len": cfg.seq_len,
                "device": cfg.device,
                "dp_world_size": cfg.dp_world_size,
                "tolerances": vars(cfg.tolerances),
            },
            "data": {"source": self.data, "batch_shapes": self.batch_shapes},
            "checks": [
                {
                    "check": o.name,
                    "status": o.status,
                    "seconds": round(o.seconds, 3),
                    "codes": sorted({f.code for f in o.findings}),
                }
                for o in self.outcomes
            ],
            "findings": [f.to_json() for f in self.findings],
            "summary": {
                "errors": self.errors,
                "warnings": self.warnings,
                "passed": sum(o.status == "pass" for o in self.outcomes),
                "failed": sum(o.status == "fail" for o in self.outcomes),
            },
        }


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """Toy tensors are too small to gain from intra-op threads, and one thread keeps step
    times steady on a shared machine."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _crashed(name: str, rule: Rule, exc: Exception) -> Finding:
    return rule.finding(
        f"the {name} check could not run: {type(exc).__name__}: {exc}",
        severity=Severity.ERROR,
        status="fail",
        crashed=True,
    )


class SmokeObserver:
    """Told as the run goes, so a caller can stream results; every method is optional."""

    def started(self, report: SmokeReport) -> None:
        """The toy is built and the first batch read; no check has run yet."""

    def check_started(self, name: str, index: int, total: int) -> None:
        """Check ``name`` (``index`` of ``total``, from 1) begins."""

    def check_done(self, outcome: CheckOutcome) -> None:
        """A check finished with these findings."""


def _describe(source: BatchSource | None) -> str:
    if source is None:
        return "synthetic tokens"
    fn = getattr(source, "fn", None)
    if fn is not None:
        return f"loader {getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"
    path = getattr(source, "path", None)
    return f"token file {path}" if path is not None else type(source).__name__


def _check_token_ids(batches: list[dict[str, torch.Tensor]], vocab: int) -> None:
    """Token ids outside the model's vocabulary fail every check with an IndexError deep in
    the embedding; say it once, naming the numbers."""
    ids = torch.cat([b["input_ids"].reshape(-1) for b in batches])
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        raise InputError(
            f"the data's token ids span {low}..{high} but the model's vocabulary is {vocab}",
            field="data",
            value=high if high >= vocab else low,
            expected=f"token ids in 0..{vocab - 1} (a model whose vocabulary covers the "
            "data, or --vocab for a toy)",
        )


def run_smoke(
    factory: ModelFactory,
    source: BatchSource | None = None,
    step: TrainStep | None = None,
    config: SmokeConfig | None = None,
    checks: Sequence[str] | None = None,
    threads: int | None = 1,
    observer: SmokeObserver | None = None,
) -> SmokeReport:
    """Run the chosen checks (all by default) on the toy model and return the report.

    ``source`` defaults to synthetic variable-length tokens, ``step`` to
    :class:`~sapper.smoke.step.DefaultTrainStep`; ``observer`` hears of each check as it
    starts and ends."""
    observer = observer or SmokeObserver()
    config = config or SmokeConfig()
    names = list(checks) if checks else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise InputError(
            "unknown check",
            field="--checks",
            value=",".join(unknown),
            expected=f"some of {', '.join(CHECKS)}",
        )
    with _threads(threads):
        torch.manual_seed(config.seed)
        ctx = SmokeContext.create(factory, source, step or DefaultTrainStep(), config)
        report = SmokeReport(
            factory.description,
            list(factory.notes),
            ctx.num_params,
            ctx.vocab_size,
            config,
            data=_describe(source),
        )
        first = ctx.batches(max(1, config.grad_accum))
        report.batch_shapes = [list(b["input_ids"].shape) for b in first]
        _check_token_ids(first, ctx.vocab_size)
        observer.started(report)
        for i, name in enumerate(names, 1):
            fn, rule = CHECKS[name]
            observer.check_started(name, i, len(names))
            torch.manual_seed(config.seed)
            start = time.perf_counter()
            try:
                findings = fn(ctx)
            except SapperError:
                raise
            except Exception as exc:  # the user's model, data or step failed in this check
                findings = [_crashed(name, rule, exc)]
            outcome = CheckOutcome(name, findings, time.perf_counter() - start)
            report.outcomes.append(outcome)
            observer.check_done(outcome)
    return report
