"""``sapper smoke`` in-process: the shipped example passes every check, planted bugs exit 1
with their code, bad input is one line and exit 2."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from tests_smoke_paths import LLAMA_TOY
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

runner = CliRunner()
_register_commands()


def invoke(*args: str):
    return runner.invoke(app, ["smoke", *args])


@pytest.mark.distributed
def test_shipped_example_passes_every_check_in_under_a_minute() -> None:
    start = time.perf_counter()
    res = invoke("--model", str(LLAMA_TOY), "--format", "json")
    elapsed = time.perf_counter() - start
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert [c["check"] for c in payload["checks"]] == [
        "contract", "overfit", "padding", "accumulation", "checkpointing", "precision",
        "data_parallel", "init_health", "measure",
    ]
    assert {c["status"] for c in payload["checks"]} == {"pass"}
    codes = {f["code"] for f in payload["findings"]}
    assert codes == {f"S{i:03d}" for i in range(1, 13)}
    keys = {"code", "severity", "message", "fix", "data"}
    assert all(keys <= set(f) for f in payload["findings"])
    assert payload["summary"] == {"errors": 0, "warnings": 0, "passed": 9, "failed": 0}
    assert elapsed < 60


def test_text_report_names_checks_and_numbers() -> None:
    res = invoke("--model", str(LLAMA_TOY), "--checks", "accumulation")
    assert res.exit_code == 0, res.output
    assert "S003" in res.output and "PASS" in res.output and "rel err" in res.output
    assert "0 error(s)" in res.output


def test_users_step_with_the_accumulation_bug_exits_1() -> None:
    res = invoke(
        "--model", str(LLAMA_TOY), "--checks", "accumulation",
        "--step", "smoke_planted:PerMicroBatchMean",
    )
    assert res.exit_code == 1
    flat = " ".join(res.output.split())  # rich wraps long results at the console width
    assert "FAIL" in flat and "averaged per micro-batch" in flat
    assert "num_items_in_batch" in res.output  # the fix is shown


def test_users_factory_that_overflows_fp16_exits_1() -> None:
    res = invoke("--factory", "smoke_planted:overflowing_lm", "--checks", "precision", "-f",
                 "json")
    assert res.exit_code == 1
    failed = {f["code"] for f in json.loads(res.stdout)["findings"]
              if f["data"]["status"] == "fail"}
    assert "S006" in failed


@pytest.mark.distributed
def test_users_loader_without_a_sampler_exits_1() -> None:
    res = invoke("--model", str(LLAMA_TOY), "--checks", "data_parallel",
                 "--loader", "smoke_planted:unsharded_loader", "-f", "json")
    assert res.exit_code == 1
    status = {f["code"]: f["data"]["status"] for f in json.loads(res.stdout)["findings"]}
    assert status == {"S007": "pass", "S008": "fail"}


def test_users_collator_with_padding_in_the_labels_exits_1() -> None:
    res = invoke("--model", str(LLAMA_TOY), "--checks", "padding",
                 "--loader", "smoke_planted:unmasked_labels_loader")
    assert res.exit_code == 1
    assert "S011" in res.output and "FAIL" in res.output and "masked_fill" in res.output


def test_a_step_given_by_file_path() -> None:
    steps = LLAMA_TOY.parent / "steps.py"
    res = invoke("--model", str(LLAMA_TOY), "--checks", "contract,accumulation",
                 "--step", f"{steps}:HFLossStep", "-f", "json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert [c["status"] for c in payload["checks"]] == ["pass", "pass"]


def test_a_file_that_fails_to_import_is_an_input_error(tmp_path) -> None:
    bad = tmp_path / "broken_model.py"
    bad.write_text("raise RuntimeError('no GPU here')\n")
    res = invoke("--factory", f"{bad}:build", "--checks", "overfit")
    assert res.exit_code == 2, res.output
    assert "RuntimeError: no GPU here" in res.output and "Traceback" not in res.output


def test_non_finite_numbers_stay_valid_json() -> None:
    res = invoke("--factory", "smoke_planted:overflowing_lm", "--checks", "precision", "-f",
                 "json")
    payload = json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    fp16 = next(f for f in payload["findings"] if f["data"].get("precision") == "fp16")
    assert fp16["data"]["rel_err"] in (None, "inf")  # overflowed: no finite error to report


def test_token_file_as_data(tmp_path) -> None:
    tokens = np.random.default_rng(0).integers(0, 30000, size=4096, dtype=np.uint16)
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    res = invoke("--model", str(LLAMA_TOY), "--data", str(path), "--checks",
                 "accumulation,init_health", "-f", "json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["model"]["vocab_size"] >= len(np.unique(tokens[: 64 * 64]))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give exactly one model"),
        (("--model", "missing.json"), "file not found"),
        (("--model", str(LLAMA_TOY), "--factory", "a:b"), "give exactly one model"),
        (("--model", str(LLAMA_TOY), "--checks", "overfitt"), "unknown check"),
        (("--model", str(LLAMA_TOY), "--skip", "speed"), "unknown check"),
        (("--model", str(LLAMA_TOY), "--dtype", "fp8"), "unknown precision"),
        (("--factory", "nope"), "not a module:function"),
        (("--factory", "missing/model.py:build"), "file not found"),
        (("--factory", "smoke_planted:no_such_fn"), "has no attribute"),
        (("--model", str(LLAMA_TOY), "--step", "tests/smoke/smoke_planted.py:Nope"),
         "has no attribute"),
        (("--model", str(LLAMA_TOY), "--data", "x.csv"), "file not found"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


def test_a_launch_config_names_the_model_to_scale(tmp_path) -> None:
    """An Axolotl YAML whose base_model is a local folder: the toy is that config.json's
    architecture; a hub id is refused with the fix, never downloaded."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(LLAMA_TOY.read_text())
    local = tmp_path / "axolotl.yml"
    local.write_text(
        "base_model: ./model\nsequence_len: 128\nmicro_batch_size: 2\n"
        "datasets:\n  - path: x\n    type: alpaca\n"
    )
    res = invoke("--config", str(local), "--checks", "overfit", "--format", "json")
    assert res.exit_code == 0, res.output
    assert [c["check"] for c in json.loads(res.stdout)["checks"]] == ["overfit"]
    hub = tmp_path / "hub.yml"
    hub.write_text(
        "base_model: meta-llama/Llama-2-7b-hf\nsequence_len: 128\n"
        "datasets:\n  - path: x\n    type: alpaca\n"
    )
    res = invoke("--config", str(hub))
    assert res.exit_code == 2
    assert "no local model config.json" in res.output and "--model" in res.output


