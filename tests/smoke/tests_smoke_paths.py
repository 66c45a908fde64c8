"""Paths shared by the smoke tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
LLAMA_TOY = ROOT / "examples" / "smoke" / "llama-toy.json"
