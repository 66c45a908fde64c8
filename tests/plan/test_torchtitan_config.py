"""The torchtitan reader: real torchtitan train configs (current and older layout) into
the Plan with torchtitan's defaults, llama3, qwen3 and deepseek_v3 flavors as shapes,
typos (C005), flavors it cannot describe (C006), bad values (exit 2 naming file and key),
and mutated examples never crashing."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.test_hostile_property import cli_case, library_case, mutated
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.errors import InputError
from sapper.model import architecture_from_plan, total_params
from sapper.plan.load import load_plan
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import detect_config, read_config
from sapper.plan.readers.torchtitan import _ffn_width
from sapper.plan.readers.torchtitan_keys import LLAMA3_FLAVORS

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples" / "torchtitan"
FILES = sorted(EXAMPLES.glob("*.toml"))
runner = CliRunner()
_register_commands()


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


BASE = """\
    [model]
    name = "llama3"
    flavor = "8B"

    [training]
    local_batch_size = 2
    seq_len = 4096
    steps = 500

    [parallelism]
    data_parallel_replicate_degree = {replicate}
    data_parallel_shard_degree = {shard}
    tensor_parallel_degree = {tp}
"""


def job(tmp_path: Path, replicate: int = 1, shard: int = -1, tp: int = 1, extra: str = "") -> Path:
    return write(tmp_path, BASE.format(replicate=replicate, shard=shard, tp=tp)
                 + textwrap.dedent(extra))


# ---- real examples ---------------------------------------------------------------------
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_examples_are_detected_as_torchtitan(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "torchtitan"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_examples_use_only_known_keys(path: Path) -> None:
    assert not [f for f in read_config(path).findings if f.code == "C005"]


def test_llama3_8b() -> None:
    src = read_config(EXAMPLES / "llama3_8b.toml")
    d = src.data
    assert d["framework"] == "torchtitan"
    assert d["batch"] == {"micro_batch_size": 1, "gradient_accumulation_steps": 1,
                          "seq_len": 8192}
    assert d["schedule"] == {"total_steps": 1000, "warmup_steps": 200, "type": "linear",
                             "min_lr": 0.0}
    assert d["clipping"] == {"max_norm": 1.0}
    # data_parallel_shard_degree = -1: FSDP over whatever the other degrees leave.
    p = d["parallel"]
    assert (p["dp"], p["zero_stage"], p["tp"], p["pp"], p["cp"]) == (-1, 3, 1, 1, 1)
    assert p["checkpointing"] == {"granularity": "selective"}  # selective_ac_option "op"
    assert d["precision"] == {"dtype": "bf16", "grad_dtype": "fp32",
                              "loss_scaling": {"mode": "none"}}
    assert d["optimizer"] == {"type": "adamw", "lr": 3e-4, "eps": 1e-8, "weight_decay": 0.1,
                              "betas": [0.9, 0.95], "fused": True}
    assert src.origin["optimizer.weight_decay"] == "optimizer.weight_decay (torchtitan default)"
    m = d["model"]
    assert (m["hidden_size"], m["num_layers"], m["num_heads"], m["num_kv_heads"]) == (
        4096, 32, 32, 8)
    assert m["vocab_size"] == 128256 and m["ffn_hidden_size"] == 14336
    assert m["rope_theta"] == 500000.0 and m["max_position_embeddings"] == 8192
    assert src.findings == [] and src.unresolved == []


@pytest.mark.parametrize(("flavor", "ffn"), [("8B", 14336), ("70B", 28672), ("405B", 53248),
                                             ("debugmodel", 768)])
def test_flavor_ffn_widths_match_meta_llama(flavor: str, ffn: int) -> None:
    # Llama 3 8B/70B/405B's intermediate_size in their published config.json.
    args = LLAMA3_FLAVORS[flavor]
    assert _ffn_width(int(args["dim"]), args) == ffn  # type: ignore[arg-type]


def test_llama3_8b_parameter_count_is_meta_llamas() -> None:
    loaded = load_plan(configs=[EXAMPLES / "llama3_8b.toml"])
    assert loaded.plan.model is not None
    assert total_params(architecture_from_plan(loaded.plan)) == 8_030_261_248


def test_405b_async_tp_and_full_checkpointing() -> None:
    d = read_config(EXAMPLES / "llama3_405b.toml").data
    p = d["parallel"]
    assert p["tp"] == 8 and p["sequence_parallel"] is True and p["tp_comm_overlap"] is True
    assert p["checkpointing"] == {"granularity": "full"}


def test_debug_model_wsd_and_every_other_block() -> None:
    d = read_config(EXAMPLES / "debug_model.toml").data
    assert d["schedule"]["type"] == "wsd"  # decay_ratio given
    assert d["parallel"]["checkpointing"] == {"granularity": "full", "every_k_layers": 2}
    assert d["model"]["vocab_size"] == 2048 and d["model"]["hidden_size"] == 256


def test_old_layout() -> None:
    src = read_config(EXAMPLES / "old_layout_llama3_70b.toml")
    d = src.data
    assert d["batch"]["micro_batch_size"] == 8
    assert src.origin["batch.micro_batch_size"] == "training.batch_size"
    assert d["parallel"]["tp"] == 8
    assert src.origin["parallel.tp"] == "training.tensor_parallel_degree"
    assert src.origin["parallel.cp"] == "experimental.context_parallel_degree"
    assert src.origin["schedule.warmup_steps"] == "training.warmup_steps"
    assert d["parallel"]["checkpointing"] == {"granularity": "full"}
    assert d["model"]["num_layers"] == 80


def test_unknown_flavor_leaves_the_model_unknown() -> None:
    """Llama 4 interleaves MoE and dense blocks: named, not described."""
    src = read_config(EXAMPLES / "llama4_17bx128e.toml")
    assert "model" not in src.data and "model" in src.unresolved
    (finding,) = [f for f in src.findings if f.code == "C006"]
    assert "llama4" in finding.message and "--model config.json" in (finding.fix or "")
    assert (src.data["parallel"]["tp"], src.data["parallel"]["pp"]) == (8, 4)
    res = runner.invoke(app, ["check", "--config", str(EXAMPLES / "llama4_17bx128e.toml"),
                              "--format", "json", "--gpus", "256", "--gpu", "H100"])
    out = json.loads(res.output)
    assert out["summary"]["items"]["memory"] == "unknown"
    assert "C006" in [f["code"] for f in out["findings"]]


def test_a_flavor_of_a_known_family_that_torchtitan_lacks_is_unknown(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.format(replicate=1, shard=-1, tp=1).replace(
        'name = "llama3"\n    flavor = "8B"', 'name = "qwen3"\n    flavor = "72B"'))
    src = read_config(path)
    assert "model" in src.unresolved and "model" not in src.data


@pytest.mark.parametrize(
    ("name", "params", "experts"),
    [("deepseek_v3_16b", 15.7e9, 64), ("deepseek_v3_671b", 671.0e9, 256),
     ("qwen3_32b", 32.8e9, 1), ("qwen3_moe_debug", None, 64)],
)
def test_deepseek_v3_and_qwen3_flavors_are_model_shapes(
    name: str, params: float | None, experts: int
) -> None:
    src = read_config(EXAMPLES / f"{name}.toml")
    assert "model" not in src.unresolved
    assert src.data["model"].get("num_experts", 1) == experts
    if params is not None:
        plan = load_plan(configs=[EXAMPLES / f"{name}.toml"]).plan
        assert total_params(architecture_from_plan(plan)) == pytest.approx(params, rel=0.01)


def test_deepseek_v3_16b_is_latent_attention_with_shared_experts() -> None:
    src = read_config(EXAMPLES / "deepseek_v3_16b.toml")
    m = src.data["model"]
    assert (m["kv_lora_rank"], m["head_dim"], m["qk_rope_head_dim"], m["v_head_dim"]) == (
        512, 192, 64, 128)
    assert "q_lora_rank" not in m  # q_lora_rank 0: queries projected directly
    assert (m["first_dense_layers"], m["moe_ffn_hidden_size"]) == (1, 1408)
    assert m["shared_expert_ffn_hidden_size"] == 2 * 1408
    assert src.data["parallel"]["ep"] == 8
    assert "deepseekv3_args" in src.origin["model.num_experts"]


def test_qwen3_head_width_and_tied_embeddings(tmp_path: Path) -> None:
    m = read_config(EXAMPLES / "qwen3_32b.toml").data["model"]
    assert (m["hidden_size"], m["num_heads"], m["head_dim"]) == (5120, 64, 128)
    assert m["tied_embeddings"] is False
    path = write(tmp_path, BASE.format(replicate=1, shard=-1, tp=1).replace(
        'name = "llama3"\n    flavor = "8B"', 'name = "qwen3"\n    flavor = "0.6B"'))
    assert read_config(path).data["model"]["tied_embeddings"] is True


@pytest.mark.parametrize(("etp", "ep"), [(2, 4), (1, None)])
def test_expert_tensor_parallel_degree_other_than_tp_leaves_ep_unknown(
    tmp_path: Path, etp: int, ep: int | None
) -> None:
    path = job(tmp_path, tp=2, extra=f"""
        expert_parallel_degree = 4
        expert_tensor_parallel_degree = {etp}
    """)
    src = read_config(path)
    if ep is None:
        assert "parallel.ep" in src.unresolved and "ep" not in src.data["parallel"]
    else:
        assert src.data["parallel"]["ep"] == ep


def _verdicts(args: list[str]) -> tuple[dict[str, str], list[str]]:
    res = runner.invoke(app, ["check", *args, "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    out = json.loads(res.output)
    items = {k: v for k, v in out["summary"]["items"].items() if k != "config"}
    return items, sorted(f["code"] for f in out["findings"])


def test_check_gives_the_verdicts_of_the_equivalent_plan(tmp_path: Path) -> None:
    """What llama3_70b.toml means to torchtitan, written by hand as a sapper plan."""
    plan = write(tmp_path, """\
        framework: torchtitan
        model:
          family: llama
          hidden_size: 8192
          num_layers: 80
          num_heads: 64
          num_kv_heads: 8
          vocab_size: 128256
          ffn_hidden_size: 28672
          activation: swiglu
          norm_type: rmsnorm
          position_encoding: rope
          rope_theta: 500000.0
          max_position_embeddings: 8192
        init: {std: 0.02, residual_scaling: depth}
        precision: {dtype: bf16, grad_dtype: fp32, loss_scaling: {mode: none}}
        optimizer: {type: adamw, lr: 1.5e-4, eps: 1.0e-8, weight_decay: 0.1,
                    betas: [0.9, 0.95], fused: true}
        schedule: {type: linear, warmup_steps: 200, total_steps: 1000, min_lr: 0.0}
        clipping: {max_norm: 1.0}
        batch: {micro_batch_size: 8, gradient_accumulation_steps: 1, seq_len: 8192}
        parallel: {tp: 8, pp: 1, cp: 1, dp: -1, zero_stage: 3, sequence_parallel: true,
                   tp_comm_overlap: false, checkpointing: {granularity: full}}
    """, "plan.yaml")
    cluster = ["--gpus", "64", "--gpu", "H100"]
    given_ = _verdicts(["--config", str(EXAMPLES / "llama3_70b.toml"), *cluster])
    by_hand = _verdicts(["--config", str(plan), *cluster])
    assert given_ == by_hand
    assert given_[0]["memory"] != "unknown"


# ---- layouts and precision ----------------------------------------------------------------
def test_hsdp_degrees_multiply(tmp_path: Path) -> None:
    src = read_config(job(tmp_path, replicate=2, shard=4))
    p = src.data["parallel"]
    assert p["dp"] == 8 and p["zero_stage"] == 3
    assert src.origin["parallel.dp"] == (
        "parallelism.data_parallel_replicate_degree × parallelism.data_parallel_shard_degree")


def test_hsdp_with_inferred_shard_is_unknown(tmp_path: Path) -> None:
    src = read_config(job(tmp_path, replicate=2, shard=-1))
    assert "parallel.dp" in src.unresolved and "dp" not in src.data["parallel"]


def test_ddp_uses_autocast(tmp_path: Path) -> None:
    src = read_config(job(tmp_path, replicate=8, shard=1))
    assert src.data["parallel"]["zero_stage"] == 0
    assert src.data["precision"]["autocast"] is True and src.data["precision"]["dtype"] == "bf16"


def test_tp_without_fsdp_trains_in_fp32(tmp_path: Path) -> None:
    src = read_config(job(tmp_path, shard=1, tp=8))
    assert src.data["precision"]["dtype"] == "fp32"
    assert src.data["parallel"]["sequence_parallel"] is True


def test_full_bf16_training(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.format(replicate=1, shard=-1, tp=1).replace(
        "steps = 500", 'steps = 500\ndtype = "bfloat16"'))
    src = read_config(path)
    assert src.data["precision"]["master_weights"] == "bf16"
    assert src.data["precision"]["optimizer_states"] == "bf16"


def test_global_batch_gives_accumulation_to_the_plan(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.format(replicate=1, shard=-1, tp=1).replace(
        "steps = 500", "steps = 500\nglobal_batch_size = 64"))
    loaded = load_plan(configs=[path], overrides=None)
    assert loaded.plan.batch.global_batch_size == 64
    assert "gradient_accumulation_steps" not in read_config(path).data["batch"]


def test_memory_budget_checkpointing_is_unknown(tmp_path: Path) -> None:
    src = read_config(job(tmp_path, extra='\n[activation_checkpoint]\nmode = "memory_budget"\n'))
    assert "parallel.checkpointing.granularity" in src.unresolved


def test_a_checkpoint_to_load_means_pretrained(tmp_path: Path) -> None:
    src = read_config(job(tmp_path, extra='\n[checkpoint]\ninitial_load_path = "/ckpt/step-0"\n'))
    assert src.data["init"]["from_pretrained"] is True


# ---- typos and bad values -------------------------------------------------------------------
@pytest.mark.parametrize(("old", "new", "hint"), [
    ("local_batch_size = 2", "local_batch_sise = 2", "training.local_batch_size"),
    ("tensor_parallel_degree", "tensor_paralel_degree", "parallelism.tensor_parallel_degree"),
    ("[training]", "[trainig]", "training"),
])
def test_typos_name_the_intended_key(tmp_path: Path, old: str, new: str, hint: str) -> None:
    path = write(tmp_path, BASE.format(replicate=1, shard=-1, tp=1).replace(old, new))
    found = [f for f in read_config(path).findings if f.code == "C005"]
    assert found and found[0].data["suggestion"] == hint, [f.message for f in found]


@pytest.mark.parametrize(("old", "new", "key"), [
    ("tensor_parallel_degree = 1", "tensor_parallel_degree = 0",
     "parallelism.tensor_parallel_degree"),
    ("local_batch_size = 2", 'local_batch_size = "two"', "training.local_batch_size"),
    ("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 0",
     "parallelism.data_parallel_shard_degree"),
    ("steps = 500", 'steps = 500\ndtype = "float16"', "training.dtype"),
])
def test_bad_values_exit_2_naming_file_and_key(tmp_path: Path, old: str, new: str,
                                               key: str) -> None:
    path = write(tmp_path, BASE.format(replicate=1, shard=-1, tp=1).replace(old, new))
    with pytest.raises(InputError) as err:
        read_config(path)
    assert key in str(err.value) and "job.toml" in str(err.value)
    res = runner.invoke(app, ["check", "--config", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert key in " ".join(res.output.split())


def test_other_formats_are_not_taken_for_torchtitan_or_nemo() -> None:
    others = [p for d in ("plans", "deepspeed", "hf") for p in (ROOT / "examples" / d).glob("*")
              if p.suffix in (".yaml", ".json", ".toml")]
    assert others
    for path in others:
        try:
            name = detect_config(Sniff.of(path)).name
        except InputError:
            continue
        assert name not in ("torchtitan", "nemo"), path


# ---- hostile input --------------------------------------------------------------------------
SOURCES = {p: p.read_bytes() for p in FILES}


@stable_settings(300, shrink=False)
@given(st.sampled_from(FILES).flatmap(lambda p: st.tuples(st.just(p), mutated(SOURCES[p]))),
       st.integers(0, 9))
def test_mutated_examples_never_crash(tmp_path_factory: pytest.TempPathFactory,
                                      case: tuple[Path, bytes], which: int) -> None:
    path, data = case
    target = tmp_path_factory.mktemp("titan") / path.name
    target.write_bytes(data)
    library_case("torchtitan", lambda: load_plan(configs=[target], config_format="torchtitan"))
    library_case("torchtitan", lambda: load_plan(configs=[target]))
    if which == 0:
        cli_case(["check", "--config", str(target), "--gpu", "H100", "--gpus", "16"])


def test_pipeline_runs_the_local_batch_as_microbatches(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.format(replicate=1, shard=-1, tp=1).replace(
        "local_batch_size = 2", "local_batch_size = 8") + textwrap.dedent("""\
        pipeline_parallel_degree = 4
        pipeline_parallel_schedule = "Interleaved1F1B"
        pipeline_parallel_microbatch_size = 2
    """))
    d = read_config(path).data
    assert d["batch"]["micro_batch_size"] == 2 and d["batch"]["gradient_accumulation_steps"] == 4
    assert d["parallel"]["pp"] == 4 and d["parallel"]["pipeline_schedule"] == "interleaved"
    bad = write(tmp_path, path.read_text().replace("microbatch_size = 2", "microbatch_size = 3"),
                "bad.toml")
    with pytest.raises(InputError, match="pipeline_parallel_microbatch_size"):
        read_config(bad)
