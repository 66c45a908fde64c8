"""Read Hugging Face TrainingArguments into the Plan: the JSON ``args.to_json_string()``
writes (``training_args.json``), the same settings as a YAML or JSON file (the
alignment-handbook and TRL recipes), or the command line that launches a Trainer script
(``python run_clm.py --per_device_train_batch_size 8 --bf16 ...``, behind ``torchrun``,
``accelerate launch`` or ``deepspeed``, with ``\\`` continuations).

The Trainer's defaults are those of the installed transformers, read from its
``TrainingArguments`` dataclass (transformers/training_args.py) when a file is read, never
written down here. The framework is ``transformers`` (the HF Trainer runs the step), or
``deepspeed`` when ``--deepspeed`` names a config: the engine then runs the step.

A Trainer script parses its own arguments next to TrainingArguments' (``--dataset_name``,
``--model_name_or_path``, TRL's ``beta``), so a key TrainingArguments does not know is
reported (C005) only when it is a near miss of one that it does know
(``gradient_acumulation_steps``): those are typos, the rest are the script's.

TrainingArguments do not describe the model. ``model_name_or_path`` naming a local folder
with a config.json is read as ``refs["hf_config"]``; a hub id, or no model at all, leaves
the model unknown (C006). The launcher's process count (``torchrun --nproc_per_node``,
``--nnodes``; ``accelerate launch --num_processes``, ``--num_machines``; ``deepspeed
--num_gpus``, ``--num_nodes``) gives the GPU count when it is a number. A value taken from
the shell (``$LR``) is unknown (C006), not read as text.

``training_args.bin`` (``torch.save`` of the dataclass, a pickle) is refused: unpickling a
file runs code from it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip
from sapper.plan.readers.base import (
    ConfigFormat,
    Sniff,
    closest,
    local_model_config,
    unknown_key_findings,
    unresolved_finding,
)
from sapper.plan.readers.hf_trainer import (
    MISSING,
    TrainerKeys,
    Values,
    apply_deepspeed,
    apply_fsdp,
    apply_precision,
    apply_trainer,
    settled,
    trainer_defaults,
    trainer_version,
)
from sapper.plan.sources import PlanSource, read_json_object

__all__ = ["FORMAT", "parse_command_line", "read_training_args"]

#: TrainingArguments fields present since transformers 4.x that are the Trainer's and
#: nothing else's: enough of them marks a file or a command line as Trainer settings
#: without importing transformers (seconds) to find out.
SIGNATURE = frozenset({
    "per_device_train_batch_size", "per_device_eval_batch_size", "output_dir",
    "overwrite_output_dir", "do_train", "do_eval", "num_train_epochs", "lr_scheduler_type",
    "logging_steps", "logging_strategy", "save_strategy", "save_steps", "save_total_limit",
    "eval_strategy", "evaluation_strategy", "eval_steps", "warmup_ratio", "learning_rate",
    "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "optim", "report_to",
    "push_to_hub", "hub_model_id", "logging_dir", "dataloader_num_workers",
    "gradient_checkpointing", "gradient_accumulation_steps", "warmup_steps", "max_steps",
    "half_precision_backend", "ddp_find_unused_parameters", "load_best_model_at_end",
    "remove_unused_columns", "hub_strategy", "log_level", "save_safetensors", "tf32",
})
#: Fields of transformers 4.x that 5.x dropped (a 4.x training_args.json has them).
_LEGACY = frozenset({"warmup_ratio", "evaluation_strategy", "half_precision_backend",
                     "save_safetensors", "logging_dir", "overwrite_output_dir"})
#: Keys of the scripts around the Trainer that give a value of the Plan.
_SEQ_KEYS = ("max_seq_length", "block_size", "max_length", "max_source_length")
_MODEL_KEYS = ("model_name_or_path",)
#: Launchers and the flags that count their processes: (per node, nodes, total).
_LAUNCHERS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "torchrun": (("nproc_per_node", "nproc-per-node"), ("nnodes",), ()),
    "torch.distributed.run": (("nproc_per_node", "nproc-per-node"), ("nnodes",), ()),
    "torch.distributed.launch": (("nproc_per_node", "nproc-per-node"), ("nnodes",), ()),
    "deepspeed": (("num_gpus",), ("num_nodes",), ()),
    "accelerate": ((), ("num_machines",), ("num_processes",)),
}
#: Longest command line read (a real one is a few KB; shlex is slow on megabytes).
_MAX_LINE = 64 << 10
#: Characters of command lines tokenised in all (a script of a few hundred commands).
_MAX_SCANNED = 1 << 20
#: Unknown keys checked for near misses (difflib is slow on thousands).
_MAX_CHECKED = 500
# ---- the command line -----------------------------------------------------------------
def parse_command_line(text: str) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """(script arguments, launcher arguments, launcher) of the command in ``text`` that
    passes the most Trainer flags. Bare flags are true; ``--key=value`` and ``--key value``
    both work; ``\\`` continuations are joined and ``#`` comments dropped."""
    joined = re.sub(r"\\\r?\n", " ", text)
    best: tuple[int, list[str]] = (0, [])
    budget = _MAX_SCANNED
    for line in joined.splitlines():
        if "--" not in line or len(line) > _MAX_LINE:
            continue
        budget -= len(line)
        if budget < 0:
            break
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue  # an unbalanced quote: not a line a shell would run either
        hits = sum(t.lstrip("-").split("=", 1)[0] in SIGNATURE for t in tokens
                   if t.startswith("--"))
        if hits > best[0]:
            best = (hits, tokens)
    tokens = best[1]
    script = next((i for i, t in enumerate(tokens) if t.endswith(".py")), None)
    launcher = _launcher(tokens[:script] if script is not None else [])
    before = _flags(tokens[:script]) if script is not None else {}
    after = _flags(tokens[script + 1:] if script is not None else tokens)
    return after, {k: str(v) for k, v in before.items()}, launcher


