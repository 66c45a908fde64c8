"""Just enough of bash to read a launch script: the commands it runs, with its own variables
expanded, and a note of every value the script does not decide.

Launch scripts (Megatron-LM's examples, Slurm batch files) build the training command from
variables: ``NLAYERS=70``, ``--num-layers $NLAYERS``, arrays expanded as
``${GPT_ARGS[@]}``, strings of options expanded unquoted, ``$((GPUS_PER_NODE*NNODES))``,
``${VAR:-default}``, and ``bash -c "$LAUNCHER $CMD"`` under ``srun``. This module follows
those the way bash does (quoting, word splitting, line continuations, comments, heredocs
skipped) and nothing else: it never runs a command. A value the script does not set
(``$SLURM_NNODES``, ``$1``, ``$(hostname)``, a variable assigned inside an ``if`` whose test
depends on one of them) stays unknown, with the reason, instead of being guessed. An
``if``/``elif``/``else`` whose test the script's own values decide (``[ "$X" = y ]``,
``[[ $DEBUG -eq 1 && $X == fp* ]]``, ``-z``/``-n``, ``!``) runs the branch bash would
take; a file test (``-f``), a regex (``=~``) or a collation (``<``) stays undecided.
``#SBATCH`` directives are read as what Slurm exports from them (``--nodes=24`` ->
``SLURM_NNODES=24``).

Everything is bounded: the text is at most sapper's config limit, values and word lists
have caps, the text all expansions of one script produce together has a cap (beyond it,
values stay unknown and :attr:`Script.notes` says so), ``${...}`` inside ``${...}`` is
followed a few levels deep, ``bash -c`` too, arithmetic refuses huge numbers. Nothing
recurses with the input's nesting (a test's ``( ! ...`` stops a few dozen levels deep), so
no script exhausts Python's stack.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Command", "Script", "Word", "read_script"]

#: Longest value a variable may hold, and most words an array or an expansion may hold:
#: real launch scripts stay far below; a doubling loop does not get to fill memory.
MAX_VALUE_CHARS = 1 << 20
MAX_WORDS = 10_000
#: Commands read from one script (each ``bash -c`` string counts too).
MAX_COMMANDS = 100_000
#: Tokens (words, operators, array items), ``$`` expansions and expanded words read from
#: one script, all ``bash -c`` strings included: a launch script has a few thousand, a
#: data blend of ten thousand files some tens of thousands. Past any, sapper reads no
#: further (and says so).
MAX_TOKENS = 1 << 18
MAX_EXPANSIONS = 1 << 19
MAX_TOTAL_WORDS = 1 << 20
#: ``bash -c "..."`` levels followed.
MAX_NESTING = 4
#: Characters all expansions of one script may produce together: every variable's value
#: each time it is expanded or assigned, and the words shown to the user. A real launch
#: script spends a few kilobytes; a script growing a variable line after line
#: (``A="$A$A"``, ``A+=...`` thousands of times) or copying a large value into thousands
#: of variables reaches this, and from there on its values are unknown.
MAX_EXPANDED_CHARS = 1 << 24
#: ``${A:-${B:-...}}`` levels followed (real scripts nest two or three).
MAX_BRACE_DEPTH = 8
#: Longest name kept for an unknown part (``${...}`` of any length, ``$VERY_LONG_NAME``).
MAX_NAME_CHARS = 80
#: Largest number arithmetic keeps (beyond: unknown); more than any size in a config.
MAX_ARITH = 10**18
#: Prefixes of variables a scheduler or launcher sets when the job starts.
_SCHEDULER = ("SLURM_", "PBS_", "LSB_", "OMPI_", "PMI_", "PMIX_", "FLUX_", "MV2_", "COBALT_")
_KEYWORDS_OPEN = {"if", "for", "while", "until", "case", "select", "{"}
_KEYWORDS_CLOSE = {"fi", "done", "esac", "}"}
_KEYWORDS = _KEYWORDS_OPEN | _KEYWORDS_CLOSE | {"then", "else", "elif"}
#: Words after which a command (``[[`` among them) may still begin.
_TEST_LEADS = frozenset({"if", "elif", "while", "until", "then", "else", "do", "!", "{", "time"})
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Runs of characters inside a word that the lexer passes over (``$NAME`` included);
#: possessive, so no backtracking state is kept over a run of millions of characters.
_WORD_RUN = re.compile(r"(?:[^ \t\r\n;&|()<>\\'\"`$]|\$(?![({]))++")
#: Runs of characters that expand to themselves, outside and inside double quotes.
_PLAIN_RUN = re.compile(r"[^\"'\\`$~]+")
_QUOTED_RUN = re.compile(r"[^\"\\`$]+")
#: Where a scan for the ``}`` closing ``${`` stops: an escape, a brace, a ``$``.
_BRACE_STOP = re.compile(r"[\\}$]")
#: An unknown part inside a word's text: its index between two private-use characters.
_MARK = re.compile("\ue000(\\d+)\ue001")
#: Variables a word remembers it came through (the first names the origin).
_MAX_VIA = 8


@dataclass(frozen=True, slots=True)
class Word:
    """One word of a command after expansion. ``unknown`` names what the script leaves
    open in it (``$NNODES``, ``$1``, ``$(pwd)``); ``text`` is the word with each unknown
    part as a placeholder, ``shown`` the word as a user reads it, ``via`` the variables
    its value came through."""

    text: str
    shown: str
    unknown: tuple[str, ...] = ()
    via: tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return not self.unknown


@dataclass
class Command:
    """A simple command of the script, its words expanded."""

    words: list[Word]
    line: int
    #: Inside an ``if``/``for``/``case``/function: it may not run, or run differently.
    conditional: bool = False


@dataclass
class Script:
    """What reading a script found: its commands in order, and why values are unknown."""

    commands: list[Command] = field(default_factory=list)
    #: Unknown name (``$NNODES``) -> why the script does not decide it.
    reasons: dict[str, str] = field(default_factory=dict)
    #: Variable -> where its value came from when not from an assignment
    #: (``#SBATCH --nodes=24``).
    origins: dict[str, str] = field(default_factory=dict)
    #: File name (as expanded, unknown parts as placeholders) -> the text the script
    #: writes to it with ``cat <<EOF > FILE``.
    files: dict[str, Word] = field(default_factory=dict)
    #: Each variable at the end, as the words ``${NAME[@]}`` gives unquoted.
    variables: dict[str, list[Word]] = field(default_factory=dict)
    #: What sapper did not follow in the script (past a bound), once each.
    notes: list[str] = field(default_factory=list)


# ---- lexing ----------------------------------------------------------------------------
@dataclass(slots=True)
class _Tok:
    kind: str  # "word", "op", "array" (NAME=( ... ) with its raw words), "redir"
    text: str
    line: int
    items: list[str] | tuple[str, ...] = ()
    append: bool = False


class _Lexer:
    """Splits bash text into raw words (quotes kept, expanded later) and operators."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1
        self.heredocs: list[tuple[str, bool, _Tok]] = []
        #: Inside ``[[ ... ]]``: ``&&``, ``||``, ``(``, ``)``, ``<`` and ``>`` are words of
        #: the test there, not operators (up to the ``]]`` or the end of the line).
        self.in_test = False
        self.at_start = True  # where a command (and so ``[[``) may begin

    def tokens(self) -> Iterator[_Tok]:
        """The tokens one by one (a script is never held as a list of them); on a line
        that opens a heredoc, once the heredoc's body is read."""
        s = self.s
        line: list[_Tok] = []
        while self.i < len(s):
            c = s[self.i]
            if c == "\\" and s.startswith("\\\n", self.i):
                self.i += 2
                self.line += 1
            elif c in " \t\r":
                self.i += 1
            elif c == "\n":
                line.append(_Tok("op", "\n", self.line))
                self.i += 1
                self.line += 1
                self.in_test = False
                self.at_start = True
                self._skip_heredocs()
                yield from line
                line.clear()
            elif c == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            elif self.in_test and c in "&|()<>" and (
                c in "()<>" or s.startswith(("&&", "||"), self.i)
            ):
                op = s[self.i : self.i + 2] if c in "&|" else c
                line.append(_Tok("word", op, self.line))
                self.i += len(op)
            elif c in ";&|()":
                self.in_test = False
                self.at_start = True
                two = s[self.i : self.i + 2]
                op = two if two in ("&&", "||", ";;", "|&", "&>") else c
                if op == "&>":
                    line.append(_Tok("redir", op, self.line))
                else:
                    line.append(_Tok("op", op, self.line))
                self.i += len(op)
            elif c in "<>":
                line.append(self._redirect())
            else:
                start_line = self.line
                word = self._word()
                m = _ASSIGN.match(word)
                if m and word == m.group(0) and s.startswith("(", self.i):
                    self.i += 1
                    line.append(
                        _Tok("array", m.group(1), start_line, self._array(), bool(m.group(2)))
                    )
                elif word and not (word.isdigit() and s.startswith((">", "<"), self.i)):
                    line.append(_Tok("word", word, start_line))  # (2>&1: 2 is no word)
                    if word == "[[" and self.at_start:
                        self.in_test = True
                    elif word == "]]":
                        self.in_test = False
                    self.at_start = word in _TEST_LEADS
            if line and not self.heredocs:
                yield from line
                line.clear()
        yield from line

    def _redirect(self) -> _Tok:
        s = self.s
        m = re.compile(r"<<-?|<<<|<>|>>|>&|<&|>\||<|>").match(s, self.i)
        op = m.group(0) if m else s[self.i]
        self.i += len(op)
        if op in ("<<", "<<-"):
            while self.i < len(s) and s[self.i] in " \t":
                self.i += 1
            delim = self._word()
            tok = _Tok("heredoc", delim, self.line)
            tok.append = delim != re.sub(r"[\"'\\]", "", delim)  # quoted: no expansion
            self.heredocs.append((re.sub(r"[\"'\\]", "", delim), op == "<<-", tok))
            return tok
        return _Tok("redir", op, self.line)

    def _skip_heredocs(self) -> None:
        """The bodies of heredocs opened on the line just ended: data, not commands."""
        s = self.s
        for delim, strip, tok in self.heredocs:
            start = self.i
            while self.i < len(s):
                end = s.find("\n", self.i)
                end = len(s) if end < 0 else end
                line = s[self.i : end]
                if (line.lstrip("\t") if strip else line) == delim:
                    tok.items = [s[start : self.i]]
                    self.i = min(end + 1, len(s))
                    self.line += 1
                    break
                self.i = min(end + 1, len(s))
                self.line += 1
            else:
                tok.items = [s[start:]]
        self.heredocs.clear()

    def _array(self) -> list[str]:
        """The raw words of ``NAME=( ... )`` up to its closing parenthesis."""
        items: list[str] = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\\" and s.startswith("\\\n", self.i):
                self.i += 2
                self.line += 1
            elif c in " \t\r":
                self.i += 1
            elif c == "\n":
                self.i += 1
                self.line += 1
            elif c == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            elif c == ")":
                self.i += 1
                break
            else:
                word = self._word()
                if not word:  # an operator inside the parentheses: not an array we read
                    self.i += 1
                    continue
                items.append(word)
                if len(items) > MAX_WORDS:
                    break
        return items

    def _word(self) -> str:
        """One raw word: up to unquoted whitespace or an operator, quotes and ``$(...)``
        kept whole (the expander reads them)."""
        s, start = self.s, self.i
        while self.i < len(s):
            run = _WORD_RUN.match(s, self.i)
            if run:
                self.i = run.end()
                continue
            c = s[self.i]
            if c in " \t\r\n;&|()<>":
                break
            if c == "\\":
                if s.startswith("\\\n", self.i):
                    break
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                self._advance_to(len(s) if end < 0 else end + 1)
            elif c == '"':
                self._advance_to(self._close_double(self.i + 1))
            elif c == "`":
                end = s.find("`", self.i + 1)
                self._advance_to(len(s) if end < 0 else end + 1)
            elif c == "$" and s.startswith("$(", self.i):
                self._advance_to(_close_paren(s, self.i + 2))
            elif c == "$" and s.startswith("${", self.i):
                end = _close_brace(s, self.i + 2)
                self._advance_to(len(s) if end < 0 else end + 1)
            else:
                self.i += 1
        return s[start : self.i]

    def _advance_to(self, end: int) -> None:
        self.line += self.s.count("\n", self.i, end)
        self.i = end

    def _close_double(self, i: int) -> int:
        s = self.s
        while i < len(s):
            c = s[i]
            if c == "\\":
                i += 2
            elif c == '"':
                return i + 1
            elif s.startswith("$(", i):
                i = _close_paren(s, i + 2)
            else:
                i += 1
        return len(s)


