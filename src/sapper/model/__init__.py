"""What follows from the model's architecture alone, computed once for every command.

:func:`architecture_from_plan` reads and checks the plan's model into an
:class:`Architecture`; :mod:`~sapper.model.params` counts its parameters per block, per
stage and in total; :mod:`~sapper.model.flops` its GEMMs and attention FLOPs (reported vs
executed); :mod:`~sapper.model.optimizers` what an optimizer keeps and moves per
parameter; :mod:`~sapper.model.stages` how blocks split over pipeline stages. ``check``,
``memory`` and ``plan`` read these and keep no table of their own, so they cannot tell the
user different numbers. Pure arithmetic: no torch, no numpy.
"""

from sapper.model.architecture import (
    Architecture,
    MissingInput,
    architecture_fields,
    architecture_from_plan,
)
from sapper.model.params import ParamCount, active_params, total_params

__all__ = [
    "Architecture",
    "MissingInput",
    "ParamCount",
    "active_params",
    "architecture_fields",
    "architecture_from_plan",
    "total_params",
]
