"""The NeMo reader: real NeMo and NeMo-Megatron-Launcher configs into the Plan, the
``${...}`` interpolations they use, typos (C005), values from outside the file (C006)
and bad values (exit 2 naming file and key), and mutated examples never crashing."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.test_hostile_property import cli_case, library_case, mutated
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.errors import InputError
from sapper.plan.load import load_plan
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.interpolation import Resolver, Unresolved
from sapper.plan.readers.registry import detect_config, read_config

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples" / "nemo"
HF = ROOT / "examples" / "hf"
FILES = sorted(EXAMPLES.glob("*.yaml"))
runner = CliRunner()
_register_commands()


def write(tmp_path: Path, text: str, name: str = "nemo.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def codes(src: Any) -> list[str]:
    return [f.code for f in src.findings]


MINIMAL = """\
    trainer:
      devices: 8
      num_nodes: 2
      precision: {precision}
      max_steps: 1000
    model:
      micro_batch_size: 2
      global_batch_size: 64
      tensor_model_parallel_size: 2
      encoder_seq_length: 2048
{extra}"""


def minimal(tmp_path: Path, precision: str = "bf16", extra: str = "") -> Path:
    return write(tmp_path, MINIMAL.format(precision=precision, extra=textwrap.indent(
        textwrap.dedent(extra), "      ")))


# ---- real examples ---------------------------------------------------------------------
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_examples_are_detected_as_nemo(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "nemo"


def test_megatron_gpt_config() -> None:
    src = read_config(EXAMPLES / "megatron_gpt_config.yaml")
    d = src.data
    assert d["framework"] == "nemo"
    assert d["hardware"] == {"gpus_per_node": 1, "nodes": 1}
    assert d["batch"] == {"micro_batch_size": 4, "global_batch_size": 8, "seq_len": 512}
    assert d["precision"] == {
        "dtype": "bf16", "autocast": False, "master_weights": "fp32", "grad_dtype": "fp32",
        "loss_scaling": {"mode": "none"},
    }
    assert d["clipping"] == {"max_norm": 1.0}
    assert d["model"]["hidden_size"] == 768 and d["model"]["num_layers"] == 12
    assert d["model"]["num_heads"] == 12 and d["model"]["ffn_hidden_size"] == 3072
    # max_position_embeddings: ${.encoder_seq_length}; data.seq_length: ${model.encoder...}
    assert d["model"]["max_position_embeddings"] == 512
    assert d["model"]["activation"] == "gelu" and d["model"]["tied_embeddings"] is True
    assert d["optimizer"] == {"type": "adamw", "lr": 2e-4, "weight_decay": 0.01,
                              "betas": [0.9, 0.98]}
    assert d["schedule"] == {"total_steps": 100000, "type": "cosine", "warmup_steps": 500,
                             "min_lr": 2e-5}
    assert d["init"] == {"std": 0.02, "residual_scaling": "depth"}
    assert d["parallel"]["tp"] == 1 and "zero_stage" not in d["parallel"]  # fused_adam
    assert src.origin["batch.seq_len"] == "model.data.seq_length"
    # The vocabulary is the tokenizer's: unknown, said once, no typo reported.
    assert codes(src) == ["C006"] and src.unresolved == ["model.vocab_size"]
    assert "GPT2BPETokenizer" in src.findings[0].message


def test_launcher_llama2_7b() -> None:
    src = read_config(EXAMPLES / "launcher_llama_llama2_7b.yaml")
    d = src.data
    assert d["hardware"] == {"gpus_per_node": 8, "nodes": 16}
    assert d["batch"] == {"micro_batch_size": 1, "global_batch_size": 2048, "seq_len": 4096}
    m = d["model"]
    assert (m["activation"], m["norm_type"], m["position_encoding"]) == (
        "swiglu", "rmsnorm", "rope")
    assert m["ffn_hidden_size"] == 11008 and m["tied_embeddings"] is False
    assert m["attention_bias"] is False and m["rope_theta"] == 10000.0
    assert src.origin["model.rope_theta"] == "model.rotary_base (NeMo default)"
    # distributed_fused_adam partitions master weights and states: ZeRO-1.
    assert d["parallel"]["zero_stage"] == 1
    assert codes(src) == ["C006"]


def test_launcher_gpt3_175b_interleaved_pipeline() -> None:
    d = read_config(EXAMPLES / "launcher_gpt3_175b.yaml").data
    assert d["parallel"]["tp"] == 4 and d["parallel"]["pp"] == 8
    assert d["parallel"]["virtual_pipeline_stages"] == 12
    assert d["parallel"]["pipeline_schedule"] == "interleaved"
    assert d["parallel"]["sequence_parallel"] is True
    assert d["model"]["hidden_size"] == 12288 and d["model"]["num_layers"] == 96


def test_launcher_mixtral_moe() -> None:
    src = read_config(EXAMPLES / "launcher_mixtral_8x7b.yaml")
    m = src.data["model"]
    assert (m["num_experts"], m["experts_top_k"], m["num_kv_heads"]) == (8, 2, 8)
    assert m["rope_theta"] == 1e6 and src.data["parallel"]["pp"] == 4
    (finding,) = src.findings
    # The tokenizer is a hub id: the fix names the config.json to pass.
    assert "mistralai/Mixtral-8x7B-v0.1" in finding.message
    assert "--model config.json" in (finding.fix or "")


def test_finetuning_config_restores_weights_in_fp16() -> None:
    src = read_config(EXAMPLES / "megatron_gpt_finetuning_config.yaml")
    assert src.data["init"] == {"from_pretrained": True}  # restore_from_path: ???
    assert src.data["precision"]["dtype"] == "fp16"
    assert src.data["precision"]["loss_scaling"]["initial_scale"] == 2.0**32
    assert "model" not in src.data and src.findings == []


def test_local_hf_tokenizer_folder_brings_the_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text((HF / "llama-2-7b.json").read_text())
    text = (EXAMPLES / "launcher_llama_llama2_7b.yaml").read_text()
    text = re.sub(r"  tokenizer:\n(    .*\n)+", "  tokenizer:\n    library: huggingface\n"
                  "    type: ./llama\n", text)
    path = write(tmp_path, text, "llama.yaml")
    src = read_config(path)
    assert src.refs == {"hf_config": tmp_path / "llama" / "config.json"}
    assert "model.vocab_size" not in src.unresolved
    model = load_plan(configs=[path]).plan.model
    assert model is not None and model.vocab_size == 32000 and model.ffn_hidden_size == 11008


def test_launcher_multiply_resolver() -> None:
    # ffn_hidden_size: ${multiply:4, ${.hidden_size}}
    src = read_config(EXAMPLES / "launcher_gpt3_5b.yaml")
    assert src.data["model"]["ffn_hidden_size"] == 4 * 4096


def test_model_is_unknown_without_vocab_and_complete_with_model_json() -> None:
    alone = load_plan(configs=[EXAMPLES / "launcher_llama_llama2_7b.yaml"])
    assert alone.plan.model is None
    both = load_plan(configs=[EXAMPLES / "launcher_llama_llama2_7b.yaml"],
                     hf_config=HF / "llama-2-7b.json")
    model = both.plan.model
    assert model is not None and model.vocab_size == 32000
    assert model.hidden_size == 4096 and model.implementation == "megatron"


def _verdicts(args: list[str]) -> tuple[dict[str, str], list[str]]:
    res = runner.invoke(app, ["check", *args, "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    out = json.loads(res.output)
    items = {k: v for k, v in out["summary"]["items"].items() if k != "config"}
    found = sorted(f["code"] for f in out["findings"] if not f["code"].startswith("C00"))
    return items, found


def test_check_gives_the_verdicts_of_the_equivalent_plan(tmp_path: Path) -> None:
    """What the launcher's Llama-2 7B config means, written by hand as a sapper plan."""
    plan = write(tmp_path, f"""\
        framework: nemo
        model:
          hf_config: {HF / 'llama-2-7b.json'}
          hidden_size: 4096
          num_layers: 32
          num_heads: 32
          ffn_hidden_size: 11008
          max_position_embeddings: 4096
          activation: swiglu
          norm_type: rmsnorm
          norm_placement: pre
          position_encoding: rope
          rope_theta: 10000.0
          attention_bias: false
          mlp_bias: false
          tied_embeddings: false
          dropout: 0.0
          implementation: megatron
        precision: {{dtype: bf16, autocast: false, master_weights: fp32, grad_dtype: fp32,
                     loss_scaling: {{mode: none}}}}
        optimizer: {{type: adamw, lr: 1.0e-4, weight_decay: 0.1, betas: [0.9, 0.95]}}
        schedule: {{type: cosine, warmup_steps: 500, total_steps: 300000, min_lr: 1.0e-5}}
        clipping: {{max_norm: 1.0}}
        init: {{std: 0.01, residual_scaling: depth}}
        batch: {{micro_batch_size: 1, global_batch_size: 2048, seq_len: 4096}}
        parallel: {{tp: 1, pp: 1, sequence_parallel: false, zero_stage: 1,
                   checkpointing: {{granularity: none}}}}
        hardware: {{gpus_per_node: 8, nodes: 16}}
    """, "plan.yaml")
    given_ = _verdicts(["--config", str(EXAMPLES / "launcher_llama_llama2_7b.yaml"),
                        "--model", str(HF / "llama-2-7b.json"), "--gpu", "H100"])
    by_hand = _verdicts(["--config", str(plan), "--gpu", "H100"])
    assert given_ == by_hand
    assert given_[0]["memory"] != "unknown"


