"""Property tests: no input makes sapper crash (exit 3), hang, or print without bound.

Generated plans, DeepSpeed configs and Hugging Face config.json files, and the shipped
examples mutated (byte flips, truncation, NULs and control characters, huge numbers,
deep nesting, values swapped for NaN, strings, lists ...) go through the loaders and the
checks, and a subset through the CLI in-process. The invariant:

* the library returns, or raises a :class:`SapperError` whose message is one line of
  bounded length (the CLI's exit 2, or 1);
* the CLI exits 0, 1 or 2, never with an unexpected exception (exit 3), no traceback,
  and bounded output;
* each case finishes within ``CASE_LIMIT_S`` (enforced with SIGALRM, so a hang fails
  the test instead of blocking the suite).

Most cases call the library (about 2 ms each); one in ten of the loaded plans also runs
the checklist and the memory verdict, and a few hundred cases go through the CLI
(60–300 ms each). The example counts add up to more than 10,000 cases per run while the
file takes about a minute on two cores. ``derandomize=True`` with no database: every run
draws the same cases, so CI is stable and a failure reproduces locally.
"""

from __future__ import annotations

import enum
import json
import re
import shutil
import tempfile
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from tests.fuzz import stable_settings, time_limit
from typer.testing import CliRunner

from sapper.checks.engine import run_checklist
from sapper.cli.app import _register_commands, app
from sapper.errors import SapperError
from sapper.memory.verdict import verdict
from sapper.plan.hardware import GPUS
from sapper.plan.load import load_plan
from sapper.plan.readers.deepspeed import read_deepspeed_config
from sapper.plan.readers.deepspeed_keys import SECTIONS
from sapper.plan.readers.hf_config import _ORIGIN, _POSITIVE_INTS, read_hf_config
from sapper.plan.readers.hf_families import FAMILIES
from sapper.plan.schema import Plan

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples"
PLAN_FILES = sorted((EXAMPLES / "plans").glob("*.yaml"))
HF_FILES = sorted((EXAMPLES / "hf").glob("*.json"))
DS_FILES = sorted((EXAMPLES / "deepspeed").glob("*.json"))
SOURCES = {p: p.read_bytes() for p in PLAN_FILES + HF_FILES + DS_FILES}

#: Wall-clock limit of one case (seconds): generous for a loaded CI machine; a case that
#: needs it is a bug either way.
CASE_LIMIT_S = 20
#: Longest error line accepted, and the most output one CLI call may print.
MAX_LINE = 2000
MAX_OUTPUT = 200_000
#: Cases per run, all tests together, that the suite promises.
MIN_CASES = 10_000

# transformers' notes on legacy keys in mutated configs are not what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
runner = CliRunner()
_register_commands()
CASES: Counter[str] = Counter()


# ---- the invariant -------------------------------------------------------------------


