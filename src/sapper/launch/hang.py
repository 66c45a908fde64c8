"""What a hung run was doing: the collective analysis of its flight-recorder dumps when
sapper can read them (:mod:`sapper.hangs`), and each rank's Python stack from the
faulthandler dumps in ``stacks/``, with the ranks that are not where the others wait.

A stack file is ``stacks/rank{R}-{pid}.txt`` in faulthandler's format (every thread,
most recent call first). A rank's place is its main thread's innermost frame; a rank
whose main thread is inside ``torch.distributed`` waits in a collective. The ranks named
are those outside any collective while others wait in one, or, when all wait, those in
a different frame from the most.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from sapper.hangs.stacks import parse_stacks

__all__ = ["analyze_hang", "read_stacks"]

_NAME = re.compile(r"rank(\d+)(?:-(\d+))?\.txt$")
#: Bytes of one stack file read (a deep stack of many threads is a few hundred KB).
_MAX_STACK_FILE = 4 << 20
#: Frames kept per rank in the JSON.
_FRAMES_KEPT = 12


def read_stacks(folder: Path) -> dict[int, dict[str, Any]]:
    """Each rank's main-thread stack from ``folder`` (``rank{R}-{pid}.txt``)."""
    ranks: dict[int, dict[str, Any]] = {}
    try:
        files = sorted(folder.glob("rank*.txt"))
    except OSError:
        return ranks
    for path in files:
        m = _NAME.search(path.name)
        if m is None:
            continue
        try:
            with path.open("rb") as fh:
                data = fh.read(_MAX_STACK_FILE)
        except OSError:
            continue
        main = parse_stacks(data, str(path)).main()
        if main is None or not main.frames:
            continue
        frames = main.frames
        ranks[int(m.group(1))] = {
            "pid": int(m.group(2)) if m.group(2) else None,
            "file": str(path),
            "frame": frames[0].text(),
            # a rank whose main thread is inside torch.distributed waits in a collective
            "in_collective": any(
                "torch/distributed" in f.file.replace("\\", "/") for f in frames
            ),
            "stack": [f.text() for f in frames[:_FRAMES_KEPT]],
        }
    return ranks


def _suspects(ranks: dict[int, dict[str, Any]]) -> tuple[list[int], str]:
    waiting = [r for r, s in ranks.items() if s["in_collective"]]
    elsewhere = [r for r, s in ranks.items() if not s["in_collective"]]
    if waiting and elsewhere:
        named = sorted(elsewhere)
        where = "; ".join(f"rank {r} at {ranks[r]['frame']}" for r in named[:8])
        verb = "waits" if len(waiting) == 1 else "wait"
        return named, (
            f"{_ranks(named)} not in the collective the others wait in ({where}); "
            f"{_ranks(sorted(waiting))} {verb} at {ranks[min(waiting)]['frame']}"
        )
    counts = Counter(s["frame"] for s in ranks.values())
    if len(counts) < 2:
        frame = next(iter(counts), "?")
        return [], f"every rank with a stack is at {frame}: no rank stands out"
    common, n = counts.most_common(1)[0]
    if n == 1:
        return [], "every rank is at a different frame: no majority to compare with"
    named = sorted(r for r, s in ranks.items() if s["frame"] != common)
    where = "; ".join(f"rank {r} at {ranks[r]['frame']}" for r in named[:8])
    return named, f"{_ranks(named)} not where the others are ({where}); the others at {common}"


def _ranks(ranks: list[int]) -> str:
    head = ", ".join(str(r) for r in ranks[:16])
    more = f" and {len(ranks) - 16} more" if len(ranks) > 16 else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {head}{more}"


def _flight_recorder(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """sapper's collective analysis of the dumps, when it is installed and can tell."""
    from sapper.hangs import diagnose_hang

    try:
        if not folder.is_dir() or not any(folder.iterdir()):
            return None, "no flight-recorder dumps were written"
        verdict = diagnose_hang(folder)
    except Exception as exc:  # the analysis of dumps must not cost the rest of the answer
        return None, f"the flight-recorder dumps could not be analysed ({type(exc).__name__})"
    return (verdict.to_json() if verdict is not None else None), None


def analyze_hang(
    run_dir: Path,
    stalled_s: float | None,
    last_steps: dict[str, int],
    world_size: int | None = None,
) -> dict[str, Any]:
    """The hang JSON of ``run.json``: how long no rank moved, each log's last step, the
    flight-recorder verdict, each rank's stack and the ranks named."""
    verdict, fr_note = _flight_recorder(run_dir / "fr")
    ranks = read_stacks(run_dir / "stacks")
    suspects, summary = _suspects(ranks) if ranks else ([], "no rank wrote its stacks")
    missing: list[int] = []
    if world_size is not None and ranks:
        missing = [r for r in range(world_size) if r not in ranks][:64]
        if missing and not suspects:
            suspects = missing
            summary = f"no stacks from {_ranks(missing)}: the first suspect(s); " + summary
    notes = [n for n in (fr_note,) if n]
    return {
        "stalled_s": round(stalled_s, 1) if stalled_s is not None else None,
        "last_steps": last_steps,
        "suspects": suspects,
        "summary": summary,
        "stacks": {str(r): s for r, s in sorted(ranks.items())},
        "missing_stacks": missing,
        "flight_recorder": verdict,
        "notes": notes,
    }
