"""One ``sapper run``: read the command, run the checklist, launch, watch, and answer.

The steps, in order: the machine is asked for its GPUs (:mod:`sapper.launch.machine`);
the command is read (:mod:`sapper.launch.command`) and its plan checked
(:mod:`sapper.launch.preflight`); the ledger says whether the plan repeats one that blew
up; an error blocks the launch unless told otherwise; the command runs under the
supervisor with the bootstrap on its children's import path; and its end is read back:
a summary for a healthy run, the post-mortem (:mod:`sapper.pipeline`) for a failed one,
the hang analysis for a hung one. Everything lands in the run folder
(:mod:`sapper.launch.folder`) and a row in the ledger.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.launch import folder as run_folder
from sapper.launch.command import Launch, parse_command
from sapper.launch.preflight import Given, Preflight, plan_inputs, preflight

if TYPE_CHECKING:
    from rich.console import Console

    from sapper.launch.supervise import Outcome

__all__ = ["HUNG_EXIT", "RunOptions", "child_env", "run_launch"]

#: sapper's exit code when it ended a hung job (as ``timeout`` does).
HUNG_EXIT = 124
#: Exit code of a blocked launch.
BLOCKED_EXIT = 1


@dataclass
class RunOptions:
    out: Path | None = None
    no_block: bool = False
    check_only: bool = False
    hang_after: float | None = 600.0
    dump_wait: float = 5.0
    grace: float = 10.0
    ledger: bool = True
    report: bool = True
    #: Plan values the user gives besides the command (--gpu, --model, --config ...).
    given: Given | None = None


def site_dir() -> Path:
    """The folder of the bootstrap (``sitecustomize``) put first on the children's path."""
    import sapper.launch

    return Path(sapper.launch.__file__).parent / "site"