def library_case(name: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn``: it returns, or raises a SapperError of one bounded line. Returns its
    result, or None when it raised one."""
    CASES[name] += 1
    with time_limit(CASE_LIMIT_S):
        try:
            return fn()
        except SapperError as exc:
            text = str(exc)
            assert "\n" not in text and len(text) < MAX_LINE, text[:MAX_LINE]
            return None


def checks_case(loaded: Any) -> None:
    """The checklist and the memory verdict over a plan that loaded: findings, never a
    crash, each message bounded."""

    def run() -> None:
        report = run_checklist(loaded)
        for f in report.findings:
            assert len(f.message) < 20_000, f.message[:500]
        report.to_json()
        verdict(loaded.plan)

    library_case("checks", run)


def cli_case(args: list[str]) -> None:
    CASES["cli"] += 1
    with time_limit(CASE_LIMIT_S):
        res = runner.invoke(app, args)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"sapper {' '.join(args)[:300]}: exit 3") from res.exception
    assert res.exit_code in (0, 1, 2), (res.exit_code, res.output[:MAX_LINE])
    assert "Traceback" not in res.output
    assert len(res.output) < MAX_OUTPUT
    if res.exit_code == 2:  # sapper's one line, or click's usage box for a bad option
        assert "error" in res.output.lower()


# ---- mutations of real files ---------------------------------------------------------
_HOSTILE_TOKENS: list[bytes] = [
    b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b".nan", b".inf", b"-.inf",
    b"9" * 5000, b"1" + b"0" * 99, b"18446744073709551616", b"-1", b"0", b"1e12",
    b"1.0e+12", b"0x" + b"f" * 120, b"1:2:3:4:5:6:7:8:9", b"2001-13-45", b"[" * 150,
    b"{" * 150, b"[" * 5000, b"[[[[1]]]]", b"&a", b"*a", b"*undefined", b"<<: *a",
    b"!!binary", b"!!python/object/apply:os.system ['true']", b"!!set {a, b}", b"~",
    b"null", b"true", b"'x'", b'"[/bold]"', b"[/x]", b"[1, 2]", b"{}", b'""',
    b"\x00", b"\x1b[2J", b"\x07", b"\r", b"\t", b"\xff\xfe", b"\xc3", b"\xef\xbb\xbf",
    b"x" * 5000, b'"auto"', b"auto", b"- - -", b"---\n", b"...\n", b"%YAML 1.1\n",
    b"? [a]\n: b", b"\n  bad: indent", b'"\\ud800"',
]
_TOKEN = st.one_of(st.sampled_from(_HOSTILE_TOKENS), st.binary(min_size=1, max_size=8))
#: A scalar after "key:" in YAML or JSON: the value a mutation swaps.
_VALUE = re.compile(rb":[ \t]*([^\s,\]}{\[][^,\]}\n]*)")


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with one to three mutations."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(["flip", "truncate", "insert", "value", "value", "delete", "repeat"])
        )
        pos = draw(st.integers(0, max(len(out) - 1, 0)))
        if kind == "flip" and out:
            out[pos] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del out[pos:]
        elif kind == "insert":
            out[pos:pos] = draw(_TOKEN)
        elif kind == "value":
            spans = [m.span(1) for m in _VALUE.finditer(out)]
            if spans:
                a, b = spans[draw(st.integers(0, len(spans) - 1))]
                out[a:b] = draw(_TOKEN)
        elif kind == "delete":
            del out[pos : pos + draw(st.integers(1, 64))]
        elif kind == "repeat":  # a span many times over: wide files, repeated keys
            piece = bytes(out[pos : pos + draw(st.integers(1, 40))])
            out[pos:pos] = piece * draw(st.integers(2, 2000))
    return bytes(out)


def _mutated_file(files: list[Path]) -> st.SearchStrategy[tuple[Path, bytes]]:
    return st.sampled_from(files).flatmap(lambda p: st.tuples(st.just(p), mutated(SOURCES[p])))


def _maybe_mutated(files: list[Path]) -> st.SearchStrategy[tuple[Path, bytes]]:
    """A file as shipped or mutated: so a plan's references sometimes all load."""
    as_shipped = st.sampled_from(files).map(lambda p: (p, SOURCES[p]))
    return st.one_of(as_shipped, _mutated_file(files))


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    """A scratch copy of the examples' layout, so relative paths (data.path) resolve."""
    root = Path(tempfile.mkdtemp(prefix="sapper-hostile-"))
    (root / "plans").mkdir()
    (root / "data").symlink_to(EXAMPLES / "data")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _write(work: Path, name: str, data: bytes) -> Path:
    path = work / "plans" / name
    path.write_bytes(data)
    return path


# ---- generated values ----------------------------------------------------------------
def _choices(annotation: Any) -> list[Any]:
    """Values a field of this type holds in a real plan (to get past validation to the
    checks): its literal or enum values, or a few typical ones of its type."""
    out: list[Any] = []
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is typing.Literal:
            out.extend(typing.get_args(arg))
        elif isinstance(arg, type) and issubclass(arg, enum.Enum):
            out.extend(m.value for m in arg)
        elif arg is bool:
            out.extend([True, False])
        elif arg is int:
            out.extend([1, 2, 4, 8, 64, 128, 4096])
        elif arg is float:
            out.extend([1e-4, 3e-4, 0.02, 0.5, 1.0, 2.0, 65536.0])
        elif arg is str:
            out.extend(["llama", "cosine", "adamw", "A100-80GB", "H100", "gelu"])
    return out


def _plan_fields(model: type[BaseModel] = Plan, prefix: str = "") -> dict[str, list[Any]]:
    """Every field path of the Plan with its plausible values; a section is a path too
    (the value swapped for a whole section)."""
    fields: dict[str, list[Any]] = {}
    for name, info in model.model_fields.items():
        nested = [
            a for a in (info.annotation, *typing.get_args(info.annotation))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if nested:
            fields.update(_plan_fields(nested[0], f"{prefix}{name}."))
        fields[f"{prefix}{name}"] = _choices(info.annotation)
    return fields


PLAN_FIELDS = _plan_fields()
_WORDS = sorted(
    {str(c) for cs in PLAN_FIELDS.values() for c in cs}
    | {g.name for g in GPUS}
    | set(FAMILIES)
    | {"auto", "", "[/x]", "\x1b[2J", "a\nb", "x" * 5000, "none", "-1", "nan"}
)
_NUMBERS = [0, 1, -1, 2, 3, 7, 8, 64, 100, 4096, 10**6, 10**6 + 1, 10**9, 2**31, 2**63,
            2**64, 10**99, 10**100, -(10**30)]
VALUE = st.one_of(
    st.sampled_from(_NUMBERS),
    st.integers(),
    st.floats(),  # nan and ±inf included
    st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1e308, 0.5, 1.0, 3e-4]),
    st.sampled_from(_WORDS),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
    st.lists(st.one_of(st.integers(-3, 3), st.floats()), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2),
)


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    node = tree
    *parents, leaf = path.split(".")
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[leaf] = value


