"""Matching the ranks' collectives, group by group: where each group stands, and who
keeps it from going on.

Every rank numbers the collectives of a process group in the order it calls them
(``collective_seq_id``), so the ranks of a group must agree at each number. For a group,
``S`` is the highest number any member enqueued. The group is stuck at ``S`` when a member
never enqueued it (it is *behind*: doing something else) or a member that did has not
completed it. Then, in order:

* members that entered ``S`` with a different op, shape or dtype than the most common one
  → an op / size / dtype mismatch, the odd ones out the suspects (a tie names every side);
* members behind → they never entered ``S``: the suspects, unless they outnumber the ranks
  at ``S`` (then those few called a collective the others never call: *ahead*);
* members whose dump is absent → the first suspects, but the dumps cannot tell (unknown);
* every member entered the same ``S`` and it did not complete → stuck inside the
  collective (the transport, a device), which the dumps alone cannot explain.

Where the ranks already disagreed before ``S`` (a rank that skipped a collective and went
on calling the next ones), the first sequence number where they differ is kept: it is where
the program's paths parted.

Membership: ``pg_config``'s ranks where a dump gives them (NCCL); else, as under gloo, the
default group is every rank up to the highest one seen and any other group is the ranks
whose dumps mention it (a member that never called one of its collectives is not seen).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sapper.hangs.dumps import DumpFolder, Entry, RankDump
from sapper.hangs.stacks import Frame, user_frame

__all__ = ["GroupState", "RankView", "match_groups"]

#: Kinds of answer for one group.
HEALTHY = "healthy"
NOT_ENTERED = "not-entered"
AHEAD = "ahead"
OP_MISMATCH = "op-mismatch"
SIZE_MISMATCH = "size-mismatch"
DTYPE_MISMATCH = "dtype-mismatch"
RANK_MISSING = "rank-missing"
STUCK_INSIDE = "stuck-inside"


@dataclass
class RankView:
    """One member of a stuck group, as the evidence shows it."""

    rank: int
    #: ``waiting`` (entered S, not completed), ``completed`` (entered S and it completed
    #: there), ``behind`` (never entered S), ``missing`` (no dump).
    role: str
    #: Its entry at S, when it entered.
    entry: Entry | None = None
    #: Its last collective in the group (the one before S for a rank behind).
    last_in_group: Entry | None = None
    #: Its last recorded collective of any group, when that is another group's.
    last_elsewhere: Entry | None = None
    #: Where it is now: the user frame of its main thread (faulthandler), else where it
    #: called its last collective (the recorder's stack), and which of the two.
    frame: Frame | None = None
    frame_source: str | None = None
    #: The innermost frame of its main thread is in torch.distributed (inside a call).
    in_collective: bool | None = None
    mismatch: str | None = None


@dataclass
class GroupState:
    pg: str
    desc: str
    ranks: tuple[int, ...]
    #: ``pg_config`` (from the dumps) or ``inferred``.
    ranks_from: str
    kind: str
    seq: int = 0
    #: The collective at S as the majority of members that entered it recorded it.
    expected: Entry | None = None
    suspects: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    views: dict[int, RankView] = field(default_factory=dict)
    #: The first sequence number below S where the members' records differ, with the
    #: ranks off the common record there.
    parted_at: int | None = None
    parted_ranks: list[int] = field(default_factory=list)
    #: When the first member entered S (ns, the recorder's clock), for ordering groups.
    since_ns: int | None = None

    @property
    def stuck(self) -> bool:
        return self.kind != HEALTHY


def _members(folder: DumpFolder) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """Process group name → (ranks, where they came from, desc)."""
    dumps = folder.dumps
    declared: dict[str, tuple[int, ...]] = {}
    descs: dict[str, str] = {}
    mentioned: dict[str, set[int]] = {}
    for d in dumps.values():
        for pg, ranks in d.groups.items():
            declared.setdefault(pg, ranks)
        for pg, desc in d.descs.items():
            descs.setdefault(pg, desc)
        for pg in set(d.collectives) | set(d.enqueued):
            mentioned.setdefault(pg, set()).add(d.rank)
    known = set(dumps) | set(folder.stacks)
    for ranks in declared.values():
        known.update(ranks)
    world = tuple(range(max(known) + 1)) if known else ()
    out: dict[str, tuple[tuple[int, ...], str, str]] = {}
    for pg in set(mentioned) | set(declared):
        desc = descs.get(pg, "")
        if pg in declared:
            out[pg] = (tuple(sorted(declared[pg])), "pg_config", desc)
        elif desc == "default_pg" or pg == "0":
            out[pg] = (world, "inferred", desc)
        else:
            out[pg] = (tuple(sorted(mentioned[pg])), "inferred", desc)
    return out


def match_groups(folder: DumpFolder) -> list[GroupState]:
    """Every process group's state, stuck groups first (the earliest stuck first)."""
    states = [_group(folder, pg, ranks, src, desc)
              for pg, (ranks, src, desc) in _members(folder).items()]  # fmt: skip
    return sorted(states, key=lambda g: (not g.stuck, g.since_ns is None, g.since_ns or 0,
                                         _pg_order(g.pg)))  # fmt: skip