def child_env(run_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: its own, plus sapper's variables; the flight
    recorder's settings only where the user has not set them."""
    env = dict(os.environ if base is None else base)
    fr = str(run_dir / "fr" / "rank_")
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(site_dir()) + (os.pathsep + path if path else "")
    env["SAPPER_RUN_DIR"] = str(run_dir)
    env["SAPPER_RUN_COMMAND"] = "1"
    for key, value in (
        ("TORCH_FR_BUFFER_SIZE", "2000"),
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"),
        ("TORCH_FR_DUMP_TEMP_FILE", fr),
        ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", fr),
        ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
        # Output is copied through a pipe: Python would buffer it in blocks, not lines.
        ("PYTHONUNBUFFERED", "1"),
    ):
        env.setdefault(key, value)
    return env


def _node_rank(launch: Launch) -> int:
    """Which node of a multi-node job this ``sapper run`` is: the launcher's
    ``--node-rank``/``--machine_rank``, else Slurm's or the launcher's variables."""
    if launch.node_rank is not None:
        return launch.node_rank
    for name in ("SLURM_NODEID", "NODE_RANK", "GROUP_RANK"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def _say(console: Console, text: str, style: str = "bold") -> None:
    from sapper.report.safe import safe_markup

    console.print(f"[{style}]sapper:[/] {safe_markup(text)}", highlight=False, soft_wrap=True)


class _Machine:
    """The machine's torch and GPUs, asked in the background from the start: a command
    with nothing to check (``python -c ...``) never waits for the answer before it
    starts; one with a plan waits, since the checklist needs the GPU."""

    def __init__(self) -> None:
        import threading

        from sapper.launch.machine import probe

        self.info: dict[str, Any] = {}
        self._thread = threading.Thread(target=lambda: self.info.update(probe()), daemon=True)
        self._thread.start()

    def wait(self) -> dict[str, Any]:
        self._thread.join()
        return self.info

    def gpu(self) -> tuple[int | None, str | None, str]:
        """(GPU count, table name of the first GPU, its origin), waiting for the probe."""
        from sapper.launch.machine import match_gpu

        gpus = self.wait().get("gpus") or []
        if not gpus:
            return None, None, "this machine"
        first = gpus[0]
        name = match_gpu(str(first.get("name", "")), first.get("memory_gib"))
        return len(gpus), name, f"this machine: {first.get('name')}"


def _show_preflight(console: Console, pre: Preflight, launch: Launch) -> None:
    from sapper.report.terminal import render_check_report

    if pre.report is not None:
        _say(console, "pre-flight checklist of " + ", ".join(pre.sources))
        console.print(render_check_report(pre.report))
    else:
        _say(console, f"pre-flight: no checklist ({pre.skipped})", "yellow")
    for note in launch.notes:
        _say(console, f"note: {note}", "dim")


def _ledger_matches(console: Console, pre: Preflight, opts: RunOptions) -> list[dict[str, Any]]:
    if not opts.ledger or pre.loaded is None:
        return []
    from sapper.launch.ledger import fingerprint, matches

    found = matches(fingerprint(pre.loaded.plan))
    for m in found:
        _say(console, m.line(), "yellow")
    return [m.to_json() for m in found]


def run_launch(argv: list[str], opts: RunOptions, console: Console,
               err_console: Console | None = None) -> int:
    """Run ``argv`` under sapper; sapper's exit code."""
    err = err_console or console
    cwd = Path.cwd()
    machine = _Machine()
    launch = parse_command(argv, cwd)
    if plan_inputs(launch, cwd, given=opts.given) is not None:  # a checklist will run
        count, gpu, gpu_origin = machine.gpu()
        launch = parse_command(argv, cwd, machine_gpus=count)
        pre = preflight(launch, cwd, gpu, gpu_origin, opts.given)
    else:
        pre = preflight(launch, cwd)
    _show_preflight(console, pre, launch)
    history = _ledger_matches(console, pre, opts)
    blocked = pre.errors > 0 and not opts.no_block
    if opts.check_only:
        return BLOCKED_EXIT if pre.errors else 0
    run_dir = run_folder.make(opts.out, launch.name, cwd)
    node = _node_rank(launch)
    started = time.time()
    run_folder.write_start(run_dir, argv, cwd, pre, node)
    if blocked:
        _say(err, f"the launch is blocked: {pre.errors} pre-flight error(s) above; the "
             "program was not started. Fix them, or run again with --no-block to launch "
             "anyway.", "bold red")
        doc = run_folder.summary(argv, cwd, BLOCKED_EXIT, None, "blocked", started,
                                 time.time(), pre, history=history)
        first = next((f for f in pre.report.findings if f.severity.value == "error"), None) \
            if pre.report is not None else None
        cause = first.code if first is not None else None
        _finish(err, run_dir, doc, pre, opts, cause, "preflight" if cause else None, machine,
                node)
        return BLOCKED_EXIT
    if machine.info:
        run_folder.write_env(run_dir, machine.info, node)
    if pre.errors:
        _say(err, f"--no-block: launching despite {pre.errors} pre-flight error(s)", "yellow")
    from sapper.launch.supervise import Supervisor

    def on_hang(stalled: float) -> None:
        _say(err, f"no rank made step progress for {stalled:.0f} s: asking every rank for "
             "its stacks and flight-recorder dump, then ending the job", "bold red")

    sup = Supervisor(
        argv, env=child_env(run_dir), cwd=cwd, run_dir=run_dir,
        hang_after=opts.hang_after, dump_wait=opts.dump_wait, grace=opts.grace,
        on_hang=on_hang, console_name=run_folder.node_name("console.log", node),
    )
    try:
        out = sup.run()
    except FileNotFoundError as exc:
        _say(err, f"cannot start {argv[0]!r}: {exc.strerror or 'not found'}", "bold red")
        doc = run_folder.summary(argv, cwd, 127, None, "failed", started, time.time(), pre,
                                 history=history)
        _finish(err, run_dir, doc, pre, opts, None, None, machine, node)
        return 127
    return _after(console, err, run_dir, argv, cwd, launch, pre, out, opts, history, machine,
                  node)


def _after(console: Console, err: Console, run_dir: Path, argv: list[str], cwd: Path,
           launch: Launch, pre: Preflight, out: Outcome, opts: RunOptions,
           history: list[dict[str, Any]], machine: _Machine, node: int) -> int:
    """Read the run back and answer: summary, post-mortem or hang analysis."""
    from sapper.report.safe import safe_markup

    code = HUNG_EXIT if out.outcome == "hung" else out.exit_code
    post = _post_mortem(run_dir, pre)
    hang = None
    if out.outcome == "hung" or (out.outcome == "failed" and _has_dumps(run_dir / "fr")):
        from sapper.launch.hang import analyze_hang

        hang = analyze_hang(run_dir, out.stalled_s, out.last_steps, launch.world_size)
    diag_json = post.get("diagnosis")
    report_path = None
    if opts.report and post.get("analysis") is not None and (
        out.outcome != "ok" or diag_json is not None
    ):
        report_path = _html_report(run_dir, post, pre, err)
    console_log = run_dir / run_folder.node_name("console.log", node)
    error = _last_error(console_log) if out.outcome == "failed" else None
    doc = run_folder.summary(
        argv, cwd, code, out.exit_code, out.outcome, out.started, out.ended, pre,
        findings=post.get("findings", []), diagnosis=diag_json, hang=hang,
        history=history, report=report_path, steps=post.get("steps"),
        tokens=_throughput(post, launch, pre), notes=post.get("notes", []),
        forwarded=out.forwarded, error=error,
    )
    console.print()
    if out.outcome == "ok":
        _print_healthy(console, doc, troubled=diag_json is not None)
    if out.outcome != "ok" or diag_json is not None:  # else the summary is the answer
        if out.outcome != "ok":
            how = "was interrupted" if out.outcome == "interrupted" else out.outcome
            _say(console, f"the run {how} (exit {out.exit_code})"
                 + (f"; sapper exits {code}" if code != out.exit_code else ""), "bold red")
        if hang is not None:
            _say(console, "hang: " + hang["summary"], "bold red")
            headline = _fr_headline(hang.get("flight_recorder"))
            if headline:
                _say(console, f"flight recorder: {headline}", "bold red")
        if post.get("diagnosis_obj") is not None and diag_json is not None:
            from sapper.report.diagnosis import render_diagnosis

            console.print(render_diagnosis(post["diagnosis_obj"]))
        if error is not None:
            _say(console, f"last error in the console: {error}", "bold red")
        if diag_json is None and post.get("steps"):  # (with one, it is the answer above)
            last = max((v for v in post["steps"].values() if v is not None), default=None)
            _say(console, "the run logs show no blow-up"
                 + (f" up to step {last:,}" if last is not None else "")
                 + ": the cause is outside the training numerics (see console.log)", "yellow")
        elif diag_json is None:
            _say(console, "no run log was written under logs/: nothing to diagnose (the "
                 "monitor attaches in Python processes that train with torch)", "yellow")
        for note in post.get("notes", []):
            _say(console, note, "yellow")
        if report_path is not None:
            console.print(f"report: {safe_markup(str(report_path))}", highlight=False)
    first = (diag_json or {}).get("causes") or []
    if hang is not None:
        first = (hang.get("flight_recorder") or {}).get("causes") or first
    cause = first[0].get("cause") if first else ("hang" if out.outcome == "hung" else None)
    check = first[0].get("check") if first else ("distributed" if out.outcome == "hung" else None)
    _finish(console, run_dir, doc, pre, opts, cause, check, machine, node)
    return code


#: A Python exception's last traceback line (``RuntimeError: CUDA out of memory ...``),
#: torchrun's ``[rank1]: ...`` prefix allowed.
_ERROR_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Halt)"
    r"(?::.*)?)$"
)