def _launcher(tokens: list[str]) -> str | None:
    for t in tokens:
        name = Path(t).name
        if name in _LAUNCHERS:
            return name
    return None


def _flags(tokens: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            continue
        key, eq, value = token[2:].partition("=")
        if eq:
            out[key] = value
        elif i < len(tokens) and not tokens[i].startswith("--"):
            out[key] = tokens[i]
            i += 1
        else:
            out[key] = True  # a bare flag: HfArgumentParser's store_true for a bool field
    return out


# ---- reading --------------------------------------------------------------------------
def read_training_args(sniff: Sniff) -> PlanSource:
    src = PlanSource(name=sniff.name)
    launch: dict[str, str] = {}
    launcher = None
    doc = sniff.mapping
    if isinstance(doc, dict) and _mapping_score(doc) > 0:
        raw, lenient = {str(k): v for k, v in doc.items()}, False
    else:
        raw, launch, launcher = parse_command_line(sniff.text)
        lenient = True
        if not raw:
            raise InputError(
                "no Trainer arguments found", file=sniff.name,
                expected="a command line with flags such as --per_device_train_batch_size, "
                "or the JSON of TrainingArguments.to_json_string()",
            )
    raw, from_shell = _shell_values(raw, src)
    defaults = trainer_defaults()
    known = set(defaults) | _LEGACY
    unknown = [k for k in raw if k not in known][:_MAX_CHECKED]
    near = [k for k in unknown if closest(k, known, cutoff=0.85)]
    src.findings += unknown_key_findings(
        [f"--{k}" if lenient else k for k in near],
        {f"--{k}" if lenient else k for k in known},
        file=src.name, framework=f"TrainingArguments (transformers {trainer_version()})",
        effect="(HfArgumentParser refuses an argument no dataclass of the script defines)",
    )
    v = Values(raw, src, lenient=lenient)
    _fsdp_config_file(v, sniff)
    deepspeed = apply_deepspeed(v, "deepspeed", sniff.path.parent)
    apply_fsdp(v, "fsdp", "fsdp_config", config_enables=False)
    v.set("framework", "deepspeed" if deepspeed else "transformers",
          "deepspeed" if deepspeed else "(TrainingArguments: the HF Trainer)")
    where = f"transformers {trainer_version()} default"
    names = {}
    if "activation_checkpointing" in raw and "gradient_checkpointing" not in raw:
        names["gradient_checkpointing"] = "activation_checkpointing"  # transformers 5
    keys = TrainerKeys(
        "the HF Trainer", names,
        {name: (defaults.get(name, MISSING), where) for name in (
            "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
            "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim",
            "lr_scheduler_type", "warmup_steps", "num_train_epochs", "max_grad_norm",
        ) if name not in from_shell},  # a default never stands in for a shell value
    )
    apply_trainer(v, keys)
    apply_precision(v, keys, deepspeed=deepspeed)
    _model(v, sniff)
    for key in _SEQ_KEYS:
        if v.take(key, "batch.seq_len", "int", minimum=1) is not None:
            break
    _hardware(v, launch, launcher)
    settled(src)
    return src


def _shell_values(raw: dict[str, Any], src: PlanSource) -> tuple[dict[str, Any], set[str]]:
    """Values taken from the shell (``$LR``, ``${BS}``, ``$(nproc)``) are unknown: the
    settings without them, and their keys."""
    out: dict[str, Any] = {}
    shell: set[str] = set()
    for key, value in raw.items():
        if isinstance(value, str) and "$" in value:
            field = _SHELL_FIELDS.get(key)
            if field is not None:
                unresolved_finding(src, f"--{key}", field,
                                   f"{clip(value)!r} is set by the shell at launch",
                                   f"give the value ({field}) on sapper's command line")
            shell.add(key)
            continue
        out[key] = value
    return out, shell


_SHELL_FIELDS = {
    "per_device_train_batch_size": "batch.micro_batch_size",
    "gradient_accumulation_steps": "batch.gradient_accumulation_steps",
    "learning_rate": "optimizer.lr",
    "max_steps": "schedule.total_steps",
    "warmup_steps": "schedule.warmup_steps",
    "max_grad_norm": "clipping.max_norm",
    "model_name_or_path": "model",
    "deepspeed": "parallel.zero_stage",
    "block_size": "batch.seq_len",
    "max_seq_length": "batch.seq_len",
}


def _fsdp_config_file(v: Values, sniff: Sniff) -> None:
    """``--fsdp_config`` may name a JSON file (TrainingArguments loads it)."""
    value = v.get("fsdp_config")
    if not isinstance(value, str) or not value.strip():
        return
    path = Path(value).expanduser()
    path = path if path.is_absolute() else sniff.path.parent / path
    if path.is_file():
        v.raw["fsdp_config"] = read_json_object(path, "an FSDP config", "FSDP settings")
    else:
        v.raw.pop("fsdp_config")


def _model(v: Values, sniff: Sniff) -> None:
    for key in _MODEL_KEYS:
        value = v.get(key)
        if value in (MISSING, None):
            continue
        if not isinstance(value, str):
            raise v.error(key, value, "a hub model id or a local model folder")
        v.set("init.from_pretrained", True, key)
        path = local_model_config(value, sniff.path.parent)
        if path is not None:
            v.src.refs["hf_config"] = path
            return
        unresolved_finding(
            v.src, key, "model",
            f"{value!r} is a hub model id; its config.json is not on this machine",
            "pass --model config.json (the model's config from the hub)",
        )
        return
    unresolved_finding(
        v.src, "TrainingArguments", "model",
        "Trainer settings do not describe the model", "pass --model config.json",
    )


def _hardware(v: Values, launch: dict[str, str], launcher: str | None) -> None:
    if launcher is None:
        return
    per_node_keys, node_keys, total_keys = _LAUNCHERS[launcher]
    lv = Values(dict(launch), v.src, lenient=True)

    def first(names: tuple[str, ...]) -> tuple[int | None, str | None]:
        for name in names:
            if name in launch:
                text = launch[name]
                if "$" in text or not text.strip().isdigit():
                    unresolved_finding(
                        v.src, f"{launcher} --{name}", "hardware.num_gpus",
                        f"{clip(text)!r} is not a number sapper can read (set at launch, or "
                        "an elastic range)", "pass --gpus N (all nodes together)",
                    )
                    return None, None
                return lv.value(name, "int", minimum=1), f"{launcher} --{name}"
        return None, None

    nodes, nodes_key = first(node_keys)
    per_node, per_key = first(per_node_keys)
    total, total_key = first(total_keys)
    if nodes is not None:
        v.set("hardware.nodes", nodes, nodes_key or "")
    if per_node is not None:
        v.set("hardware.gpus_per_node", per_node, per_key or "")
        v.set("hardware.num_gpus", per_node * (nodes or 1),
              f"{per_key} × {nodes_key}" if nodes_key else per_key or "")
    elif total is not None:
        v.set("hardware.num_gpus", total, total_key or "")


# ---- recognising ------------------------------------------------------------------------
#: Keys that belong to Axolotl, accelerate or a sapper plan, never to TrainingArguments.
_FOREIGN = frozenset({"base_model", "micro_batch_size", "datasets", "sequence_len",
                      "distributed_type", "compute_environment", "model", "hardware",
                      "parallel", "train_micro_batch_size_per_gpu", "zero_optimization",
                      "train_batch_size"})
#: Keys of trainers built on TrainingArguments that have a reader of their own
#: (LLaMA-Factory's ``stage``/``finetuning_type``/``cutoff_len``/``template``, the
#: ``dataset_name`` of TRL's scripts): such a file is still Trainer settings, read here
#: with less confidence than its own reader's.
_OTHER_TRAINERS = frozenset({"stage", "finetuning_type", "cutoff_len", "template",
                             "dataset_name"})


def _mapping_score(doc: dict[str, Any]) -> float:
    keys = {str(k) for k in doc}
    if keys & _FOREIGN:
        return 0.0
    hits = len(keys & SIGNATURE)
    if hits < 3:
        return 0.0
    score = min(0.97, 0.5 + 0.05 * hits)
    return min(score, 0.8) if keys & _OTHER_TRAINERS else score


def _recognise(sniff: Sniff) -> float:
    """A mapping with several of the Trainer's own fields and none of Axolotl's,
    accelerate's, DeepSpeed's or a sapper plan's; or text whose command line passes
    Trainer flags (``--per_device_train_batch_size``...)."""
    doc = sniff.mapping
    if isinstance(doc, dict):
        return _mapping_score(doc)
    if "--" not in sniff.text:
        return 0.0
    flags = set(re.findall(r"--([a-z][a-z0-9_]*)", sniff.text[:200_000]))
    hits = len(flags & SIGNATURE)
    return 0.0 if hits < 2 else min(0.95, 0.6 + 0.05 * hits)


FORMAT = ConfigFormat(
    name="training_args",
    title="Hugging Face TrainingArguments (JSON, YAML or the command line)",
    looks_for="per_device_train_batch_size, learning_rate, num_train_epochs, output_dir ... "
    "as keys (training_args.json) or as --flags of the script's command line",
    recognise=_recognise,
    read=read_training_args,
)
