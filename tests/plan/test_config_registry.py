"""The config-reader registry: every shipped example is recognised as its own format, a
file nobody recognises is refused with what each reader looked for, and files merge in
the documented order (referenced files first, later files win)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.errors import InputError
from sapper.plan.load import load_plan
from sapper.plan.readers.base import Sniff, closest
from sapper.plan.readers.registry import detect_config, formats

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples"
runner = CliRunner()
_register_commands()

#: examples/<folder>/ -> the format every config file in it must be detected as.
FOLDER_FORMATS = {
    "plans": "sapper",
    "hf": "hf",
    "smoke": "hf",
    "deepspeed": "deepspeed",
    "megatron": "megatron",
    "nemo": "nemo",
    "torchtitan": "torchtitan",
    "accelerate": "accelerate",
    "training_args": "training_args",
    "axolotl": "axolotl",
    "llmfoundry": "llmfoundry",
    "olmo": "olmo",
    "nanotron": "nanotron",
    "torchtune": "torchtune",
    "litgpt": "litgpt",
    "llamafactory": "llamafactory",
    "trl": "trl",
}
#: Launch-config folders whose JSON files are the DeepSpeed configs the launch configs name.
_DEEPSPEED_BESIDE = ("accelerate", "axolotl", "megatron")
_NOT_CONFIGS = {".md", ".py", ".txt"}


def _examples() -> list[tuple[Path, str]]:
    out = []
    for folder, fmt in FOLDER_FORMATS.items():
        for path in sorted((EXAMPLES / folder).glob("*")):
            if path.is_file() and path.suffix.lower() not in _NOT_CONFIGS:
                json_beside = path.suffix == ".json" and folder in _DEEPSPEED_BESIDE
                out.append((path, "deepspeed" if json_beside else fmt))
    return out


def test_formats_are_named_once_and_say_what_they_look_for() -> None:
    names = [f.name for f in formats()]
    assert len(names) == len(set(names))
    for fmt in formats():
        assert fmt.title and fmt.looks_for


@pytest.mark.parametrize(
    ("path", "fmt"), _examples(), ids=lambda v: v.name if isinstance(v, Path) else v
)
def test_every_example_is_detected_as_its_own_format(path: Path, fmt: str) -> None:
    sniff = Sniff.of(path)
    scores = {f.name: f.recognise(sniff) for f in formats()}
    assert detect_config(sniff).name == fmt, scores
    rivals = {name: s for name, s in scores.items() if name != fmt}
    assert scores[fmt] > max(rivals.values()) + 0.05, scores


@pytest.mark.parametrize("name", ["llamafactory", "trl"])
def test_trainer_readers_claim_no_other_formats_example(name: str) -> None:
    """LLaMA-Factory and TRL configs are TrainingArguments with more keys: their readers
    must not claim a Trainer, Axolotl, accelerate or any other format's file."""
    fmt = next(f for f in formats() if f.name == name)
    for path, owner in _examples():
        if owner != name:
            assert fmt.recognise(Sniff.of(path)) == 0.0, path


@pytest.mark.parametrize("name", ["llmfoundry", "olmo", "nanotron"])
def test_composer_era_readers_claim_no_other_formats_example(name: str) -> None:
    """llm-foundry and OLMo configs share Composer's keys (global_train_batch_size,
    device_train_microbatch_size, precision), Nanotron's a model section: none of the three
    claims another format's file, the others' included."""
    fmt = next(f for f in formats() if f.name == name)
    for path, owner in _examples():
        if owner != name:
            assert fmt.recognise(Sniff.of(path)) == 0.0, path


@pytest.mark.parametrize("name", ["torchtune", "litgpt"])
def test_recipe_readers_claim_no_other_formats_example(name: str) -> None:
    """torchtune and LitGPT YAMLs sit beside Axolotl, NeMo and sapper plans: their
    readers must give every other format's file a confidence of 0."""
    fmt = next(f for f in formats() if f.name == name)
    for path, owner in _examples():
        if owner != name:
            assert fmt.recognise(Sniff.of(path)) == 0.0, path


