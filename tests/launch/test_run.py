"""``sapper run`` end to end, on real programs: transparent for a program that does not
train, exit codes and signals passed through, a blocked launch that never starts the
program, a crash diagnosed, a hang named, and the run folder read back by ``diagnose``
and ``report``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAPPER = str(Path(sys.executable).parent / "sapper")
LOOP = str(Path(__file__).parent / "programs" / "train_loop.py")
BROKEN = ROOT / "examples" / "plans" / "broken-postln-no-warmup.yaml"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["SAPPER_HOME"] = str(tmp_path / "home")
    e.pop("CUDA_VISIBLE_DEVICES", None)
    return e


def sapper(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 180):
    return subprocess.run([SAPPER, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def run_json(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


def test_a_program_that_does_not_train_is_transparent(tmp_path: Path, env) -> None:
    done = sapper(["run", "--out", "r", "--", sys.executable, "-c", "print(1)"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1\n"  # sapper speaks on stderr only
    doc = run_json(tmp_path / "r")
    assert (doc["outcome"], doc["exit_code"], doc["diagnosis"]) == ("ok", 0, None)
    assert doc["command"] == [sys.executable, "-c", "print(1)"]
    assert (tmp_path / "r" / "console.log").read_text() == "1\n"
    envjson = json.loads((tmp_path / "r" / "env.json").read_text())
    assert envjson["python"] and "variables" in envjson


def test_the_child_sees_the_bootstrap_contract(tmp_path: Path, env) -> None:
    code = ("import os, json; print(json.dumps({k: os.environ.get(k) for k in "
            "('SAPPER_RUN_DIR', 'SAPPER_RUN_COMMAND', 'TORCH_FR_DUMP_TEMP_FILE', "
            "'TORCH_NCCL_TRACE_BUFFER_SIZE', 'PYTHONPATH')}))")
    env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "7"  # the user's own setting stays
    done = sapper(["run", "--out", "r", "--", sys.executable, "-c", code], env, tmp_path)
    seen = json.loads(done.stdout)
    run_dir = str((tmp_path / "r").resolve())
    assert seen["SAPPER_RUN_DIR"] == run_dir and seen["SAPPER_RUN_COMMAND"] == "1"
    assert seen["TORCH_FR_DUMP_TEMP_FILE"] == run_dir + "/fr/rank_"
    assert seen["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "7"
    assert seen["PYTHONPATH"].split(os.pathsep)[0].endswith("sapper/launch/site")


def test_exit_code_passes_through(tmp_path: Path, env) -> None:
    done = sapper(["run", "--out", "r", "--", sys.executable, "-c", "raise SystemExit(3)"],
                  env, tmp_path)
    assert done.returncode == 3
    assert (run_json(tmp_path / "r")["outcome"], run_json(tmp_path / "r")["exit_code"]) == (
        "failed", 3)


def test_a_death_by_signal_is_128_plus_n(tmp_path: Path, env) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    done = sapper(["run", "--out", "r", "--", sys.executable, "-c", code], env, tmp_path)
    assert done.returncode == 143
    assert run_json(tmp_path / "r")["program_exit_code"] == 143


def test_sigint_is_forwarded_to_the_job(tmp_path: Path, env) -> None:
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, lambda *a: sys.exit(42))\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([SAPPER, "run", "--out", "r", "--", sys.executable, "-c", code],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 42  # the program's own answer to Ctrl-C
    doc = run_json(tmp_path / "r")
    assert (doc["outcome"], doc["signals"]) == ("interrupted", ["SIGINT"])


def test_a_preflight_error_blocks_the_launch(tmp_path: Path, env) -> None:
    marker = tmp_path / "started"
    code = f"open({str(marker)!r}, 'w').close()"
    cmd = [sys.executable, "-c", code]
    # The program names its config with --config, as a script would.
    script = tmp_path / "train.py"
    script.write_text(code + "\n")
    cmd = [sys.executable, str(script), "--config", str(BROKEN)]
    done = sapper(["run", "--out", "r", "--", *cmd], env, tmp_path)
    assert done.returncode == 1
    assert not marker.exists()
    assert "--no-block" in done.stderr and "N401" in done.stderr
    doc = run_json(tmp_path / "r")
    assert doc["outcome"] == "blocked" and doc["preflight"]["summary"]["errors"] >= 1
    done = sapper(["run", "--out", "r2", "--no-block", "--", *cmd], env, tmp_path)
    assert done.returncode == 0 and marker.exists()
    listed = sapper(["runs", "--format", "json"], env, tmp_path)
    outcomes = [r["outcome"] for r in json.loads(listed.stdout)["runs"]]
    assert outcomes == ["ok", "blocked"]
    blocked = sapper(["runs", "--outcome", "blocked", "--format", "json"], env, tmp_path)
    assert [r["cause"] for r in json.loads(blocked.stdout)["runs"]] == ["N401"]


def test_check_only_stops_after_the_checklist(tmp_path: Path, env) -> None:
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    done = sapper(["run", "--check-only", "--", sys.executable, str(script), "--config",
                   str(ROOT / "examples/plans/healthy-llama-7b.yaml")], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "precision" in done.stdout and not marker.exists()
    assert not (tmp_path / "runs").exists()


def test_a_missing_ledger_home_never_stops_a_run(tmp_path: Path, env) -> None:
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("x")
    env["SAPPER_HOME"] = str(blocker)
    done = sapper(["run", "--out", "r", "--", sys.executable, "-c", "print(1)"], env, tmp_path)
    assert done.returncode == 0 and done.stdout == "1\n"
    assert "not in the ledger" in done.stderr


@pytest.mark.slow
def test_a_crash_is_diagnosed(tmp_path: Path, env) -> None:
    done = sapper(["run", "--out", "r", "--", sys.executable, LOOP, "40", "--nan-at", "15"],
                  env, tmp_path)
    assert done.returncode == 1
    doc = run_json(tmp_path / "r")
    assert doc["outcome"] == "failed"
    assert doc["diagnosis"] is not None
    codes = {s["code"] for s in doc["diagnosis"]["symptoms"]}
    assert "R001" in codes  # the non-finite loss the planted fault makes
    assert doc["error"].startswith("RuntimeError: loss is")
    assert Path(doc["report"]).is_file()
    # the run folder as a whole, read by diagnose and report
    again = sapper(["diagnose", "r", "--format", "json"], env, tmp_path)
    assert again.returncode == 1
    def said(d: dict) -> list:
        return [(s["code"], s["step"], s["message"]) for s in d["symptoms"]]

    assert said(json.loads(again.stdout)) == said(doc["diagnosis"])
    page = sapper(["report", "r", "-o", "page.html"], env, tmp_path)
    assert page.returncode == 0, page.stderr
    assert (tmp_path / "page.html").is_file()


@pytest.mark.slow
def test_a_healthy_run_is_summarised(tmp_path: Path, env) -> None:
    done = sapper(["run", "--out", "r", "--", sys.executable, LOOP, "20"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    doc = run_json(tmp_path / "r")
    assert (doc["outcome"], doc["diagnosis"], doc["hang"]) == ("ok", None, None)
    assert doc["steps"] == {"rank0.jsonl": 19}
    assert "ended well" in done.stderr and "rank 0 done" in done.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_a_hang_names_the_rank(tmp_path: Path, env) -> None:
    started = time.monotonic()
    done = sapper(["run", "--out", "r", "--hang-after", "5", "--", sys.executable, "-m",
                   "torch.distributed.run", "--nproc-per-node", "2", LOOP, "100000",
                   "--gloo", "--hang-rank", "1", "--hang-at", "6"], env, tmp_path, timeout=240)
    assert done.returncode == 124, done.stderr[-3000:]
    doc = run_json(tmp_path / "r")
    assert doc["outcome"] == "hung"
    hang = doc["hang"]
    assert hang["suspects"] == [1]
    assert "train_loop.py" in hang["stacks"]["1"]["frame"]
    assert hang["stacks"]["0"]["in_collective"] is True
    assert time.monotonic() - started < 200


def test_a_command_that_cannot_start_is_127(tmp_path: Path, env) -> None:
    done = sapper(["run", "--out", "r", "--", "sapper-no-such-program-here"], env, tmp_path)
    assert done.returncode == 127 and "cannot start" in done.stderr
    doc = run_json(tmp_path / "r")
    assert (doc["outcome"], doc["program_exit_code"]) == ("failed", None)


def test_an_unknown_gpu_name_is_an_input_error(tmp_path: Path, env) -> None:
    done = sapper(["run", "--gpu", "Z100", "--", sys.executable, "-c", "print(1)"], env,
                  tmp_path)
    assert done.returncode == 2 and "--gpu" in done.stderr and done.stdout == ""


def test_another_node_writes_its_own_files_into_the_shared_folder(tmp_path: Path,
                                                                  env) -> None:
    env["NODE_RANK"] = "1"
    done = sapper(["run", "--out", "shared", "--", sys.executable, "-c", "print(1)"], env,
                  tmp_path)
    assert done.returncode == 0
    folder = tmp_path / "shared"
    assert not (folder / "run.json").exists()
    assert json.loads((folder / "run-node1.json").read_text())["node"] == 1
    assert (folder / "console-node1.log").read_text() == "1\n"
    assert (folder / "env-node1.json").is_file()
    listed = sapper(["runs", "--format", "json"], env, tmp_path)
    assert json.loads(listed.stdout)["runs"] == []  # node 0 records the run


#: A rank that logs two steps, then blocks without ever answering the dump trigger (no
#: torch: the bootstrap's trigger thread never starts); like the bootstrap, it registers
#: faulthandler for SIGUSR1 into an empty stack file named after its rank and pid.
_STUCK = """
import faulthandler, json, os, signal, time
run = os.environ["SAPPER_RUN_DIR"]
os.makedirs(f"{run}/stacks", exist_ok=True)
out = open(f"{run}/stacks/rank0-{os.getpid()}.txt", "a")
faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
with open(f"{run}/logs/rank0.jsonl", "a") as log:
    for step in range(2):
        log.write(json.dumps({"kind": "step", "step": step, "loss": 1.0}) + "\\n")
        log.flush()
