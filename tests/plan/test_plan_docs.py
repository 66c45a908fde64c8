"""docs/plan.md is generated from the schema and must match it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from sapper.plan.docs import render_plan_docs
from sapper.plan.schema import Plan

DOC = Path(__file__).parent.parent.parent / "docs" / "plan.md"


def test_committed_plan_docs_are_up_to_date() -> None:
    assert DOC.read_text() == render_plan_docs(), (
        "docs/plan.md is stale: run `python -m sapper.plan.docs > docs/plan.md`"
    )


def _section(info: FieldInfo) -> type[BaseModel] | None:
    ann = info.annotation
    for a in (ann, *getattr(ann, "__args__", ())):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _undocumented(model: type[BaseModel], prefix: str = "") -> list[str]:
    missing = []
    for name, info in model.model_fields.items():
        sub = _section(info)
        if sub is not None:
            missing += _undocumented(sub, f"{prefix}{name}.")
        elif not info.description:
            missing.append(prefix + name)
    return missing


def test_every_plan_field_is_documented() -> None:
    assert _undocumented(Plan) == []


def test_docs_name_every_section_and_gpu() -> None:
    text = render_plan_docs()
    for section in ("model", "precision.loss_scaling", "parallel.checkpointing", "data"):
        assert f"## `{section}`" in text
    assert "| `A100-80GB` | 80 |" in text