def test_every_format_has_a_shipped_example() -> None:
    assert {f.name for f in formats()} <= {fmt for _, fmt in _examples()}


def test_an_unrecognised_file_is_refused_in_one_line(tmp_path: Path) -> None:
    odd = tmp_path / "notes.txt"
    odd.write_text("just some words\nand more\n")
    res = runner.invoke(app, ["check", "--config", str(odd)])
    assert res.exit_code == 2, res.output
    text = res.output
    assert "notes.txt" in text and "not a config sapper can read" in text
    assert "--config-format NAME" in text
    for fmt in formats():  # the formats it could have been, by name
        assert fmt.name in text
    assert "Traceback" not in res.output
    assert len(text.strip().splitlines()) == 1, text
    with pytest.raises(InputError) as info:
        load_plan(configs=[odd])
    assert "\n" not in str(info.value) and not info.value.details


def test_a_syntax_error_is_reported_rather_than_unrecognised(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(InputError, match=r"malformed YAML at line"):
        load_plan(configs=[bad])


def test_config_format_forces_a_reader_and_an_unknown_one_is_named(tmp_path: Path) -> None:
    plan = EXAMPLES / "plans" / "healthy-llama-7b.yaml"
    res = runner.invoke(app, ["check", "--config", str(plan), "--config-format", "sapper"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["check", "--config", str(plan), "--config-format", "nope"])
    assert res.exit_code == 2
    assert "--config-format" in res.output and "sapper" in res.output


def test_positional_plan_and_config_are_the_same_input() -> None:
    plan = EXAMPLES / "plans" / "healthy-llama-7b.yaml"
    a = runner.invoke(app, ["check", str(plan), "--format", "json"])
    b = runner.invoke(app, ["check", "--config", str(plan), "--format", "json"])
    assert a.exit_code == b.exit_code
    assert json.loads(a.stdout)["summary"] == json.loads(b.stdout)["summary"]


def test_later_configs_win_and_refs_come_before_their_file(tmp_path: Path) -> None:
    hf = EXAMPLES / "hf" / "llama-2-7b.json"
    first = tmp_path / "a.yaml"
    first.write_text(
        f"model: {{hf_config: {hf}, num_layers: 8}}\nbatch: {{micro_batch_size: 2}}\n"
    )
    second = tmp_path / "b.yaml"
    second.write_text("batch: {micro_batch_size: 4}\n")
    loaded = load_plan(configs=[first, second])
    assert loaded.plan.model is not None
    assert loaded.plan.model.num_layers == 8  # the plan's key over its config.json
    assert loaded.plan.model.hidden_size == 4096  # from the referenced config.json
    assert loaded.plan.batch.micro_batch_size == 4  # the later file wins
    assert loaded.sources == [str(hf), str(first), str(second)]


def test_an_explicit_model_replaces_the_reference(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("model: {hf_config: absent.json}\nbatch: {micro_batch_size: 2}\n")
    gpt2 = EXAMPLES / "hf" / "gpt2-xl.json"
    loaded = load_plan(plan, hf_config=gpt2)
    assert loaded.plan.model is not None and loaded.plan.model.family == "gpt2"


def test_closest_key_folds_case_and_dashes() -> None:
    known = ["gradient_accumulation_steps", "learning_rate", "max_grad_norm"]
    assert closest("gradient_acumulation_steps", known) == "gradient_accumulation_steps"
    assert closest("Learning-Rate", known) == "learning_rate"
    assert closest("completely_else", known) is None


def test_a_value_from_any_source_resolves_the_field() -> None:
    # The NeMo YAML cannot know the vocabulary (C006); the config.json read first gives it.
    nemo = EXAMPLES / "nemo" / "launcher_llama_llama2_7b.yaml"
    alone = load_plan(configs=[nemo])
    assert "model.vocab_size" in alone.plan.unresolved and alone.plan.model is None
    both = load_plan(configs=[nemo], hf_config=EXAMPLES / "hf" / "llama-2-7b.json")
    assert both.plan.model is not None and both.plan.model.vocab_size == 32000
    assert "model.vocab_size" not in both.plan.unresolved
