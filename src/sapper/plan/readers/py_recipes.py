"""Training recipes written in Python, which sapper refuses with what to pass instead.

OLMo-core, NeMo 2 and Megatron-Bridge describe a run in Python (a ``TransformerConfig``
built in a script, ``llm.pretrain`` recipes, a ``ConfigContainer``): the values exist only
once the code runs, and sapper never runs a config. A file that imports one of them is
named as what it is, with the inputs sapper reads for the same run.
"""

from __future__ import annotations

import re

from sapper.errors import InputError
from sapper.plan.readers.base import Sniff

__all__ = ["refuse_python_recipe"]

#: (import pattern, what the file is). Only the first 64 KiB of a file is searched.
_RECIPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^[ \t]*(?:from|import)[ \t]+olmo_core\b", re.M),
     "an OLMo-core training script (Python)"),
    (re.compile(r"^[ \t]*(?:from[ \t]+nemo\.collections[ \t]+import[ \t]+(?:[\w, \t(]*\b)?llm\b"
                r"|(?:from|import)[ \t]+nemo\.collections\.llm\b)", re.M),
     "a NeMo 2 recipe (Python)"),
    (re.compile(r"^[ \t]*(?:from|import)[ \t]+megatron\.bridge\b", re.M),
     "a Megatron-Bridge recipe (Python)"),
)
_HEAD = 1 << 16


def refuse_python_recipe(sniff: Sniff) -> InputError | None:
    """The one-line error for a Python recipe of OLMo-core, NeMo 2 or Megatron-Bridge, or
    None when ``sniff`` is not one."""
    head = sniff.text[:_HEAD]
    for pattern, what in _RECIPES:
        if pattern.search(head):
            return InputError(
                f"{what}: sapper reads config files and never runs code to build one",
                file=sniff.name,
                expected="the model's config.json (--model) with the run's sizes as flags "
                "(--gpus, --micro-batch, --seq-len, --tp, --pp, --dtype ...), or a sapper "
                "plan (YAML)",
            )
    return None
