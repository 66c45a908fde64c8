"""``sapper inspect``: a checkpoint read streamed, tensor by tensor, without the model.

Usage::

    from sapper.checkpoint import inspect_paths
    result = inspect_paths(["checkpoint-500"])            # or two: (older, newer)
    for finding in result.findings: ...                   # K-codes, sapper.checkpoint.rules

The public names load lazily: ``sapper rules`` imports only :mod:`sapper.checkpoint.rules`,
which stays free of torch so listing rules is instant.
"""

from __future__ import annotations

from sapper.lazy import lazy_exports

__all__ = ["CheckpointReport", "InspectResult", "inspect_checkpoint", "inspect_paths"]

_HOME = dict.fromkeys(__all__, "inspect")

__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