def _last_error(console_log: Path) -> str | None:
    """The last exception line the program printed (from the end of console.log)."""
    try:
        with console_log.open("rb") as fh:
            fh.seek(max(0, console_log.stat().st_size - (64 << 10)))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        m = _ERROR_LINE.match(line.strip())
        if m:
            return m.group(1)[:300]
    return None


def _fr_headline(verdict: Any) -> str | None:
    """The one line of the flight-recorder verdict (its summary's headline)."""
    if not isinstance(verdict, dict):
        return None
    summary = verdict.get("summary")
    if isinstance(summary, dict) and isinstance(summary.get("headline"), str):
        return summary["headline"]
    causes = verdict.get("causes") or []
    if causes and isinstance(causes[0], dict) and isinstance(causes[0].get("title"), str):
        return causes[0]["title"]
    return None


def _has_dumps(folder: Path) -> bool:
    """Whether the job left flight-recorder dumps (its own collective timeout)."""
    try:
        return any(p.is_file() and p.stat().st_size > 0 for p in folder.iterdir())
    except OSError:
        return False


def _post_mortem(run_dir: Path, pre: Preflight) -> dict[str, Any]:
    """The run logs read and diagnosed as ``sapper diagnose RUN_DIR`` would."""
    logs = run_dir / "logs"
    try:
        if not any(p.stat().st_size > 0 for p in logs.glob("*.jsonl")):
            return {}
    except OSError:
        return {}
    from sapper.errors import InputError
    from sapper.pipeline.run import diagnose_run, read_run

    try:
        run = read_run([logs])
        diagnosis, analyses, _ = diagnose_run(run, pre.loaded)
    except InputError as exc:
        return {"notes": [f"the run logs could not be read: {exc}"]}
    doc = diagnosis.to_json()
    healthy = doc["summary"]["verdict"] == "healthy"
    steps = {
        Path(a.log.path).name: (a.log.records[-1].step if a.log.records else None)
        for a in analyses if a.log.format != "sapper-ranks"
    }
    per_log = [a for a in analyses if a.log.format != "sapper-ranks"]
    return {
        "diagnosis": None if healthy else doc,
        "diagnosis_obj": diagnosis,
        "analysis": per_log[0] if per_log else None,
        "analyses": per_log,
        "findings": [f.to_json() for a in analyses for f in a.findings],
        "steps": steps,
        "notes": [f"{e.file}: {e}" for e in run.failed],
    }


