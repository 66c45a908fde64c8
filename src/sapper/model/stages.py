"""How many layers each pipeline stage holds: the one split memory, parallel and the
parameter counts per stage use.

Reading a plan already needs it (an explicit first/last split that cannot work is rejected
there, naming the field), and so do the memory model's pipeline schedule and the per-stage
parameter counts; all import it from here.
"""

from __future__ import annotations

from functools import lru_cache

from sapper.errors import InputError

__all__ = ["stage_split"]


@lru_cache(maxsize=1024)
def stage_split(layers: int, pp: int, first: int | None, last: int | None) -> tuple[int, ...]:
    """Layers on each of ``pp`` stages, first to last: even (the first stages take one more
    when it does not divide) unless ``first``/``last`` fix the end stages' counts and the
    others share the rest; an explicit split that leaves the others no equal share raises
    :class:`InputError` naming the field."""
    if pp == 1:
        return (layers,)
    if first is None and last is None:
        base, extra = divmod(layers, pp)
        return tuple(base + (1 if i < extra else 0) for i in range(pp))
    fixed = [x for x in (first, last) if x is not None]
    rest, others = layers - sum(fixed), pp - len(fixed)
    given = f"first_stage_layers({first}), last_stage_layers({last})"
    if rest < 0 or (others == 0 and rest != 0) or (others and (rest <= 0 or rest % others)):
        field = "parallel.first_stage_layers" if first is not None else (
            "parallel.last_stage_layers"
        )
        raise InputError(
            f"{given} leave {rest} of the {layers} layers for the other {others} stages",
            field=field,
            value=first if first is not None else last,
            expected=f"counts that leave a positive multiple of {others} layers"
            if others else f"counts adding up to {layers}",
        )
    mid = [rest // others] * others if others else []
    return tuple(([first] if first is not None else []) + mid + (
        [last] if last is not None else []
    ))
