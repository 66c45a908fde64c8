"""What the Megatron reader takes from a launch before giving it meaning: each argument as
the user wrote it, and what the launcher and the script leave known or open. Shared by
:mod:`sapper.plan.readers.megatron` (which fills it) and
:mod:`sapper.plan.readers.megatron_map` (which reads it into the Plan)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sapper.plan.readers.shell import Word

__all__ = ["Arg", "Launch"]


@dataclass
class Arg:
    """One Megatron argument as the user wrote it (``key``: ``--num-layers`` in a script,
    ``num_layers`` in a dump) and what it holds: ``flag`` for store_true/false arguments,
    else its ``values`` (words that may be partly unknown)."""

    key: str
    values: list[Word] = field(default_factory=list)
    flag: bool | None = None


@dataclass
class Launch:
    """What a launch holds: Megatron's arguments by dest, the launcher's, and what is
    known about the processes."""

    file: str
    kind: str  # "script" or "dump"
    args: dict[str, Arg] = field(default_factory=dict)
    #: The training script run (``pretrain_gpt.py``), when one is seen.
    program: str | None = None
    #: Launcher option -> value word (``--nproc_per_node`` -> 8).
    launcher: dict[str, Word] = field(default_factory=dict)
    #: The launcher that starts the processes: torchrun, deepspeed, python, or None.
    launcher_name: str | None = None
    #: A scheduler runs the command on every node (srun, mpirun): the process count
    #: is the scheduler's.
    wrapped: str | None = None
    unknown_options: list[str] = field(default_factory=list)
    #: Expansions that may hold any arguments (``$EXTRA_ARGS`` not set in the script).
    open_expansions: list[Word] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    #: Files the script writes with a heredoc (name as expanded -> text).
    files: dict[str, Word] = field(default_factory=dict)
    #: From a log: the vocabulary Megatron padded, as printed (size, padded size).
    padded_vocab: tuple[int, int] | None = None
    #: What the script reader did not follow, past one of its bounds (shell.Script.notes).
    notes: list[str] = field(default_factory=list)
