"""What the vectorised twins of the streaming detectors share.

A twin takes the streaming detector object (for its options, never its state) and the
columns of one attempt, and returns the findings the detector would return, fed the
same rows one by one and finished. A twin is used only for the exact class it mirrors,
with options in the range it was proven on (``accepts``), and only while the streaming
detector's source is the one it was proven against (:data:`FINGERPRINTS`): a change to
a detector sends that detector to the streaming fallback until its twin is brought
back to equivalence (``tests/runtime/test_columnar_equivalence.py`` says when).
"""

from __future__ import annotations

import hashlib
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.rules.model import Finding, Rule, Severity
from sapper.runtime.detector import Detector

__all__ = ["Twin", "at_rows", "finding", "fingerprint", "row_of", "walking_twin"]


@dataclass(frozen=True)
class Twin:
    """A vectorised detector: ``run(detector, columns) -> findings`` for ``cls``."""

    cls: type[Detector]
    run: Callable[[Any, Columns], list[Finding]]
    accepts: Callable[[Any], bool]
    #: Modules whose source the twin mirrors (the detector's own, its helpers').
    modules: tuple[str, ...]
    #: ``Detector.unevaluated`` after the same stream; ``None`` for a detector that
    #: reports nothing there (a twin without it stands in for no detector that does).
    unevaluated: Callable[[Any, Columns, list[Finding]], list[str]] | None = None
    #: The most its temporaries hold at once, in bytes per row of the columns
    #: (measured on a long run log): whether it may run beside another twin.
    scratch: int = 100
    #: Its time on a long run log, in seconds per million rows (measured): the longest
    #: start first when twins run side by side.
    cost: float = 0.1


def walking_twin(
    cls: type[Detector],
    walk: Callable[[Any, Columns], tuple[Any, list[Finding]]],
    accepts: Callable[[Any], bool],
    modules: tuple[str, ...],
    *,
    scratch: int = 100,
    cost: float = 0.1,
) -> Twin:
    """A twin whose ``walk`` runs a scratch copy of the detector over the columns and
    returns it with the findings: ``unevaluated`` right after ``run`` on the same columns
    asks that scratch copy instead of walking again."""
    last: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()

    def run(det: Any, cols: Columns) -> list[Finding]:
        scratch, found = walk(det, cols)
        last[det] = (id(cols), scratch)
        return found

    def unevaluated(det: Any, cols: Columns, found: list[Finding]) -> list[str]:
        kept = last.pop(det, None)
        scratch = kept[1] if kept is not None and kept[0] == id(cols) else walk(det, cols)[0]
        return scratch.unevaluated()

    return Twin(
        cls=cls,
        run=run,
        accepts=accepts,
        unevaluated=unevaluated,
        modules=modules,
        scratch=scratch,
        cost=cost,
    )


def at_rows(column: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    """``column`` at ``rows``; ``None`` stands for every row (a run log's field, present
    on each): the column itself, no copy."""
    return column if rows is None else column[rows]


def row_of(rows: np.ndarray | None, j: int) -> int:
    """The row of the ``j``-th of ``rows`` (``None``: every row, so ``j`` itself)."""
    return j if rows is None else int(rows[j])


def fingerprint(modules: tuple[str, ...]) -> str:
    """A digest of the source of ``modules``: what a twin was proven equivalent to."""
    import importlib

    digest = hashlib.sha256()
    for name in modules:
        try:
            digest.update(inspect.getsource(importlib.import_module(name)).encode())
        except (OSError, TypeError):  # no source shipped (a .pyc-only install): unproven
            return ""
    return digest.hexdigest()[:16]


def finding(
    rule: Rule,
    message: str,
    step: int,
    *,
    severity: Severity | None = None,
    **details: Any,
) -> Finding:
    """``rule.finding`` as :meth:`RuleDetector.fire` calls it."""
    return rule.finding(message, step=step, severity=severity, fix=None, **details)


def state_is(det: Detector, names: set[str]) -> bool:
    """Whether ``det`` holds exactly the attributes a twin knows (plus the framework it
    was told, which none of the twinned detectors reads): a detector that gained state
    since is not the one the twin was proven on."""
    return set(vars(det)) - {"framework"} == names