def _close_paren(s: str, i: int) -> int:
    """Index just past the ``)`` closing a ``$(`` whose body starts at ``i``."""
    depth = 1
    while i < len(s) and depth:
        c = s[i]
        if c == "\\":
            i += 1
        elif c == "'":
            end = s.find("'", i + 1)
            i = len(s) - 1 if end < 0 else end
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        i += 1
    return i


def _close_brace(s: str, i: int) -> int:
    """Index of the ``}`` closing a ``${`` whose body starts at ``i`` (-1 when none):
    ``${A:-${B:-1}}`` is one expansion, as bash reads it. A loop, not a recursion."""
    depth = 1
    search = _BRACE_STOP.search
    while True:
        m = search(s, i)
        if m is None:
            return -1
        i = m.start()
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == "}":
            depth -= 1
            if not depth:
                return i
        elif s.startswith("${", i):
            depth += 1
            i += 1
        elif s.startswith("$(", i):
            i = _close_paren(s, i + 2)
            continue
        i += 1


# ---- expansion -------------------------------------------------------------------------
@dataclass(slots=True)
class _Piece:
    text: str  # unknown parts as markers
    split: bool  # from an unquoted expansion: split on whitespace
    via: tuple[str, ...] = ()
    #: From "${A[@]}": one word per item (items separated by NUL).
    items: bool = False