# ---- precision ---------------------------------------------------------------------------
def test_fp16_mixed_gets_nemos_grad_scaler(tmp_path: Path) -> None:
    src = read_config(minimal(tmp_path, "16-mixed"))
    ls = src.data["precision"]["loss_scaling"]
    assert ls == {"mode": "dynamic", "initial_scale": 2.0**32, "growth_interval": 1000,
                  "hysteresis": 2}
    assert src.origin["precision.loss_scaling.hysteresis"] == "model.hysteresis (NeMo default)"
    # megatron_amp_O2 defaults to False: torch.autocast over fp32 weights.
    assert src.data["precision"]["autocast"] is True


def test_fp16_scaler_settings_from_the_file(tmp_path: Path) -> None:
    src = read_config(minimal(tmp_path, "16", """\
        native_amp_init_scale: 65536
        native_amp_growth_interval: 500
        hysteresis: 4
        megatron_amp_O2: true
    """))
    p = src.data["precision"]
    assert p["dtype"] == "fp16" and p["autocast"] is False and p["master_weights"] == "fp32"
    assert p["loss_scaling"] == {"mode": "dynamic", "initial_scale": 65536.0,
                                 "growth_interval": 500, "hysteresis": 4}


@pytest.mark.parametrize(("precision", "dtype"), [
    ("32", "fp32"), ("32-true", "fp32"), ("bf16-mixed", "bf16"), ("16", "fp16"),
])
def test_precision_words(tmp_path: Path, precision: str, dtype: str) -> None:
    assert read_config(minimal(tmp_path, precision)).data["precision"]["dtype"] == dtype