def _field_value(key: str) -> st.SearchStrategy[Any]:
    """A value for ``key``: two times in three one it could hold (so plans get past
    validation to the checks), else anything."""
    choices = PLAN_FIELDS.get(key) or []
    plausible = st.sampled_from(choices) if choices else VALUE
    # Not one_of(plausible, plausible, VALUE): hypothesis flattens VALUE's own branches.
    return st.integers(0, 2).flatmap(lambda i: VALUE if i == 0 else plausible)


def _overrides(
    keys: list[str], value: Callable[[str], st.SearchStrategy[Any]] = lambda _: VALUE
) -> st.SearchStrategy[list[tuple[str, Any]]]:
    pair = st.sampled_from(keys).flatmap(lambda k: st.tuples(st.just(k), value(k)))
    return st.lists(pair, min_size=1, max_size=4)


def _yaml(tree: Any) -> bytes:
    return yaml.safe_dump(tree, allow_unicode=True).encode()


_HEALTHY = yaml.safe_load(SOURCES[EXAMPLES / "plans" / "healthy-llama-7b.yaml"])
_DS_KEYS = [f"{s}.{k}" if s else k for s, keys in SECTIONS.items() for k in keys or ()]
_HF_KEYS = sorted(set(_POSITIVE_INTS) | {k for ks in _ORIGIN.values() for k in ks})
_HF_KEYS += ["model_type", "architectures", "rope_scaling", "text_config", "auto_map"]


# ---- the tests -----------------------------------------------------------------------
@stable_settings(2500)
@given(case=_mutated_file(PLAN_FILES), run_checks=st.integers(0, 9))
def test_mutated_plan_files(work: Path, case: tuple[Path, bytes], run_checks: int) -> None:
    source, data = case
    path = _write(work, source.name, data)
    loaded = library_case("plan files", lambda: load_plan(path))
    if loaded is not None and run_checks == 0:
        checks_case(loaded)


@stable_settings(2000)
@given(case=_mutated_file(HF_FILES))
def test_mutated_hf_configs(work: Path, case: tuple[Path, bytes]) -> None:
    path = _write(work, "config.json", case[1])
    library_case("hf files", lambda: read_hf_config(path))


@stable_settings(2000)
@given(case=_mutated_file(DS_FILES))
def test_mutated_deepspeed_configs(work: Path, case: tuple[Path, bytes]) -> None:
    path = _write(work, "ds.json", case[1])
    library_case("deepspeed files", lambda: read_deepspeed_config(path))


@stable_settings(1500)
@given(changes=_overrides(sorted(PLAN_FIELDS), _field_value), run_checks=st.integers(0, 4))
def test_generated_plans(work: Path, changes: list[tuple[str, Any]], run_checks: int) -> None:
    tree = json.loads(json.dumps(_HEALTHY))
    for key, value in changes:
        _set(tree, key, value)
    path = _write(work, "generated.yaml", _yaml(tree))
    loaded = library_case("generated plans", lambda: load_plan(path))
    if loaded is not None and run_checks == 0:
        checks_case(loaded)