def test_piped_text_streams_each_check_and_shows_the_loaders_shapes() -> None:
    """CliRunner's output is not a terminal: each check's row is printed as it finishes,
    under one header line, and the header gives the shapes the loader chose."""
    res = invoke("--model", str(LLAMA_TOY), "--checks", "padding,accumulation",
                 "--loader", "smoke_planted:sharded_loader", "--micro-batch", "7")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    head = " ".join(" ".join(lines[:3]).split())  # the header wraps at the console width
    assert "micro-batches 4 × 22, 4 × 23 tokens (loader smoke_planted:sharded_loader)" in head
    assert sum(line.startswith("check ") for line in lines) == 1
    assert lines.index(next(x for x in lines if x.startswith("padding"))) < lines.index(
        next(x for x in lines if x.startswith("accumulation"))
    )


def test_json_gives_the_batch_shapes() -> None:
    res = invoke("--model", str(LLAMA_TOY), "--checks", "padding", "-f", "json",
                 "--seq-len", "16", "--micro-batch", "3")
    data = json.loads(res.stdout)["data"]
    assert data == {"source": "synthetic tokens", "batch_shapes": [[3, 16], [3, 16]]}


def test_token_ids_beyond_the_vocabulary_are_one_input_error() -> None:
    res = invoke("--factory", "smoke_planted:tiny_lm", "--loader", "smoke_planted:sharded_loader")
    assert res.exit_code == 2, res.output
    assert "token ids span 0..509 but the model's vocabulary is 128" in " ".join(
        res.output.split()
    )