def stuck_in_io():
    time.sleep(600)
stuck_in_io()
"""


@pytest.mark.slow
def test_sigusr1_gets_the_stacks_of_a_rank_that_does_not_answer(tmp_path: Path,
                                                                 env) -> None:
    done = sapper(["run", "--out", "r", "--hang-after", "1", "--", sys.executable, "-c",
                   _STUCK], env, tmp_path, timeout=120)
    assert done.returncode == 124, done.stderr
    hang = run_json(tmp_path / "r")["hang"]
    assert hang["stacks"]["0"]["frame"].endswith("in stuck_in_io")


def test_a_run_folder_that_cannot_be_made_is_an_input_error(tmp_path: Path, env) -> None:
    (tmp_path / "taken").write_text("a file")
    done = sapper(["run", "--out", "taken", "--", sys.executable, "-c", "print(1)"], env,
                  tmp_path)
    assert done.returncode == 2 and "--out" in done.stderr and done.stdout == ""


@pytest.mark.slow
def test_the_summary_sets_measured_tokens_against_the_plan(tmp_path: Path, env) -> None:
    lm = str(Path(__file__).parent / "programs" / "tiny_lm.py")
    plan = str(ROOT / "examples/plans/healthy-llama-7b.yaml")
    done = sapper(["run", "--out", "r", "--config", plan, "--", sys.executable, lm, "40"],
                  env, tmp_path)
    assert done.returncode == 0, done.stderr
    tokens = run_json(tmp_path / "r")["tokens"]
    assert tokens["measured"] > 0 and tokens["predicted"] > 0
    assert "tokens/s measured vs" in done.stderr
