"""sapper's bootstrap in every Python process a ``sapper run`` command starts.

``sapper run`` puts this folder first on the children's ``PYTHONPATH``; Python imports
``sitecustomize`` at start-up, so this file runs in every Python process of the job
(torchrun's, deepspeed's and accelerate's children included), with no change to the
program. It is the same mechanism ``opentelemetry-instrument`` and ``ddtrace-run`` use.

It does nothing unless ``SAPPER_RUN_DIR`` is set. Then it only puts a finder on
``sys.meta_path`` that waits for the modules sapper attaches to (torch, the HF and
Lightning trainers, sapper's own monitor) and, once one of them has been imported by the
program, hands it to :func:`sapper.monitor.attach.imported`. Nothing is imported early:
a process that never imports torch (the launcher, a tokenizer subprocess) pays one set
lookup per import. A ``sitecustomize`` of the user's further along ``sys.path`` is run
after this one, as it would have been without sapper.

Any failure of sapper's own switches sapper off in that process with one line on stderr,
``sapper: bootstrap off (<reason>)``; the program goes on as if sapper were not there.
Kept importable by older interpreters than sapper's own (no new syntax): the command may
start a Python that is not the one sapper runs in.
"""

import os
import sys

#: Modules whose import completes a step of the attachment (sapper.monitor.attach).
_WATCHED = frozenset(
    (
        "torch",
        "transformers.trainer",
        "lightning.pytorch.trainer.trainer",
        "pytorch_lightning.trainer.trainer",
        "sapper.monitor.monitor",
    )
)

_HERE = os.path.dirname(os.path.abspath(__file__))
_off = []  # a reason once sapper is off in this process


def _say_off(reason):
    if not _off:
        _off.append(reason)
        try:
            sys.stderr.write(f"sapper: bootstrap off ({reason})\n")
            sys.stderr.flush()
        except Exception:
            pass


def _notify(name, module):
    """A watched module finished importing: let sapper attach what it needs."""
    if _off:
        return
    try:
        from sapper.monitor import attach
    except Exception as exc:  # another interpreter, or a broken install
        _say_off(f"sapper is not importable by {sys.executable}: {exc}")
        return
    try:
        attach.imported(name, module)
    except Exception as exc:
        _say_off(f"{type(exc).__name__}: {exc}")


class _ChainedLoader:
    """The real loader of a watched module, then :func:`_notify` once it has run."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def __getattr__(self, attr):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        # The module sees its own loader, not this wrapper (resource readers ask it).
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        self._loader.exec_module(module)
        _notify(self._name, sys.modules.get(self._name, module))


class _SapperFinder:
    """A ``sys.meta_path`` finder that wraps the loader of each watched module."""

    def __init__(self, home):
        self._home = home  # keeps this module alive once the user's takes its name
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WATCHED or fullname in self._busy or _off:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ChainedLoader(spec.loader, fullname)
        return spec


def _install():
    finder = _SapperFinder(sys.modules.get(__name__))
    sys.meta_path.insert(0, finder)
    for name in sorted(_WATCHED):  # imported before this file ran (a .pth file)
        if name in sys.modules:
            _notify(name, sys.modules[name])


def _run_users_sitecustomize():
    """Run the ``sitecustomize`` this one shadows, under that name, as ``site`` would:
    its errors reach ``site``, which reports them the way it always does. Through the
    import system's own objects, already loaded at start-up: ``importlib.util`` would
    cost a few milliseconds in every process."""
    import _frozen_importlib

    finder = next((f for f in sys.meta_path if getattr(f, "__name__", "") == "PathFinder"), None)
    if finder is None:
        return
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = finder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = _frozen_importlib.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("SAPPER_RUN_DIR"):
    try:
        _install()
    except Exception as exc:
        _say_off(f"{type(exc).__name__}: {exc}")
_run_users_sitecustomize()