_Value = str | list[str]


class _Shell:
    def __init__(self, text: str) -> None:
        self.vars: dict[str, _Value] = {}
        self.script = Script()
        #: Open blocks, innermost last, and how many of them are ruled out (state False)
        #: or undecided (None): counted as frames come and go, so a script of a million
        #: unclosed ``{`` costs no more per command than one of three.
        self.frames: list[_Frame] = []
        self._states = {True: 0, False: 0, None: 0}
        #: Characters the expansions produced so far (MAX_EXPANDED_CHARS), the depth of
        #: ``${...}`` being expanded, and the line of the command being read.
        self.spent = 0
        self.depth = 0
        self.too_deep = False
        #: Tokens read, expansions and words expanded (MAX_TOKENS, MAX_EXPANSIONS,
        #: MAX_TOTAL_WORDS); past any, ``stopped``: nothing more is read.
        self.tokens = 0
        self.expansions = 0
        self.words = 0
        self.stopped = False
        self.line = 1
        #: Exit status of the last command, where the file decides it (a test).
        self.status: bool | None = True
        #: While reading an ``if``'s test: (operator before, result) of each command.
        self.cond: list[tuple[str, bool | None]] | None = None
        self.nesting = 0
        #: Unknown names in the order met; a marker holds the index.
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self._sbatch(text)

    # -- Slurm directives -----------------------------------------------------------------
    def _sbatch(self, text: str) -> None:
        """``#SBATCH`` lines, as the variables Slurm sets from them (a number only)."""
        env = {
            "nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
            "N": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
            "ntasks-per-node": ("SLURM_NTASKS_PER_NODE",),
            "gpus-per-node": ("SLURM_GPUS_PER_NODE",),
            "ntasks": ("SLURM_NTASKS",),
            "n": ("SLURM_NTASKS",),
        }
        for line in text.splitlines()[:1000]:
            m = re.match(r"\s*#SBATCH\s+(--?[A-Za-z-]+)(?:[= ]\s*(\S+))?", line)
            if not m:
                continue
            key, value = m.group(1).lstrip("-"), m.group(2) or ""
            if key == "gres":
                g = re.fullmatch(r"gpu(?::[\w.-]+)?:(\d+)", value)
                names: tuple[str, ...] = ("SLURM_GPUS_ON_NODE",) if g else ()
                value = g.group(1) if g else ""
            else:
                names = env.get(key, ())
            if names and re.fullmatch(r"\d+", value):
                for name in names:
                    self.vars[name] = value
                    self.script.origins[name] = f"#SBATCH {m.group(1)}={value}"

    # -- running ----------------------------------------------------------------------------
    def run(self, text: str) -> None:
        if self.nesting > MAX_NESTING:
            return
        self.nesting += 1
        try:
            self._run(_Lexer(text).tokens())
        finally:
            self.nesting -= 1

    def _run(self, toks: Iterator[_Tok]) -> None:
        cmd: list[_Tok] = []
        before = "\n"  # the operator before the command being collected
        for tok in toks:
            self.tokens += 1 + len(tok.items)
            if self.tokens > MAX_TOKENS:
                self._stop(f"more than {MAX_TOKENS} words and operators")
            if self.stopped:
                return
            if tok.kind == "op" and tok.text not in ("(", ")"):
                self._command(cmd, before)
                cmd, before = [], tok.text
            elif tok.kind != "op":
                cmd.append(tok)
            if len(self.script.commands) > MAX_COMMANDS:
                self._stop(f"more than {MAX_COMMANDS} commands")
            if self.stopped:
                return
        self._command(cmd, before)

    # -- branches ---------------------------------------------------------------------------
    @property
    def skipped(self) -> bool:
        """Inside a branch the script's own values rule out (``if [[ $DTYPE == fp8 ]]``
        with DTYPE=bf16): its commands never run."""
        return self._states[False] > 0

    @property
    def conditional(self) -> bool:
        """Inside a branch, loop or function whose running is not known from the file."""
        return self._states[None] > 0

    def _push(self, frame: _Frame) -> None:
        self.frames.append(frame)
        self._states[frame.state] += 1

    def _pop(self) -> None:
        if self.frames:
            self._states[self.frames.pop().state] -= 1

    def _decide(self, frame: _Frame, state: bool | None) -> None:
        """Set the state of an open frame, keeping the counts."""
        self._states[frame.state] -= 1
        frame.state = state
        self._states[state] += 1

    def _leave_blocks(self) -> None:
        self.frames.clear()
        self._states = {True: 0, False: 0, None: 0}

    def _keyword(self, head: str, op: str) -> bool | None:
        """Open or close a block; True when ``head`` was a keyword taking the command."""
        if head in ("if", "elif"):
            if head == "elif" and self.frames:
                self._decide(self.frames[-1], True)  # while its test is read; at "then"
            else:
                self._push(_Frame())
            self.cond = []
            return False
        if head == "then":
            frame = self.frames[-1] if self.frames else None
            if frame is not None and self.cond is not None:
                result = _combine(self.cond)
                if frame.taken is True:  # an earlier branch ran: this one cannot
                    result = False
                self._decide(frame, result)
                if result is True:
                    frame.taken = True
                elif result is None and frame.taken is False:
                    frame.taken = None
            self.cond = None
            return False
        if head == "else" and self.frames:
            frame = self.frames[-1]
            self._decide(frame, {True: False, False: True, None: None}[frame.taken])  # type: ignore[index]
            return False
        if head in ("for", "while", "until", "case", "select", "{"):
            self._push(_Frame(state=None))
            return head in ("for", "select", "case")
        if head in ("fi", "done", "esac", "}"):
            self._pop()
            return False
        return False

    def _command(self, toks: list[_Tok], op: str = "\n") -> None:
        """One simple command; after ``&&`` / ``||`` it runs as the previous command's
        status says: known for a test on the script's own values, else unknown."""
        gate: bool | None = True
        if op in ("&&", "||") and self.cond is None:
            last = self.status
            gate = last if op == "&&" else (None if last is None else not last)
        if gate is False:
            return
        if toks:
            self.line = toks[0].line
        if gate is None:
            self._push(_Frame(state=None))
        try:
            self.status = self._simple(toks, op)
        finally:
            if gate is None:
                self._pop()

    def _simple(self, toks: list[_Tok], op: str) -> bool | None:
        kept: list[_Tok] = []
        skip = False
        heredoc: _Tok | None = None
        target: _Tok | None = None
        writes = False
        for tok in toks:  # redirections go, with their targets
            if skip:
                skip = False
                if writes and target is None and tok.kind == "word":
                    target = tok
            elif tok.kind == "redir":
                skip, writes = True, tok.text in (">", ">|")
            elif tok.kind == "heredoc":
                heredoc = tok
            else:
                kept.append(tok)
        if heredoc is not None and target is not None:
            self._written(heredoc, target)
        negate = False
        while kept and kept[0].kind == "word":
            head = kept[0].text
            if head in _KEYWORDS:
                if self._keyword(head, op):
                    return None  # a loop's or case's header is no command
                kept = kept[1:]
                negate = False
            elif head in ("!", "time", "do"):
                negate = negate != (head == "!")
                kept = kept[1:]
            else:
                break
        if self.cond is not None:  # the test of an if: evaluated, not run
            if kept and not self.skipped:
                result = self._condition(kept)
                self.cond.append((op, None if result is None else result != negate))
            return None
        if not kept or self.skipped:
            return None
        if kept[0].kind == "word" and (
            kept[0].text == "function" or kept[0].text.endswith("()")
            or (len(kept) > 1 and kept[1].text == "{")
        ):
            self._push(_Frame(state=None))  # a function body runs when called
            return None
        if kept[0].kind == "word" and kept[0].text in (
            "export", "declare", "typeset", "local", "readonly"
        ):
            for tok in kept[1:]:
                self._assign(tok)
            return True
        first = 0  # leading assignments: alone they set variables, before a command its env
        while first < len(kept) and (kept[first].kind == "array" or _is_assignment(kept[first])):
            first += 1
        if first == len(kept):
            for tok in kept:
                self._assign(tok)
            return True
        words: list[Word] = []
        for tok in kept[first:]:
            if tok.kind == "word":
                words.extend(self.expand(tok.text))
            if len(words) > MAX_WORDS:
                break
        if not words:
            return None
        self.script.commands.append(Command(words, kept[first].line, self.conditional))
        self._nested(words)
        result = self._condition(kept[first:]) if words[0].text in ("[[", "[", "test") else (
            _test([(w.text, w.known, False) for w in words]))
        return None if result is None else result != negate

    def _condition(self, toks: list[_Tok]) -> bool | None:
        """The status of a test command (``[ ... ]``, ``[[ ... ]]``, ``test``, ``true``) on
        the script's own values. Inside ``[[ ]]`` a word is not split and an unquoted
        right side of ``==`` is a pattern, as bash reads it."""
        raws = [t.text for t in toks if t.kind == "word"]
        if raws[:1] != ["[["]:
            words = [w for raw in raws for w in self.expand(raw)]
            return _test([(w.text, w.known, False) for w in words])
        items: list[tuple[str, bool, bool | None]] = []
        for raw in raws[:MAX_WORDS]:
            word = self.word("".join(p.text for p in self._pieces(raw, True)), [])
            self.words += 1
            if not re.search(r"[\"'\\]", raw):
                pattern: bool | None = True
            elif len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'" and (
                raw[0] not in raw[1:-1]
            ):
                pattern = False
            else:
                pattern = None  # partly quoted: which characters match as a pattern is
                # not followed
            items.append((word.text, word.known, pattern))
        return _test(items)

    def _written(self, heredoc: _Tok, target: _Tok) -> None:
        """``cat <<EOF > FILE``: the text the script writes to FILE (expanded unless the
        delimiter is quoted), for a reader that looks for that file."""
        if self.skipped or not heredoc.items:
            return
        body = heredoc.items[0][:MAX_VALUE_CHARS]
        if not heredoc.append:
            body = "".join(p.text for p in self._pieces(body, True, heredoc=True))
        names = self.expand(target.text)
        if len(names) == 1:
            self.script.files[names[0].text] = self.word(body, [])

    def _nested(self, words: list[Word]) -> None:
        """``bash -c "STRING"`` (also under srun): STRING is a script of its own, its
        unknown parts staying unknown."""
        for i, w in enumerate(words[:-2]):
            if w.text.rsplit("/", 1)[-1] in ("bash", "sh", "zsh") and words[i + 1].text == "-c":
                self.run(words[i + 2].text)
                return

    def _assign(self, tok: _Tok) -> None:
        if tok.kind == "array":
            items: list[str] = []
            for raw in tok.items:
                items.extend(w.text for w in self.expand(raw))
            old = self.vars.get(tok.text)
            if tok.append and old is not None:
                items = [*(old if isinstance(old, list) else [old]), *items]
            self._set(tok.text, items[:MAX_WORDS], tok.line, append=tok.append)
            return
        m = _ASSIGN.match(tok.text)
        if not m:
            return  # ``export NAME`` without a value
        name = m.group(1)
        texts: list[str] = []
        first: _Piece | None = None
        for count, piece in enumerate(self._pieces(tok.text[m.end() :], True)):
            texts.append(piece.text)
            first = piece if count == 0 else None
        value: _Value = "".join(texts)
        old = self.vars.get(name)
        if m.group(2) and old is not None:
            if isinstance(old, list):
                value = [*old, value]
            elif self._charge(len(old) + len(value)):
                value = old + value
            else:
                value = self._spent_mark(name)
        self._set(name, value, tok.line)
        inherited = [self.script.origins[v] for v in (first.via if first else ())
                     if v in self.script.origins]
        if inherited:  # NNODES=$SLURM_NNODES (one piece): from "#SBATCH --nodes"
            self.script.origins[name] = inherited[0]

    def _set(self, name: str, value: _Value, line: int, append: bool = False) -> None:
        if self.conditional:
            why = (
                f"${name} is set inside a block whose running the file does not decide "
                f"(line {line}), so its value at launch is not known"
            )
            old = self.vars.get(name)
            if append and isinstance(old, list):  # the items before stay; more may follow
                value = [*old, self._mark(f"${{{name}[@]}}", why.replace("set", "extended", 1))]
            else:
                value = self._mark(f"${name}", why)
        elif isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            value = self._mark(f"${name}", f"${name} holds more than {MAX_VALUE_CHARS} "
                               "characters")
        elif isinstance(value, list) and not self._charge(sum(map(len, value))):
            value = self._spent_mark(name)
        self.vars[name] = value
        self.script.origins.pop(name, None)

    # -- bounds ---------------------------------------------------------------------------
    def _charge(self, chars: int) -> bool:
        """Count ``chars`` of expanded text against MAX_EXPANDED_CHARS; False (and a note,
        once) when they would pass it: the caller leaves the value unknown instead."""
        if self.spent + chars <= MAX_EXPANDED_CHARS:
            self.spent += chars
            return True
        if self.spent <= MAX_EXPANDED_CHARS:
            self.spent = MAX_EXPANDED_CHARS + 1
            self.script.notes.append(
                f"line {self.line}: the script's expansions pass {MAX_EXPANDED_CHARS} "
                "characters in all (a variable grown or copied over and over), so sapper "
                "expands no more variables from there on: their values are unknown"
            )
        return False

    def _stop(self, what: str) -> None:
        if not self.stopped:
            self.stopped = True
            self.script.notes.append(
                f"line {self.line}: the script holds {what}, past sapper's bound for a "
                "launch script, so sapper reads no further: the commands after it are not "
                "checked"
            )

    def _spent_mark(self, name: str) -> str:
        return self._mark(f"${name}", f"${name} was not expanded: the script's expansions "
                          f"pass {MAX_EXPANDED_CHARS} characters in all (line {self.line})")

    # -- words ------------------------------------------------------------------------------
    def _mark(self, name: str, why: str) -> str:
        """The marker standing for an unknown part, its reason kept once per name (names
        clipped: a marker is never the way a short text grows long)."""
        if len(name) > MAX_NAME_CHARS:
            name = clip_text(name, MAX_NAME_CHARS)
            why = clip_text(why, 4 * MAX_NAME_CHARS)
        if name not in self._index:
            self._index[name] = len(self.names)
            self.names.append(name)
            self.script.reasons[name] = why
        return f"\ue000{self._index[name]}\ue001"

    def word(self, text: str, via: list[str] | dict[str, None]) -> Word:
        marks = _MARK.findall(text)
        unknown = tuple(dict.fromkeys(self.names[int(i)] for i in marks))
        # Each marker shows as its name: bounded, counted like any expanded text.
        longer = sum(len(self.names[int(i)]) for i in marks)
        if marks and not self._charge(longer):
            shown = _MARK.sub("…", text)
        else:
            shown = _MARK.sub(lambda m: self.names[int(m.group(1))], text)
        return Word(text, shown, unknown, tuple(dict.fromkeys(via)))

    def expand(self, raw: str) -> list[Word]:
        """A raw word as the words bash passes to the command: unquoted expansions split
        on whitespace (an empty one is no word), ``"${A[@]}"`` one word per item."""
        words: list[Word] = []
        text: list[str] = []  # the word being built, in parts (linear in its length)
        filled = started = False
        via: dict[str, None] = {}  # the first few variables the words came through
        for p in self._pieces(raw):
            if len(via) < _MAX_VIA:
                via.update(dict.fromkeys(p.via))
            if not (p.split or p.items):
                text.append(p.text)
                filled, started = filled or bool(p.text), True
                continue
            parts = (p.text.split("\x00", MAX_WORDS + 1) if p.items
                     else re.split(r"[ \t\n]+", p.text, maxsplit=MAX_WORDS + 1))
            for j, part in enumerate(parts):
                if j > 0 and (started or filled):
                    words.append(self.word("".join(text), via))
                    text, filled, started = [], False, False
                text.append(part)
                filled = filled or bool(part)
                started = started or bool(part) or p.items
            if len(words) > MAX_WORDS:
                break
        if started or filled:
            words.append(self.word("".join(text), via))
        self.words += len(words)
        if self.words > MAX_TOTAL_WORDS:
            self._stop(f"more than {MAX_TOTAL_WORDS} words once expanded")
        return words

    def _pieces(
        self, raw: str, assignment: bool = False, heredoc: bool = False
    ) -> Iterator[_Piece]:
        """The parts of a raw word in order, one by one (a word of a million expansions is
        never held as a list of them)."""
        i, n = 0, len(raw)
        quoted = heredoc  # a heredoc's body expands like a double-quoted string ...
        lit: list[str] = []  # literal text not yet flushed (a list: linear in the length)

        while i < n:
            run = (_QUOTED_RUN if quoted else _PLAIN_RUN).match(raw, i)
            if run:
                lit.append(run.group(0))
                i = run.end()
                continue
            c = raw[i]
            if c == '"' and heredoc:  # ... whose quotes are its own text
                lit.append(c)
                i += 1
            elif c == '"':
                quoted = not quoted
                if not quoted:
                    yield from _flushed(lit)
                    yield _Piece("", False)  # "" is a word of its own
                i += 1
            elif c == "'" and not quoted:
                end = raw.find("'", i + 1)
                end = n if end < 0 else end
                lit.append(raw[i + 1 : end])
                yield from _flushed(lit)
                yield _Piece("", False)
                i = end + 1
            elif c == "\\":
                nxt = raw[i + 1 : i + 2]
                if nxt == "\n":  # a line continuation, inside quotes too
                    nxt = ""
                lit.append(c + nxt if quoted and nxt not in ('"', "\\", "$", "`", "") else nxt)
                i += 2
            elif c == "`":
                end = raw.find("`", i + 1)
                end = n if end < 0 else end
                yield from _flushed(lit)
                yield self._output(raw[i + 1 : end])
                i = end + 1
            elif c == "$" and i + 1 < n:
                yield from _flushed(lit)
                self.expansions += 1
                if self.expansions > MAX_EXPANSIONS:
                    self._stop(f"more than {MAX_EXPANSIONS} expansions")
                    return
                piece, i = self._dollar(raw, i, quoted or assignment)
                yield piece
            elif c == "~" and i == 0 and not quoted:
                yield from _flushed(lit)
                yield _Piece(self._mark("~", "~ is the home folder at launch"), False)
                i += 1
            else:
                lit.append(c)
                i += 1
        yield from _flushed(lit)

    def _dollar(self, raw: str, i: int, quoted: bool) -> tuple[_Piece, int]:
        n = len(raw)
        if raw.startswith("$((", i):
            end = _close_paren(raw, i + 2)
            return self._arith(raw[i + 3 : end - 2], quoted), end
        if raw.startswith("$(", i):
            end = _close_paren(raw, i + 2)
            return self._output(raw[i + 2 : end - 1]), end
        if raw.startswith("${", i):
            end = _close_brace(raw, i + 2)
            end = n if end < 0 else end
            return self._braced(raw[i + 2 : end], quoted), end + 1
        m = _NAME.match(raw, i + 1)
        if m:
            return self._lookup(m.group(0), quoted), m.end()
        ch = raw[i + 1]
        if ch.isdigit() or ch in "@*#?$!-":
            return self._special(ch), i + 2
        return _Piece("$", False), i + 1

    def _special(self, ch: str) -> _Piece:
        if ch.isdigit() or ch in "@*":
            why = f"${ch} is an argument the script is called with"
        elif ch == "#":
            why = "$# counts the arguments the script is called with"
        else:
            why = f"${ch} is known only while the script runs"
        return _Piece(self._mark("$" + ch, why), False)

    def _braced(self, body: str, quoted: bool) -> _Piece:
        m = re.fullmatch(
            r"([A-Za-z_][A-Za-z0-9_]*|\d+)(?:\[([@*]|\d+)\])?(?:(:?[-=+?])(.*))?", body, re.S
        )
        if not m:
            why = f"${{{body}}} is a form of parameter expansion sapper does not evaluate"
            return _Piece(self._mark("${" + body + "}", why), False)
        name, index, op, arg = m.group(1), m.group(2), m.group(3), m.group(4)
        if name.isdigit():
            why = f"${name} is an argument the script is called with"
            return _Piece(self._mark("$" + name, why), False)
        value = self.vars.get(name)
        if index is not None and value is not None:
            items = value if isinstance(value, list) else [value]
            if index in ("@", "*"):
                if not self._charge(sum(map(len, items)) + len(items)):
                    return _Piece(self._spent_mark(name), False)
                if index == "@" and quoted:
                    return _Piece("\x00".join(items), False, (name,), items=bool(items))
                return _Piece(" ".join(items), not quoted, (name,))
            k = int(index) if len(index) < 19 else len(items)
            item = items[k] if k < len(items) else ""
            if not self._charge(len(item)):
                return _Piece(self._spent_mark(name), False)
            return _Piece(item, not quoted, (name,))
        if op is None or op in (":?", "?"):
            return self._lookup(name, quoted)
        unset = value is None or (op.startswith(":") and value == "")
        if op in (":+", "+"):
            if unset:
                return _Piece("", False)
            return _Piece(self._inner(arg, body), not quoted, (name,))
        # :- - := = : the default when unset; a scheduler's variable stays unknown, since
        # the job runs with the scheduler's value, not the fallback.
        if not unset or (value is None and name.startswith(_SCHEDULER)):
            return self._lookup(name, quoted)
        text = self._inner(arg, body)
        if op in (":=", "="):
            self._set(name, text, 0)
        return _Piece(text, not quoted, (name,))

    def _inner(self, arg: str, body: str) -> str:
        """The word inside ``${A:-word}`` expanded, at most MAX_BRACE_DEPTH levels of
        ``${...}`` deep (the depth is counted, so no input nests Python's calls deeper)."""
        if self.depth >= MAX_BRACE_DEPTH:
            if not self.too_deep:
                self.too_deep = True
                self.script.notes.append(
                    f"line {self.line}: ${{...}} nested in ${{...}} more than "
                    f"{MAX_BRACE_DEPTH} levels deep is not expanded: its value is unknown"
                )
            name = "${" + body + "}"
            return self._mark(name, f"{clip_text(name)} nests ${{...}} more than "
                              f"{MAX_BRACE_DEPTH} levels deep, which sapper does not expand")
        self.depth += 1
        try:
            return "".join(p.text for p in self._pieces(arg, True))
        finally:
            self.depth -= 1

    def _lookup(self, name: str, quoted: bool) -> _Piece:
        value = self.vars.get(name)
        if value is None:
            why = (
                f"${name} is set by the scheduler when the job starts"
                if name.startswith(_SCHEDULER)
                else f"${name} is not set in the script (it comes from the environment at "
                "launch)"
            )
            return _Piece(self._mark("$" + name, why), False)
        if isinstance(value, list):  # $ARR is its first item
            value = value[0] if value else ""
        if not self._charge(len(value)):
            return _Piece(self._spent_mark(name), False)
        return _Piece(value, not quoted, (name,))

    def _output(self, body: str) -> _Piece:
        name = "$(" + clip_text(" ".join(body.split()), 40) + ")"
        return _Piece(self._mark(name, f"{name} is the output of a command, known only at "
                                 "launch"), False)

    def _arith(self, expr: str, quoted: bool) -> _Piece:
        names: list[str] = []
        marks: list[str] = []
        if len(expr) > _MAX_ARITH_TEXT:
            name = f"$(({clip_text(expr.strip())}))"
            return _Piece(self._mark(name, f"{name} is longer than {_MAX_ARITH_TEXT} "
                                     "characters, which sapper does not evaluate"), False)

        def value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if len(names) < _MAX_VIA:
                names.append(name)
            v = self.vars.get(name)
            if isinstance(v, list):
                v = v[0] if v else ""
            if isinstance(v, str) and not self._charge(len(v)):
                v = self._spent_mark(name)
            if isinstance(v, str) and re.fullmatch(r"\s*-?\d+\s*", v):
                return f"({v.strip()})"
            if v is None or _MARK.search(v):
                if len(marks) < MAX_WORDS:
                    marks.append(v if v is not None else self._lookup(name, True).text)
            elif len(marks) < MAX_WORDS:
                marks.append(self._mark(f"${name}", f"${name} is not a whole number "
                                        f"({clip_text(v)})"))
            return "0"

        text = re.sub(
            r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?|\b([A-Za-z_][A-Za-z0-9_]*)\b", value, expr
        )
        if marks:
            held = "".join(x.group(0) for mark in marks for x in _MARK.finditer(mark))
            return _Piece(held, False, tuple(names))
        result = _evaluate(text)
        if result is None:
            name = f"$(({clip_text(expr.strip())}))"
            why = f"{name} is not arithmetic sapper evaluates (whole numbers, + - * / % **)"
            return _Piece(self._mark(name, why), False)
        return _Piece(str(result), not quoted, tuple(names))