def test_bf16_true_has_no_fp32_copy(tmp_path: Path) -> None:
    p = read_config(minimal(tmp_path, "bf16-true")).data["precision"]
    assert p["master_weights"] == "bf16" and p["optimizer_states"] == "bf16"


def test_fsdp_is_zero3_and_turns_o2_off(tmp_path: Path) -> None:
    src = read_config(minimal(tmp_path, "bf16", "fsdp: true\nmegatron_amp_O2: true\n"))
    assert src.data["parallel"]["zero_stage"] == 3
    assert src.data["precision"]["autocast"] is True


# ---- interpolations ----------------------------------------------------------------------
def test_relative_nested_and_string_interpolations() -> None:
    r = Resolver({
        "trainer": {"max_steps": 100, "nodes": "${oc.env:NODES}"},
        "model": {"hidden_size": 1024, "n": 12, "ffn": "${multiply:${.hidden_size}, 4}",
                  "sched": {"steps": "${trainer.max_steps}", "up": "${..n}",
                            "s": "${..hidden_size}x${..n}", "less": "${sum:${..n},-1}"},
                  "list": [7, 8], "pick": "${.list[1]}", "esc": "\\${x}"},
    })
    assert r.get("model.ffn") == 4096
    assert r.get("model.sched.steps") == 100 and r.get("model.sched.up") == 12
    assert r.get("model.sched.s") == "1024x12" and r.get("model.sched.less") == 11
    assert r.get("model.pick") == 8 and r.get("model.esc") == "${x}"
    env = r.get("trainer.nodes")
    assert isinstance(env, Unresolved) and "oc.env" in env.why


