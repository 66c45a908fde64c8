"""DeepSpeed JSON → Plan: DeepSpeed's semantics, "auto" never guessed, typos caught."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sapper.errors import InputError
from sapper.plan.load import load_plan
from sapper.plan.readers.deepspeed import read_deepspeed_config
from sapper.plan.readers.deepspeed_keys import SECTIONS, suggest
from sapper.plan.sources import PlanSource

EXAMPLES = Path(__file__).parent.parent.parent / "examples" / "deepspeed"


def _read(tmp_path: Path, config: dict[str, Any]) -> PlanSource:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return read_deepspeed_config(path)


def _codes(src: PlanSource) -> list[str]:
    return [f.code for f in src.findings]


def test_zero2_bf16_example() -> None:
    src = read_deepspeed_config(EXAMPLES / "zero2-bf16.json")
    d = src.data
    assert d["batch"] == {
        "micro_batch_size": 1,
        "gradient_accumulation_steps": 8,
        "global_batch_size": 512,
    }
    assert d["precision"] == {"dtype": "bf16", "loss_scaling": {"mode": "none"}}
    assert d["clipping"] == {"max_norm": 1.0}
    assert d["parallel"]["zero_stage"] == 2
    assert d["optimizer"] == {
        "type": "adamw",
        "lr": 3e-4,
        "eps": 1e-8,
        "weight_decay": 0.1,
        "betas": [0.9, 0.95],
    }
    assert d["schedule"] == {
        "type": "cosine",
        "warmup_steps": 2000,
        "total_steps": 100000,
        "min_lr": pytest.approx(3e-5),
    }
    assert src.origin["parallel.zero_stage"] == "zero_optimization.stage"
    assert src.findings == [] and src.unresolved == []


def test_fp16_dynamic_scaling_in_deepspeed_terms(tmp_path: Path) -> None:
    src = _read(
        tmp_path,
        {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 12,
                "loss_scale_window": 500,
                "hysteresis": 4,
                "min_loss_scale": 1,
            }
        },
    )
    ls = src.data["precision"]["loss_scaling"]
    assert ls == {
        "mode": "dynamic",
        "initial_scale": 4096.0,
        "growth_interval": 500,
        "hysteresis": 4,
        "min_scale": 1,
    }
    assert src.origin["precision.loss_scaling.initial_scale"] == "fp16.initial_scale_power"


def test_fp16_defaults_are_deepspeeds(tmp_path: Path) -> None:
    ls = _read(tmp_path, {"fp16": {"enabled": True}}).data["precision"]["loss_scaling"]
    assert ls == {"mode": "dynamic", "growth_interval": 1000, "hysteresis": 2}


def test_fp16_static_scale(tmp_path: Path) -> None:
    src = _read(tmp_path, {"fp16": {"enabled": True, "loss_scale": 1024}})
    assert src.data["precision"]["loss_scaling"] == {"mode": "static", "static_scale": 1024.0}


def test_legacy_bfloat16_and_cpu_offload(tmp_path: Path) -> None:
    src = read_deepspeed_config(EXAMPLES / "zero2-legacy-keys.json")
    assert src.data["precision"]["dtype"] == "bf16"
    assert src.data["parallel"]["offload_optimizer"] == "cpu"
    assert src.data["clipping"] == {"max_norm": 0}
    assert src.data["parallel"]["checkpointing"] == {
        "partition_activations": True,
        "cpu_offload": True,
    }
    assert sorted(_codes(src)) == ["C004", "C004"]


def test_both_precisions_enabled(tmp_path: Path) -> None:
    src = _read(tmp_path, {"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert _codes(src) == ["C003"]
    assert "dtype" not in src.data.get("precision", {})


def test_auto_values_are_unresolved_never_guessed() -> None:
    src = read_deepspeed_config(EXAMPLES / "zero3-offload-hf-auto.json")
    assert _codes(src) == ["C002"]
    assert "batch" not in src.data
    assert src.data["optimizer"] == {"type": "adamw"}
    assert {
        "batch.micro_batch_size",
        "batch.gradient_accumulation_steps",
        "batch.global_batch_size",
        "precision.dtype",
        "clipping.max_norm",
        "optimizer.lr",
    } <= set(src.unresolved)
    assert src.data["parallel"] == {
        "zero_stage": 3,
        "offload_optimizer": "cpu",
        "offload_params": "cpu",
        # the sizes the file gives; its "auto" ones stay unresolved
        "deepspeed": {
            "max_live_parameters": 10**9,
            "max_reuse_distance": 10**9,
            "sub_group_size": 10**9,
            "contiguous_gradients": True,
        },
        "overlap_dp_comm": True,
    }
    assert {
        "parallel.deepspeed.reduce_bucket_size",
        "parallel.deepspeed.prefetch_bucket_size",
        "parallel.deepspeed.param_persistence_threshold",
    } <= set(src.unresolved)
    assert src.findings[0].data["keys"]["train_micro_batch_size_per_gpu"] == (
        "batch.micro_batch_size"
    )


def test_command_line_resolves_auto() -> None:
    overrides = PlanSource(name="command line")
    overrides.set("batch.micro_batch_size", 2, origin="--micro-batch")
    loaded = load_plan(deepspeed=EXAMPLES / "zero3-offload-hf-auto.json", overrides=overrides)
    assert "batch.micro_batch_size" not in loaded.plan.unresolved
    assert "batch.gradient_accumulation_steps" in loaded.plan.unresolved


def test_deepspeed_adam_is_adamw_unless_told(tmp_path: Path) -> None:
    adam = {"optimizer": {"type": "Adam", "params": {"lr": 1e-4}}}
    assert _read(tmp_path, adam).data["optimizer"]["type"] == "adamw"
    adam["optimizer"]["params"]["adam_w_mode"] = False
    assert _read(tmp_path, adam).data["optimizer"]["type"] == "adam"


def test_warmup_lr_peak_replaces_optimizer_lr(tmp_path: Path) -> None:
    src = _read(
        tmp_path,
        {
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "scheduler": {
                "type": "WarmupDecayLR",
                "params": {"warmup_max_lr": 2e-4, "warmup_min_lr": 1e-5, "total_num_steps": 5000},
            },
        },
    )
    assert src.data["optimizer"]["lr"] == 2e-4
    assert src.origin["optimizer.lr"] == "scheduler.params.warmup_max_lr"
    assert src.data["schedule"] == {
        "type": "linear",
        "warmup_steps": 1000,
        "total_steps": 5000,
        "min_lr": 1e-5,
    }


@pytest.mark.parametrize(
    ("config", "path", "suggestion"),
    [
        ({"gradient_cliping": 1.0}, "gradient_cliping", "gradient_clipping"),
        (
            {"zero_optimization": {"stage3_param_persitance_threshold": 1e5}},
            "zero_optimization.stage3_param_persitance_threshold",
            "stage3_param_persistence_threshold",
        ),
        (
            {"fp16": {"enabled": True, "loss_scale_windw": 500}},
            "fp16.loss_scale_windw",
            "loss_scale_window",
        ),
        ({"zero_optimisation": {"stage": 2}}, "zero_optimisation", "zero_optimization"),
        ({"stage": 2}, "stage", "zero_optimization.stage"),
        (
            {"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memroy": True}}},
            "zero_optimization.offload_optimizer.pin_memroy",
            "pin_memory",
        ),
        ({"bf16": {"enable": True}}, "bf16.enable", "enabled"),
        ({"train_micro_batch_size": 4}, "train_micro_batch_size", "train_micro_batch_size_per_gpu"),
    ],
)
def test_unknown_keys_name_the_intended_key(
    tmp_path: Path, config: dict, path: str, suggestion: str
) -> None:
    src = _read(tmp_path, config)
    found = [f for f in src.findings if f.code == "C001"]
    assert len(found) == 1
    assert found[0].data == {"key": path, "suggestion": suggestion}
    assert f"did you mean {suggestion}?" in found[0].message


def test_strictness_is_described_per_section(tmp_path: Path) -> None:
    top = _read(tmp_path, {"gradient_cliping": 1.0}).findings[0].message
    assert "ignores it silently" in top
    zero = _read(tmp_path, {"zero_optimization": {"overlap_com": True}}).findings[0].message
    assert "recent ones refuse to start" in zero


def test_pass_through_sections_are_not_checked_inside(tmp_path: Path) -> None:
    src = _read(
        tmp_path,
        {
            "optimizer": {"type": "Lamb", "params": {"lr": 1e-3, "max_coeff": 0.3}},
            "amp": {"enabled": True, "opt_level": "O1"},
        },
    )
    assert _codes(src) == []
    assert src.data["precision"] == {"dtype": "fp16", "loss_scaling": {"mode": "dynamic"}}


def test_documented_examples_use_only_known_keys() -> None:
    for path in EXAMPLES.glob("*.json"):
        unknown = [f for f in read_deepspeed_config(path).findings if f.code == "C001"]
        expected = 1 if "typo" in path.stem else 0
        assert len(unknown) == expected, path.name


def test_key_table_is_well_formed() -> None:
    assert "" in SECTIONS and "zero_optimization" in SECTIONS[""]
    for section in SECTIONS:
        if section:
            parent, _, leaf = section.rpartition(".")
            assert leaf in (SECTIONS[parent] or ()), section
    assert suggest("completely_unrelated_words", "") is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"zero_optimization": {"stage": 4}},
            "zero_optimization.stage: invalid value (got 4); expected 0, 1, 2 or 3",
        ),
        ({"train_batch_size": "big"}, "train_batch_size: invalid value (got 'big')"),
        ({"train_micro_batch_size_per_gpu": 0}, "expected an integer ≥ 1"),
        ({"fp16": True}, "fp16: invalid value (got True); expected a JSON object"),
        ({"fp16": {"enabled": "yes"}}, "fp16.enabled: invalid value"),
        (
            {"zero_optimization": {"offload_param": {"device": "gpu"}}},
            "zero_optimization.offload_param.device: invalid value (got 'gpu')",
        ),
        ({"optimizer": {"params": {"betas": 0.9}}}, "optimizer.params.betas"),
        ({"gradient_clipping": -1}, "gradient_clipping: invalid value (got -1)"),
    ],
)
def test_bad_values(tmp_path: Path, config: dict, message: str) -> None:
    with pytest.raises(InputError) as err:
        _read(tmp_path, config)
    assert message in str(err.value)
    assert "ds.json" in str(err.value)


def test_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text("[]")
    with pytest.raises(InputError, match="must be a JSON object"):
        read_deepspeed_config(path)


FIXTURES = Path(__file__).parent.parent / "fixtures" / "deepspeed"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_widely_used_configs_raise_no_false_typo(path: Path) -> None:
    src = read_deepspeed_config(path)
    assert [f.message for f in src.findings if f.code in ("C001", "C004")] == []


def test_widely_used_configs_map_as_deepspeed_runs_them() -> None:
    hf = read_deepspeed_config(FIXTURES / "hf-trainer-zero2.json")
    assert hf.data["parallel"] == {
        "zero_stage": 2, "offload_optimizer": "cpu", "overlap_dp_comm": True,
        "deepspeed": {"reduce_bucket_size": 2 * 10**8, "allgather_bucket_size": 2 * 10**8,
                      "contiguous_gradients": True},
    }
    assert {"precision.dtype", "optimizer.lr", "batch.micro_batch_size"} <= set(hf.unresolved)
    megatron = read_deepspeed_config(FIXTURES / "megatron-bf16-zero0.json").data
    assert megatron["batch"] == {"micro_batch_size": 2, "global_batch_size": 2048}
    assert (megatron["precision"]["dtype"], megatron["parallel"]["zero_stage"]) == ("bf16", 0)
    # Without ZeRO the engine all-reduces gradients after backward, not overlapped.
    assert megatron["parallel"]["overlap_dp_comm"] is False
    rlhf = read_deepspeed_config(FIXTURES / "rlhf-actor-zero3-hybrid.json").data
    assert rlhf["precision"]["loss_scaling"] == {
        "mode": "dynamic",
        "growth_interval": 100,
        "hysteresis": 2,
    }
    assert rlhf["parallel"]["offload_params"] == "none"
    nvme = read_deepspeed_config(FIXTURES / "nvme-infinity-zero3.json").data["parallel"]
    assert (nvme["offload_optimizer"], nvme["offload_params"]) == ("nvme", "nvme")
    assert nvme["checkpointing"] == {"partition_activations": True, "cpu_offload": True}


@pytest.mark.parametrize(
    ("zero", "expected"),
    [({"stage": 1}, False), ({"stage": 2}, False), ({"stage": 3}, True),
     ({"stage": 2, "overlap_comm": True}, True), ({"stage": 3, "overlap_comm": False}, False)],
)
def test_overlap_comm_defaults_as_deepspeed_resolves_them(
    tmp_path: Path, zero: dict, expected: bool
) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}))
    assert read_deepspeed_config(cfg).data["parallel"]["overlap_dp_comm"] is expected


def test_zero_sizes_are_kept_in_elements_from_real_configs() -> None:
    """nvme-infinity-zero3.json (DeepSpeed's ZeRO-Infinity example) writes every stage-3
    size as a JSON float (5e7, 1e9): each lands as an integer with its key as origin."""
    src = read_deepspeed_config(Path(__file__).parents[1] / "fixtures" / "deepspeed"
                                / "nvme-infinity-zero3.json")
    assert src.data["parallel"]["deepspeed"] == {
        "prefetch_bucket_size": 5 * 10**7,
        "max_live_parameters": 10**9,
        "max_reuse_distance": 10**9,
        "param_persistence_threshold": 10**5,
        "sub_group_size": 10**9,
        "contiguous_gradients": True,
    }
    assert src.origin["parallel.deepspeed.prefetch_bucket_size"] == (
        "zero_optimization.stage3_prefetch_bucket_size"
    )


def test_zero_sizes_take_the_bare_field_names_too(tmp_path: Path) -> None:
    """DeepSpeedZeroConfig populates by name as well as by its stage3_ alias."""
    src = _read(tmp_path, {"zero_optimization": {
        "stage": 3, "max_live_parameters": 3e7, "prefetch_bucket_size": 1000,
    }})
    assert src.data["parallel"]["deepspeed"] == {
        "max_live_parameters": 3 * 10**7, "prefetch_bucket_size": 1000,
    }
    assert _codes(src) == []  # both spellings are documented keys


def test_zero_size_auto_is_unresolved(tmp_path: Path) -> None:
    src = _read(tmp_path, {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})
    assert "deepspeed" not in src.data["parallel"]
    assert "parallel.deepspeed.reduce_bucket_size" in src.unresolved
    assert _codes(src) == ["C002"]


@pytest.mark.parametrize("bad", [-1, 0.5, 1.5e0, "5e8", True, [5e8], 1e30])
def test_a_bad_zero_size_names_the_key(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InputError) as err:
        _read(tmp_path, {"zero_optimization": {"stage": 2, "reduce_bucket_size": bad}})
    assert err.value.field == "zero_optimization.reduce_bucket_size"
