"""Which command-line option sets which plan field, in both directions.

The CLI uses it to turn options into plan values; reports use it the other way, so a
check that could not run names the option that would let it (``hardware.gpu (--gpu)``).
"""

from __future__ import annotations

__all__ = ["OPTION_FIELDS", "describe_input"]

#: option name (as the CLI function receives it) -> Plan field path.
OPTION_FIELDS: dict[str, str] = {
    "gpus": "hardware.num_gpus",
    "gpus_per_node": "hardware.gpus_per_node",
    "nodes": "hardware.nodes",
    "gpu": "hardware.gpu",
    "seq_len": "batch.seq_len",
    "micro_batch": "batch.micro_batch_size",
    "grad_accum": "batch.gradient_accumulation_steps",
    "global_batch": "batch.global_batch_size",
    "tp": "parallel.tp",
    "pp": "parallel.pp",
    "dp": "parallel.dp",
    "cp": "parallel.cp",
    "ep": "parallel.ep",
    "zero": "parallel.zero_stage",
    "checkpointing": "parallel.checkpointing.granularity",
    "dtype": "precision.dtype",
    "loss_scale": "precision.loss_scaling",
    "lr": "optimizer.lr",
    "optimizer_impl": "optimizer.impl",
    "warmup": "schedule.warmup_steps",
    "max_norm": "clipping.max_norm",
    "dataset": "data.path",
}

#: Inputs no single option sets.
_OTHER: dict[str, str] = {
    "model": "--model config.json or a model section",
    "schedule": "--warmup and schedule.total_steps",
    "precision.loss_scaling.mode": "--loss-scale dynamic|N",
    "parallel": "a layout without the parallel item's errors",
}


def describe_input(field: str) -> str:
    """``hardware.gpu (--gpu)``: the plan field and how to give it."""
    how = _OTHER.get(field)
    if how is None:
        flags = [k for k, v in OPTION_FIELDS.items() if v == field]
        how = "--" + flags[0].replace("_", "-") if flags else ""
    return f"{field} ({how})" if how else field
