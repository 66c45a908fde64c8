"""What the fast commands import, not how fast they are (benchmarks/startup.py times them).

Each case runs one ``sapper`` command in a fresh interpreter, as the console script does,
and lists the heavy packages it imported: listing and explaining rules must not import
torch, transformers or numpy; checking a model of a family sapper counts itself must
not import transformers or torch; the offline commands run on a real small input of each
kind (a ``trainer_state.json``, a sapper run log, a CSV, a Megatron-LM text log, plan and
launch configs) import neither torch, transformers, tensorboard nor the cross-rank pass,
and analyzing or watching one small log does not import numpy; inspecting a safetensors
model, or diagnosing with one, imports no torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "numpy", "tensorboard")
#: The cross-rank pass and the monitor's distributed side: only ranked logs need them.
CROSS_RANK = ("sapper.distributed.offline", "sapper.distributed.detectors",
              "sapper.distributed.context")

_PROBE = """
import json, sys
args, watched = json.loads(sys.argv[1]), json.loads(sys.argv[2])
from sapper.cli.app import main
sys.argv = ["sapper", *args]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = [m for m in watched if m in sys.modules]
sys.__stdout__.write("\\n" + json.dumps({"code": code, "heavy": heavy}) + "\\n")
"""


def _imports(*args: str, watched: tuple[str, ...] = HEAVY) -> tuple[int, list[str]]:
    """(exit code, ``watched`` modules imported) of ``sapper ARGS`` in a fresh
    interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args), json.dumps(watched)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.stdout.strip(), proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["code"], out["heavy"]


def _pyproject_rule_modules() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(data["project"]["entry-points"]["sapper.rules"])


def _installed_rule_modules() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group="sapper.rules")}


def test_installed_rule_entry_points_match_pyproject() -> None:
    """The rule modules are found through the installed metadata, which an editable
    install writes once: after the entry points change, reinstall."""
    assert _installed_rule_modules() == _pyproject_rule_modules(), (
        "the installed sapper.rules entry points predate pyproject.toml: "
        "reinstall sapper (pip install -e .)"
    )


@pytest.mark.parametrize(
    "args", [("--help",), ("rules",), ("explain", "N102"), ("explain", "X005")]
)
def test_rules_and_help_import_nothing_heavy(args: tuple[str, ...]) -> None:
    if _installed_rule_modules() != _pyproject_rule_modules():
        pytest.skip("stale installed entry points (see the test above)")
    code, heavy = _imports(*args)
    assert code == 0
    assert heavy == []


@pytest.mark.parametrize("command", ["check", "memory"])
def test_a_known_family_is_read_without_transformers(command: str) -> None:
    code, heavy = _imports(
        command,
        "--model", "examples/hf/llama-2-7b.json",
        "--gpus", "64", "--gpus-per-node", "8", "--gpu", "A100-80GB",
        "--seq-len", "4096", "--micro-batch", "1",
    )
    assert code in (0, 1)
    assert "transformers" not in heavy
    if _installed_rule_modules() == _pyproject_rule_modules():  # stale: X rules load torch
        assert "torch" not in heavy


LOGS = ROOT / "examples" / "logs"
#: One small real log of each kind the offline commands read.
SMALL_LOGS = {
    "trainer_state": LOGS / "hf-llama-sft" / "trainer_state.json",
    "runlog": LOGS / "sapper-gpt2-healthy.jsonl",
    "csv": LOGS / "wandb-history-lr-stuck.csv",
    "megatron": LOGS / "megatron-gpt345m-fp16.log",
}
#: Never imported by an offline command on one log or a config.
NEVER = ("torch", "transformers", "tensorboard", *CROSS_RANK)


def _offline(*args: str) -> tuple[int, list[str]]:
    code, loaded = _imports(*args, watched=(*HEAVY, *CROSS_RANK))
    assert code in (0, 1), (args, code)
    return code, loaded


@pytest.mark.parametrize("kind", sorted(SMALL_LOGS))
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_analyze_of_one_small_log_imports_nothing_heavy(kind: str, fmt: str) -> None:
    """One log is one rank and a small one is read as records: no torch, tensorboard or
    cross-rank pass, and not even numpy (the columns are for long logs)."""
    _, loaded = _offline("analyze", str(SMALL_LOGS[kind]), "--format", fmt)
    assert loaded == []


@pytest.mark.parametrize("kind", ["trainer_state", "runlog"])
def test_watch_of_one_small_log_imports_nothing_heavy(kind: str) -> None:
    _, loaded = _offline(
        "watch", str(SMALL_LOGS[kind]), "--idle-timeout", "0.2", "--poll", "0.05",
        "--format", "json",
    )
    assert loaded == []


@pytest.mark.parametrize("kind", ["trainer_state", "runlog", "megatron"])
def test_diagnose_of_one_small_log_imports_nothing_heavy(kind: str) -> None:
    """As analyze: a small log's diagnosis needs no numpy either (its onsets are found
    over records; numpy comes only with the columns of a long log)."""
    _, loaded = _offline("diagnose", str(SMALL_LOGS[kind]))
    assert loaded == []


