"""Parallel layouts (seed §4, checklist item 6): validate them, predict a step's cost,
and search the space of layouts for the fastest that fits.

* :func:`validate` — every layout constraint the plan breaks, with the arithmetic.
* :func:`predict_step` — per-GPU step time, tokens/s, TFLOP/s, MFU and where the time
  goes (compute, exposed communication by kind, pipeline bubble, optimizer).
* :func:`search` — every valid layout ranked by predicted throughput, memory-checked
  with :func:`sapper.memory.estimate`, each with the reasons it wins.
"""

from sapper.model.flops import padded_vocab
from sapper.parallel.cluster import Cluster
from sapper.parallel.cost import BREAKDOWN, StepCost, predict_step
from sapper.parallel.layout import Layout, placement, split_layers
from sapper.parallel.search import Candidate, SearchResult, search
from sapper.parallel.validate import LayoutIssue, bubble_fraction, validate
from sapper.parallel.workload import Workload

__all__ = [
    "BREAKDOWN",
    "Candidate",
    "Cluster",
    "Layout",
    "LayoutIssue",
    "SearchResult",
    "StepCost",
    "Workload",
    "bubble_fraction",
    "padded_vocab",
    "placement",
    "predict_step",
    "search",
    "split_layers",
    "validate",
]