def _flushed(lit: list[str]) -> list[_Piece]:
    """The literal text gathered so far as one piece (none if empty), emptying ``lit``."""
    if not lit:
        return []
    piece = _Piece("".join(lit), False)
    lit.clear()
    return [piece]


def clip_text(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_assignment(tok: _Tok) -> bool:
    return tok.kind == "word" and _ASSIGN.match(tok.text) is not None


# ---- tests ---------------------------------------------------------------------------------
@dataclass(slots=True)
class _Frame:
    """An open block: whether its current branch runs (None: not known from the file),
    and whether an earlier branch of the same ``if`` ran."""

    state: bool | None = True
    taken: bool | None = False


#: File and terminal tests: the launch machine's state, never known from the file.
_FILE_TESTS = frozenset("-" + c for c in "abcdefghkprstuwxGLNOSv")
_INT_TESTS = {
    "-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-lt": lambda a, b: a < b,
    "-le": lambda a, b: a <= b, "-gt": lambda a, b: a > b, "-ge": lambda a, b: a >= b,
}
_GLOB = re.compile(r"[*?\[]")
#: ``( ( ! ...`` levels a test may nest (a launch script's tests nest one or two).
_MAX_TEST_DEPTH = 32


def _test(items: list[tuple[str, bool, bool | None]]) -> bool | None:
    """The status of ``[ A = B ]``, ``[[ A != B && -n C ]]``, ``test -z A``, ``[ 3 -gt 2 ]``,
    ``true``, ``false``, given each word as (text, known, matches as a pattern); None for
    anything else, or where an unknown value or the machine's state decides it."""
    texts = [t for t, _, _ in items]
    if texts in (["true"], [":"]):
        return True
    if texts == ["false"]:
        return False
    if texts and texts[0] == "test":
        body, double = items[1:], False
    elif len(texts) >= 2 and (texts[0], texts[-1]) == ("[", "]"):
        body, double = items[1:-1], False
    elif len(texts) >= 2 and (texts[0], texts[-1]) == ("[[", "]]"):
        body, double = items[1:-1], True
    else:
        return None
    if not body:
        return False  # [ ] with nothing inside
    parser = _TestParser(body, double)
    try:
        result = parser.either(0)
    except (IndexError, ValueError):
        return None
    return result if parser.i == len(body) else None


class _TestParser:
    """Recursive descent over a test's words, three-valued (None: not known from the
    file); ``||`` / ``-o`` bind looser than ``&&`` / ``-a``, as in bash."""

    def __init__(self, items: list[tuple[str, bool, bool | None]], double: bool) -> None:
        self.items, self.i = items, 0
        self.ors, self.ands = ("||", "&&") if double else ("-o", "-a")
        self.double = double

    def _peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.items[j][0] if j < len(self.items) and self.items[j][1] else (
            None if j >= len(self.items) else "\ue000")

    def either(self, depth: int) -> bool | None:
        value = self.both(depth)
        while self._peek() == self.ors:
            self.i += 1
            rhs = self.both(depth)
            value = True if value is True or rhs is True else (
                None if value is None or rhs is None else False)
        return value

    def both(self, depth: int) -> bool | None:
        value = self.negated(depth)
        while self._peek() == self.ands:
            self.i += 1
            rhs = self.negated(depth)
            value = False if value is False or rhs is False else (
                None if value is None or rhs is None else True)
        return value

    def negated(self, depth: int) -> bool | None:
        if depth > _MAX_TEST_DEPTH:
            raise ValueError("nested too deep")
        head = self._peek()
        if head == "!" and self.i + 1 < len(self.items):
            self.i += 1
            value = self.negated(depth + 1)
            return None if value is None else not value
        if head == "(":
            self.i += 1
            value = self.either(depth + 1)
            if self._peek() != ")":
                raise ValueError("unclosed (")
            self.i += 1
            return value
        return self.primary()

    def primary(self) -> bool | None:
        items, i = self.items, self.i
        if i + 2 < len(items) and items[i + 1][1] and _is_binary(items[i + 1][0]):
            (a, a_known, _), (op, _, _), (b, b_known, pattern) = items[i : i + 3]
            self.i += 3
            if not (a_known and b_known):
                return None
            return _binary(a, op, b, pattern if self.double else False)
        text, known, _ = items[i]
        if known and text in ("-z", "-n") and i + 1 < len(items) and not (
            items[i + 1][1] and items[i + 1][0] in (self.ands, self.ors, ")")
        ):
            self.i += 2
            operand, operand_known, _ = items[i + 1]
            return None if not operand_known else (operand == "") == (text == "-z")
        if known and text in _FILE_TESTS and i + 1 < len(items):
            self.i += 2
            return None  # the file system or the environment at launch decides
        self.i += 1
        return None if not known else text != ""


def _is_binary(op: str) -> bool:
    return op in ("=", "==", "!=", "=~", "<", ">", "-ef", "-nt", "-ot") or op in _INT_TESTS


def _binary(a: str, op: str, b: str, pattern: bool | None) -> bool | None:
    if op in _INT_TESTS:
        if not (re.fullmatch(r"\s*-?\d{1,18}\s*", a) and re.fullmatch(r"\s*-?\d{1,18}\s*", b)):
            return None  # an arithmetic expression or not a number: not followed
        return bool(_INT_TESTS[op](int(a), int(b)))
    if op in ("=", "==", "!="):
        if _GLOB.search(b) and pattern is not False:
            if pattern is None or len(b) > 1000 or len(a) > 100_000:
                return None
            same = fnmatch.fnmatchcase(a, b)
        else:
            same = a == b
        return same == (op != "!=")
    return None  # =~, < and > (the locale's collation), -nt ...: not followed


def _combine(parts: list[tuple[str, bool | None]]) -> bool | None:
    """Left to right, as bash runs ``A && B || C`` (three-valued)."""
    value: bool | None = None
    for i, (op, result) in enumerate(parts):
        if i == 0:
            value = result
        elif op == "&&":
            value = False if value is False or result is False else (
                None if value is None or result is None else True)
        elif op == "||":
            value = True if value is True or result is True else (
                None if value is None or result is None else False)
        else:
            value = result  # ``if a; b; then``: the last command decides
    return value


# ---- arithmetic ------------------------------------------------------------------------
_ARITH_TOKEN = re.compile(r"\s*(\d+|\*\*|[-+*/%()])")
#: Longest ``$((...))`` text evaluated (a size in a launch script is a few names).
_MAX_ARITH_TEXT = 10_000


def _evaluate(text: str) -> int | None:
    """Whole-number arithmetic with + - * / % ** and parentheses, as bash's ``$((...))``
    computes it (division truncates toward zero); None for anything else or numbers
    beyond MAX_ARITH."""
    if len(text) > 1000:
        return None
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _ARITH_TOKEN.match(text, pos)
        if not m:
            return None
        tokens.append(m.group(1))
        pos = m.end()
    try:
        value, rest = _sum(tokens, 0, 0)
    except (ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None
    return value if rest == len(tokens) else None


def _check(v: int) -> int:
    if abs(v) > MAX_ARITH:
        raise OverflowError
    return v


def _sum(t: list[str], i: int, depth: int) -> tuple[int, int]:
    v, i = _product(t, i, depth)
    while i < len(t) and t[i] in "+-":
        rhs, j = _product(t, i + 1, depth)
        v, i = _check(v + rhs if t[i] == "+" else v - rhs), j
    return v, i


def _product(t: list[str], i: int, depth: int) -> tuple[int, int]:
    v, i = _power(t, i, depth)
    while i < len(t) and t[i] in ("*", "/", "%"):
        rhs, j = _power(t, i + 1, depth)
        if t[i] == "*":
            v = _check(v * rhs)
        elif t[i] == "/":
            v = int(v / rhs) if abs(v) < 2**53 else (abs(v) // abs(rhs)) * (
                1 if (v >= 0) == (rhs >= 0) else -1)
        else:
            v = v - rhs * int(v / rhs)
        i = j
    return v, i


def _power(t: list[str], i: int, depth: int) -> tuple[int, int]:
    base, i = _unary(t, i, depth)
    if i < len(t) and t[i] == "**":
        exp, i = _power(t, i + 1, depth)
        if exp < 0 or exp > 64:
            raise ValueError
        base = _check(base**exp)
    return base, i


def _unary(t: list[str], i: int, depth: int) -> tuple[int, int]:
    if depth > 50 or i >= len(t):
        raise ValueError
    tok = t[i]
    if tok in "+-" and tok:
        v, j = _unary(t, i + 1, depth + 1)
        return (-v if tok == "-" else v), j
    if tok == "(":
        v, j = _sum(t, i + 1, depth + 1)
        if j >= len(t) or t[j] != ")":
            raise ValueError
        return v, j + 1
    if tok.isdigit():
        if len(tok) > 19:
            raise OverflowError
        return int(tok), i + 1
    raise ValueError


def read_script(text: str) -> Script:
    """The commands of a bash script with its own variables expanded (see the module)."""
    shell = _Shell(text)
    shell.run(text)
    for name in list(shell.vars)[:MAX_WORDS]:
        if shell.stopped:
            break
        shell._leave_blocks()
        shell.script.variables[name] = shell.expand("${" + name + "[@]}")[:MAX_WORDS]
    return shell.script
