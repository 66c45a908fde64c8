"""Where sapper's findings live inside an experiment tracker's run.

The monitor's tracker sinks (:mod:`sapper.monitor.trackers`) write them there, so they show
on the dashboard the team watches; the W&B and MLflow log readers (:mod:`sapper.logs.wandb`,
:mod:`sapper.logs.mlflow`) read them back, so ``sapper analyze`` on the run folder sees what
the live monitor found. Both sides name the place through this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapper.jsontext import dumps

if TYPE_CHECKING:
    from sapper.rules.model import Finding

__all__ = ["MLFLOW_FINDINGS_ARTIFACT", "WANDB_FINDINGS_KEY", "findings_document"]

#: The W&B summary key holding the findings, as a list of Finding JSON objects.
WANDB_FINDINGS_KEY = "sapper/findings"
#: The MLflow artifact (path inside the run's artifacts) holding the findings as JSON.
MLFLOW_FINDINGS_ARTIFACT = "sapper/findings.json"


def findings_document(findings: list[Finding]) -> str:
    """The MLflow findings artifact's text: ``{"findings": [...]}``, strict JSON (a
    finding's NaN value is ``"nan"``, which the Finding model reads back as the float)."""
    return dumps({"findings": [f.model_dump(mode="json") for f in findings]}, indent=1)
