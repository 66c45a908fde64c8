"""What a launch command says about the job, before it runs: the launcher and its process
counts, the config files the program will read, and the flags on its command line.

``sapper run -- <command>`` reads the command the way each launcher reads it (torchrun,
``python -m torch.distributed.run``, ``deepspeed``, ``accelerate launch``, composer,
``llamafactory-cli``, ``axolotl``, ``tune run``, ``trl``, ``litgpt``, ``python``, a shell
script), so the checklist runs on the same files and flags as the program, through the
readers ``sapper check`` uses (:mod:`sapper.plan.readers`): this module only finds them.
A value the command leaves to the machine (``--nproc-per-node gpu``, deepspeed without
``--num_gpus``) is the machine's GPU count when known, else unknown; an elastic range
(``--nnodes 1:4``) is unknown. Nothing here runs or imports the program.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Launch", "parse_command"]

#: Suffixes of config files a program argument may name.
_CONFIG_SUFFIXES = frozenset({".yaml", ".yml", ".json", ".toml"})
#: Script flags whose value is a config file the program reads.
_CONFIG_FLAGS = frozenset({
    "config", "config_file", "config-file", "cfg", "config_path", "config-path",
    "yaml", "args_file",
})
#: Script flags whose value is a DeepSpeed JSON (the HF Trainer's, Megatron-DeepSpeed's).
_DEEPSPEED_FLAGS = frozenset({"deepspeed", "deepspeed_config", "deepspeed-config"})
#: Script flags whose value names the model (a local folder holds its config.json).
_MODEL_FLAGS = frozenset({
    "model_name_or_path", "model-name-or-path", "pretrained_model_name_or_path",
    "base_model", "model_path", "model-path", "model_dir",
})
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Launch:
    """One launch command, read."""

    argv: list[str]
    #: torchrun, deepspeed, accelerate, composer, llamafactory, axolotl, torchtune, trl,
    #: litgpt, python, shell, or the program's own name.
    launcher: str
    #: The training program's argv, without the launcher and its options.
    program: list[str] = field(default_factory=list)
    nproc_per_node: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    #: All processes of the job (every node together), when the command says.
    world_size: int | None = None
    #: Where each count came from, in the user's words (``torchrun --nproc-per-node``).
    origins: dict[str, str] = field(default_factory=dict)
    #: Config files the program reads, in the order it reads them (later ones win).
    configs: list[Path] = field(default_factory=list)
    #: The DeepSpeed JSON the command names (``--deepspeed``, ``--deepspeed_config_file``).
    deepspeed: Path | None = None
    #: The model's config.json, when a flag names a local model folder.
    model: Path | None = None
    #: Plan values the launcher itself sets: (field, value, origin).
    values: list[tuple[str, object, str]] = field(default_factory=list)
    #: What could not be read, one line each.
    notes: list[str] = field(default_factory=list)
    #: Whether the command starts Python code that may train (not ``python -c``, not a
    #: shell built-in): only then are flags read as a training command line.
    trains: bool = True

    @property
    def text(self) -> str:
        """The command as one shell line, for the readers that read command lines."""
        return shlex.join(self.argv)

    @property
    def name(self) -> str:
        """A short name for the run folder: the config's or the script's stem."""
        for path in [*self.configs, *(Path(a) for a in self.program[:1])]:
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem).strip("-.")
            if stem:
                return stem[:40]
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(self.argv[0]).name)[:40] or "run"


# ---- option tables --------------------------------------------------------------------
#: Per launcher: options that take no value. Any other ``--option`` takes the next token
#: (or ``=value``), as argparse does for these launchers.
_TORCHRUN_FLAGS = frozenset({
    "standalone", "no-python", "no_python", "run-path", "run_path", "module", "m",
    "help", "h", "virtual-local-rank", "virtual_local_rank", "use_env", "use-env",
})
_DEEPSPEED_LAUNCH_FLAGS = frozenset({
    "no_python", "no-python", "no_local_rank", "no-local-rank", "module", "force_multi",
    "force-multi", "elastic_training", "elastic-training", "save_pid", "save-pid",
    "bind_cores_to_rank", "no_ssh_check", "no_ssh", "help", "h",
})
_ACCELERATE_FLAGS = frozenset({
    "multi_gpu", "multi-gpu", "use_deepspeed", "use-deepspeed", "use_fsdp", "use-fsdp",
    "use_megatron_lm", "use-megatron-lm", "use_xpu", "cpu", "tpu", "module", "m",
    "no_python", "no-python", "quiet", "q", "debug", "same_network", "same-network",
    "ipex", "enable_cpu_affinity", "downcast_bf16", "tpu_use_cluster",
    "tpu_use_sudo", "dynamo_use_fullgraph", "dynamo_use_dynamic", "help", "h",
})
_COMPOSER_FLAGS = frozenset({
    "module_mode", "m", "command_mode", "c", "verbose", "v", "help", "h",
})


def _opts(
    tokens: list[str], flags: frozenset[str], short_values: frozenset[str] = frozenset()
) -> tuple[dict[str, str], list[str]]:
    """A launcher's options (name without dashes -> value; a flag -> ``"true"``) up to its
    first positional token, and the tokens from there on (the program)."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            return opts, tokens[i + 1 :]
        if not tok.startswith("-") or tok == "-":
            return opts, tokens[i:]
        name, eq, value = tok.lstrip("-").partition("=")
        if eq:
            opts[name] = value
            i += 1
            continue
        if len(tok) > 2 and tok[1] != "-" and tok[1:2] in short_values and name not in flags:
            opts[tok[1:2]] = tok[2:]  # -n8
            i += 1
            continue
        # A flag this table does not know (a launcher newer than sapper) must not swallow
        # the script: no launcher option takes a .py file as its value.
        if name in flags or i + 1 >= len(tokens) or tokens[i + 1].endswith(".py"):
            opts[name] = "true"
            i += 1
            continue
        opts[name] = tokens[i + 1]
        i += 2
    return opts, []