@stable_settings(1000)
@given(base=st.sampled_from(DS_FILES), changes=_overrides(_DS_KEYS))
def test_generated_deepspeed_configs(
    work: Path, base: Path, changes: list[tuple[str, Any]]
) -> None:
    tree = json.loads(SOURCES[base])
    for key, value in changes:
        _set(tree, key, value)
    path = _write(work, "ds.json", json.dumps(tree).encode())
    library_case("generated deepspeed", lambda: read_deepspeed_config(path))


@stable_settings(1000)
@given(base=st.sampled_from(HF_FILES), changes=_overrides(_HF_KEYS))
def test_generated_hf_configs(work: Path, base: Path, changes: list[tuple[str, Any]]) -> None:
    tree = json.loads(SOURCES[base])
    for key, value in changes:
        if key == "model_type" and isinstance(value, str) and value not in FAMILIES:
            # A real family outside FAMILIES is built on the meta device (~1 s): keep
            # those to the unit tests, so this stays a fast test.
            value = value + "?"
        tree[key] = value
    path = _write(work, "config.json", json.dumps(tree).encode())
    library_case("generated hf", lambda: read_hf_config(path))


@stable_settings(500)
@given(
    hf=_maybe_mutated(HF_FILES),
    ds=_maybe_mutated(DS_FILES),
    plan=_maybe_mutated(PLAN_FILES),
)
def test_plans_referencing_mutated_files(
    work: Path, hf: tuple[Path, bytes], ds: tuple[Path, bytes], plan: tuple[Path, bytes]
) -> None:
    _write(work, "model.json", hf[1])
    _write(work, "ds.json", ds[1])
    refs = b"model: {hf_config: model.json}\ndeepspeed: ds.json\n"
    path = _write(work, "refs.yaml", refs + plan[1])
    library_case("plans with references", lambda: load_plan(path))


_OPTION_VALUES = ["8", "0", "-1", "nan", "inf", "-inf", "1e12", str(2**64), "9" * 5000,
                  "", "x", "A100-80GB", "bf16", "full", "3e-4", "1.0"]
_OPTIONS = ["--gpus", "--gpus-per-node", "--nodes", "--gpu", "--seq-len", "--micro-batch",
            "--grad-accum", "--global-batch", "--tp", "--pp", "--dp", "--zero", "--dtype",
            "--lr", "--warmup", "--max-norm", "--checkpointing", "--select", "--ignore"]


@stable_settings(250)
@given(
    command=st.sampled_from(["check", "check", "memory", "plan"]),
    plan=st.one_of(st.none(), _mutated_file(PLAN_FILES)),
    hf=st.one_of(st.none(), _mutated_file(HF_FILES)),
    ds=st.one_of(st.none(), _mutated_file(DS_FILES)),
    options=st.lists(
        st.tuples(st.sampled_from(_OPTIONS), st.sampled_from(_OPTION_VALUES)), max_size=3
    ),
    fmt=st.sampled_from(["text", "json"]),
)
def test_cli(
    work: Path,
    command: str,
    plan: tuple[Path, bytes] | None,
    hf: tuple[Path, bytes] | None,
    ds: tuple[Path, bytes] | None,
    options: list[tuple[str, str]],
    fmt: str,
) -> None:
    args = [command, "--format", fmt]
    if plan is not None:
        args.append(str(_write(work, "cli.yaml", plan[1])))
    if hf is not None:
        args += ["--model", str(_write(work, "cli-model.json", hf[1]))]
    if ds is not None:
        args += ["--deepspeed", str(_write(work, "cli-ds.json", ds[1]))]
    for option, value in options:
        if option in ("--select", "--ignore") and command != "check":
            continue
        args += [option, value]
    cli_case(args)


def test_zz_enough_cases() -> None:
    """The promise of the module docstring; skipped when only some tests ran (-k)."""
    expected = {
        "plan files", "hf files", "deepspeed files", "generated plans", "generated deepspeed",
        "generated hf", "plans with references", "cli",
    }
    if not expected <= set(CASES):
        pytest.skip("only part of the property tests ran")
    total = sum(n for name, n in CASES.items() if name != "checks")
    assert total >= MIN_CASES, dict(CASES)
