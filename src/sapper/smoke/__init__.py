"""Start small (seed §6): prove numerics, accumulation, checkpointing, precision and data
parallelism on a toy of the real architecture before the big run.

Usage::

    from sapper.smoke import hf_toy_factory, run_smoke
    report = run_smoke(hf_toy_factory("config.json"))      # synthetic data, default step
    report = run_smoke(user_factory(build_model), source=LoaderFactory(make_loader),
                       step=MyTrainStep())                  # the user's model, data, step

The public names load lazily: ``sapper rules`` imports only :mod:`sapper.smoke.rules`,
which must stay free of torch so listing rules is instant.
"""

from __future__ import annotations

from sapper.lazy import lazy_exports

__all__ = [
    "CHECKS",
    "BatchSource",
    "DefaultTrainStep",
    "LoaderFactory",
    "ModelFactory",
    "SmokeConfig",
    "SmokeReport",
    "StepOptions",
    "StepResult",
    "SyntheticTokens",
    "TokenFile",
    "Tolerances",
    "ToySize",
    "TrainStep",
    "hf_toy_factory",
    "run_smoke",
    "user_factory",
]

_HOME = {
    "CHECKS": "runner",
    "SmokeReport": "runner",
    "run_smoke": "runner",
    "SmokeConfig": "context",
    "Tolerances": "context",
    "BatchSource": "batches",
    "LoaderFactory": "batches",
    "SyntheticTokens": "batches",
    "TokenFile": "batches",
    "DefaultTrainStep": "step",
    "StepOptions": "step",
    "StepResult": "step",
    "TrainStep": "step",
    "ModelFactory": "toy",
    "ToySize": "toy",
    "hf_toy_factory": "toy",
    "user_factory": "toy",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