def _flag_values(args: list[str]) -> dict[str, str]:
    """Every ``--name value`` / ``--name=value`` anywhere in ``args`` (a CLI whose flags
    may follow its positional config)."""
    out: dict[str, str] = {}
    for i, tok in enumerate(args):
        if not tok.startswith("--"):
            continue
        name, eq, value = tok[2:].partition("=")
        if eq:
            out[name] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            out[name] = args[i + 1]
    return out


def _get(opts: dict[str, str], *names: str) -> tuple[str | None, str | None]:
    for name in names:
        for spelled in {name, name.replace("_", "-"), name.replace("-", "_")}:
            if spelled in opts:
                return opts[spelled], spelled
    return None, None


def _count(launch: Launch, value: str | None, what: str, origin: str) -> int | None:
    """A process or node count as an int; a range, a variable or a word is unknown."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit() and int(text) > 0:
        launch.origins[what] = origin
        return int(text)
    launch.notes.append(f"{origin} {text!r} is not a count sapper can read: {what} unknown")
    return None


# ---- the machine's part -----------------------------------------------------------------
def _local_gpus(launch: Launch, machine_gpus: int | None, what: str) -> int | None:
    visible = _env("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        n = len([d for d in visible.split(",") if d.strip()])
        launch.origins[what] = "CUDA_VISIBLE_DEVICES"
        return n
    if machine_gpus:
        launch.origins[what] = "this machine's GPUs"
        return machine_gpus
    return None


# ---- the program ------------------------------------------------------------------------
def _python_program(tokens: list[str]) -> tuple[list[str], str | None, bool]:
    """(program argv from the script or module on, the module name if ``-m``, whether it
    is ``-c`` code) of ``python [options] ...`` without its interpreter token."""
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "-m" and i + 1 < len(tokens):
            return tokens[i + 1 :], tokens[i + 1], False
        if tok.startswith("-m") and len(tok) > 2:
            return [tok[2:], *tokens[i + 1 :]], tok[2:], False
        if tok == "-c" or tok.startswith("-c"):
            return [], None, True
        if tok in ("-W", "-X", "-Q") and i + 1 < len(tokens):
            i += 2
            continue
        if tok.startswith("-"):
            i += 1
            continue
        return tokens[i:], None, False
    return [], None, True  # the interactive interpreter


def _is_python(token: str) -> bool:
    return bool(_PYTHON.match(Path(token).name))


def _resolve(value: str, cwd: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else cwd / path


def _existing(value: str, cwd: Path) -> Path | None:
    path = _resolve(value, cwd)
    try:
        return path if path.is_file() else None
    except OSError:
        return None


def _model_config(value: str, cwd: Path) -> Path | None:
    path = _resolve(value, cwd)
    try:
        if path.is_dir() and (path / "config.json").is_file():
            return path / "config.json"
    except OSError:
        return None
    return None


def _program_files(launch: Launch, args: list[str], cwd: Path) -> None:
    """The config files, DeepSpeed JSON and model folder a program's arguments name."""
    i = 0
    while i < len(args):
        tok = args[i]
        value: str | None = None
        name = ""
        if tok.startswith("--"):
            name, eq, value = tok[2:].partition("=")
            if not eq:
                more = i + 1 < len(args) and not args[i + 1].startswith("--")
                value = args[i + 1] if more else None
                i += 1 if value is not None else 0
        elif Path(tok).suffix.lower() in _CONFIG_SUFFIXES:
            path = _existing(tok, cwd)
            if path is not None and path not in launch.configs:
                launch.configs.append(path)
        i += 1
        if value is None:
            continue
        if name in _DEEPSPEED_FLAGS:
            path = _existing(value, cwd)
            if path is not None:
                launch.deepspeed = path
            elif value.lower() not in ("true", "false"):
                launch.notes.append(f"--{name} {value!r}: no such file here")
        elif name in _CONFIG_FLAGS:
            path = _existing(value, cwd)
            if path is not None and Path(value).suffix.lower() in _CONFIG_SUFFIXES:
                if path not in launch.configs:
                    launch.configs.append(path)
            elif path is None:
                launch.notes.append(f"--{name} {value!r} is not a file here (a built-in "
                                    "config name is not read)")
        elif name in _MODEL_FLAGS and launch.model is None:
            launch.model = _model_config(value, cwd)


