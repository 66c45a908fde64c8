"""The ledger of runs: what each run planned, how it ended and why (seed §6: record the
root cause, avoid it next time).

One SQLite file, ``$SAPPER_HOME/runs.sqlite`` (``~/.sapper`` by default; a team points
``SAPPER_HOME`` at a shared path), written through Python's own ``sqlite3``. Write-ahead
logging and a busy timeout let many writers (the ranks of a job, several jobs) add rows
at once without corrupting it; each row is one short transaction. The ledger is never in
a run's way: a missing, locked or unreadable ledger gives one warning line and the run
goes on.

A row holds the plan's fingerprint (model shape, precision, layout, optimizer, LR and
schedule, data), the outcome, the first cause, the run folder and the date. A new plan
matches a run that blew up when the model family is the same and so is every setting
the earlier cause concerns (``lr`` for an LR cause: the learning rate, warmup and
schedule), which is what makes the old cause likely to repeat.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sapper.plan.schema import Plan

__all__ = [
    "CAUSE_SETTINGS",
    "LedgerError",
    "Match",
    "Row",
    "add_run",
    "fingerprint",
    "ledger_path",
    "list_runs",
    "matches",
]

#: Seconds a writer waits for another's lock before giving up (with a warning).
BUSY_TIMEOUT_S = 10.0
#: Outcomes that count as a run that blew up.
BLEW_UP = ("failed", "hung")

#: The settings each cause check concerns: a new plan repeats an old cause when these
#: are the same (and the model family is).
CAUSE_SETTINGS: dict[str, tuple[str, ...]] = {
    "precision": ("dtype", "loss_scale"),
    "scaler": ("dtype", "loss_scale", "static_scale"),
    "clipping": ("max_norm", "dtype"),
    "init": ("init_std", "residual_scaling", "hidden_size", "num_layers"),
    "normalization": ("norm_placement", "warmup_steps"),
    "lr": ("lr", "warmup_steps", "schedule"),
    "data": ("data", "seq_len"),
    "accumulation": ("grad_accum", "micro_batch"),
    "memory": ("micro_batch", "seq_len", "zero", "tp", "pp", "checkpointing", "gpu"),
    "parallel": ("tp", "pp", "cp", "ep", "zero", "world_size"),
    "distributed": ("world_size", "tp", "pp", "cp", "ep"),
    "hardware": ("gpu",),
}


class LedgerError(Exception):
    """The ledger could not be read or written (said in one line; never stops a run)."""


@dataclass
class Row:
    id: int
    date: str
    outcome: str
    cause: str | None
    check: str | None
    run_dir: str
    command: str
    family: str | None
    fingerprint: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "date": self.date, "outcome": self.outcome, "cause": self.cause,
            "check": self.check, "run_dir": self.run_dir, "command": self.command,
            "family": self.family, "fingerprint": self.fingerprint,
        }


@dataclass
class Match:
    """An earlier run that blew up with the same model family and the same settings as
    its cause concerned."""

    row: Row
    settings: dict[str, Any]

    def line(self) -> str:
        same = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        return (
            f"this plan matches run {self.row.run_dir} ({self.row.date[:10]}), which "
            f"{'hung' if self.row.outcome == 'hung' else 'blew up'} with cause "
            f"{self.row.cause}: same {self.row.family} model and {same}"
        )

    def to_json(self) -> dict[str, Any]:
        return {"run_dir": self.row.run_dir, "date": self.row.date, "cause": self.row.cause,
                "outcome": self.row.outcome, "settings": self.settings}


def ledger_path() -> Path:
    """``$SAPPER_HOME/runs.sqlite`` (``~/.sapper/runs.sqlite`` by default)."""
    home = os.environ.get("SAPPER_HOME") or os.path.join(os.path.expanduser("~"), ".sapper")
    return Path(home) / "runs.sqlite"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    date TEXT NOT NULL,
    outcome TEXT NOT NULL,
    cause TEXT,
    cause_check TEXT,
    run_dir TEXT NOT NULL,
    command TEXT NOT NULL,
    family TEXT,
    fingerprint TEXT NOT NULL
)
"""


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.is_file():
            raise LedgerError(f"no ledger at {path}")
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if create:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(_SCHEMA)
        return conn
    except (sqlite3.Error, OSError) as exc:
        raise LedgerError(f"the ledger {path} cannot be used ({exc})") from None


