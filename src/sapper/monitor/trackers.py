"""Findings where people already look: the W&B run page and the MLflow run.

:class:`WandbSink` puts each finding on the active W&B run: the summary key
``sapper/findings`` (the list, which :mod:`sapper.logs.wandb` reads back) with error and
warning counts, a ``sapper:<code>`` tag per code so runs can be filtered by what fired,
a ``wandb.alert`` for errors and warnings (Slack or e-mail, as the user set alerts up),
at most one per code per ``alert_every_s`` and ``max_alerts`` in all, and at the end a
``sapper/findings_table`` table in the summary. :class:`MlflowSink` sets a
``sapper.<code>`` tag per code on the active MLflow run and logs the findings as the
artifacts ``sapper/findings.txt`` (to read) and ``sapper/findings.json`` (which
:mod:`sapper.logs.mlflow` reads back).

Neither sink may break training: a tracker down, offline, rate-limited or of another
version than expected costs the findings on that tracker only. Every call is guarded;
the first failure is told once through ``on_error`` (the monitor makes it an R190
finding) and the sink goes quiet. A failed alert falls back to the summary, which holds
every finding anyway. Neither sink writes the run's metrics: the training script logs
those itself, and a second ``wandb.log`` per step would move W&B's ``_step``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from sapper.errors import InputError, clip
from sapper.monitor.sinks import Sink
from sapper.rules.model import Finding, Severity
from sapper.runtime.trackers import (
    MLFLOW_FINDINGS_ARTIFACT,
    WANDB_FINDINGS_KEY,
    findings_document,
)

__all__ = [
    "TRACKERS",
    "MlflowSink",
    "TrackerSink",
    "WandbSink",
    "check_sinks",
    "tracker_sinks",
]

#: Findings kept per run for the summary and the artifacts; later ones are counted.
MAX_KEPT = 500
_ALERT_LEVELS = {Severity.ERROR: "ERROR", Severity.WARNING: "WARN"}


class TrackerSink(Sink):
    """What both tracker sinks share: findings held until a run is active, every call
    guarded, the first failure reported once."""

    #: The tracker's name in messages and in ``Monitor(sinks=[...])``.
    name = ""

    def __init__(self, on_error: Callable[[str], None] | None = None) -> None:
        self.on_error = on_error
        self.failed = False
        self.kept: list[Finding] = []
        self.dropped = 0
        self._codes: dict[str, int] = {}
        self._unsent: list[Finding] = []  # arrived while no run was active

    def findings(self, findings: list[Finding]) -> None:
        if self.failed or not findings:
            return
        try:
            run = self.active_run()
            if run is None:
                self._unsent.extend(findings[: MAX_KEPT - len(self._unsent)])
                return
            batch, self._unsent = self._unsent + list(findings), []
            new_codes = self._keep(batch)
            self.send(run, batch, new_codes)
        except Exception as exc:
            self.fail(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self.failed:
            return
        try:
            run = self.active_run()
            if run is None:
                if self._unsent:
                    self.fail(
                        f"no {self.name} run was active, so {len(self._unsent)} finding(s) "
                        f"were not sent (start the run before the monitor)"
                    )
                return
            if self._unsent:
                batch, self._unsent = self._unsent, []
                self.send(run, batch, self._keep(batch))
            self.finish(run)
        except Exception as exc:
            self.fail(f"{type(exc).__name__}: {exc}")

    def fail(self, reason: str) -> None:
        """Switch the sink off and say why, once."""
        if self.failed:
            return
        self.failed = True
        if self.on_error is not None:
            self.on_error(f"the {self.name} sink failed and was switched off: {clip(reason)}")

    def _keep(self, batch: list[Finding]) -> list[str]:
        new = []
        for f in batch:
            if f.code not in self._codes:
                new.append(f.code)
            self._codes[f.code] = self._codes.get(f.code, 0) + 1
            if len(self.kept) < MAX_KEPT:
                self.kept.append(f)
            else:
                self.dropped += 1
        return new

    def counts(self) -> dict[str, int]:
        errors = sum(f.severity is Severity.ERROR for f in self.kept)
        warnings = sum(f.severity is Severity.WARNING for f in self.kept)
        return {"errors": errors, "warnings": warnings, "total": len(self.kept) + self.dropped}

    # ---- per tracker ----------------------------------------------------------------
    def active_run(self) -> Any:
        """The tracker's active run, or None."""
        raise NotImplementedError

    def send(self, run: Any, batch: list[Finding], new_codes: list[str]) -> None:
        """Put a batch of new findings on the run."""
        raise NotImplementedError

    def finish(self, run: Any) -> None:
        """The monitor closed: the last writes."""