def _program(launch: Launch, tokens: list[str], cwd: Path) -> None:
    """The program a launcher starts: a Python script or module, a known CLI, or a
    shell script."""
    if not tokens:
        return
    head = tokens[0]
    if _is_python(head):
        program, module, code = _python_program(tokens[1:])
        if code:
            launch.trains = False
            return
        if module is not None:
            _module(launch, module, program[1:], cwd)
            return
        tokens = program
        if not tokens:
            return
        head = tokens[0]
    base = Path(head).name
    if base in _CLIS:
        _CLIS[base](launch, tokens[1:], cwd)
        return
    if base.endswith((".sh", ".bash", ".slurm")) or base in ("bash", "sh", "zsh"):
        _shell(launch, tokens, cwd)
        return
    launch.program = tokens
    _program_files(launch, tokens[1:], cwd)


def _module(launch: Launch, module: str, args: list[str], cwd: Path) -> None:
    if module in ("torch.distributed.run", "torch.distributed.launch"):
        _torchrun(launch, args, cwd, f"python -m {module}")
    elif module in ("deepspeed.launcher.runner", "deepspeed"):
        _deepspeed(launch, args, cwd)
    elif module in ("accelerate.commands.launch",):
        _accelerate(launch, args, cwd)
    elif module.startswith("axolotl.cli"):
        _axolotl(launch, args, cwd, module)
    elif module.startswith("llamafactory"):
        _llamafactory(launch, args, cwd)
    else:
        launch.program = [module, *args]
        _program_files(launch, args, cwd)


