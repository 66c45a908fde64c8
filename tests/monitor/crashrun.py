"""A fork server of tiny monitored training runs, for the crash-safety tests.

It imports torch, transformers and sapper once (seconds), then reads one JSON spec per
line on stdin and forks a child per spec that trains a tiny GPT-2 with the monitor and
a run log. Lines on stdout (each one ``write``, so children and server never tear each
other's lines):

    P <id> <pid>              a child started
    S <id> <step> <unix time> the child's mon.step(loss) for <step> returned
    Z <id>                    the child stalls (sleeps) from here on
    U <id>                    the child's own SIGTERM handler ran
    X <id> <exit code>        the child ended (negative: killed by that signal)

Spec keys: ``id``, ``run_log``, ``steps``, ``sleep`` (seconds between steps),
``stall_after`` (a step), ``user_handler`` (install a SIGTERM handler that exits 3
before building the monitor).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from typing import Any

import torch
from tinytrain import Markov, gpt2

from sapper.monitor import Monitor


def say(text: str) -> None:
    os.write(1, (text + "\n").encode())


def train(spec: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    ident = spec["id"]
    if spec.get("user_handler"):

        def handler(signum: int, frame: object) -> None:
            say(f"U {ident}")
            sys.exit(3)

        signal.signal(signal.SIGTERM, handler)
    model = gpt2(hidden=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = Monitor(model, opt, console=False, run_log=spec["run_log"])
    data = Markov(batch=4, seq=16)
    for step in range(spec.get("steps", 10_000)):
        x = next(data)
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.step(out.loss)
        say(f"S {ident} {step} {time.time():.6f}")
        if step == spec.get("stall_after"):
            say(f"Z {ident}")
            time.sleep(3600)
        time.sleep(spec.get("sleep", 0.0))
    # no mon.close(): the exit paths must do it


def child(spec: dict[str, Any]) -> None:
    code = 0
    try:
        train(spec)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    atexit._run_exitfuncs()  # what the interpreter does at exit; then leave at once
    os._exit(code)


def main() -> None:
    for line in sys.stdin:
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            child(spec)
        say(f"P {spec['id']} {pid}")
        _, status = os.waitpid(pid, 0)
        say(f"X {spec['id']} {os.waitstatus_to_exitcode(status)}")


if __name__ == "__main__":
    main()
