"""accelerate config YAML -> Plan: accelerate's semantics and defaults, its own keys for
typos, values the file cannot know left unknown."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.launch_support import EXAMPLES, LLAMA, hostile_case, one_line_error, same_verdicts
from tests.plan.test_hostile_property import mutated

from sapper.plan.load import load_plan
from sapper.plan.readers.accelerate_keys import BLOCKS, TOP_LEVEL
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import detect_config, read_config

ACC = EXAMPLES / "accelerate"
YAMLS = sorted(ACC.glob("*.yaml"))
CLUSTER = ["--model", str(LLAMA), "--gpu", "H100", "--seq-len", "4096", "--micro-batch", "1"]


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "default_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _codes(src) -> list[str]:
    return [f.code for f in src.findings]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_accelerate(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "accelerate"
    src = read_config(path)
    assert src.findings == [] and src.unresolved == []


def test_fsdp_template() -> None:
    """accelerate examples/config_yaml_templates/fsdp.yaml: FSDP1 FULL_SHARD, bf16 under
    autocast, no activation checkpointing."""
    src = read_config(ACC / "fsdp.yaml")
    assert src.data == {
        "framework": "accelerate",
        "hardware": {"nodes": 1, "num_gpus": 2, "gpus_per_node": 2},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": True},
        "parallel": {"zero_stage": 3, "checkpointing": {"granularity": "none"}},
    }
    assert src.origin["parallel.zero_stage"] == "fsdp_config.fsdp_sharding_strategy"


def test_handbook_zero3_is_run_by_deepspeed() -> None:
    src = read_config(ACC / "handbook-zero3.yaml")
    assert src.data["framework"] == "deepspeed"
    assert src.data["parallel"] == {
        "zero_stage": 3, "offload_optimizer": "none", "offload_params": "none"
    }
    assert src.data["precision"] == {"dtype": "bf16", "loss_scaling": {"mode": "none"}}
    assert src.data["hardware"] == {"nodes": 1, "num_gpus": 8, "gpus_per_node": 8}


def test_deepspeed_template_reads_its_config_file_first() -> None:
    """The DeepSpeed JSON holds the settings; accelerate's block only points at it."""
    loaded = load_plan(configs=[ACC / "deepspeed.yaml"])
    plan = loaded.plan
    assert plan.framework == "deepspeed"
    assert plan.parallel.zero_stage == 1
    assert plan.precision.dtype == "fp16" and plan.precision.loss_scaling.mode == "dynamic"
    assert plan.hardware.num_gpus == 2
    assert str(ACC / "zero_stage1_config.json") in loaded.sources


def test_multi_node_counts_processes_over_all_machines() -> None:
    src = read_config(ACC / "multi_node.yaml")
    assert src.data["hardware"] == {"nodes": 2, "num_gpus": 8, "gpus_per_node": 4}
    assert src.data["precision"] == {"dtype": "fp32"}
    assert src.origin["precision.dtype"] == "mixed_precision (accelerate default: no)"


def test_fsdp2_with_tensor_parallel_hsdp() -> None:
    """accelerate examples/torch_native_parallelism/configs/tp_hsdp.yaml."""
    plan = load_plan(configs=[ACC / "tp_hsdp.yaml"]).plan
    assert plan.parallel.zero_stage == 3  # fsdp_reshard_after_forward: true
    assert (plan.parallel.tp, plan.parallel.cp, plan.parallel.dp) == (2, 1, 4)
    assert plan.world_size == 8


@pytest.mark.parametrize(("name", "cp", "dp"), [("cp.yaml", 8, 1), ("nd.yaml", 4, 2)])
def test_fsdp2_with_context_parallel(name: str, cp: int, dp: int) -> None:
    """accelerate examples/torch_native_parallelism/configs/cp.yaml and nd.yaml: FSDP2
    shards over dp_shard × cp, the eight processes are dp × cp."""
    plan = load_plan(configs=[ACC / name]).plan
    assert (plan.parallel.cp, plan.parallel.dp, plan.parallel.zero_stage) == (cp, dp, 3)
    assert plan.world_size == 8


def test_ulysses_sequence_parallel_is_read_as_cp(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {
        "distributed_type": "DEEPSPEED", "num_processes": 8, "mixed_precision": "bf16",
        "deepspeed_config": {"zero_stage": 3},
        "parallelism_config": {"parallelism_config_sp_size": 4,
                               "parallelism_config_sp_backend": "deepspeed",
                               "parallelism_config_dp_shard_size": 1},
    }))
    assert src.data["parallel"]["cp"] == 4
    assert "Ulysses" in src.origin["parallel.cp"]
    assert "dp" not in src.data["parallel"]  # DeepSpeed forms SP × DP from the GPU count