def test_report_of_one_small_log_imports_no_torch(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    _, loaded = _offline("report", str(SMALL_LOGS["trainer_state"]), "-o", str(out))
    assert out.stat().st_size > 0
    assert not set(loaded) & set(NEVER), loaded


def _safetensors_model(folder: Path) -> Path:
    """A small model saved as safetensors with numpy (no torch in this process either),
    its head tied to its embedding in config.json (the tied-weights check reads both)."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    embed = rng.normal(0, 0.02, (64, 32)).astype(np.float32)
    folder.mkdir()
    save_file(
        {
            "model.embed_tokens.weight": embed,
            "lm_head.weight": embed.copy(),
            "model.layers.0.mlp.up_proj.weight": rng.normal(0, 0.02, (32, 32)).astype(
                np.float16
            ),
            "model.layers.0.input_layernorm.weight": np.ones(32, dtype=np.float32),
        },
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "tie_word_embeddings": True, "torch_dtype": "float32"})
    )
    return folder


def test_a_safetensors_checkpoint_is_read_without_torch(tmp_path: Path) -> None:
    """inspect of a safetensors model and diagnose with it beside a small log reduce its
    tensors with numpy: no torch (nor transformers, tensorboard, the cross-rank pass)."""
    folder = _safetensors_model(tmp_path / "model")
    code, loaded = _offline("inspect", str(folder / "model.safetensors"), "--format", "json")
    assert code == 0
    assert not set(loaded) & set(NEVER), loaded
    code, loaded = _offline("inspect", str(folder))
    assert code == 0
    assert not set(loaded) & set(NEVER), loaded
    _, loaded = _offline(
        "diagnose", str(SMALL_LOGS["runlog"]), "--checkpoint", str(folder / "model.safetensors")
    )
    assert not set(loaded) & set(NEVER), loaded


@pytest.mark.parametrize(
    "configs",
    [
        ("-c", "examples/plans/healthy-llama-7b.yaml"),
        ("-c", "examples/torchtitan/llama3_8b.toml"),
        ("-c", "examples/deepspeed/zero2-bf16.json", "-m", "examples/hf/llama-2-7b.json"),
    ],
    ids=["plan", "torchtitan", "deepspeed+hf"],
)
def test_check_of_a_config_imports_no_torch(configs: tuple[str, ...]) -> None:
    if _installed_rule_modules() != _pyproject_rule_modules():
        pytest.skip("stale installed entry points (see the test above)")
    _, loaded = _offline("check", *configs)
    assert not set(loaded) & set(NEVER), loaded


def test_event_file_check_agrees_with_tensorboard() -> None:
    """Every log's format is probed with the TFRecord checksum: sapper's own, so the
    probe does not import tensorboard, and it must agree with tensorboard's."""
    import random

    pywrap = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")
    from sapper.logs.tensorboard import masked_crc32c

    rng = random.Random(0)
    for n in range(64):
        data = bytes(rng.randrange(256) for _ in range(n % 24))
        assert masked_crc32c(data) == pywrap.masked_crc32c(data)


def test_log_format_help_lists_the_readers_formats() -> None:
    """analyze/report/watch spell the format list out (the readers load lazily)."""
    from sapper.cli.analyze_cmd import LOG_FORMATS
    from sapper.logs import FORMATS

    assert LOG_FORMATS == FORMATS


def test_early_read_threshold_is_the_columnar_readers() -> None:
    """The command line tells a log worth reading early without importing the readers."""
    from sapper.cli.analyze_cmd import EARLY_READ_BYTES
    from sapper.logs.columnar import DEFAULT_MIN_BYTES

    assert EARLY_READ_BYTES == DEFAULT_MIN_BYTES


def test_lazy_exports_resolve() -> None:
    """The packages that export lazily still export every name in __all__."""
    import sapper
    import sapper.distributed
    import sapper.plan

    for module in (sapper, sapper.plan, sapper.distributed):
        for name in module.__all__:
            assert getattr(module, name) is not None, (module.__name__, name)


_EXIT_PROBE = """
import atexit, gc, json, sys
from sapper.cli.app import main
sys.argv = ["sapper", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
frozen = gc.get_freeze_count()
atexit._run_exitfuncs()
sys.__stderr__.write(json.dumps({"code": code, "before": frozen,
                                 "after": gc.get_freeze_count()}) + "\\n")
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_analyze_leaves_the_collector_out_of_its_exit(fmt: str) -> None:
    """Once analyze has written its answer, its exit handlers take every live object out
    of the collector's sweeps at shutdown (not before: the command itself is swept as
    usual), and the answer is whole."""
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_PROBE,
         json.dumps(["analyze", str(SMALL_LOGS["runlog"]), "--format", fmt])],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
    )
    out = json.loads(proc.stderr.strip().splitlines()[-1])
    assert out["code"] in (0, 1), proc.stderr
    assert out["before"] == 0
    assert out["after"] > 1000
    if fmt == "json":
        assert isinstance(json.loads(proc.stdout), (dict, list))
    else:
        assert proc.stdout.strip()