@pytest.mark.parametrize(("doc", "words"), [
    ({"a": "${b}", "b": "${a}"}, "cycle"),
    ({"a": "${data_dir}/x"}, "does not have"),
    ({"a": "???"}, "mandatory"),
    ({"a": "${.....x}"}, "above the top"),
    ({"a": "${now:%Y}"}, "resolved at launch"),
    ({"a": "${multiply:2}"}, "two numbers"),
    ({"a": "${" * 3000 + "}" * 3000}, "nested deeper"),
    ({"a": "${b"}, "unbalanced"),
])
def test_interpolations_that_cannot_be_known(doc: dict[str, Any], words: str) -> None:
    value = Resolver(doc).get("a")
    assert isinstance(value, Unresolved) and words in value.why


def test_hostile_interpolations_are_bounded() -> None:
    # Each level refers to the one below 2 or 8 times: 8^15 evaluations if expanded
    # naively; memoized, one per key, and the string's length is bounded.
    doc: dict[str, Any] = {"v0": 1}
    for i in range(1, 15):
        doc[f"v{i}"] = f"${{sum:${{v{i - 1}}},${{v{i - 1}}}}}"
    text = {f"s{i}": f"${{s{i - 1}}}" * 8 for i in range(1, 15)} | {"s0": "ab"}
    start = time.monotonic()
    assert Resolver(doc).get("v14") == 2**14
    assert isinstance(Resolver(text).get("s14"), Unresolved)
    assert time.monotonic() - start < 2