@pytest.mark.parametrize(
    ("block", "stage"),
    [
        ({"fsdp_sharding_strategy": "SHARD_GRAD_OP"}, 2),
        ({"fsdp_sharding_strategy": 3}, 0),  # NO_SHARD by number
        ({"fsdp_sharding_strategy": "4"}, 3),  # HYBRID_SHARD
        ({"fsdp_reshard_after_forward": "SHARD_GRAD_OP"}, 2),  # FSDP1's second spelling
        ({}, 3),
        ({"fsdp_version": 2, "fsdp_reshard_after_forward": False}, 2),
        ({"fsdp_version": 2}, 3),
        ({"sharding_strategy": "NO_SHARD"}, 0),  # the prefix is optional
    ],
)
def test_fsdp_sharding(tmp_path: Path, block: dict, stage: int) -> None:
    path = _write(tmp_path, {"distributed_type": "FSDP", "num_processes": 8,
                             "fsdp_config": block})
    assert read_config(path).data["parallel"]["zero_stage"] == stage


def test_fsdp_offload_moves_parameters_and_optimizer(tmp_path: Path) -> None:
    path = _write(tmp_path, {"distributed_type": "FSDP", "num_processes": 8, "fsdp_config": {
        "fsdp_offload_params": True, "fsdp_activation_checkpointing": True}})
    parallel = read_config(path).data["parallel"]
    assert parallel["offload_params"] == parallel["offload_optimizer"] == "cpu"
    assert parallel["checkpointing"] == {"granularity": "full"}


def test_deepspeed_block_without_file_uses_accelerate_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, {"distributed_type": "DEEPSPEED", "num_processes": 4,
                             "mixed_precision": "fp16",
                             "deepspeed_config": {"gradient_accumulation_steps": 4,
                                                  "gradient_clipping": 1.0,
                                                  "offload_optimizer_device": "cpu"}})
    src = read_config(path)
    assert src.data["parallel"] == {"zero_stage": 2, "offload_optimizer": "cpu"}
    assert src.origin["parallel.zero_stage"] == "deepspeed_config.zero_stage (accelerate default)"
    assert src.data["batch"] == {"gradient_accumulation_steps": 4}
    assert src.data["clipping"] == {"max_norm": 1.0}
    plan = load_plan(configs=[path]).plan
    assert plan.precision.loss_scaling.mode == "dynamic"  # DeepSpeed's fp16 default
    assert not plan.precision.autocast


def test_megatron_lm_block(tmp_path: Path) -> None:
    path = _write(tmp_path, {"distributed_type": "MEGATRON_LM", "num_processes": 16,
                             "num_machines": 2, "mixed_precision": "bf16",
                             "megatron_lm_config": {
                                 "megatron_lm_tp_degree": 2, "megatron_lm_pp_degree": 2,
                                 "megatron_lm_num_micro_batches": 4,
                                 "megatron_lm_sequence_parallelism": True,
                                 "megatron_lm_recompute_activations": True,
                                 "megatron_lm_use_distributed_optimizer": True,
                                 "megatron_lm_gradient_clipping": 1.0}})
    plan = load_plan(configs=[path]).plan
    assert plan.framework == "megatron"
    p = plan.parallel
    assert (p.tp, p.pp, p.sequence_parallel, p.zero_stage) == (2, 2, True, 1)
    assert p.checkpointing.granularity == "selective"
    assert plan.batch.gradient_accumulation_steps == 4 and plan.clipping.max_norm == 1.0
    assert plan.dp_degree == 4


def test_typos_are_c005_with_the_suggestion(tmp_path: Path) -> None:
    path = _write(tmp_path, {"distributed_type": "FSDP", "num_processes": 8,
                             "mixed_precison": "bf16",
                             "fsdp_config": {"fsdp_ofload_params": True}})
    src = read_config(path)
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {"mixed_precison": "mixed_precision",
                     "fsdp_config.fsdp_ofload_params": "fsdp_config.fsdp_offload_params"}
    assert "refuses" in src.findings[0].message


def test_process_count_left_to_the_launcher_is_unknown(tmp_path: Path) -> None:
    path = _write(tmp_path, {"distributed_type": "MULTI_GPU", "num_processes": -1,
                             "mixed_precision": "bf16"})
    src = read_config(path)
    assert _codes(src) == ["C006"] and src.unresolved == ["hardware.num_gpus"]
    assert "hardware" not in src.data or "num_gpus" not in src.data["hardware"]


