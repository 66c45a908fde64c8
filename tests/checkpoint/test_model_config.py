"""``sapper inspect --config``: checkpoints against the model a config.json describes
(K013 missing or reshaped, K014 unknown tensors, K015 far from the planned init), the
parameters an optimizer holds that never got a gradient (K016), and tensors that moved
between two checkpoints though nothing trains them (K023).

Every checkpoint here is written by the library that writes it in practice: the HF
Trainer (the session's ``hf_run``), ``save_pretrained``, or ``torch.save`` of a plain
training loop's model and optimizer. Each fault has its healthy twin.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from ckptgen import Markov, llama, plant_weights
from typer.testing import CliRunner

from sapper.checkpoint import inspect_paths
from sapper.cli.app import _register_commands, app

_register_commands()


def _codes(result) -> list[str]:
    return sorted({f.code for f in result.findings})


def _of(result, code: str):
    return [f for f in result.findings if f.code == code]


def _config(tmp_path: Path, **changes) -> Path:
    cfg = llama().config.to_dict()
    cfg.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


# ---- K013 / K014: does the checkpoint fit the model? ----------------------------------
def test_trainer_checkpoints_fit_their_own_config(hf_run: list[Path]) -> None:
    result = inspect_paths(hf_run, config=hf_run[0] / "config.json")
    assert result.findings == [], [f.message for f in result.findings]


def test_another_width_is_an_error_naming_the_shapes(hf_run, tmp_path) -> None:
    result = inspect_paths([hf_run[-1]], config=_config(tmp_path, hidden_size=64))
    (found,) = _of(result, "K013")
    assert found.severity.value == "error" and result.exit_code() == 1
    assert "model.embed_tokens.weight [256, 32] (model: [256, 64])" in found.message


def test_a_missing_layer_is_named_as_initialised_at_random(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])

    def drop(sd: dict) -> None:
        for key in [k for k in sd if k.startswith("model.layers.3.mlp.")]:
            del sd[key]

    plant_weights(folder, drop)
    result = inspect_paths([folder], config=folder / "config.json")
    (found,) = _of(result, "K013")
    assert "3 of the model's tensors are not in the checkpoint" in found.message
    assert found.data["missing"] == [
        f"model.layers.3.mlp.{p}_proj.weight" for p in ("down", "gate", "up")
    ]


def test_unknown_tensors_are_a_warning_and_old_buffers_are_not(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])

    def add(sd: dict) -> None:
        # older transformers saved the rotary table of every layer
        sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = 1e4 ** -(torch.arange(8) / 8)
        sd["value_head.weight"] = torch.randn(1, 32)

    plant_weights(folder, add)
    result = inspect_paths([folder], config=folder / "config.json")
    (found,) = _of(result, "K014")
    assert found.data["unexpected"] == ["value_head.weight"]
    assert _codes(result) == ["K014"]


def test_names_from_the_base_model_or_a_wrapper_still_match(tmp_path) -> None:
    """A base model's save (no ``model.`` prefix) and a compiled model's state dict
    (``_orig_mod.``) are the model's tensors under other names, not missing ones."""
    model = llama(tied=True)
    cfg = _config(tmp_path, tie_word_embeddings=True)
    base = tmp_path / "base.pt"
    torch.save(model.model.state_dict(), base)
    wrapped = tmp_path / "wrapped.pt"
    torch.save({f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, wrapped)
    for path in (base, wrapped):
        result = inspect_paths([path], config=cfg)
        assert "K013" not in _codes(result) and "K014" not in _codes(result), path


def test_moe_experts_match_in_the_saved_and_the_fused_form(tmp_path) -> None:
    """transformers 5 holds Mixtral's experts as one 3-D tensor per layer and
    save_pretrained writes one tensor per expert: both are the model."""
    cfg = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, vocab_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg)
    model.save_pretrained(tmp_path / "saved")
    fused = tmp_path / "fused.pt"
    torch.save(model.state_dict(), fused)
    for path in (tmp_path / "saved", fused):
        result = inspect_paths([path], config=tmp_path / "saved")
        assert result.findings == [], (path, [f.message for f in result.findings])


def test_a_checkpoint_in_another_naming_scheme_is_not_compared(tmp_path) -> None:
    sd = {f"decoder.layers.{i}.mlp.linear_fc1.weight": torch.randn(64, 32) for i in range(4)}
    path = tmp_path / "megatron_like.pt"
    torch.save(sd, path)
    result = inspect_paths([path], config=_config(tmp_path))
    (found,) = _of(result, "K013")
    assert found.severity.value == "info" and "not compared" in found.message
    assert result.exit_code() == 0


# ---- K015: the planned init --------------------------------------------------------------
def test_an_embedding_left_at_torch_default_init_is_far_from_the_plan(tmp_path) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "init")
    result = inspect_paths([tmp_path / "init"], config=tmp_path / "init")
    assert result.findings == [], [f.message for f in result.findings]

    torch.nn.init.normal_(model.model.embed_tokens.weight)  # nn.Embedding's own N(0, 1)
    model.save_pretrained(tmp_path / "bad")
    result = inspect_paths([tmp_path / "bad"], config=tmp_path / "bad")
    (found,) = _of(result, "K015")
    assert found.data["tensor"] == "model.embed_tokens.weight"
    assert 30 < found.data["ratio"] < 70


