"""What a rule is and what it reports.

A :class:`Rule` is documentation with a stable code: the seed's three parts (why it
explodes, the early signs, how to defuse it) plus the checklist item or runtime topic it
belongs to. The logic that fires it lives next to it (a plan check or a runtime detector)
and returns :class:`Finding` objects that carry the numbers; reporters decide how to show
them. One text serves ``sapper explain``, the terminal report and the HTML report.
"""

from __future__ import annotations

import enum
import textwrap
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["CHECKLIST_ITEMS", "Finding", "Rule", "Severity"]

#: The seven pre-flight items of seed §5.1, in the order the report shows them.
CHECKLIST_ITEMS: tuple[str, ...] = (
    "precision",
    "clipping",
    "init",
    "normalization",
    "memory",
    "parallel",
    "data",
)


class Severity(str, enum.Enum):
    """How bad a finding is; ``error`` makes ``sapper check`` exit 1."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 2, "warning": 1, "info": 0}[self.value]


class Rule(BaseModel):
    """A documented check with a stable code (``N101``).

    Codes are grouped by a one-letter family prefix so ``--select``/``--ignore`` work by
    prefix: ``C`` configuration, ``N`` numerics (precision, clipping, init, normalization),
    ``M`` memory, ``P`` parallel layout, ``D`` data, ``R`` runtime monitor, ``X`` cross-rank
    (distributed) runtime, ``S`` start-small (smoke) checks.
    """

    model_config = ConfigDict(frozen=True)

    code: str = Field(pattern=r"^[A-Z][0-9]{3}$", description="Stable code, e.g. N101.")
    name: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$", description="kebab-case name.")
    check: str = Field(description="Checklist item (seed §5.1) or runtime topic.")
    severity: Severity = Field(description="Default severity of its findings.")
    title: str = Field(description="One line saying what is wrong.")
    why: str = Field(description="Why it explodes.")
    signs: str = Field(description="The early signs that show it.")
    fix: str = Field(description="How to defuse it.")
    seed: str = Field(default="", description="Seed sections, e.g. '§2.2'.")

    @field_validator("why", "signs", "fix", "title")
    @classmethod
    def _prose(cls, text: str) -> str:
        """Source strings are wrapped for the editor; paragraphs are re-flowed here so the
        terminal, JSON and HTML wrap them to their own width."""
        paragraphs = textwrap.dedent(text).strip().split("\n\n")
        return "\n\n".join(" ".join(p.split()) for p in paragraphs)

    def finding(
        self,
        message: str,
        *,
        fix: str | None = None,
        severity: Severity | None = None,
        **details: Any,
    ) -> Finding:
        """A finding of this rule; ``details`` are the numbers (value, threshold, step...)."""
        known = {k: details.pop(k) for k in _FINDING_FIELDS if k in details}
        return Finding(
            code=self.code,
            severity=severity or self.severity,
            check=self.check,
            title=self.title,
            message=message,
            fix=fix or self.fix.split("\n\n")[0],
            **known,
            data=details,
        )


class Finding(BaseModel):
    """One reported problem with the numbers behind it (the stable JSON schema)."""

    code: str
    severity: Severity
    check: str
    title: str
    message: str = Field(description="One line carrying the measured numbers.")
    fix: str = Field(description="The suggested fix for this instance.")
    step: int | None = Field(default=None, description="Training step where it fired.")
    rank: int | None = Field(default=None, description="Global rank, for distributed runs.")
    value: float | None = Field(default=None, description="The measured value.")
    threshold: float | None = Field(default=None, description="The threshold it crossed.")
    source: str | None = Field(default=None, description="File and field it comes from.")
    data: dict[str, Any] = Field(default_factory=dict, description="Further numbers.")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


_FINDING_FIELDS = ("step", "rank", "value", "threshold", "source")