# ---- launchers ----------------------------------------------------------------------
def _set_counts(launch: Launch, per_node: int | None, nodes: int | None,
                total: int | None = None) -> None:
    launch.nproc_per_node = launch.nproc_per_node or per_node
    launch.nnodes = launch.nnodes or nodes
    if total is not None:
        launch.world_size = total
    elif per_node is not None:
        launch.world_size = per_node * (nodes or 1)
        if nodes is not None:
            launch.origins["world_size"] = (
                f"{launch.origins.get('nproc_per_node', '')} × {launch.origins.get('nnodes', '')}"
            )
        else:
            launch.origins["world_size"] = launch.origins.get("nproc_per_node", "")


def _torchrun(launch: Launch, tokens: list[str], cwd: Path, name: str = "torchrun") -> None:
    launch.launcher = "torchrun"
    opts, rest = _opts(tokens, _TORCHRUN_FLAGS)
    raw, spelled = _get(opts, "nproc_per_node", "nproc-per-node")
    per_node: int | None = None
    if raw is not None and raw.strip() in ("gpu", "auto", "cuda"):
        per_node = _local_gpus(launch, _MACHINE_GPUS.get("n"), "nproc_per_node")
    else:
        per_node = _count(launch, raw, "nproc_per_node", f"{name} --{spelled}")
    if raw is None:
        per_node = 1  # torchrun's default
        launch.origins["nproc_per_node"] = f"{name} (default 1 per node)"
    nraw, nspelled = _get(opts, "nnodes")
    nodes = _count(launch, nraw, "nnodes", f"{name} --{nspelled}") if nraw else None
    rank, _ = _get(opts, "node_rank", "node-rank")
    if rank is not None and rank.isdigit():
        launch.node_rank = int(rank)
    _set_counts(launch, per_node, nodes)
    if nraw is not None and nodes is None:
        launch.world_size = None
    _launched(launch, opts, rest, cwd)


def _hostfile(launch: Launch, path: Path) -> tuple[int | None, int | None]:
    """(nodes, slots per node) of a DeepSpeed hostfile (``host slots=N`` lines)."""
    try:
        text = path.read_text(errors="replace")[: 1 << 20]
    except OSError:
        return None, None
    slots = [int(m.group(1)) for m in re.finditer(r"^\s*[^#\s]+\s+slots\s*=\s*(\d+)", text, re.M)]
    if not slots:
        return None, None
    per = slots[0] if len(set(slots)) == 1 else None
    launch.origins["nnodes"] = f"deepspeed --hostfile {path.name}"
    if per is not None:
        launch.origins["nproc_per_node"] = f"deepspeed --hostfile {path.name} slots"
    launch.world_size = sum(slots)
    launch.origins["world_size"] = f"deepspeed --hostfile {path.name} slots"
    return len(slots), per


def _deepspeed(launch: Launch, tokens: list[str], cwd: Path) -> None:
    launch.launcher = "deepspeed"
    opts, rest = _opts(tokens, _DEEPSPEED_LAUNCH_FLAGS)
    gpus, gname = _get(opts, "num_gpus", "num-gpus")
    nodes_raw, nname = _get(opts, "num_nodes", "num-nodes")
    include, _ = _get(opts, "include", "i")
    hostfile, _ = _get(opts, "hostfile", "H")
    per_node = _count(launch, gpus, "nproc_per_node", f"deepspeed --{gname}") if gpus else None
    nodes = _count(launch, nodes_raw, "nnodes", f"deepspeed --{nname}") if nodes_raw else None
    total = None
    if include is not None:
        # localhost:0,1@worker-1:0,1: hosts joined by @, slots after the colon.
        hosts = [h for h in include.split("@") if h.strip()]
        counts = [len([s for s in h.partition(":")[2].split(",") if s.strip()]) for h in hosts]
        if counts and all(counts):
            nodes, total = len(hosts), sum(counts)
            per_node = counts[0] if len(set(counts)) == 1 else None
            for what in ("nnodes", "world_size") + (("nproc_per_node",) if per_node else ()):
                launch.origins[what] = "deepspeed --include"
    elif hostfile is not None:
        path = _existing(hostfile, cwd)
        if path is not None:
            hnodes, hper = _hostfile(launch, path)
            nodes = nodes or hnodes
            per_node = per_node or hper
            total = None if gpus or nodes_raw else launch.world_size
    if per_node is None and include is None:
        per_node = _local_gpus(launch, _MACHINE_GPUS.get("n"), "nproc_per_node")
    _set_counts(launch, per_node, nodes, total)
    if _get(opts, "module")[0] == "true" and rest:
        _module(launch, rest[0], rest[1:], cwd)
    elif _get(opts, "no_python", "no-python")[0] == "true":
        _program(launch, rest, cwd)
    elif rest:
        _program(launch, ["python", *rest], cwd)