def test_a_role_initialised_wider_than_planned_in_every_layer(tmp_path) -> None:
    """All layers off alike: no peer stands out (K002 is silent), the plan does."""
    model = llama(layers=4)
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.mlp.down_proj.weight, std=1.0)
    model.save_pretrained(tmp_path / "ckpt")
    result = inspect_paths([tmp_path / "ckpt"], config=tmp_path / "ckpt")
    assert "K002" not in _codes(result)
    (found,) = _of(result, "K015")
    assert found.data["role"] == "mlp.down_proj.weight" and "(4 layers)" in found.message


def test_trained_weights_within_their_band_stay_silent(hf_run) -> None:
    result = inspect_paths([hf_run[-1]], config=hf_run[-1])
    assert "K015" not in _codes(result)


# ---- K016 and K023: a plain training loop -------------------------------------------
class _Model(torch.nn.Module):
    """A tiny Llama with a value head the loss never reaches (an unused branch), first in
    module order so the optimizer's stateless parameters come before the trained ones."""

    def __init__(self) -> None:
        super().__init__()
        self.value_head = torch.nn.Linear(32, 1)
        self.lm = llama(layers=2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, labels=ids).loss


def _train(steps: int, unused: bool, frozen_written: bool) -> tuple[dict, dict]:
    torch.manual_seed(0)
    model = _Model()
    if not unused:
        del model.value_head
    model.lm.model.embed_tokens.weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    data = Markov(n=16)
    for step in range(steps):
        loss = model(data.data[step % 4 * 4 : step % 4 * 4 + 4])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if frozen_written:  # an in-place write to a frozen weight (a buggy EMA)
            with torch.no_grad():
                model.lm.model.embed_tokens.weight.mul_(0.999)
    return {k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict()


@pytest.mark.parametrize("unused", [True, False])
def test_a_parameter_the_loss_never_reaches(tmp_path, unused) -> None:
    sd, opt = _train(3, unused=unused, frozen_written=False)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": sd, "optimizer": opt}, path)
    result = inspect_paths([path])
    found = _of(result, "K016")
    if not unused:
        assert found == [], [f.message for f in result.findings]
        return
    (k016,) = found
    assert k016.data["parameters"] == ["value_head.weight", "value_head.bias"]
    # the parameters after the stateless ones are still named right
    trained = {k for k in sd if k.startswith("lm.") and "embed_tokens" not in k}
    assert {u.name for u in result.checkpoints[0].updates} == trained


@pytest.mark.parametrize("written", [True, False])
def test_a_frozen_weight_that_moved(tmp_path, written) -> None:
    paths = []
    for steps in (2, 4):
        sd, opt = _train(steps, unused=False, frozen_written=written)
        paths.append(tmp_path / f"step{steps}.pt")
        torch.save({"model": sd, "optimizer": opt}, paths[-1])
    result = inspect_paths(paths)
    found = _of(result, "K023")
    if not written:
        assert found == [], [f.message for f in result.findings]
        return
    (k023,) = found
    assert k023.data["tensor"] == "lm.model.embed_tokens.weight"
    assert "in no param group" in k023.message


def test_a_tied_head_moving_with_its_embedding_is_not_frozen(tmp_path) -> None:
    """torch.save keeps both names of a tied weight; the optimizer holds one of them."""
    torch.manual_seed(0)
    model = llama(layers=2, tied=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Markov(n=8)
    paths = []
    for step in range(4):
        model(input_ids=data.data[:4], labels=data.data[:4]).loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 2:
            paths.append(tmp_path / f"s{step}.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, paths[-1])
    result = inspect_paths(paths)
    assert "K023" not in _codes(result), [f.message for f in result.findings]


def test_a_rotary_table_rewritten_between_checkpoints(hf_run, copy_of) -> None:
    a, b = copy_of(hf_run[0]), copy_of(hf_run[-1])
    key = "model.layers.0.self_attn.rotary_emb.inv_freq"
    plant_weights(a, lambda sd: sd.__setitem__(key, torch.linspace(1, 0.01, 8)))
    plant_weights(b, lambda sd: sd.__setitem__(key, torch.linspace(1, 0.01, 8).bfloat16().float()))
    (found,) = _of(inspect_paths([a, b]), "K023")
    assert found.data["tensor"] == key and "buffer" in found.message


# ---- the command ---------------------------------------------------------------------
def test_cli_config_option_and_its_bad_input(hf_run, tmp_path) -> None:
    runner = CliRunner()
    res = runner.invoke(
        app, ["inspect", str(hf_run[-1]), "--config", str(_config(tmp_path, hidden_size=64))]
    )
    assert res.exit_code == 1 and "K013" in res.output
    res = runner.invoke(app, ["inspect", str(hf_run[-1]), "--model", str(hf_run[-1])])
    assert res.exit_code == 0, res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "llama", "hidden_size": -3}')
    res = runner.invoke(app, ["inspect", str(hf_run[-1]), "--config", str(bad)])
    assert res.exit_code == 2 and "hidden_size" in res.output and "Traceback" not in res.output
