"""The answer about a hung job: one stuck collective, the rank(s) that keep it, and why.

It follows ``sapper diagnose``'s JSON contract (``causes``, ``considered``, ``symptoms``,
``summary``; :meth:`sapper.diagnose.diagnosis.Diagnosis.to_json`) with
``check: "distributed"``, so a consumer of diagnose reads a hang like any other cause. The
evidence is per rank (what each member of the stuck group was doing), never a table of
every entry. ``cause`` is ``unknown`` when the dumps cannot tell (a member's dump absent,
every member inside the same collective), with what is missing.

One dump is one moment: a rank one collective behind in a job that was still progressing
is a straggler (X002 of the live monitor), not a hang. Dumps written on a collective
timeout, or by sapper's heartbeat when a rank stopped, are taken as a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapper.hangs.dumps import DumpFolder, Entry, read_folder
from sapper.hangs.match import (
    AHEAD,
    DTYPE_MISMATCH,
    NOT_ENTERED,
    OP_MISMATCH,
    RANK_MISSING,
    SIZE_MISMATCH,
    STUCK_INSIDE,
    GroupState,
    RankView,
    match_groups,
)

__all__ = ["HangVerdict", "diagnose_hang"]

#: Per-rank evidence listed at most (suspects first); the rest are counted.
MAX_EVIDENCE = 32

_TITLES = {
    NOT_ENTERED: "A rank never entered the collective the others wait in",
    AHEAD: "A rank called a collective the others never called",
    OP_MISMATCH: "Ranks called different collectives at the same point",
    SIZE_MISMATCH: "Ranks called the same collective with different sizes",
    DTYPE_MISMATCH: "Ranks called the same collective with different dtypes",
    RANK_MISSING: "A rank of the stuck group left no dump",
    STUCK_INSIDE: "Every rank entered the same collective and it never completed",
}
_FIXES = {
    NOT_ENTERED: "make every rank of the group call the collective: look at the suspect's "
    "frame for a data-dependent branch, an uneven last batch or an early exit",
    AHEAD: "remove the extra collective or call it on every rank of the group",
    OP_MISMATCH: "make every rank call the same collective at this point (a branch that "
    "differs by rank chose another op)",
    SIZE_MISMATCH: "give every rank the same tensor shape for this collective (pad the "
    "uneven last batch or drop it on every rank)",
    DTYPE_MISMATCH: "give every rank the same dtype for this collective (a cast that "
    "differs by rank)",
    RANK_MISSING: "find why the rank stopped: its own log and exit status, the host's "
    "kernel log (OOM killer, Xid), its stacks",
    STUCK_INSIDE: "check the transport: NCCL_DEBUG=INFO logs, the NICs and links of the "
    "group's hosts, a device in error",
}
#: How sure each kind of answer is: a mismatch is recorded on both sides; a rank behind
#: is one moment of a job that may still have been moving (a straggler); the undecided
#: kinds have none.
_CONFIDENCE = {NOT_ENTERED: 0.8, AHEAD: 0.6, OP_MISMATCH: 0.95, SIZE_MISMATCH: 0.95,
               DTYPE_MISMATCH: 0.95}  # fmt: skip
_NEXT = {
    RANK_MISSING: "collect the missing rank's dump or stacks (faulthandler) and run "
    "`sapper diagnose` again",
    STUCK_INSIDE: "run the group's collective alone (nccl-tests) on the same hosts",
}


def _entry_json(e: Entry | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {"process_group": e.pg, "seq": e.seq, "op": e.op,
            "input_sizes": [list(s) for s in e.in_sizes],
            "output_sizes": [list(s) for s in e.out_sizes],
            "dtypes": list(e.in_dtypes), "state": e.state,
            "completed": e.done}  # fmt: skip


def _doing(v: RankView) -> str:
    """One line: what this member was doing, from the evidence it left."""
    parts = []
    if v.role == "missing":
        parts.append("no dump")
    elif v.role == "behind":
        last = v.last_in_group
        parts.append(f"never entered it; its last collective here was #{last.seq} {last.op} "
                     f"({'completed' if last.done else 'not completed'})"
                     if last else "never entered it, nor any earlier collective here")  # fmt: skip
    elif v.role == "waiting":
        parts.append("waiting in it")
    else:
        parts.append("entered it and it completed on this rank")
    if v.mismatch and v.entry is not None:
        parts.append(f"with {v.entry.op} of {v.entry.sizes_text()} "
                     f"{'/'.join(v.entry.in_dtypes) or ''}".rstrip())  # fmt: skip
    if v.last_elsewhere is not None and v.role == "behind":
        e = v.last_elsewhere
        parts.append(f"last recorded: #{e.seq} {e.op} of group {e.pg}"
                     f"{'' if e.done else ' (not completed: it waits there)'}")  # fmt: skip
    if v.frame is not None:
        where = "now at" if v.frame_source == "faulthandler" else "last collective called from"
        inside = " (inside a torch.distributed call)" if v.in_collective else ""
        parts.append(f"{where} {v.frame.text()}{inside}")
    return "; ".join(parts)


@dataclass
class HangVerdict:
    """What the dumps of one job say."""

    folder: str
    ranks: list[int]
    groups: list[GroupState]
    #: Ranks without a dump that some group counts as a member.
    missing: list[int] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    stacks: int = 0
    #: Rank → its last record when that is a point-to-point op (send/recv) that did not
    #: complete: pipeline stages waiting on each other, which matching does not pair.
    p2p_waiting: dict[int, Entry] = field(default_factory=dict)

    @property
    def stuck(self) -> GroupState | None:
        return next((g for g in self.groups if g.stuck), None)

    @property
    def hung(self) -> bool:
        return self.stuck is not None

    @property
    def empty(self) -> bool:
        """No dump recorded a collective: the recorder was off (buffer 0), or the job
        hung before its first collective; the dumps cannot tell where it is."""
        return not self.groups

    @property
    def p2p_only(self) -> bool:
        """No collective is stuck, but ranks wait in sends/receives: not healthy."""
        return not self.hung and not self.empty and bool(self.p2p_waiting)

    def exit_code(self) -> int:
        return 1 if self.hung or self.empty or self.p2p_only else 0

    @property
    def undecided(self) -> bool:
        g = self.stuck
        return g is not None and g.kind in (RANK_MISSING, STUCK_INSIDE)

    def collective_json(self, g: GroupState) -> dict[str, Any]:
        e = g.expected
        return {
            "process_group": g.pg, "desc": g.desc, "ranks": list(g.ranks),
            "ranks_from": g.ranks_from, "seq": g.seq,
            "op": e.op if e else None,
            "input_sizes": [list(s) for s in e.in_sizes] if e else None,
            "output_sizes": [list(s) for s in e.out_sizes] if e else None,
            "dtypes": list(e.in_dtypes) if e else None,
        }  # fmt: skip

    def evidence(self, g: GroupState) -> list[dict[str, Any]]:
        order = sorted(g.views.values(), key=lambda v: (v.rank not in g.suspects, v.rank))
        out = []
        for v in order[:MAX_EVIDENCE]:
            out.append({
                "rank": v.rank, "role": v.role, "suspect": v.rank in g.suspects,
                "message": _doing(v), "entry": _entry_json(v.entry),
                "last_in_group": _entry_json(v.last_in_group),
                "last_elsewhere": _entry_json(v.last_elsewhere),
                "frame": v.frame.text() if v.frame else None,
                "frame_source": v.frame_source, "in_collective": v.in_collective,
                "mismatch": v.mismatch,
            })  # fmt: skip
        if len(order) > MAX_EVIDENCE:
            roles: dict[str, int] = {}
            for v in order[MAX_EVIDENCE:]:
                roles[v.role] = roles.get(v.role, 0) + 1
            out.append({"rank": None, "role": "more", "suspect": False,
                        "message": f"{len(order) - MAX_EVIDENCE} more ranks: " + ", ".join(
                            f"{n} {role}" for role, n in sorted(roles.items()))})  # fmt: skip
        return out

    def headline(self) -> str:
        g = self.stuck
        if self.empty:
            return ("the dumps hold no collective: the flight recorder was off "
                    "(TORCH_FR_BUFFER_SIZE=0) or the job stopped before its first one")
        if g is None and self.p2p_only:
            ranks = sorted(self.p2p_waiting)
            return (f"no collective is stuck, but rank(s) {', '.join(map(str, ranks[:16]))} "
                    "wait in a point-to-point op (send/recv) that never completed")  # fmt: skip
        if g is None:
            return "no hang: every process group's recorded collectives completed on every rank"
        op = g.expected.op if g.expected else "a collective"
        who = ", ".join(map(str, g.suspects[:16])) + (" …" if len(g.suspects) > 16 else "")
        plural = "s" if len(g.suspects) != 1 else ""
        return {
            NOT_ENTERED: f"rank{plural} {who} never entered {op} #{g.seq} of process group "
            f"{g.pg}; the other ranks wait in it",
            AHEAD: f"rank{plural} {who} called {op} #{g.seq} of process group {g.pg}, which "
            "the other ranks never called",
            OP_MISMATCH: f"rank{plural} {who} called a different collective than {op} at "
            f"#{g.seq} of process group {g.pg}",
            SIZE_MISMATCH: f"rank{plural} {who} called {op} #{g.seq} of process group {g.pg} "
            "with different sizes",
            DTYPE_MISMATCH: f"rank{plural} {who} called {op} #{g.seq} of process group "
            f"{g.pg} with a different dtype",
            RANK_MISSING: f"process group {g.pg} is stuck in {op} #{g.seq}; rank{plural} "
            f"{who} left no dump (the first suspect{plural})",
            STUCK_INSIDE: f"every rank of process group {g.pg} entered {op} #{g.seq} and "
            "it never completed",
        }[g.kind]

    def notes(self, g: GroupState) -> list[str]:
        notes = []
        if g.parted_at is not None:
            notes.append(f"the ranks' records already differ at #{g.parted_at} of this group "
                         f"(ranks {', '.join(map(str, g.parted_ranks[:16]))} off the common "
                         "record): the program's paths parted there")  # fmt: skip
        missing = [r for r in g.missing if r not in g.suspects]
        if missing:
            notes.append(f"no dump from rank(s) {', '.join(map(str, missing[:16]))} of this "
                         "group: they are suspects too")  # fmt: skip
        if g.ranks_from == "inferred":
            notes.append("the group's ranks are inferred from the dumps (the recorder wrote "
                         "no pg_config, as under gloo): a last rank that left no dump is not "
                         "seen")  # fmt: skip
        if g.kind in (NOT_ENTERED, AHEAD):
            notes.append("one dump is one moment: if the job was still making progress, "
                         "the rank is a straggler (X002), not a hang")  # fmt: skip
        others = [x for x in self.groups if x.stuck and x is not g]
        if others:
            notes.append("also stuck: " + "; ".join(
                f"process group {x.pg} at #{x.seq} ({x.kind}, ranks "
                f"{', '.join(map(str, x.suspects[:8]))})" for x in others[:8]))  # fmt: skip
        return notes

    def to_json(self) -> dict[str, Any]:
        g = self.stuck
        causes = []
        if g is not None:
            causes.append({
                "check": "distributed",
                "cause": "unknown" if self.undecided else f"hang-{g.kind}",
                "code": None,
                "title": _TITLES[g.kind],
                "confidence": _CONFIDENCE.get(g.kind),
                "first_step": None,
                "steps_before_symptom": None,
                "evidence": self.evidence(g),
                "explains": ["collective timeout"],
                "fix": _FIXES[g.kind],
                "next_test": _NEXT.get(g.kind, "re-run with the suspect rank's branch "
                                       "logged just before the collective"),
                "notes": [self.headline(), *self.notes(g)],
                "collective": self.collective_json(g),
                "suspects": g.suspects,
                "mismatch": g.kind,
                "missing": g.missing,
            })  # fmt: skip
        if self.empty:
            causes.append(self._empty_json())
        elif self.p2p_only:
            causes.append(self._p2p_json())
        return {
            "causes": causes,
            "considered": [],
            "symptoms": [],
            "summary": {
                "verdict": causes[0]["cause"] if causes else "healthy",
                "check": "distributed",
                "headline": self.headline(),
                "dumps": self.folder,
                "ranks": len(self.ranks),
                "missing_dumps": self.missing,
                "stacks_files": self.stacks,
                "format_versions": self.versions,
                "groups": [{"process_group": x.pg, "desc": x.desc, "ranks": len(x.ranks),
                            "state": x.kind, "seq": x.seq} for x in self.groups[:64]],
            },
        }  # fmt: skip


    def _empty_json(self) -> dict[str, Any]:
        test = ("run again with the recorder on (TORCH_FR_BUFFER_SIZE=2000) and "
                "faulthandler stacks (sapper run writes both)")  # fmt: skip
        return {
            "check": "distributed", "cause": "unknown", "code": None,
            "title": "The flight-recorder dumps hold no collective", "confidence": None,
            "first_step": None, "steps_before_symptom": None,
            "evidence": [{"rank": r, "role": "empty", "suspect": False,
                          "message": "no collective recorded"} for r in self.ranks[:MAX_EVIDENCE]],
            "explains": [], "fix": test, "next_test": test, "notes": [self.headline()],
            "collective": None, "suspects": [], "mismatch": None, "missing": self.missing,
        }  # fmt: skip


    def _p2p_json(self) -> dict[str, Any]:
        test = ("log each pipeline stage's sends and receives (peer, shape) around the last "
                "step; a receive whose send never comes names the stage that stopped")
        evidence = [{"rank": r, "role": "p2p-waiting", "suspect": False,
                     "message": f"waits in {e.op} of group {e.pg} (#{e.seq}, "
                     f"{e.sizes_text()})", "entry": _entry_json(e)}
                    for r, e in sorted(self.p2p_waiting.items())[:MAX_EVIDENCE]]  # fmt: skip
        return {
            "check": "distributed", "cause": "unknown", "code": None,
            "title": "Ranks wait in point-to-point ops that never completed",
            "confidence": None, "first_step": None, "steps_before_symptom": None,
            "evidence": evidence, "explains": ["collective timeout"], "fix": test,
            "next_test": test, "notes": [self.headline(), "sends and receives are not "
                                         "paired across ranks by this analysis"],
            "collective": None, "suspects": [], "mismatch": "p2p", "missing": self.missing,
        }  # fmt: skip


def verdict_of(found: DumpFolder) -> HangVerdict:
    groups = match_groups(found)
    missing = sorted({r for g in groups for r in g.missing})
    versions = sorted({d.version for d in found.dumps.values()})
    p2p = {r: d.last for r, d in found.dumps.items()
           if d.last is not None and d.last.p2p and not d.last.done}  # fmt: skip
    return HangVerdict(found.folder, sorted(found.dumps), groups, missing, versions,
                       len(found.stacks), p2p)  # fmt: skip


def diagnose_hang(folder: Path) -> HangVerdict | None:
    """The hang the flight-recorder dumps under ``folder`` show (a folder or one dump
    file); None when it holds no dumps. InputError for a dump that cannot be read."""
    found = read_folder(folder)
    return None if found is None else verdict_of(found)