def _accelerate_default_config() -> Path | None:
    """accelerate's default config file, which ``accelerate launch`` reads when
    ``--config_file`` is not given (``$HF_HOME/accelerate/default_config.yaml``)."""
    cache = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    path = Path(cache) / "accelerate" / "default_config.yaml"
    try:
        return path if path.is_file() else None
    except OSError:
        return None


def _accelerate(launch: Launch, tokens: list[str], cwd: Path) -> None:
    if tokens[:1] == ["launch"]:
        tokens = tokens[1:]
    launch.launcher = "accelerate"
    opts, rest = _opts(tokens, _ACCELERATE_FLAGS)
    cfg, _ = _get(opts, "config_file", "config-file")
    if cfg is not None:
        path = _existing(cfg, cwd)
        if path is not None:
            launch.configs.append(path)
        else:
            launch.notes.append(f"accelerate --config_file {cfg!r}: no such file here")
    else:
        default = _accelerate_default_config()
        if default is not None:
            launch.configs.append(default)
    total_raw, tname = _get(opts, "num_processes", "num-processes")
    nodes_raw, nname = _get(opts, "num_machines", "num-machines")
    total = _count(launch, total_raw, "world_size", f"accelerate --{tname}") if total_raw else None
    nodes = _count(launch, nodes_raw, "nnodes", f"accelerate --{nname}") if nodes_raw else None
    per_node = None
    if total is not None and (nodes or 1) and total % (nodes or 1) == 0:
        per_node = total // (nodes or 1)
        launch.origins["nproc_per_node"] = launch.origins["world_size"]
    _set_counts(launch, per_node, nodes, total)
    rank, _ = _get(opts, "machine_rank", "machine-rank")
    if rank is not None and rank.isdigit():
        launch.node_rank = int(rank)
    mp, _ = _get(opts, "mixed_precision", "mixed-precision")
    dtype = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "no": "fp32"}.get((mp or "").lower())
    if dtype is not None:
        launch.values.append(("precision.dtype", dtype, "accelerate --mixed_precision"))
    ds, _ = _get(opts, "deepspeed_config_file", "deepspeed-config-file")
    if ds is not None and _existing(ds, cwd) is not None:
        launch.deepspeed = _existing(ds, cwd)
    zero, _ = _get(opts, "zero_stage", "zero-stage")
    if zero is not None and zero.isdigit() and int(zero) <= 3:
        launch.values.append(("parallel.zero_stage", int(zero), "accelerate --zero_stage"))
    ga, _ = _get(opts, "gradient_accumulation_steps", "gradient-accumulation-steps")
    if ga is not None and ga.isdigit() and int(ga) > 0:
        launch.values.append(("batch.gradient_accumulation_steps", int(ga),
                              "accelerate --gradient_accumulation_steps"))
    _launched(launch, opts, rest, cwd)


def _launched(launch: Launch, opts: dict[str, str], rest: list[str], cwd: Path) -> None:
    """What torchrun or accelerate starts after its own options: ``-m MODULE``, a program
    run as is (``--no-python``), or a Python script."""
    if _get(opts, "module", "m")[0] == "true" and rest:
        _module(launch, rest[0], rest[1:], cwd)
    elif _get(opts, "no_python", "no-python")[0] == "true":
        _program(launch, rest, cwd)
    elif rest:
        _program(launch, ["python", *rest], cwd)


