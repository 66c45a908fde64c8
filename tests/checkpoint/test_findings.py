"""Each finding class on a checkpoint the HF Trainer wrote: a planted fault fires it, the
untouched checkpoint (the healthy twin) stays silent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from ckptgen import llama, plant_json, plant_torch, plant_weights

from sapper.checkpoint import inspect_paths
from sapper.rules.model import Finding


def _codes(findings: list[Finding]) -> list[str]:
    return sorted({f.code for f in findings})


def _trainer_param_order() -> list[str]:
    """The parameter order of the Trainer's optimizer: its decay group, then no-decay,
    from the Trainer's own grouping function over the same model."""
    model = llama()
    decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
    names = [n for n, _ in model.named_parameters()]
    return [n for n in names if n in decay] + [n for n in names if n not in decay]


def test_healthy_trainer_checkpoints_are_silent(hf_run: list[Path]) -> None:
    for folder in hf_run:
        result = inspect_paths([folder])
        assert result.findings == [], [f.message for f in result.findings]
        assert result.exit_code() == 0
        rep = result.checkpoints[0]
        step = float(folder.name.split("-")[1])
        assert rep.steps == {"optimizer": step, "scheduler": step, "trainer": step}
        assert rep.kind == "hf-trainer"
        assert all(rep.pieces[k] for k in ("weights", "optimizer", "scheduler", "rng"))
        # every optimizer parameter got its weight's name, not an index
        assert all(not u.name.startswith("optimizer") for u in rep.updates)


def test_nonfinite_weight_names_tensor_count_and_first_index(hf_run, copy_of) -> None:
    key = "model.layers.2.mlp.down_proj.weight"
    folder = copy_of(hf_run[-1])

    def edit(sd: dict) -> None:
        sd[key][3, 5] = float("nan")
        sd[key][7, 1] = float("inf")

    plant_weights(folder, edit)
    result = inspect_paths([folder])
    (hit,) = [f for f in result.findings if f.code == "K001"]
    assert hit.data["tensor"] == key
    assert hit.data["first_index"] == [3, 5]
    assert (hit.data["nan"], hit.data["posinf"]) == (1, 1)
    assert result.exit_code() == 1


def test_nonfinite_adam_moment(hf_run, copy_of) -> None:
    order = _trainer_param_order()
    name = "model.layers.1.self_attn.o_proj.weight"
    folder = copy_of(hf_run[-1])
    plant_torch(
        folder / "optimizer.pt",
        lambda o: o["state"][order.index(name)]["exp_avg"].view(-1)[10].fill_(float("nan")),
    )
    hits = [f for f in inspect_paths([folder]).findings if f.code == "K001"]
    assert [f.data["tensor"] for f in hits] == [f"{name}.exp_avg"]


def test_scale_outlier_names_the_layer(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])
    plant_weights(folder, lambda sd: sd["model.layers.2.self_attn.q_proj.weight"].mul_(30))
    result = inspect_paths([folder])
    hits = [f for f in result.findings if f.code == "K002"]
    assert [(f.data["layer"], f.data["role"]) for f in hits] == [(2, "self_attn.q_proj.weight")]
    assert result.checkpoints[0].layers()[0]["layer"] == 2  # the worst layer first
    (q,) = [r for r in result.checkpoints[0].roles() if r["role"] == "self_attn.q_proj.weight"]
    assert (q["layers"], q["max_layer"]) == (4, 2)
    assert hits[0].data["factor"] == pytest.approx(30, rel=0.2)


def test_dead_tensor(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])
    plant_weights(folder, lambda sd: sd["model.layers.1.mlp.up_proj.weight"].zero_())
    hits = [f for f in inspect_paths([folder]).findings if f.code == "K003"]
    assert [f.data["tensor"] for f in hits] == ["model.layers.1.mlp.up_proj.weight"]


def test_adam_v_underflow_and_jump_name_the_layer(hf_run, copy_of) -> None:
    order = _trainer_param_order()
    name = "model.layers.2.mlp.down_proj.weight"
    folder = copy_of(hf_run[-1])
    plant_torch(
        folder / "optimizer.pt", lambda o: o["state"][order.index(name)]["exp_avg_sq"].zero_()
    )
    findings = inspect_paths([folder]).findings
    assert _codes(findings) == ["K004", "K005"]
    for f in findings:
        assert f.data["tensor"] == name
    jump = next(f for f in findings if f.code == "K005")
    assert jump.value > 1e3  # |m|/eps with eps 1e-8