def fingerprint(plan: Plan | None) -> dict[str, Any]:
    """The settings of a plan that decide whether a cause repeats, flat."""
    if plan is None:
        return {}
    m, p, par, b = plan.model, plan.precision, plan.parallel, plan.batch
    fp: dict[str, Any] = {
        "family": m.family if m is not None else None,
        "hidden_size": m.hidden_size if m is not None else None,
        "num_layers": m.num_layers if m is not None else None,
        "num_heads": m.num_heads if m is not None else None,
        "vocab_size": m.vocab_size if m is not None else None,
        "num_experts": m.num_experts if m is not None else None,
        "norm_placement": m.norm_placement if m is not None else None,
        "dtype": p.dtype,
        "loss_scale": p.loss_scaling.mode,
        "static_scale": p.loss_scaling.static_scale,
        "tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": par.cp, "ep": par.ep,
        "zero": par.zero_stage,
        "checkpointing": par.checkpointing.granularity,
        "world_size": plan.hardware.num_gpus,
        "gpu": plan.hardware.gpu,
        "optimizer": plan.optimizer.type,
        "lr": plan.optimizer.lr,
        "weight_decay": plan.optimizer.weight_decay,
        "schedule": plan.schedule.type,
        "warmup_steps": plan.schedule.warmup_steps,
        "total_steps": plan.schedule.total_steps,
        "max_norm": plan.clipping.max_norm,
        "init_std": plan.init.std,
        "residual_scaling": plan.init.residual_scaling,
        "micro_batch": b.micro_batch_size,
        "grad_accum": b.gradient_accumulation_steps,
        "global_batch": b.global_batch_size,
        "seq_len": b.seq_len,
        "data": plan.data.path,
    }
    return {k: (v.value if hasattr(v, "value") else v) for k, v in fp.items()}


def add_run(
    *,
    outcome: str,
    run_dir: Path | str,
    command: str,
    fingerprint: dict[str, Any],
    cause: str | None = None,
    check: str | None = None,
    path: Path | None = None,
) -> int:
    """Add one run; its row id. :class:`LedgerError` when the ledger cannot take it."""
    conn = _connect(path or ledger_path(), create=True)
    try:
        cur = conn.execute(
            "INSERT INTO runs (date, outcome, cause, cause_check, run_dir, command, family,"
            " fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                time.strftime("%Y-%m-%dT%H:%M:%S%z"), outcome, cause, check, str(run_dir),
                command[:4000], fingerprint.get("family"),
                json.dumps(fingerprint, sort_keys=True, default=str),
            ),
        )
        return int(cur.lastrowid or 0)
    except sqlite3.Error as exc:
        raise LedgerError(f"the ledger {path or ledger_path()} cannot take the run ({exc})")\
            from None
    finally:
        conn.close()


def list_runs(
    outcome: str | None = None,
    cause: str | None = None,
    limit: int | None = None,
    path: Path | None = None,
) -> list[Row]:
    """The runs, newest first, filtered by outcome and by cause (a part of its name)."""
    conn = _connect(path or ledger_path(), create=False)
    try:
        sql = ("SELECT id, date, outcome, cause, cause_check, run_dir, command, family,"
               " fingerprint FROM runs")
        where, args = [], []
        if outcome:
            where.append("outcome = ?")
            args.append(outcome)
        if cause:
            where.append("cause LIKE ?")
            args.append(f"%{cause}%")
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        rows = conn.execute(sql, args).fetchall()
    except sqlite3.Error as exc:
        raise LedgerError(f"the ledger {path or ledger_path()} cannot be read ({exc})") from None
    finally:
        conn.close()
    out = []
    for r in rows:
        try:
            fp = json.loads(r[8])
        except ValueError:
            fp = {}
        out.append(Row(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7],
                       fp if isinstance(fp, dict) else {}))
    return out


def matches(fp: dict[str, Any], path: Path | None = None, limit: int = 3) -> list[Match]:
    """Earlier runs that blew up whose cause concerns settings this plan repeats; none
    when there is no ledger yet."""
    family = fp.get("family")
    if not family:
        return []
    try:
        rows = [r for r in list_runs(path=path) if r.outcome in BLEW_UP and r.cause]
    except LedgerError:
        return []
    found: list[Match] = []
    for row in rows:
        if row.family != family:
            continue
        keys = CAUSE_SETTINGS.get(row.check or "", ())
        same = {k: fp.get(k) for k in keys}
        if not keys or all(v is None for v in same.values()):
            continue
        if all(row.fingerprint.get(k) == v for k, v in same.items()):
            found.append(Match(row, {k: v for k, v in same.items() if v is not None}))
        if len(found) >= limit:
            break
    return found