def test_interpolation_from_outside_leaves_the_field_unknown(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        trainer:
          devices: ${oc.env:SLURM_GPUS_ON_NODE}
          num_nodes: 2
          precision: bf16
        model:
          micro_batch_size: ${oc.env:MBS}
          global_batch_size: 64
          tensor_model_parallel_size: 1
          encoder_seq_length: 2048
    """)
    src = read_config(path)
    assert "gpus_per_node" not in src.data["hardware"]
    assert "micro_batch_size" not in src.data["batch"]
    assert {"hardware.gpus_per_node", "batch.micro_batch_size"} <= set(src.unresolved)
    res = runner.invoke(app, ["check", "--config", str(path), "--format", "json"])
    out = json.loads(res.output)
    assert "C006" in [f["code"] for f in out["findings"]]
    assert "batch.micro_batch_size" in out["summary"]["unresolved"]
    assert out["summary"]["items"]["memory"] == "unknown"


def test_devices_minus_one_is_unknown(tmp_path: Path) -> None:
    src = read_config(write(tmp_path, MINIMAL.format(precision="bf16", extra="").replace(
        "devices: 8", "devices: -1")))
    assert "hardware.gpus_per_node" in src.unresolved


# ---- typos and bad values -------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "where", "key", "hint"), [
    ("", "trainer", "max_step", "trainer.max_steps"),
    ("tensor_model_paralel_size: 2\n", "model", "", "model.tensor_model_parallel_size"),
])
def test_typos_name_the_intended_key(tmp_path: Path, extra: str, where: str, key: str,
                                     hint: str) -> None:
    text = MINIMAL.format(precision="bf16", extra=textwrap.indent(extra, "      "))
    if key:
        text = text.replace("max_steps: 1000", f"{key}: 1000")
    src = read_config(write(tmp_path, text))
    found = [f for f in src.findings if f.code == "C005"]
    assert len(found) == 1 and found[0].data["suggestion"] == hint, found


@pytest.mark.parametrize(("old", "new", "key"), [
    ("micro_batch_size: 2", "micro_batch_size: -1", "model.micro_batch_size"),
    ("micro_batch_size: 2", "micro_batch_size: two", "model.micro_batch_size"),
    ("precision: bf16", "precision: 17", "trainer.precision"),
    ("tensor_model_parallel_size: 2", "tensor_model_parallel_size: 0",
     "model.tensor_model_parallel_size"),
])
def test_bad_values_exit_2_naming_file_and_key(tmp_path: Path, old: str, new: str,
                                               key: str) -> None:
    path = write(tmp_path, MINIMAL.format(precision="bf16", extra="").replace(old, new))
    with pytest.raises(InputError) as err:
        read_config(path)
    assert key in str(err.value) and "nemo.yaml" in str(err.value)
    res = runner.invoke(app, ["check", "--config", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert key in " ".join(res.output.split())


def test_unknown_activation_is_unresolved_not_guessed(tmp_path: Path) -> None:
    src = read_config(minimal(tmp_path, extra="""\
        num_layers: 2
        hidden_size: 64
        num_attention_heads: 4
        activation: reglu
    """))
    assert "model.activation" in src.unresolved
    assert "activation" not in src.data["model"]


# ---- hostile input --------------------------------------------------------------------------
SOURCES = {p: p.read_bytes() for p in FILES}


@stable_settings(300, shrink=False)
@given(st.sampled_from(FILES).flatmap(lambda p: st.tuples(st.just(p), mutated(SOURCES[p]))),
       st.integers(0, 9))
def test_mutated_examples_never_crash(tmp_path_factory: pytest.TempPathFactory,
                                      case: tuple[Path, bytes], which: int) -> None:
    path, data = case
    target = tmp_path_factory.mktemp("nemo") / path.name
    target.write_bytes(data)
    library_case("nemo", lambda: load_plan(configs=[target], config_format="nemo"))
    library_case("nemo", lambda: load_plan(configs=[target]))
    if which == 0:
        cli_case(["check", "--config", str(target), "--gpu", "H100"])


@pytest.mark.parametrize(("devices", "count"), [("[0, 1, 2, 3]", 4), ('"0,1"', 2), ('"4"', 4)])
def test_devices_as_lightning_reads_them(tmp_path: Path, devices: str, count: int) -> None:
    src = read_config(write(tmp_path, MINIMAL.format(precision="bf16", extra="").replace(
        "devices: 8", f"devices: {devices}")))
    assert src.data["hardware"]["gpus_per_node"] == count


_PIECES = st.sampled_from(["${", "}", ".", "..", ":", ",", "a", "b", "model", "x", "multiply",
                           "sum", "oc.env", "1", "-2", "2.5", "'", '"', "[0]", "\\", "$", " "])
_INTERP = st.lists(_PIECES, max_size=40).map("".join)


@stable_settings(2000)
@given(st.dictionaries(st.sampled_from(["a", "b", "x"]), _INTERP, min_size=1),
       st.dictionaries(st.sampled_from(["a", "b", "x"]), _INTERP))
def test_any_interpolation_text_resolves_or_is_unresolved(top: dict[str, str],
                                                         inner: dict[str, str]) -> None:
    """Whatever ``${...}`` text a file holds, the resolver returns a value or says why it
    cannot, never raises, and stays within the time limit."""
    resolver = Resolver({**top, "model": dict(inner)})
    for key in [*top, *(f"model.{k}" for k in inner)]:
        library_case("interpolation", lambda key=key: resolver.get(key))