def test_loss_scaler_collapsed_and_healthy(hf_run, copy_of) -> None:
    healthy = copy_of(hf_run[-1])
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))  # initialises the scale (65536) as a first step does
    torch.save(scaler.state_dict(), healthy / "scaler.pt")
    assert inspect_paths([healthy]).findings == []
    state = scaler.state_dict()
    state["scale"] = 0.25
    torch.save(state, healthy / "scaler.pt")
    findings = inspect_paths([healthy]).findings
    assert _codes(findings) == ["K006"]
    assert findings[0].severity.value == "error" and findings[0].value == 0.25


@pytest.mark.parametrize(
    ("piece", "edit"),
    [
        ("scheduler.pt", lambda s: s.update(last_epoch=1)),
        ("optimizer.pt", lambda o: [e["step"].fill_(9) for e in o["state"].values()]),
    ],
)
def test_resume_step_mismatch(hf_run, copy_of, piece: str, edit: Callable) -> None:
    folder = copy_of(hf_run[-1])
    plant_torch(folder / piece, edit)
    findings = inspect_paths([folder]).findings
    assert "K007" in _codes(findings)


def test_resume_lr_mismatch(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])
    plant_torch(folder / "optimizer.pt", lambda o: [g.update(lr=0.05) for g in o["param_groups"]])
    findings = [f for f in inspect_paths([folder]).findings if f.code == "K008"]
    # the scheduler's last lr and the logged lr both disagree with it
    assert len(findings) == 3 and {f.value for f in findings} == {0.05}


def test_resume_lr_reset_against_the_log(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])

    def edit(state: dict) -> None:
        for entry in state["log_history"]:
            if "learning_rate" in entry:
                entry["learning_rate"] = 1e-6

    plant_json(folder / "trainer_state.json", edit)
    findings = [f for f in inspect_paths([folder]).findings if f.code == "K008"]
    assert len(findings) == 1 and "logged learning_rate" in findings[0].message


def test_resume_incomplete(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])
    (folder / "scheduler.pt").unlink()
    (folder / "rng_state.pth").unlink()
    findings = inspect_paths([folder]).findings
    assert _codes(findings) == ["K009"]
    assert "resume will not be equivalent" in findings[0].message
    assert len(findings[0].data["missing"]) == 2


def test_tied_weights_untied(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])
    plant_json(folder / "config.json", lambda c: c.update(tie_word_embeddings=True))
    plant_weights(
        folder, lambda sd: sd.update({"lm_head.weight": sd["model.embed_tokens.weight"].clone()})
    )
    assert "K010" not in _codes(inspect_paths([folder]).findings)  # stored twice, still equal
    plant_weights(folder, lambda sd: sd["lm_head.weight"].add_(0.01))
    hits = [f for f in inspect_paths([folder]).findings if f.code == "K010"]
    assert [f.data["tensor"] for f in hits] == ["lm_head.weight"]


def test_saturated_fp16(hf_run, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    sd = {k: v.half() for k, v in load_file(hf_run[-1] / "model.safetensors").items()}
    save_file(sd, tmp_path / "healthy.safetensors")
    assert inspect_paths([tmp_path / "healthy.safetensors"]).findings == []
    sd["model.layers.3.mlp.gate_proj.weight"][0, :4] = 65504.0
    save_file(sd, tmp_path / "bad.safetensors")
    hits = inspect_paths([tmp_path / "bad.safetensors"]).findings
    assert [f.value for f in hits if f.code == "K011"] == [4.0]
    # four values at 65504 also make that layer's RMS an outlier among its peers
    assert {f.data["tensor"] for f in hits} == {"model.layers.3.mlp.gate_proj.weight"}


def test_dtype_disagrees_with_config(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])
    plant_weights(folder, lambda sd: sd.update({k: v.half() for k, v in sd.items()}))
    hits = inspect_paths([folder]).findings
    assert [(f.code, f.data["stored"], f.data["config_dtype"]) for f in hits] == [
        ("K012", "float16", "float32")
    ]
    plant_json(folder / "config.json", lambda c: c.update(dtype="float16"))
    assert inspect_paths([folder]).findings == []


def test_second_moment_outlier_is_judged_on_the_gradient_scale(hf_run, copy_of) -> None:
    order = _trainer_param_order()
    name = "model.layers.2.self_attn.q_proj.weight"
    for mult, fires in ((9.0, False), (1000.0, True)):  # 3x the gradient is not a finding
        folder = copy_of(hf_run[-1]) if mult == 9.0 else copy_of(hf_run[0])
        plant_torch(
            folder / "optimizer.pt",
            lambda o, m=mult: o["state"][order.index(name)]["exp_avg_sq"].mul_(m),
        )
        hits = [f for f in inspect_paths([folder]).findings if f.code == "K002"]
        assert [f.data["tensor"] for f in hits] == ([f"{name}.exp_avg_sq"] if fires else [])
