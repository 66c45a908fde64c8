"""Each reported hostile input gives exit 2 and one short line, fast, never a traceback.

Users reported: /dev/zero read without limit, a FIFO blocking for ever, a YAML alias bomb,
100k-deep nesting and 5000-digit integers crashing (exit 3), 2**64 GPUs looping, NaN and
inf accepted, ``--select ZZZ`` passing everything, ``data.path: /proc`` crashing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.errors import InputError
from sapper.plan.sources import MAX_CONFIG_BYTES, read_json_file, read_yaml_file

ROOT = Path(__file__).parent.parent.parent
HF = ROOT / "examples" / "hf"
DS = ROOT / "examples" / "deepspeed"
PLANS = ROOT / "examples" / "plans"
runner = CliRunner()
_register_commands()

#: Every hostile case must be refused in well under this (seconds; CI has 2 cores).
FAST_S = 5.0

BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    ]
)


def refused(*args: str, within: float = FAST_S) -> str:
    """Run the CLI; assert exit 2 with one short error line, in time. Returns the line."""
    t0 = time.monotonic()
    res = runner.invoke(app, list(args))
    elapsed = time.monotonic() - t0
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 1000, res.output[:2000]
    assert elapsed < within, f"{elapsed:.1f} s"
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---- files that are not config files -------------------------------------------------
@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
@pytest.mark.parametrize("option", ["--model", "--deepspeed", None])
def test_devices_are_refused_unread(device: str, option: str | None) -> None:
    args = ["check", option, device] if option else ["check", device]
    line = refused(*args)
    assert f"{device}: is a device, not a regular file" in line


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("reader", [read_json_file, read_yaml_file])
def test_fifo_is_refused_without_blocking(tmp_path: Path, reader) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            reader(fifo)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(FAST_S)
    if thread.is_alive():
        # A regression opened the FIFO: give it a writer and EOF so the suite goes on.
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(FAST_S)
        pytest.fail("reading a FIFO blocked")
    assert len(outcome) == 1 and isinstance(outcome[0], InputError), outcome
    assert "is a FIFO (named pipe), not a regular file" in str(outcome[0])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_through_the_cli(tmp_path: Path) -> None:
    fifo = tmp_path / "ds.json"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock() -> None:  # a safety net: a blocked open gets a writer after FAST_S
        if not done.wait(FAST_S):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    threading.Thread(target=unblock, daemon=True).start()
    try:
        assert "FIFO" in refused("check", "--deepspeed", str(fifo))
    finally:
        done.set()


def test_folder_is_refused(tmp_path: Path) -> None:
    assert "is a folder, not a regular file" in refused("check", "--model", str(tmp_path))


def test_file_over_the_size_limit_is_refused_with_its_size(tmp_path: Path) -> None:
    big = tmp_path / "plan.yaml"
    with big.open("wb") as fh:  # sparse: no 9 MiB actually written
        fh.truncate(MAX_CONFIG_BYTES + (1 << 20))
    line = refused("check", str(big))
    assert "file is 9.0 MiB, over the 8 MiB limit" in line


def test_invalid_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "\xff"}')
    assert "not UTF-8 text (byte 16" in refused("check", "--model", str(path))


# ---- YAML: aliases, nesting, integers ------------------------------------------------
def test_billion_laughs_fails_fast_with_a_short_message(tmp_path: Path) -> None:
    line = refused("check", write(tmp_path, "bomb.yaml", BILLION_LAUGHS), within=2.0)
    assert "more than 100000 values once aliases are expanded" in line


def test_ordinary_aliases_and_merge_keys_still_load(tmp_path: Path) -> None:
    text = "a: &a {x: 1, y: [1, 2]}\nb: *a\nc: {<<: *a, x: 2}\n"
    assert read_yaml_file(write(tmp_path, "q.yaml", text)) == {
        "a": {"x": 1, "y": [1, 2]},
        "b": {"x": 1, "y": [1, 2]},
        "c": {"x": 2, "y": [1, 2]},
    }


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    line = refused("check", write(tmp_path, "loop.yaml", "a: &a [1, *a]\n"))
    assert "an alias inside its own anchor" in line


@pytest.mark.parametrize("opener,closer", [("[", "]"), ("{a: ", "}")])
def test_yaml_nested_100k_deep(tmp_path: Path, opener: str, closer: str) -> None:
    text = "model: " + opener * 100_000 + "1" + closer * 100_000
    line = refused("check", write(tmp_path, "deep.yaml", text))
    assert "nest" in line


def test_yaml_nesting_through_aliases_is_counted(tmp_path: Path) -> None:
    levels = ["a0: &a0 " + "[" * 60 + "1" + "]" * 60]
    levels += [f"a{i}: &a{i} " + "[" * 60 + f"*a{i - 1}" + "]" * 60 for i in range(1, 4)]
    line = refused("check", write(tmp_path, "deep.yaml", "\n".join(levels)))
    assert "nested deeper than 100 levels once aliases are expanded" in line


@pytest.mark.parametrize("opener,closer", [("[", "]"), ('{"a": ', "}")])
@pytest.mark.parametrize("option", ["--model", "--deepspeed"])
def test_json_nested_100k_deep(tmp_path: Path, opener: str, closer: str, option: str) -> None:
    text = opener * 100_000 + "1" + closer * 100_000
    line = refused("check", option, write(tmp_path, "deep.json", text))
    assert "nested deeper than 100 levels" in line


def test_5000_digit_integers(tmp_path: Path) -> None:
    huge = "9" * 5000
    line = refused("check", write(tmp_path, "p.yaml", f"hardware: {{num_gpus: {huge}}}\n"))
    assert "an integer of 5000 characters" in line
    for option, text in (
        ("--deepspeed", f'{{"train_batch_size": {huge}}}'),
        ("--model", f'{{"model_type": "llama", "hidden_size": {huge}}}'),
    ):
        line = refused("check", option, write(tmp_path, "c.json", text))
        assert "an integer of 5000 digits; sapper reads at most 100" in line


def test_long_integer_below_the_digit_limit_hits_the_range(tmp_path: Path) -> None:
    line = refused("check", write(tmp_path, "p.yaml", f"batch: {{seq_len: {'9' * 90}}}\n"))
    assert "expected a number > 0, ≤ 10^9" in line


def test_bad_timestamp_is_input_not_a_crash(tmp_path: Path) -> None:
    line = refused("check", write(tmp_path, "p.yaml", "name: 2001-13-45\n"))
    assert "cannot read this value (month must be in 1..12)" in line


# ---- values ----------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["check", "memory", "plan"])
def test_2_to_the_64_gpus(command: str) -> None:
    line = refused(
        command, "--model", str(HF / "gpt2-xl.json"), "--gpu", "H100", "--seq-len", "1024",
        "--global-batch", "512", "--gpus", str(2**64),
    )
    assert "--gpus (plan field hardware.num_gpus)" in line
    assert "expected a number > 0, ≤ 10^6" in line


@pytest.mark.parametrize(
    "args,part",
    [
        (("--micro-batch", "1e12"), "--micro-batch"),
        (("--micro-batch", str(10**12)), "a number > 0, ≤ 10^6"),
        (("--max-norm", "nan"), "expected a finite number"),
        (("--lr", "inf"), "expected a finite number"),
        (("--lr", "-inf"), "--lr"),
        (("--nodes", "1000000"), "nodes × gpus_per_node at most 10^6 GPUs"),
        (("--tp", "1000", "--dp", "1000000"), "tp·pp·cp·dp is at most 10^6"),
    ],
)
def test_bad_command_line_values(args: tuple[str, ...], part: str) -> None:
    res = runner.invoke(app, ["check", *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert part in " ".join(res.output.split())


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_deepspeed_non_finite_numbers_name_the_key(tmp_path: Path, literal: str) -> None:
    text = f'{{"train_batch_size": 8, "bf16": {{"enabled": true}}, "gradient_clipping": {literal}}}'
    line = refused("check", "--deepspeed", write(tmp_path, "ds.json", text))
    assert "ds.json: gradient_clipping: invalid value" in line
    assert "expected a finite number (JSON has no NaN or Infinity)" in line


def test_nested_non_finite_number_has_its_path(tmp_path: Path) -> None:
    text = '{"optimizer": {"type": "AdamW", "params": {"betas": [0.9, NaN]}}}'
    line = refused("check", "--deepspeed", write(tmp_path, "ds.json", text))
    assert "optimizer.params.betas[1]: invalid value (got nan)" in line


def test_plan_nan_and_inf(tmp_path: Path) -> None:
    line = refused("check", write(tmp_path, "p.yaml", "clipping: {max_norm: .nan}\n"))
    assert "clipping.max_norm: invalid value (got nan); expected a finite number" in line
    line = refused("check", write(tmp_path, "p.yaml", "optimizer: {lr: .inf}\n"))
    assert "optimizer.lr" in line


def test_initial_scale_power_overflow(tmp_path: Path) -> None:
    text = '{"fp16": {"enabled": true, "initial_scale_power": 5000}}'
    line = refused("check", "--deepspeed", write(tmp_path, "ds.json", text))
    assert "fp16.initial_scale_power" in line and "≤ 127" in line


def test_long_values_are_clipped_in_the_message(tmp_path: Path) -> None:
    text = f"hardware: {{num_gpus: '{'x' * 300_000}'}}\n"
    line = refused("check", write(tmp_path, "p.yaml", text))
    assert "more characters)" in line and len(line) < 1000


def test_markup_and_control_characters_stay_literal(tmp_path: Path) -> None:
    line = refused("check", write(tmp_path, "p.yaml", 'precision: {dtype: "[/bold] \\e[31m"}\n'))
    assert "[/bold]" in line and "\x1b" not in line


def test_wide_deepspeed_file_reports_a_bounded_number_of_keys(tmp_path: Path) -> None:
    keys = {f"key{i}": i for i in range(5000)}
    res = runner.invoke(
        app, ["check", "--deepspeed", write(tmp_path, "ds.json", json.dumps(keys)), "-f", "json"]
    )
    assert res.exit_code == 0, res.output
    codes = [f["code"] for f in json.loads(res.stdout)["findings"]]
    assert codes.count("C001") == 21
    assert "4980 more keys are not DeepSpeed keys" in res.stdout


# ---- rule selection --------------------------------------------------------------------
@pytest.mark.parametrize("option", ["--select", "--ignore"])
def test_unknown_rule_code_exits_2(option: str) -> None:
    line = refused("check", str(PLANS / "healthy-llama-7b.yaml"), option, "N1,ZZZ")
    assert f"{option}: unknown rule code or prefix (got 'ZZZ')" in line
    assert "`sapper rules`" in line


def test_known_prefixes_still_select() -> None:
    res = runner.invoke(app, ["check", str(PLANS / "healthy-llama-7b.yaml"), "--select", "n,D1"])
    assert res.exit_code == 0, res.output
    assert refused("rules", "--select", "Q")


# ---- datasets --------------------------------------------------------------------------
def _data_plan(tmp_path: Path, path: str) -> str:
    text = (
        f"model: {{hf_config: {HF / 'gpt2-xl.json'}}}\n"
        f"batch: {{seq_len: 1024}}\n"
        f"data: {{path: {json.dumps(path)}}}\n"
    )
    return write(tmp_path, "plan.yaml", text)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_data_path_proc(tmp_path: Path) -> None:
    line = refused("check", _data_plan(tmp_path, "/proc"), within=30.0)
    assert "data.path" in line


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_data_path_device(tmp_path: Path) -> None:
    assert "is a device, not a regular file" in refused("check", _data_plan(tmp_path, "/dev/zero"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_data_path_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "tokens.jsonl"
    os.mkfifo(fifo)
    assert "FIFO" in refused("check", _data_plan(tmp_path, str(fifo)))


def test_data_folder_with_too_many_entries(tmp_path: Path, monkeypatch) -> None:
    from sapper.data import tokens

    monkeypatch.setattr(tokens, "MAX_FOLDER_ENTRIES", 10)
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(11):
        (folder / f"{i}.txt").write_text("")
    line = refused("check", _data_plan(tmp_path, str(folder)))
    assert "the folder holds more than 10 entries" in line


# ---- smoke ---------------------------------------------------------------------------
@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.skipif(sys.platform != "linux", reason="device paths")
def test_smoke_model_device() -> None:
    assert "is a device" in refused("smoke", "--model", "/dev/zero", within=30.0)


@pytest.mark.skipif(sys.platform != "linux", reason="FIFOs")
def test_smoke_factory_file_that_is_a_fifo_is_never_imported(tmp_path: Path) -> None:
    fifo = tmp_path / "model.py"
    os.mkfifo(fifo)  # importing it would block forever on the read
    line = refused("smoke", "--factory", f"{fifo}:build", within=30.0)
    assert "not a regular file" in line


def test_smoke_factory_file_named_unlike_a_module(tmp_path: Path) -> None:
    path = write(tmp_path, "my-model.py", "def build():\n    return None\n")
    assert "not a Python module name" in refused("smoke", "--factory", f"{path}:build")


# ---- found by the property tests ------------------------------------------------------
@pytest.mark.parametrize("key", ["n_embd", "hidden_size"])
@pytest.mark.parametrize("value", [None, "wide", 0])
def test_hf_size_resolved_to_nothing(tmp_path: Path, key: str, value: object) -> None:
    raw = json.loads((HF / "gpt2-xl.json").read_text())
    raw[key] = value  # GPT-2's hidden_size is an alias of n_embd: null passed transformers
    line = refused("check", "--model", write(tmp_path, "config.json", json.dumps(raw)))
    assert ": n_embd: invalid value" in line or f": {key}: invalid value" in line, line


def test_missing_nested_field_names_the_file(tmp_path: Path) -> None:
    text = "model: {hidden_size: 64, num_layers: 2, num_heads: 2, vocab_size: 100,\n"
    text += "        rope_scaling: {factor: 2}}\n"
    line = refused("check", write(tmp_path, "p.yaml", text))
    assert line.endswith("p.yaml: model.rope_scaling.type: missing value; expected a value")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_file_larger_than_its_stat_size_is_cut_at_the_limit(tmp_path: Path, monkeypatch) -> None:
    """Files under /proc report size 0: the read itself stops one byte past the limit."""
    from sapper.plan import sources

    path = tmp_path / "config.json"
    path.write_text('{"a": "' + "x" * 100 + '"}')
    monkeypatch.setattr(sources, "MAX_CONFIG_BYTES", 50)
    real_stat = os.stat

    def zero_size(p, *a, **k):  # the stat before opening, as /proc reports it
        info = real_stat(p, *a, **k)
        return os.stat_result((*info[:6], 0, *info[7:]))

    monkeypatch.setattr(sources.os, "stat", zero_size)
    monkeypatch.setattr(sources.os, "fstat", lambda fd: zero_size(f"/proc/self/fd/{fd}"))
    with pytest.raises(InputError, match="file holds more than the 0 MiB limit"):
        read_json_file(path)