def _composer(launch: Launch, tokens: list[str], cwd: Path) -> None:
    launch.launcher = "composer"
    opts, rest = _opts(tokens, _COMPOSER_FLAGS, short_values=frozenset({"n"}))
    per_raw, pname = _get(opts, "nproc", "n")
    dashes = "--" if len(pname or "") > 1 else "-"
    per_node = (
        _count(launch, per_raw, "nproc_per_node", f"composer {dashes}{pname}")
        if per_raw else None
    )
    total_raw, _ = _get(opts, "world_size", "world-size")
    total = _count(launch, total_raw, "world_size", "composer --world_size") if total_raw else None
    if per_node is None and total is None:
        per_node = _local_gpus(launch, _MACHINE_GPUS.get("n"), "nproc_per_node")
    nodes = None
    if per_node and total and total % per_node == 0:
        nodes = total // per_node
        launch.origins["nnodes"] = "composer --world_size / -n"
    _set_counts(launch, per_node, nodes, total)
    if rest:
        _program(launch, ["python", *rest], cwd)


def _config_cli(launch: Launch, name: str, args: list[str], cwd: Path) -> None:
    """A trainer CLI that takes its config as a positional argument (or ``--config``);
    ``key=value`` overrides after it are noted, not read."""
    launch.launcher = name
    launch.program = [name, *args]
    for arg in args:
        if arg.startswith("-"):
            continue
        if "=" in arg:
            launch.notes.append(f"override {arg!r} is not read (give it in the config)")
        elif Path(arg).suffix.lower() in _CONFIG_SUFFIXES and _existing(arg, cwd) is None:
            launch.notes.append(f"{arg!r}: no such file here")
    _program_files(launch, args, cwd)


def _local_world(launch: Launch, per_name: str = "NPROC_PER_NODE") -> None:
    """The process counts of a CLI that starts torchrun or accelerate itself: its
    environment (``NPROC_PER_NODE``, ``NNODES``) or the machine's GPUs."""
    if _env(per_name):
        per_node = _count(launch, _env(per_name), "nproc_per_node", per_name)
    else:
        per_node = _local_gpus(launch, _MACHINE_GPUS.get("n"), "nproc_per_node")
    nodes = _count(launch, _env("NNODES"), "nnodes", "NNODES") if _env("NNODES") else None
    if launch.world_size is None:
        _set_counts(launch, per_node, nodes)


def _llamafactory(launch: Launch, args: list[str], cwd: Path) -> None:
    sub = args[0] if args else ""
    _config_cli(launch, "llamafactory", args[1:] if sub in ("train", "sft") else args, cwd)
    _local_world(launch)


def _axolotl(launch: Launch, args: list[str], cwd: Path, module: str | None = None) -> None:
    rest = args[1:] if args[:1] and args[0] in ("train", "preprocess", "inference") else args
    prior = launch.launcher
    _config_cli(launch, "axolotl", rest, cwd)
    if prior in ("accelerate", "torchrun", "deepspeed"):
        launch.launcher = prior  # the launcher's counts stand
        return
    raw, spelled = _get(_flag_values(rest), "num_processes", "num-processes")
    if raw is not None:
        _set_counts(launch, _count(launch, raw, "nproc_per_node", f"axolotl --{spelled}"), None)
    else:
        _local_world(launch)


def _tune(launch: Launch, args: list[str], cwd: Path) -> None:
    """``tune run [torchrun options] RECIPE --config X [key=value ...]``."""
    if args[:1] != ["run"]:
        launch.launcher, launch.trains = "torchtune", False
        return
    opts, rest = _opts(args[1:], _TORCHRUN_FLAGS)
    if opts:
        _torchrun(launch, args[1 : len(args) - len(rest)], cwd, "tune run")
    else:
        _set_counts(launch, 1, None)
        launch.origins["nproc_per_node"] = "tune run (one process without torchrun options)"
        launch.origins["world_size"] = launch.origins["nproc_per_node"]
    _config_cli(launch, "torchtune", rest[1:], cwd)
    launch.program = rest


