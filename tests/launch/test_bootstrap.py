"""``sapper run``'s bootstrap on real programs whose code knows nothing of sapper.

Each program runs as a child process with the environment ``sapper run`` gives it
(``SAPPER_RUN_DIR``, ``SAPPER_RUN_COMMAND`` and the bootstrap's folder first on
``PYTHONPATH``); the test reads what landed in the run folder.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sapper
from sapper.runtime.runlog import read_runlog

SITE = Path(sapper.__file__).parent / "launch" / "site"
PROGRAMS = Path(__file__).with_name("bootstrap_programs")
#: What a bootstrap that switched itself off prints, once.
OFF = "sapper: bootstrap off ("


def bootstrap_env(run_dir: Path, *, pythonpath: list[Path] = (), **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        SAPPER_RUN_DIR=str(run_dir),
        SAPPER_RUN_COMMAND="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    paths = [str(SITE), *map(str, pythonpath)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def run(
    args: list[str], run_dir: Path, *, expect_off: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        args,
        env=bootstrap_env(run_dir, **env),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=run_dir.parent,
        check=False,
    )
    if not expect_off:
        assert OFF not in proc.stderr, proc.stderr
    return proc


def program(name: str) -> str:
    return str(PROGRAMS / name)


def serious(path: Path) -> list[str]:
    """Codes of the warnings and errors in a run log."""
    return sorted(
        {f.code for f in read_runlog(path).findings if f.severity.value in ("warning", "error")}
    )


# ---- transparent where nothing trains --------------------------------------------------
def test_a_program_without_torch_is_untouched(tmp_path: Path) -> None:
    code = "import sys; print(1); print('torch' in sys.modules, 'sapper' in sys.modules)"
    proc = run([sys.executable, "-c", code], tmp_path / "run")
    assert proc.returncode == 0
    assert proc.stdout.split() == ["1", "False", "False"]
    assert proc.stderr == ""
    assert not (tmp_path / "run").exists()  # nothing written for a process that never trains


def test_the_users_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    code = (
        "import os, sys, sitecustomize\n"
        "print(os.environ.get('USER_SITE_RAN'), sitecustomize.__file__)\n"
        "print(any(type(f).__name__ == '_SapperFinder' for f in sys.meta_path))\n"
    )
    proc = run([sys.executable, "-c", code], tmp_path / "run", pythonpath=[user])
    assert proc.returncode == 0, proc.stderr
    ran, where, finder = proc.stdout.split()
    assert ran == "yes" and Path(where) == user / "sitecustomize.py"
    assert finder == "True"


def test_without_a_run_folder_the_bootstrap_does_nothing(tmp_path: Path) -> None:
    code = "import sys; print(any(type(f).__name__ == '_SapperFinder' for f in sys.meta_path))"
    proc = run([sys.executable, "-c", code], tmp_path / "run", SAPPER_RUN_DIR="")
    assert proc.returncode == 0 and proc.stdout.split() == ["False"]


@pytest.mark.slow
def test_a_broken_bootstrap_says_one_line_and_the_program_goes_on(tmp_path: Path) -> None:
    """The run folder cannot be made (a file stands at its path): one line, the run goes
    on and ends as it would have."""
    blocker = tmp_path / "run"
    blocker.write_text("not a folder")
    proc = run([sys.executable, program("own_monitor.py")], blocker, expect_off=True)
    assert proc.returncode == 0, proc.stderr
    assert "steps 30" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("sapper:")]
    assert len(lines) == 1 and lines[0].startswith(OFF), proc.stderr


# ---- Hugging Face Trainer ------------------------------------------------------------
@pytest.mark.slow
def test_hf_trainer_fault_is_found_without_touching_the_script(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    run_dir = tmp_path / "run"
    proc = run(
        [sys.executable, program("hf_train.py"), "--out", str(tmp_path / "out"), "--lr", "1e3"],
        run_dir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = run_dir / "logs" / "rank0.jsonl"
    read = read_runlog(log)
    assert read.metas and read.metas[0]["framework"] == "hf-trainer"
    assert [r.step for r in read.steps] == list(range(1, 41))
    # The loss leaves its level at once (LR 1e3): a spike, and the gradient norm surges.
    assert {"R002", "R013"} <= set(serious(log)), serious(log)
    assert "R002" in proc.stderr  # and it was said live, on the console


@pytest.mark.slow
def test_hf_trainer_healthy_run_is_quiet(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    run_dir = tmp_path / "run"
    proc = run([sys.executable, program("hf_train.py"), "--out", str(tmp_path / "out")], run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = run_dir / "logs" / "rank0.jsonl"
    read = read_runlog(log)
    assert len(read.steps) == 40 and len(read.metas) == 1
    assert read.steps[-1].loss < read.steps[0].loss
    assert serious(log) == []


# ---- Lightning -------------------------------------------------------------------------
@pytest.mark.slow
def test_lightning_trainer_gets_the_callback(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    run_dir = tmp_path / "run"
    proc = run([sys.executable, program("lightning_train.py")], run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = run_dir / "logs" / "rank0.jsonl"
    read = read_runlog(log)
    assert read.metas[0]["framework"] == "lightning"
    assert [r.step for r in read.steps] == list(range(1, 41))
    assert read.steps[-1].loss < read.steps[0].loss / 5
    assert serious(log) == []


# ---- plain loops -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.distributed
def test_plain_loop_under_torchrun_writes_a_log_per_rank(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           program("plain_ddp.py")]  # fmt: skip
    proc = run(cmd, run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        log = run_dir / "logs" / f"rank{rank}.jsonl"
        read = read_runlog(log)
        assert read.metas[0]["rank"] == rank and read.metas[0]["model"] == "DistributedDataParallel"
        steps = read.steps
        assert [r.step for r in steps] == list(range(30))
        # the loss the loop gave backward, and the optimizer's side of each step
        assert all(r.loss is not None and r.grad_norm is not None and r.lr == 0.2 for r in steps)
        assert steps[-1].loss < steps[0].loss / 5
        assert serious(log) == []
    # the launcher's own process trains nothing: no stack file of its own
    stacks = sorted(p.name.split("-")[0] for p in (run_dir / "stacks").glob("*.txt"))
    assert stacks == ["rank0", "rank1"]


@pytest.mark.slow
def test_a_program_with_its_own_monitor_gets_no_second_one(tmp_path: Path) -> None:
    """sapper.Monitor in the program: nothing added, and its log (it names none) goes
    to the run folder, one writer, each step once."""
    run_dir = tmp_path / "run"
    proc = run([sys.executable, program("own_monitor.py")], run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "steps 30" in proc.stdout
    logs = list((run_dir / "logs").iterdir())
    assert [p.name for p in logs] == ["rank0.jsonl"]
    read = read_runlog(logs[0])
    assert len(read.metas) == 1
    assert [r.step for r in read.steps] == list(range(30))


# ---- dumps on request ------------------------------------------------------------------
def _wait_for(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.1)


def _stack_text(run_dir: Path, rank: int) -> str:
    return "".join(p.read_text() for p in (run_dir / "stacks").glob(f"rank{rank}-*.txt"))


@pytest.mark.slow
@pytest.mark.distributed
def test_the_trigger_file_dumps_every_ranks_stacks_and_flight_recorder(tmp_path: Path) -> None:
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           program("wait_for_dump.py"), str(marks)]  # fmt: skip
    env = bootstrap_env(run_dir, TORCH_FR_BUFFER_SIZE="2000")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: all((marks / f"ready{r}").exists() for r in (0, 1)))
        assert all(_stack_text(run_dir, r) == "" for r in (0, 1))  # nothing until asked
        (run_dir / ".sapper-dump").write_text("now\n")
        _wait_for(lambda: all("wait_for_release" in _stack_text(run_dir, r) for r in (0, 1)))
        _wait_for(lambda: all((run_dir / "fr" / f"rank_{r}").exists() for r in (0, 1)))
        for r in (0, 1):
            data = (run_dir / "fr" / f"rank_{r}").read_bytes()
            assert data[:1] == b"\x80" and b"all_reduce" in data  # torch's pickled dump
    finally:
        (marks / "release").write_text("")
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert out.count("released") == 2


@pytest.mark.slow
def test_sigusr1_writes_the_stacks(tmp_path: Path) -> None:
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [sys.executable, program("wait_for_dump.py"), str(marks)],
        env=bootstrap_env(run_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(lambda: (marks / "ready0").exists())
        pid = int((marks / "ready0").read_text())
        files = list((run_dir / "stacks").glob("rank0-*.txt"))
        assert [p.name for p in files] == [f"rank0-{pid}.txt"]  # the pid SIGUSR1 may go to
        os.kill(pid, signal.SIGUSR1)
        _wait_for(lambda: "wait_for_release" in files[0].read_text(), timeout=20)
    finally:
        (marks / "release").write_text("")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "released" in out, err[-3000:]
    assert not (run_dir / "fr").exists()  # no process group: no flight recorder


def test_the_programs_do_not_import_sapper() -> None:
    """The programs above are unchanged user code: only the one that brings its own
    monitor imports sapper."""
    for path in PROGRAMS.glob("*.py"):
        imports = re.findall(r"^(?:import|from) sapper\b", path.read_text(), re.MULTILINE)
        assert bool(imports) == (path.name == "own_monitor.py"), path.name


@pytest.mark.slow
def test_plain_loop_loss_is_what_the_step_optimised(tmp_path: Path) -> None:
    """Two micro-batches a step, each ``scaler.scale(loss / 2).backward()``: the run log
    holds the step's mean loss, the scaling undone, and the scaler's scale."""
    pytest.importorskip("torch.amp").GradScaler("cpu")
    run_dir = tmp_path / "run"
    proc = run([sys.executable, program("plain_accumulate.py")], run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    read = read_runlog(run_dir / "logs" / "rank0.jsonl")
    assert [r.step for r in read.steps] == list(range(12))
    assert [r.loss for r in read.steps] == pytest.approx(printed, rel=1e-5)
    assert read.steps[-1].loss_scale == 1024.0
    assert all(r.extra.get("grad_accum") == 2 for r in read.steps[1:])


@pytest.mark.slow
def test_a_program_that_handles_sigusr1_keeps_it(tmp_path: Path) -> None:
    """The program takes SIGUSR1 for itself: sapper stops offering it (no empty stack
    file), the program's handler still runs, and the trigger file still dumps."""
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [sys.executable, program("wait_for_dump.py"), str(marks)],
        env=bootstrap_env(run_dir, OWN_SIGUSR1="1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(lambda: (marks / "ready0").exists())
        _wait_for(lambda: not list((run_dir / "stacks").glob("*.txt")), timeout=10)
        os.kill(int((marks / "ready0").read_text()), signal.SIGUSR1)
        (run_dir / ".sapper-dump").write_text("now\n")
        _wait_for(lambda: "wait_for_release" in _stack_text(run_dir, 0), timeout=20)
    finally:
        (marks / "release").write_text("")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert "own SIGUSR1 handler ran" in out and "released" in out


@pytest.mark.slow
def test_plain_loop_fault_is_found_with_its_scheduler(tmp_path: Path) -> None:
    """The loop's LR scheduler (found beside its optimizer) steps per micro-batch: R042,
    in the run log and on the console."""
    run_dir = tmp_path / "run"
    proc = run([sys.executable, program("plain_scheduler_fault.py")], run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = run_dir / "logs" / "rank0.jsonl"
    assert serious(log) == ["R042"] and "R042" in proc.stderr
    steps = read_runlog(log).steps
    assert all(r.extra.get("scheduler_steps") == 2 for r in steps[1:])
