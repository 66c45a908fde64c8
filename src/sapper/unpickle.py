"""sapper's own restricted unpickler, for every pickle it reads (a torch checkpoint's
``data.pkl``, a Distributed Checkpoint's ``.metadata``, a flight-recorder dump). It sits in a
layer of its own below the packages that read pickles, so each of them can use it.

``pickle.load`` imports and calls whatever a file names, so a checkpoint or a dump from an
untrusted place could run a command. Here ``find_class`` answers only from the table the
format gives (:class:`Vocabulary`), by fully qualified name; anything else is refused before
it is built, naming the global. The classes of the table are :class:`Record` types: a record is
data only. Its pickled state is kept in one slot (``state``) apart from its attributes, it
has no ``__dict__``, and nothing of the file can become a method or an attribute the reader
later calls. The functions of the table are sapper's own (``torch.Size`` becomes a tuple of
ints), never the library's.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sapper.errors import InputError

__all__ = ["Record", "Vocabulary", "record_type", "restricted_loads"]


class Record:
    """A pickled object of a format's class, read back as data: the class's name
    (``qualname``) and the state the pickle gave it (``state``: a dict, a tuple, ...).
    The reader interprets ``state``; nothing here runs on it."""

    __slots__ = ("state",)
    qualname = ""

    def __new__(cls, *args: Any) -> Record:
        if args:  # NEWOBJ/REDUCE with arguments: the real class would run code on them
            raise pickle.UnpicklingError(f"{cls.qualname} built with arguments")
        obj = super().__new__(cls)
        obj.state = None
        return obj

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __reduce__(self) -> Any:  # never pickled back
        raise TypeError("a Record is read-only data")


def record_type(qualname: str) -> type[Record]:
    """A Record class named after ``qualname`` (NEWOBJ needs a class, one per name)."""
    return type(qualname.rpartition(".")[2], (Record,), {"__slots__": (), "qualname": qualname})


@dataclass
class Vocabulary:
    """What a format's pickles may name: Record classes and sapper's own functions."""

    records: tuple[str, ...] = ()
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._table: dict[str, Any] = {name: record_type(name) for name in self.records}
        self._table.update(self.functions)

    def find(self, module: str, name: str) -> Any:
        try:
            return self._table[f"{module}.{name}"]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed") from None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, vocabulary: Vocabulary,
                 persistent: Callable[[Any], Any] | None) -> None:  # fmt: skip
        super().__init__(io.BytesIO(data))
        self._vocabulary = vocabulary
        self._persistent = persistent

    def find_class(self, module: str, name: str) -> Any:
        return self._vocabulary.find(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("persistent ids are not allowed")
        return self._persistent(pid)


#: What unpickling hostile bytes raises beyond UnpicklingError (a truncated stream, a
#: bad opcode argument, a memo index that does not exist, a value our functions refuse).
_ERRORS = (
    pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
    AttributeError, OverflowError, UnicodeDecodeError, MemoryError, RecursionError,
    RuntimeError, NotImplementedError,
)  # fmt: skip


def restricted_loads(
    data: bytes,
    vocabulary: Vocabulary,
    file: str,
    persistent_load: Callable[[Any], Any] | None = None,
) -> Any:
    """The object in ``data``, built from ``vocabulary`` only; InputError naming ``file``
    when the pickle is damaged or names anything else (nothing of it is run).
    ``persistent_load`` answers the pickle's persistent ids (torch's storages)."""
    try:
        return _Unpickler(data, vocabulary, persistent_load).load()
    except _ERRORS as exc:
        text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if isinstance(exc, pickle.UnpicklingError) and "is not allowed" in text:
            raise InputError(
                "refused to unpickle: the file needs a global that could run code; "
                "nothing in it was executed",
                file=file,
                field="pickle",
                value=text.removeprefix("global ").removesuffix(" is not allowed"),
                expected="the classes of its format, by name",
            ) from None
        raise InputError(
            f"not a readable pickle ({type(exc).__name__}: {text})", file=file
        ) from None