def test_missing_deepspeed_file_is_unknown_not_guessed(tmp_path: Path) -> None:
    path = _write(tmp_path, {"distributed_type": "DEEPSPEED", "num_processes": 8,
                             "deepspeed_config": {"deepspeed_config_file": "absent/ds.json"}})
    src = read_config(path)
    assert _codes(src) == ["C006"] and "parallel.zero_stage" in src.unresolved
    assert src.refs == {}


@pytest.mark.parametrize(
    ("config", "parts"),
    [
        ({"distributed_type": "MULTI_TPU"}, ["distributed_type: invalid value", "MULTI_GPU"]),
        ({"compute_environment": "LOCAL_MACHINE", "num_processes": 8, "num_machines": 1,
          "mixed_precision": "bf16"}, ["distributed_type: missing value"]),
        ({"distributed_type": "FSDP", "mixed_precision": "fp64"},
         ["mixed_precision: invalid value (got 'fp64')", "bf16"]),
        ({"distributed_type": "MULTI_GPU", "num_processes": "eight"},
         ["num_processes: invalid value (got 'eight')", "integer"]),
        ({"distributed_type": "MULTI_GPU", "num_processes": 6, "num_machines": 4},
         ["num_processes: invalid value (got 6)", "multiple of num_machines (4)"]),
        ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": "QUARTER"}},
         ["fsdp_config.fsdp_sharding_strategy: invalid value (got 'QUARTER')", "FULL_SHARD"]),
        ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 4}},
         ["deepspeed_config.zero_stage: invalid value (got 4)", "0, 1, 2 or 3"]),
        ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"offload_param_device": "gpu"}},
         ["deepspeed_config.offload_param_device: invalid value (got 'gpu')", "cpu"]),
        ({"distributed_type": "MULTI_GPU", "num_machines": 2, "machine_rank": 2},
         ["machine_rank: invalid value (got 2)", "0 .. 1"]),
        ({"distributed_type": "FSDP", "fsdp_config": "full"},
         ["fsdp_config: invalid value (got 'full')", "mapping"]),
        ({"distributed_type": "FSDP", "parallelism_config": {
            "parallelism_config_cp_size": 2, "parallelism_config_sp_size": 2}},
         ["parallelism_config.parallelism_config_sp_size: invalid value (got 2)"]),
        ({"distributed_type": "FSDP", "parallelism_config": {
            "parallelism_config_cp_size": 2, "parallelism_config_dp_replicate_size": 4}},
         ["parallelism_config.parallelism_config_cp_size: invalid value (got 2)",
          "pure replication"]),
        ({"distributed_type": "FSDP", "parallelism_config": {
            "parallelism_config_sp_backend": "ring"}},
         ["parallelism_config.parallelism_config_sp_backend: invalid value (got 'ring')"]),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, config: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, config), *parts)


def test_same_verdicts_as_the_hand_written_plan(tmp_path: Path) -> None:
    assert same_verdicts(ACC / "handbook-fsdp.yaml", {
        "framework": "accelerate",
        "hardware": {"nodes": 1, "num_gpus": 8, "gpus_per_node": 8},
        "precision": {"dtype": "bf16", "autocast": True, "loss_scaling": {"mode": "none"}},
        "parallel": {"zero_stage": 3},
    }, tmp_path, *CLUSTER) == []


def test_same_verdicts_with_an_unknown_process_count(tmp_path: Path) -> None:
    path = _write(tmp_path, {"distributed_type": "MULTI_GPU", "mixed_precision": "fp16"})
    loader = same_verdicts(path, {
        "framework": "accelerate",
        "precision": {"dtype": "fp16", "autocast": True},
        "unresolved": ["hardware.num_gpus"],
    }, tmp_path, "--model", str(LLAMA), "--seq-len", "4096")
    assert loader == ["C006"]


def test_key_tables_match_the_installed_accelerate() -> None:
    """The tables were read from accelerate 1.15; a newer accelerate may add keys."""
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    launch = pytest.importorskip("accelerate.commands.launch")
    fields = {f.name for cls in (config_args.ClusterConfig, config_args.SageMakerConfig)
              for f in dataclasses.fields(cls)}
    assert fields <= TOP_LEVEL
    dests = {a.dest for a in launch.launch_command_parser()._actions}
    for prefix, block in (("fsdp_", "fsdp_config"), ("megatron_lm_", "megatron_lm_config"),
                          ("dynamo_", "dynamo_config"),
                          ("parallelism_config_", "parallelism_config")):
        assert {d for d in dests if d.startswith(prefix)} <= BLOCKS[block], block


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("accelerate")
    for path in ACC.iterdir():
        shutil.copy(path, folder / path.name)
    return folder


@stable_settings(300)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)