def _trl(launch: Launch, args: list[str], cwd: Path) -> None:
    sub = args[0] if args else ""
    if sub not in ("sft", "dpo", "grpo", "kto", "reward", "rloo", "ppo", "orpo"):
        launch.launcher, launch.trains = "trl", False
        return
    _config_cli(launch, "trl", args[1:], cwd)
    raw, spelled = _get(_flag_values(args[1:]), "num_processes", "num-processes")
    if raw is not None:
        _set_counts(launch, _count(launch, raw, "nproc_per_node", f"trl --{spelled}"), None)
    else:
        _local_world(launch)


def _litgpt(launch: Launch, args: list[str], cwd: Path) -> None:
    _config_cli(launch, "litgpt", args[1:] if args else [], cwd)
    opts = _flag_values(args[1:])
    raw, spelled = _get(opts, "devices")
    nodes_raw, nname = _get(opts, "num_nodes", "num-nodes")
    nodes = _count(launch, nodes_raw, "nnodes", f"litgpt --{nname}") if nodes_raw else None
    if raw is not None and raw.strip() not in ("auto", "-1"):
        _set_counts(launch, _count(launch, raw, "nproc_per_node", f"litgpt --{spelled}"), nodes)
    else:
        per = _local_gpus(launch, _MACHINE_GPUS.get("n"), "nproc_per_node")
        _set_counts(launch, per, nodes)


def _shell(launch: Launch, tokens: list[str], cwd: Path) -> None:
    """``bash pretrain.sh`` or ``./pretrain.sh``: the script is read as ``sapper check``
    reads a Megatron or Trainer launch script; its own launcher gives the counts."""
    launch.launcher = "shell"
    launch.program = tokens
    script = tokens[0]
    if Path(script).name in ("bash", "sh", "zsh"):
        rest = [t for t in tokens[1:] if not t.startswith("-")]
        if not rest or "-c" in tokens[1:2]:
            launch.trains = False
            return
        script = rest[0]
    path = _existing(script, cwd)
    if path is None:
        launch.notes.append(f"{script!r}: no such script here")
        return
    launch.configs.append(path)


_CLIS = {
    "torchrun": lambda launch, t, cwd: _torchrun(launch, t, cwd),
    "deepspeed": _deepspeed,
    "accelerate": _accelerate,
    "composer": _composer,
    "llamafactory-cli": _llamafactory,
    "lmf": _llamafactory,
    "axolotl": _axolotl,
    "tune": _tune,
    "trl": _trl,
    "litgpt": _litgpt,
}

#: The machine's GPU count while one command is parsed (for ``--nproc-per-node gpu``).
_MACHINE_GPUS: dict[str, int | None] = {}
#: ``env NAME=value`` assignments before the command, while it is parsed.
_ENV_GIVEN: dict[str, str] = {}


def _env(name: str) -> str | None:
    """A variable as the command will see it: ``env NAME=...`` first, then sapper's own
    environment (which the command inherits)."""
    return _ENV_GIVEN.get(name, os.environ.get(name))


def parse_command(argv: list[str], cwd: Path | None = None,
                  machine_gpus: int | None = None) -> Launch:
    """Read a launch command. ``cwd`` is where relative paths start (the command's own
    working directory); ``machine_gpus`` stands in for counts the launcher takes from
    the machine."""
    cwd = cwd or Path.cwd()
    tokens = list(argv)
    given: dict[str, str] = {}
    while tokens and (tokens[0] == "env" or _ENV_ASSIGN.match(tokens[0])):
        name, _, value = tokens[0].partition("=")
        if tokens[0] != "env":
            given[name] = value
        tokens = tokens[1:]  # env FOO=1 ...
    launch = Launch(argv=list(argv), launcher=Path(tokens[0]).name if tokens else "")
    _MACHINE_GPUS["n"] = machine_gpus
    _ENV_GIVEN.update(given)
    try:
        _program(launch, tokens, cwd)
    finally:
        _MACHINE_GPUS.clear()
        _ENV_GIVEN.clear()
    if launch.launcher in ("python",) or _is_python(launch.launcher):
        launch.launcher = "python"
    # ``python train.py`` alone says nothing of the world size: the program may start
    # its processes itself (Lightning's ``devices=8``, ``mp.spawn``); its config decides.
    return launch
