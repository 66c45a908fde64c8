"""The halt policy: stop the run on chosen findings instead of burning more compute."""

from __future__ import annotations

from collections.abc import Iterable

from sapper.errors import SapperError
from sapper.rules.model import Finding, Severity

__all__ = ["HaltPolicy", "SapperHalt"]


class SapperHalt(SapperError):
    """Raised by the monitor from ``Monitor.step`` (or the model's forward, for a position
    overflow caught before the embedding) when a finding matches the halt policy."""

    exit_code = 1

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        first = findings[0]
        where = f" at step {first.step}" if first.step is not None else ""
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        super().__init__(f"sapper halted the run{where}: {first.code} {first.message}{more}")


class HaltPolicy:
    """Severities ("error", "warning") and/or codes or code prefixes ("R001", "R03")."""

    def __init__(self, halt_on: Iterable[str | Severity] = ()) -> None:
        self.severities: set[str] = set()
        self.codes: list[str] = []
        for item in halt_on:
            text = item.value if isinstance(item, Severity) else str(item).strip()
            if text.lower() in {s.value for s in Severity}:
                self.severities.add(text.lower())
            elif text:
                self.codes.append(text.upper())

    def matches(self, finding: Finding) -> bool:
        if finding.severity.value in self.severities:
            return True
        return any(finding.code.startswith(c) for c in self.codes)

    def check(self, findings: list[Finding]) -> None:
        hits = [f for f in findings if self.matches(f)]
        if hits:
            raise SapperHalt(hits)