def _module(name: str) -> ModuleType:
    """The tracker's package, imported on first use; missing, it names the extra."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise RuntimeError(
            f"the {name} package is not installed (pip install 'sapper[{name}]')"
        ) from None


def _text(f: Finding) -> str:
    where = f" at step {f.step}" if f.step is not None else ""
    rank = f" (rank {f.rank})" if f.rank is not None else ""
    return f"{f.code} {f.severity.value}{where}{rank}: {f.message}\nfix: {f.fix}"


class WandbSink(TrackerSink):
    """Findings on the active W&B run (summary, tags, alerts, a table at the end)."""

    name = "wandb"

    def __init__(
        self,
        run: Any = None,
        *,
        on_error: Callable[[str], None] | None = None,
        alert_every_s: float = 300.0,
        max_alerts: int = 20,
    ) -> None:
        super().__init__(on_error)
        self._run = run
        self.alert_every_s = alert_every_s
        self.max_alerts = max_alerts
        self.alerts_sent = 0
        self._alerted: dict[str, float] = {}
        self._alerts_off = False

    def _wandb(self) -> ModuleType:
        return _module("wandb")

    def active_run(self) -> Any:
        if self._run is not None:
            return self._run
        return getattr(self._wandb(), "run", None)

    def send(self, run: Any, batch: list[Finding], new_codes: list[str]) -> None:
        summary = run.summary
        summary[WANDB_FINDINGS_KEY] = [f.to_json() for f in self.kept]
        for key, value in self.counts().items():
            summary[f"sapper/{key}"] = value
        if new_codes:
            tags = tuple(run.tags or ())
            run.tags = tags + tuple(f"sapper:{c}" for c in new_codes if f"sapper:{c}" not in tags)
        for f in batch:
            self._alert(run, f)

    def _alert(self, run: Any, f: Finding) -> None:
        """A W&B alert for an error or a warning, rate-limited; a failure (offline, the
        alert API missing) turns alerts off with one message, the summary goes on."""
        level = _ALERT_LEVELS.get(f.severity)
        if level is None or self._alerts_off or self.alerts_sent >= self.max_alerts:
            return
        now = time.monotonic()
        last = self._alerted.get(f.code)
        if last is not None and now - last < self.alert_every_s:
            return
        self._alerted[f.code] = now
        try:
            wandb = self._wandb()
            alert_level = getattr(getattr(wandb, "AlertLevel", None), level, level)
            run.alert(
                title=f"sapper {f.code}: {f.title}"[:100],
                text=clip(_text(f), 2000),
                level=alert_level,
                wait_duration=int(self.alert_every_s),
            )
            self.alerts_sent += 1
        except Exception as exc:
            self._alerts_off = True
            if self.on_error is not None:
                self.on_error(
                    f"W&B alerts could not be sent ({type(exc).__name__}: {clip(str(exc))}); "
                    "the findings are still in the run summary (sapper/findings)"
                )

    def finish(self, run: Any) -> None:
        if not self.kept:
            return
        wandb = self._wandb()
        table = wandb.Table(
            columns=["step", "rank", "code", "severity", "message", "fix"],
            data=[[f.step, f.rank, f.code, f.severity.value, f.message, f.fix] for f in self.kept],
        )
        run.summary["sapper/findings_table"] = table


class MlflowSink(TrackerSink):
    """Findings on the active MLflow run: a tag per code and two artifacts."""

    name = "mlflow"

    def __init__(
        self, *, on_error: Callable[[str], None] | None = None, artifact_every_s: float = 60.0
    ) -> None:
        super().__init__(on_error)
        self.artifact_every_s = artifact_every_s
        self._written: float | None = None
        self._stale = False

    def _mlflow(self) -> ModuleType:
        return _module("mlflow")

    def active_run(self) -> Any:
        return self._mlflow().active_run()

    def send(self, run: Any, batch: list[Finding], new_codes: list[str]) -> None:
        mlflow = self._mlflow()
        first = {}
        for f in batch:
            first.setdefault(f.code, f)
        for code in new_codes:
            f = first[code]
            # MLflow keeps tag values up to 5000 characters (mlflow/utils/validation.py)
            mlflow.set_tag(f"sapper.{code}", clip(f"{f.severity.value}: {f.message}", 4000))
        mlflow.set_tag("sapper.findings", str(self.counts()["total"]))
        self._stale = True
        now = time.monotonic()
        if self._written is None or now - self._written >= self.artifact_every_s:
            self._artifacts(mlflow)

    def _artifacts(self, mlflow: Any) -> None:

        lines = [_text(f) for f in self.kept]
        if self.dropped:
            lines.append(f"... and {self.dropped} more finding(s) not kept")
        mlflow.log_text("\n\n".join(lines) + "\n", "sapper/findings.txt")
        mlflow.log_text(findings_document(self.kept), MLFLOW_FINDINGS_ARTIFACT)
        self._written = time.monotonic()
        self._stale = False

    def finish(self, run: Any) -> None:
        if self._stale:
            self._artifacts(self._mlflow())


#: Tracker sink names accepted by ``Monitor(sinks=[...])``.
TRACKERS: dict[str, type[TrackerSink]] = {"wandb": WandbSink, "mlflow": MlflowSink}


def _auto() -> list[str]:
    """The trackers with an active run in this process. Only modules already imported
    are asked: the monitor never imports wandb or mlflow on its own (seconds each)."""
    found = []
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        found.append("wandb")
    mlflow = sys.modules.get("mlflow")
    active = getattr(mlflow, "active_run", None) if mlflow is not None else None
    if callable(active):
        try:
            if active() is not None:
                found.append("mlflow")
        except Exception:  # a broken tracker install must not stop the monitor
            pass
    return found


def check_sinks(spec: Iterable[str | Sink] | None) -> list[str | Sink] | None:
    """``Monitor(sinks=...)`` validated at construction: names must be trackers."""
    if spec is None:
        return None
    if isinstance(spec, (str, Sink)):
        spec = [spec]
    items = list(spec)
    for item in items:
        if isinstance(item, Sink):
            continue
        if not isinstance(item, str) or item not in TRACKERS:
            raise InputError(
                "unknown sink",
                field="sinks",
                value=item,
                expected=" / ".join(TRACKERS) + ", or a sapper.monitor.sinks.Sink",
            )
    return items


def tracker_sinks(
    spec: list[str | Sink] | None, on_error: Callable[[str], None] | None
) -> list[Sink]:
    """The sinks ``Monitor(sinks=spec)`` adds: the named trackers and given sinks, or
    (``spec`` None) a sink for each tracker whose run is active now."""
    items = _auto() if spec is None else spec
    out: list[Sink] = []
    for item in items:
        if isinstance(item, Sink):
            if isinstance(item, TrackerSink) and item.on_error is None:
                item.on_error = on_error  # its failures become the monitor's R190 too
            out.append(item)
        else:
            out.append(TRACKERS[item](on_error=on_error))
    return out