def _pg_order(pg: str) -> tuple[int, str]:
    return (int(pg), "") if pg.isdigit() else (1 << 62, pg)


def _group(folder: DumpFolder, pg: str, ranks: tuple[int, ...], src: str,
           desc: str) -> GroupState:  # fmt: skip
    dumps = folder.dumps
    present = [r for r in ranks if r in dumps]
    missing = [r for r in ranks if r not in dumps]
    g = GroupState(pg, desc, ranks, src, HEALTHY, missing=missing)
    enq = {r: dumps[r].enqueued.get(pg, 0) for r in present}
    done = {r: dumps[r].completed.get(pg, 0) for r in present}
    top = max(enq.values(), default=0)
    g.seq = top
    at_top = [r for r in present if enq[r] == top]
    behind = [r for r in present if enq[r] < top]
    waiting = [r for r in at_top if done[r] < top]
    if top == 0 or (not behind and not waiting):
        return g
    entries = {r: dumps[r].collectives.get(pg, {}).get(top) for r in at_top}
    for r in present:
        view = RankView(r, "behind" if r in behind else "waiting" if r in waiting
                        else "completed", entry=entries.get(r))  # fmt: skip
        _what_else(dumps[r], pg, view, folder)
        g.views[r] = view
    for r in missing:
        g.views[r] = RankView(r, "missing")
        st = folder.stacks.get(r)
        if st is not None:
            _where_now(st, g.views[r])
    created = [e.created_ns for e in entries.values() if e is not None and e.created_ns]
    g.since_ns = min(created) if created else None
    g.parted_at, g.parted_ranks = _parted(dumps, present, pg, top)

    known = {r: e for r, e in entries.items() if e is not None}
    odd, kind = _odd_ones(known)
    if known:
        common = Counter(e.signature() for e in known.values()).most_common(1)[0][0]
        g.expected = next(e for e in known.values() if e.signature() == common)
    if odd:
        g.kind, g.suspects = kind, odd
        for r in odd:
            g.views[r].mismatch = kind
    elif behind and len(at_top) < len(behind):
        g.kind, g.suspects = AHEAD, at_top
    elif behind:
        g.kind, g.suspects = NOT_ENTERED, behind
    elif missing:
        g.kind, g.suspects = RANK_MISSING, missing
    else:
        g.kind, g.suspects = STUCK_INSIDE, waiting
    return g


def _odd_ones(entries: dict[int, Entry]) -> tuple[list[int], str]:
    """The ranks whose record at one sequence number differs from the most common one,
    and how (op before size before dtype); every rank off the largest side when tied."""
    if len(entries) < 2:
        return [], ""
    counts = Counter(e.signature() for e in entries.values())
    if len(counts) == 1:
        return [], ""
    (top, n), *rest = counts.most_common()
    tied = [sig for sig, m in rest if m == n]
    keep = {top} if not tied else set()
    odd = sorted(r for r, e in entries.items() if e.signature() not in keep)
    ref = next(e for e in entries.values() if e.signature() == top)
    others = [entries[r] for r in odd if entries[r].signature() != top] or [
        e for e in entries.values() if e.signature() != top]
    if any(e.op != ref.op for e in others):
        return odd, OP_MISMATCH
    if any((e.in_sizes, e.out_sizes) != (ref.in_sizes, ref.out_sizes) for e in others):
        return odd, SIZE_MISMATCH
    return odd, DTYPE_MISMATCH


def _parted(dumps: dict[int, RankDump], present: list[int], pg: str,
            top: int) -> tuple[int | None, list[int]]:  # fmt: skip
    """The first sequence number below ``top`` (within what the ranks kept) where the
    members' records differ."""
    kept = {r: dumps[r].collectives.get(pg, {}) for r in present}
    seqs = sorted({s for k in kept.values() for s in k if s < top})
    for s in seqs:
        odd, _ = _odd_ones({r: k[s] for r, k in kept.items() if s in k})
        if odd:
            return s, odd
    return None, []


def _what_else(dump: RankDump, pg: str, view: RankView, folder: DumpFolder) -> None:
    kept = dump.collectives.get(pg, {})
    below = [s for s in kept if view.entry is None or s < view.entry.seq]
    view.last_in_group = kept[max(below)] if below else None
    if view.role == "behind" and view.last_in_group is None and kept:
        view.last_in_group = kept[max(kept)]
    if dump.last is not None and dump.last.pg != pg:
        view.last_elsewhere = dump.last
    st = dump.stacks or folder.stacks.get(dump.rank)
    if st is not None:
        _where_now(st, view)
    else:
        last = view.last_elsewhere or view.entry or view.last_in_group
        if last is not None and last.frames:
            view.frame, view.frame_source = user_frame(last.frames), "flight recorder"


def _where_now(stacks: Any, view: RankView) -> None:
    main = stacks.main()
    if main is None or not main.frames:
        return
    view.frame, view.frame_source = user_frame(main.frames), "faulthandler"
    view.in_collective = "/torch/distributed/" in main.frames[0].file
