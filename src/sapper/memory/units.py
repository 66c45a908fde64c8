"""The one way sapper writes a byte count (dtype sizes: :mod:`sapper.model.dtypes`).

Estimates are kept in bytes (ints) everywhere; GiB (2^30) appear only when shown.
"""

from __future__ import annotations

__all__ = ["GIB", "fmt_bytes"]

GIB = 1 << 30


def fmt_bytes(n: float) -> str:
    """``12.3 GiB`` / ``512.0 MiB`` / ``1.2 KiB``: the unit that keeps 1-4 digits."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{sign}{n / size:.1f} {unit}"
    return f"{sign}{n:.0f} B"
