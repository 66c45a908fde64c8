"""Read a Megatron-LM or Megatron-DeepSpeed launch into the Plan: a launch script (or plain
text) with ``--num-layers 32 --hidden-size 4096 ...``, or the arguments dump Megatron
prints at start (``------------------------ arguments ------------------------``), also
inside a full training log.

A script is read as bash runs it (:mod:`sapper.plan.readers.shell`): its variables,
arrays, ``$((...))`` and ``bash -c`` strings are expanded, and a value it leaves to the
environment (``$NNODES`` from Slurm, ``$1``) stays unknown (C006), never guessed. The
training command is the one that runs a ``.py`` file with the most Megatron arguments;
the launcher before it (``torchrun``, ``python -m torch.distributed.run``, ``deepspeed``)
gives the GPUs per node and the nodes. Arguments Megatron does not know are C005: its
``parse_args`` refuses them at start. A dump is what ``validate_args`` resolved, so its
values are taken as printed (world size included).

What the values mean in Megatron's terms is in :mod:`sapper.plan.readers.megatron_map`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sapper.errors import InputError
from sapper.plan.readers.base import ConfigFormat, Sniff, unknown_key_findings
from sapper.plan.readers.megatron_args import DESTS, OPTIONS
from sapper.plan.readers.megatron_launch import Arg, Launch
from sapper.plan.readers.megatron_map import map_launch
from sapper.plan.readers.shell import Command, Script, Word, read_script
from sapper.plan.rules import UNRESOLVED_VALUE
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "parse_dump", "parse_launch", "read_megatron"]

_BANNER = re.compile(r"-{8,} arguments -{8,}")
_END = re.compile(r"-{8,} end of arguments -{8,}")
_DUMP_LINE = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*) \.{2,} ?(.*)")
_WORLD = re.compile(r"using world size: (\d+)")
_PADDED = re.compile(r"> padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")
#: Arguments only Megatron scripts pass (with dashes); three of them make a launch script.
_DISTINCT = (
    "--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
    "--max-position-embeddings", "--micro-batch-size", "--global-batch-size",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--train-iters",
    "--lr-decay-style", "--train-samples", "--ffn-hidden-size", "--make-vocab-size-divisible-by",
    "--use-distributed-optimizer", "--sequence-parallel", "--init-method-std", "--clip-grad",
)
_OPTION_TOKEN = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?=[\s=\"'\\]|$)", re.M)
#: Launchers and their options that set the processes per node and the nodes.
_TORCHRUN = {"torchrun", "torch.distributed.run", "torch.distributed.launch"}
_PER_NODE = {"--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num-gpus"}
_NODES = {"--nnodes", "--num_nodes", "--num-nodes"}
_WRAPPERS = {"srun", "mpirun", "mpiexec", "aprun", "jsrun", "flux"}
#: Longest dump value parsed as a Python literal (a list of data paths).
_MAX_LITERAL = 10_000


# ---- the arguments dump ----------------------------------------------------------------
def parse_dump(text: str, file: str) -> Launch | None:
    """The first arguments dump in ``text`` (None when there is none): every
    ``name ..... value`` line between the banners, whatever prefix a logger or a rank
    tag puts before it."""
    start = _BANNER.search(text)
    if start is None:
        return None
    launch = Launch(file, "dump")
    end = _END.search(text, start.end())
    body = text[start.end() : end.start() if end else len(text)]
    for line in body.splitlines():
        m = _DUMP_LINE.search(line)
        if not m:
            continue
        name, raw = m.group(1), m.group(2).strip()
        if raw in ("None", ""):
            continue
        if raw in ("True", "False"):
            launch.args[name] = Arg(name, flag=raw == "True")
            continue
        values = [raw]
        if raw.startswith("[") and raw.endswith("]") and len(raw) <= _MAX_LITERAL:
            try:
                items = ast.literal_eval(raw)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                items = None
            if isinstance(items, list):
                values = [str(v) for v in items]
        launch.args[name] = Arg(name, [Word(v, v) for v in values])
    world = _WORLD.search(text, 0, start.start())
    if "world_size" not in launch.args and world and len(world.group(1)) < 8:
        # "using world size: 8, data-parallel size: 8, ..." printed before the dump
        launch.args["world_size"] = Arg("using world size", [Word(world.group(1),
                                                                   world.group(1))])
    if end is not None:
        m = _PADDED.search(text, end.end())
        if m and len(m.group(1)) < 12 and len(m.group(3)) < 12:
            launch.padded_vocab = (int(m.group(1)), int(m.group(3)))
    return launch


# ---- the launch script -----------------------------------------------------------------
def parse_launch(text: str, file: str) -> Launch:
    """The training command of a launch script (or of plain text holding arguments)."""
    script = read_script(text)
    command, at = _training_command(script)
    launch = Launch(file, "script", reasons=script.reasons, origins=script.origins,
                    files=script.files, notes=script.notes)
    if command is None:
        # A file of settings only (MODEL_ARGS="--num-layers 24 ..." for another script to
        # source): the variable holding the most Megatron arguments.
        best = max(
            script.variables.items(),
            key=lambda kv: sum(w.text.split("=", 1)[0] in OPTIONS for w in kv[1]),
            default=None,
        )
        if best is not None and any(w.text.split("=", 1)[0] in OPTIONS for w in best[1]):
            _megatron_args(launch, best[1])
        return launch
    words = command.words
    if at is not None:
        launch.program = words[at].shown
        _launcher(launch, words[:at])
        words = words[at + 1 :]
    _megatron_args(launch, words)
    return launch


def _is_program(word: Word) -> bool:
    return word.text.endswith(".py") and not word.text.startswith("-")


def _program_index(words: list[Word]) -> int | None:
    """Where the program is: the first ``.py`` word, or the module after ``-m`` (python's
    or torchrun's) that is not a launcher itself."""
    for i, w in enumerate(words):
        if _is_program(w):
            return i
        if w.text in ("-m", "--module") and i + 1 < len(words):
            module = words[i + 1].text
            if module not in _TORCHRUN and not module.startswith("-"):
                return i + 1
    return None


def _training_command(script: Script) -> tuple[Command | None, int | None]:
    """The command with the most Megatron arguments (one that runs a .py file first, one
    outside a conditional block next), and the index of its program word."""
    best: tuple[tuple[int, int, int], Command, int | None] | None = None
    for cmd in script.commands:
        at = _program_index(cmd.words)
        if cmd.words and cmd.words[0].text in ("echo", "printf", "cat"):
            continue
        rest = cmd.words[at + 1 :] if at is not None else cmd.words
        count = sum(1 for w in rest if w.text.split("=", 1)[0] in OPTIONS)
        if count == 0:
            continue
        score = (count, at is not None, not cmd.conditional)
        if best is None or score > best[0]:
            best = (score, cmd, at)
    return (best[1], best[2]) if best else (None, None)


def _launcher(launch: Launch, words: list[Word]) -> None:
    """torchrun / ``python -m torch.distributed.run`` / deepspeed and their options; srun
    or mpirun in front make the process count the scheduler's."""
    i = 0
    while i < len(words):
        w = words[i]
        base = w.text.rsplit("/", 1)[-1]
        if base in _WRAPPERS and launch.launcher_name is None:
            launch.wrapped = base
        if base in _TORCHRUN or base == "deepspeed":
            launch.launcher_name = "torchrun" if base in _TORCHRUN else "deepspeed"
        elif re.fullmatch(r"python[\d.]*", base) and launch.launcher_name is None:
            launch.launcher_name = "python"
        elif launch.launcher_name in ("torchrun", "deepspeed") and w.text.startswith("--"):
            key, eq, value = w.text.partition("=")
            if key in _PER_NODE | _NODES:
                if eq:
                    launch.launcher[key] = Word(value, w.shown.partition("=")[2], w.unknown,
                                                w.via)
                elif i + 1 < len(words):
                    launch.launcher[key] = words[i + 1]
                    i += 1
        i += 1


def _megatron_args(launch: Launch, words: list[Word]) -> None:
    """argparse's reading of the words after the program: ``--opt value``, ``--opt=value``,
    flags; several values up to the next option (``--data-path 0.3 a 0.7 b``)."""
    current: Arg | None = None
    for w in words:
        if not w.known and w.shown.startswith("$") and _whole_expansion(w):
            # An unquoted $EXTRA_ARGS the script does not set: it may hold any arguments.
            if current is not None and current.flag is None and not current.values:
                current.values.append(w)
            else:
                launch.open_expansions.append(w)
            continue
        text = w.text
        if text.startswith("--") and len(text) > 2 and not _NUMBER.fullmatch(text):
            key, eq, value = text.partition("=")
            entry = OPTIONS.get(key)
            if entry is None:
                launch.unknown_options.append(w.shown.partition("=")[0])
                current = None
                continue
            dest, kind = entry
            if kind in ("t", "f", "b"):
                flag = kind == "t" or (kind == "b" and not key.startswith("--no-"))
                launch.args[dest] = Arg(key, flag=flag)
                current = None
                continue
            current = Arg(key)
            launch.args[dest] = current
            if eq:
                shown = w.shown.partition("=")[2]
                current.values.append(Word(value, shown, w.unknown, w.via))
                current = None
            continue
        if current is not None:
            current.values.append(w)


_NUMBER = re.compile(r"-?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _whole_expansion(word: Word) -> bool:
    """A word that is nothing but one unknown expansion (``$EXTRA_ARGS``)."""
    return len(word.unknown) == 1 and word.shown == word.unknown[0]


# ---- the format ------------------------------------------------------------------------
def read_megatron(sniff: Sniff) -> PlanSource:
    """A Plan source from a Megatron launch script or arguments dump."""
    launch = parse_dump(sniff.text, sniff.name) or parse_launch(sniff.text, sniff.name)
    if not launch.args:
        raise InputError(
            "no Megatron arguments found"
            + "".join(f" ({note})" for note in launch.notes[:1]),
            file=sniff.name,
            expected="a launch script running pretrain_gpt.py with --num-layers, "
            "--hidden-size ... or Megatron's printed arguments dump",
        )
    src = PlanSource(name=sniff.name)
    if launch.kind == "script" and _megatron_parser(launch.program):
        src.findings.extend(
            unknown_key_findings(
                launch.unknown_options,
                OPTIONS,
                file=sniff.name,
                framework="Megatron-LM",
                effect="Megatron's argparse refuses arguments it does not know (and "
                "abbreviations: allow_abbrev=False), so the job stops at start with "
                "'unrecognized arguments' after waiting in the queue.",
            )
        )
    map_launch(launch, src, Path(sniff.name).parent)
    for note in launch.notes:  # values left unknown there are named where they are used
        src.findings.append(
            UNRESOLVED_VALUE.finding(
                f"{sniff.name}: {note}",
                source=sniff.name,
                fix="write the values the launch needs out in the script, or give them in "
                "a sapper plan passed with another --config",
            )
        )
    return src


def _megatron_parser(program: str | None) -> bool:
    """Whether the program's arguments are Megatron's own: its ``pretrain_*.py`` entry
    points (which add only Model Optimizer's, in the table too), or plain text. Other
    programs (``tasks/main.py``, the multimodal and post-training examples, a user's own
    script) add arguments of their own through ``extra_args_provider``, so an argument
    the table lacks is not a typo there."""
    if program is None:
        return True
    return re.fullmatch(r"pretrain_\w*\.py", program.rsplit("/", 1)[-1]) is not None


def _recognise(sniff: Sniff) -> float:
    """Megatron's arguments banner is certain; otherwise three or more of the arguments
    only Megatron takes (``--num-layers``, ``--tensor-model-parallel-size`` ...) written
    with dashes, as argparse reads them. A JSON, YAML or TOML mapping is another format's."""
    text = sniff.text
    if _BANNER.search(text) and sum(1 for _ in _dump_names(text)) >= 5:
        return 0.97
    if sniff.json is not None:
        return 0.0
    seen = {m.group(1) for m in _OPTION_TOKEN.finditer(text[: 1 << 20])}
    hits = len(seen & set(_DISTINCT))
    if hits >= 3:
        return 0.9
    return 0.4 if hits == 2 else 0.0


def _dump_names(text: str) -> list[str]:
    start = _BANNER.search(text)
    if start is None:
        return []
    names = []
    for line in text[start.end() : start.end() + 4096].splitlines():
        m = _DUMP_LINE.search(line)
        if m and m.group(1) in DESTS:
            names.append(m.group(1))
    return names


FORMAT = ConfigFormat(
    name="megatron",
    title="a Megatron-LM / Megatron-DeepSpeed launch script or arguments dump",
    looks_for="--num-layers, --hidden-size, --tensor-model-parallel-size ... arguments, or "
    "the '---- arguments ----' dump Megatron prints at start",
    recognise=_recognise,
    read=read_megatron,
)