def _throughput(post: dict[str, Any], launch: Launch, pre: Preflight) -> dict[str, Any]:
    """Measured tokens/s of the job (each rank's median, summed) against the plan's."""
    medians = []
    for a in post.get("analyses", []):
        values = [r.tokens_per_s for r in a.log.records if r.tokens_per_s]
        if values:
            medians.append(statistics.median(values[len(values) // 2:]))
    measured = None
    how = None
    if medians:
        measured = sum(medians)
        how = f"{len(medians)} rank log(s), the median of each over its second half, summed"
        ws = launch.world_size
        if len(medians) == 1 and ws and ws > 1:
            measured, how = medians[0] * ws, f"one rank's median × {ws} ranks"
    return {"measured": measured, "predicted": pre.predicted_tokens_per_s(), "how": how}


def _html_report(run_dir: Path, post: dict[str, Any], pre: Preflight, err: Console) -> Path | None:
    from sapper.report.html import build_report_data, write_report

    plan = pre.loaded.plan if pre.loaded is not None else None
    path = run_dir / "report.html"
    try:
        data = build_report_data(
            post["analysis"], plan=plan, checklist=pre.report,
            expected_tokens_per_s=pre.predicted_tokens_per_s(),
            title=f"sapper run {run_dir.name}", diagnosis=post.get("diagnosis"),
        )
        write_report(path, data)
    except OSError as exc:
        _say(err, f"could not write {path} ({exc.strerror})", "yellow")
        return None
    return path


def _print_healthy(console: Console, doc: dict[str, Any], troubled: bool = False) -> None:
    """The one screen of a run that exited 0: steps, findings, throughput against the
    plan. ``troubled``: its logs still show a problem (the diagnosis follows)."""
    steps = doc.get("steps") or {}
    last = [s for s in steps.values() if s is not None]
    counts: dict[str, int] = {}
    for f in doc.get("findings", []):
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    took = doc["ended"] - doc["started"]
    if last:
        ended = "ended (exit 0)" if troubled else "ended well (exit 0)"
        _say(console, f"the run {ended} in {took:,.0f} s: {max(last):,} steps "
             f"over {len(steps)} run log(s); findings: {counts.get('error', 0)} error(s), "
             f"{counts.get('warning', 0)} warning(s), {counts.get('info', 0)} info"
             + ("; its logs show a problem, diagnosed below" if troubled else ""),
             "bold yellow" if troubled else "bold green")
    else:
        _say(console, f"the program ended with exit 0 in {took:,.0f} s (no run log: no "
             "training steps were monitored)", "bold green")
    tokens = doc.get("tokens") or {}
    if tokens.get("measured") is not None:
        line = f"throughput: {tokens['measured']:,.0f} tokens/s measured"
        if tokens.get("predicted"):
            ratio = tokens["measured"] / tokens["predicted"]
            line += f" vs {tokens['predicted']:,.0f} predicted by the plan ({ratio:.0%})"
        _say(console, line)
    if troubled:
        return  # the diagnosis that follows names the findings that matter
    for f in doc.get("findings", [])[:5]:
        if f["severity"] in ("error", "warning"):
            _say(console, f"{f['code']} {f['title']}: {f['message']}", "yellow")


def _finish(console: Console, run_dir: Path, doc: dict[str, Any], pre: Preflight,
            opts: RunOptions, cause: str | None, check: str | None,
            machine: _Machine, node: int = 0) -> None:
    """env.json if not yet written, run.json, then the ledger row (node 0's: one row a
    run); a ledger that cannot take it is one warning."""
    if not (run_dir / run_folder.node_name("env.json", node)).exists():
        run_folder.write_env(run_dir, machine.wait(), node)
    doc["node"] = node
    run_folder.write_json(run_dir / run_folder.node_name("run.json", node), doc)
    if opts.ledger and not node:
        from sapper.launch.ledger import LedgerError, add_run, fingerprint

        try:
            add_run(outcome=doc["outcome"], run_dir=run_dir, command=doc["command_line"],
                    fingerprint=fingerprint(pre.loaded.plan if pre.loaded else None),
                    cause=cause, check=check)
        except LedgerError as exc:
            _say(console, f"warning: {exc}; the run is not in the ledger", "yellow")
    _say(console, f"run folder: {run_dir}", "dim")
    sys.stdout.flush()
