"""Offline analysis at scale: a 1M-step sapper run log through ``sapper analyze`` and
``sapper report``.

Targets (issue 7): analyze a 1M-step JSONL log in under 5 s; the report for 1M steps
under 5 MB; the report opens in headless Chromium in under 2 s. The log is generated
here (a realistic curve with noise, a few spikes and a NaN), read with the same reader
``sapper analyze`` uses, and fed to the monitor's default detectors; the time per
detector is measured on a sample so a slow one can be named. Run::

    python benchmarks/analyze_speed.py [--steps 1000000] [--no-browser]
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

from sapper.cli.analyze_cmd import detectors_for
from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.report.html import build_report_data, write_report
from sapper.runtime.detector import DetectorSet

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=100_000,
                        help="records used to time each detector on its own")
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sapper-bench-"))
    try:
        log_path = work / "run.jsonl"
        _, t_write = timed(lambda: write_log(log_path, args.steps))
        size_mb = log_path.stat().st_size / 1e6

        log, t_read = timed(lambda: read_log(log_path))
        analysis, t_detect = timed(lambda: analyze_log(log, detectors_for(None)))
        t_analyze = t_read + t_detect

        sample = log.records[: args.sample]
        per_detector = []
        for det in detectors_for(None):
            _, t = timed(lambda det=det: DetectorSet([det]).run(sample))
            per_detector.append((type(det).__name__, 1e6 * t.cpu / max(1, len(sample))))

        data, t_data = timed(lambda: build_report_data(analysis))
        report = work / "report.html"
        size, t_render = timed(lambda: write_report(report, data))
        browser = None if args.no_browser else open_in_browser(report)

        rows = [
            ("log", f"{args.steps:,} steps, {size_mb:,.0f} MB JSONL", "", ""),
            ("generate the log", str(t_write), "", ""),
            ("read (parse to records)", str(t_read), "", ""),
            (f"detectors ({len(analysis.findings)} findings)", str(t_detect), "", ""),
            ("analyze = read + detectors", str(t_analyze), "< 5 s",
             "PASS" if t_analyze.cpu < 5 else "FAIL"),
            ("report data (decimate)", str(t_data), "", ""),
            ("report render + write", str(t_render), "", ""),
            ("report size", f"{size / 1e6:.2f} MB", "< 5 MB", "PASS" if size < 5e6 else "FAIL"),
        ]
        if browser is None:
            rows.append(("open in Chromium", "not measured (no chromium/playwright)", "< 2 s", ""))
        else:
            wall, render = browser
            rows.append(("open in Chromium (navigate → drawn)", f"{wall:.2f} s", "< 2 s",
                         "PASS" if wall < 2 else "FAIL"))
            rows.append(("  of which the page's own load + draw", f"{render:.2f} s", "", ""))
        print(f"sapper analyze/report benchmark · python {sys.version.split()[0]} · "
              f"{os.cpu_count()} CPU(s) · load average {os.getloadavg()[0]:.1f} "
              "(time targets judged on CPU time, which a shared machine inflates less)")
        width = max(len(r[0]) for r in rows)
        for name, value, target, verdict in rows:
            print(f"{name:<{width}}  {value:<38} {target:<8} {verdict}")
        print(f"\nper-detector CPU cost on {len(sample):,} records (µs per record; × "
              f"{args.steps:,} for the full log):")
        for name, us in sorted(per_detector, key=lambda x: -x[1]):
            print(f"  {name:<24} {us:8.2f} µs  → {us * args.steps / 1e6:6.2f} s")
        failed = [r for r in rows if r[3] == "FAIL"]
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
