"""The launch-script reader stays bounded on any script: a variable grown or copied line
after line, ``${...}`` / ``$(...)`` / quotes nested tens of thousands deep, millions of
tokens or expansions. Each is read in bounded time and memory (measured in a fresh
interpreter: wall clock and peak RSS), what is past a bound is unknown and said so (C006),
and ``sapper check`` exits 0, 1 or 2, never 3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings, time_limit
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.plan.readers.shell import (
    MAX_BRACE_DEPTH,
    MAX_EXPANDED_CHARS,
    MAX_TOKENS,
    read_script,
)

ROOT = Path(__file__).parent.parent.parent
runner = CliRunner()
_register_commands()

#: Generous bounds for one ``sapper check`` of a hostile script on a loaded CI machine.
LIMIT_S = 10
LIMIT_RSS_MB = 500

TRAIN = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 256 "
    "--num-attention-heads 8 --seq-length 128 --max-position-embeddings 128 "
    "--micro-batch-size 1 --global-batch-size 8 --bf16"
)

_PROBE = """
import json, resource, sys, time
start = time.perf_counter()
try:  # Linux keeps the forking parent's peak across fork and exec: start this one afresh
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
except OSError:
    pass
from sapper.cli.app import main
sys.argv = ["sapper", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rss_mb = rss / 2**20 if sys.platform == "darwin" else rss / 2**10
try:  # the peak since clear_refs above (VmHWM), where /proc has it
    with open("/proc/self/status") as fh:
        hwm = [line for line in fh if line.startswith("VmHWM:")]
    rss_mb = int(hwm[0].split()[1]) / 2**10 if hwm else rss_mb
except OSError:
    pass
sys.__stdout__.write("\\n" + json.dumps(
    {"code": code, "seconds": time.perf_counter() - start, "rss_mb": rss_mb}) + "\\n")
"""


def measured_check(path: Path) -> tuple[int, dict, float, float]:
    """``sapper check --config PATH -f json`` in a fresh interpreter: (exit code, the
    JSON report or {}, seconds, peak RSS in MB)."""
    args = ["check", "--config", str(path), "--config-format", "megatron", "-f", "json"]
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args)],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-2000:]
    probe = json.loads(lines[-1])
    body = "\n".join(lines[:-1]).strip()
    report = json.loads(body) if probe["code"] in (0, 1) and body else {}
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return probe["code"], report, probe["seconds"], probe["rss_mb"]


def notes(report: dict) -> list[str]:
    return [f["message"] for f in report.get("findings", []) if f["code"] == "C006"]


def script(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(["#!/bin/bash", *lines]) + "\n")
    return path


# ---- a variable grown or copied line after line -------------------------------------
def test_a_variable_doubled_and_copied_stays_within_time_and_memory(tmp_path: Path) -> None:
    """``A="$A$A"`` to just under the per-value cap, then copied into thousands of
    variables: each copy alone is allowed, together they once took gigabytes."""
    path = script(
        tmp_path, "double.sh", "NL=4", TRAIN.replace("--num-layers 4", "--num-layers $NL"),
        'A="' + "x" * 28 + '"', *['A="$A$A"'] * 15, *[f'V{i}="$A"' for i in range(4000)],
        "echo $NL",
    )
    code, report, seconds, rss = measured_check(path)
    assert code in (0, 1), report
    assert seconds < LIMIT_S and rss < LIMIT_RSS_MB, (seconds, rss)
    said = notes(report)
    assert any(f"pass {MAX_EXPANDED_CHARS} characters in all" in n for n in said), said
    # what the script decided before the bound is kept
    assert report["summary"]["derived"], report["summary"]


@pytest.mark.parametrize("line", ['A="${A}' + "x" * 90 + '"', 'A+="' + "x" * 90 + '"',
                                  'A="$A$A"'])
def test_a_variable_grown_over_thousands_of_lines_is_bounded(tmp_path: Path,
                                                             line: str) -> None:
    path = script(tmp_path, "grow.sh", TRAIN, "A=x", *[line] * 60_000,
                  'torchrun pretrain_gpt.py --num-layers 4 --data-path "$A"')
    code, report, seconds, rss = measured_check(path)
    assert code in (0, 1), report
    assert seconds < LIMIT_S and rss < LIMIT_RSS_MB, (seconds, rss)


def test_past_the_budget_values_are_unknown_and_named() -> None:
    text = ('A="' + "x" * 1000 + '"\n' + 'A="$A$A"\n' * 10
            + "".join(f'V{i}="$A"\n' for i in range(40)) + "NL=4\necho $NL\n")
    result = read_script(text)
    [word] = result.commands[-1].words[1:]
    assert word.unknown == ("$NL",)
    assert "was not expanded" in result.reasons["$NL"]
    assert len(result.notes) == 1 and "line" in result.notes[0]


# ---- nesting ---------------------------------------------------------------------------
def test_nested_defaults_fifty_thousand_deep_do_not_overflow_the_stack(
        tmp_path: Path) -> None:
    deep = "${A:-" * 50_000 + "1" + "}" * 50_000
    path = script(tmp_path, "deep.sh", f"NL={deep}",
                  TRAIN.replace("--num-layers 4", "--num-layers $NL"))
    code, report, seconds, rss = measured_check(path)
    assert code in (0, 1), report
    assert seconds < LIMIT_S and rss < LIMIT_RSS_MB, (seconds, rss)
    said = " ".join(notes(report))
    assert f"more than {MAX_BRACE_DEPTH} levels deep" in said, said
    assert "--num-layers" in said  # the value it would have set is named unknown


@pytest.mark.parametrize("nested", [
    "${A:-" * 50_000 + "1" + "}" * 50_000,
    "${A:+" * 50_000 + "1" + "}" * 50_000,
    "${A:-" * 200_000,
    "$(" * 50_000 + ")" * 50_000,
    '"$(' * 50_000 + ')"' * 50_000,
    "`" * 50_001,
    "$((" * 20_000 + "1" + "))" * 20_000,
    '"' * 50_001,
    "'" * 50_001,
    "{" * 50_000,
])
def test_deep_nesting_of_any_kind_is_read_in_bounded_time(nested: str) -> None:
    with time_limit(LIMIT_S):
        read_script(f"A=1\nX={nested}\necho $X\n{TRAIN}\n")


def test_nested_defaults_are_read_as_bash_reads_them() -> None:
    text = "B=2\necho ${A:-${B:-1}} ${A:-${C:-1}}x ${B:+${B}y}z\n"
    [command] = read_script(text).commands
    assert [w.text for w in command.words] == ["echo", "2", "1x", "2yz"]


def test_deeper_than_the_bound_is_unknown_not_guessed() -> None:
    deep = "${A:-" * (MAX_BRACE_DEPTH + 5) + "1" + "}" * (MAX_BRACE_DEPTH + 5)
    shallow = "${A:-" * 3 + "1" + "}" * 3
    result = read_script(f"echo {shallow} {deep}\n")
    first, second = result.commands[0].words[1:]
    assert first.text == "1"
    assert not second.known
    assert any("levels deep" in n for n in result.notes)


# ---- sheer size -----------------------------------------------------------------------
@pytest.mark.parametrize("body", [
    ["{ a=1"] * 300_000,  # a million unclosed blocks once cost a scan per command
    ["if [ $Z = 1 ]; then a=1"] * 100_000,
    ["echo " + "$X " * 9000] * 100,
    ["A=x", "echo " + "$A" * 1_000_000],
    ["echo " + ";" * 2_000_000],
])
def test_huge_scripts_stop_at_a_bound_and_say_so(tmp_path: Path, body: list[str]) -> None:
    path = script(tmp_path, "huge.sh", TRAIN, *body)
    code, report, seconds, rss = measured_check(path)
    assert code in (0, 1, 2), report
    assert seconds < LIMIT_S and rss < LIMIT_RSS_MB, (seconds, rss)


def test_a_script_past_the_token_bound_is_read_up_to_it() -> None:
    result = read_script(f"{TRAIN}\n" + "a=1\n" * (MAX_TOKENS + 10) + "echo late\n")
    assert [c.words[0].text for c in result.commands] == ["torchrun"]
    assert any(f"more than {MAX_TOKENS} words and operators" in n for n in result.notes)


def test_a_heredoc_on_a_line_with_more_commands_is_still_read() -> None:
    text = "cat <<EOF > ds.json; echo done\n{\"stage\": 2}\nEOF\n"
    result = read_script(text)
    assert result.files["ds.json"].text == '{"stage": 2}\n'
    assert [c.words[0].text for c in result.commands] == ["cat", "echo"]


# ---- property: nested and repeated expansions never crash ---------------------------
_OPEN = ["${A:-", "${A:+", "${A:=", "${#", "${A[", "$(", "$((", '"', "'", "`", "${", "{ ",
         "if [ $A = 1 ]; then ", "bash -c \"", "A=("]
_CLOSE = ["}", ")", "))", '"', "'", "`", "]", "; fi", " }", "\\\""]
_GROW = ['A="$A$A"', 'A="${A}xxxxxxxx"', "A+=xxxxxxxx", 'B="$A$A$A$A"', "A=($A ${A[@]})",
         "A+=(${A[@]})", 'A="$((A*A))"', "export A=$A$A", "A=${A:-$A}${A:+$A}"]


@st.composite
def _nested_script(draw: st.DrawFn) -> str:
    lines = ["#!/bin/bash", 'A="' + "x" * draw(st.integers(0, 64)) + '"']
    for _ in range(draw(st.integers(1, 3))):
        opens = draw(st.lists(st.sampled_from(_OPEN), min_size=1, max_size=4))
        depth = draw(st.integers(1, 3000))
        closes = draw(st.lists(st.sampled_from(_CLOSE), max_size=4))
        inner = draw(st.sampled_from(["1", "$A", "${A[@]}", "x y", ""]))
        lines.append("X=" + "".join(opens) * depth + inner + "".join(closes) * depth)
    grow = draw(st.lists(st.sampled_from(_GROW), min_size=1, max_size=3))
    lines += grow * draw(st.integers(1, 4000))
    lines.append(TRAIN.replace("--num-layers 4", "--num-layers ${X:-4}") + ' --data-path "$A"')
    return "\n".join(lines) + "\n"


@given(text=_nested_script())
@stable_settings(40, shrink=False)
def test_nested_and_repeated_expansions_never_crash(
        tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.mktemp("shell") / "launch.sh"
    path.write_text(text)
    with time_limit(20):
        res = runner.invoke(app, ["check", "--config", str(path), "--config-format",
                                  "megatron", "-f", "json"])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError("exit 3") from res.exception
    assert res.exit_code in (0, 1, 2), res.output[:500]
    assert "Traceback" not in res.output


# ---- the same for NeMo's ${...} interpolations -----------------------------------------
def test_a_nemo_interpolation_nested_deep_and_long_is_bounded(tmp_path: Path) -> None:
    """Each level of ``${multiply:2,${...}}`` reads its text again: a long value nested
    deep once took minutes; past the bound the value is unknown (C006)."""
    deep = "${multiply:2," * 150_000 + "1" + "}" * 150_000
    path = tmp_path / "nemo.yaml"
    path.write_text(
        "trainer:\n  devices: 8\n  num_nodes: 1\n  precision: bf16\n"
        "model:\n  micro_batch_size: 1\n  global_batch_size: 8\n"
        "  tensor_model_parallel_size: 1\n  encoder_seq_length: 2048\n"
        f"  num_layers: '{deep}'\n  hidden_size: 1024\n  num_attention_heads: 16\n"
    )
    with time_limit(LIMIT_S):
        res = runner.invoke(app, ["check", "--config", str(path), "-f", "json"])
    assert res.exit_code in (0, 1), res.output[:500]
    said = " ".join(notes(json.loads(res.stdout)))
    assert "model.num_layers" in said and "interpolations" in said, said
