"""Shared test helpers."""

from __future__ import annotations

import os

# Tests must never reach a model hub: every model is built from a config.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
