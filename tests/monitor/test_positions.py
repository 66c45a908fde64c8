"""Position faults on real tiny training runs: sequences longer than the model's
positions, with the ids past the table (R090) or wrapped / clamped to fit (R091), by the
training script or inside the model; and the healthy twins that must stay quiet."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import transformers
from tinytrain import FAST, Markov, Run, gpt2, llama, nanogpt, train
from torch import nn

from sapper.monitor import SapperHalt
from sapper.monitor.positions import position_limit
from sapper.rules.model import Severity

#: The models' position tables / trained context (tinytrain's default).
TABLE = 64
#: Batch (micro-batch number, 1-based) from which sequences grow past the table.
ONSET = 15


class Longer(Markov):
    """From batch ``start`` on, sequences of ``length`` tokens (past the position table)."""

    def __init__(self, start: int = ONSET, length: int = 80) -> None:
        super().__init__()
        self.i, self.start, self.length = 0, start, length

    def __next__(self) -> torch.Tensor:
        self.i += 1
        return self.sample(8, self.length if self.i > self.start else 32)


def _wrap(x: torch.Tensor) -> torch.Tensor:
    return (torch.arange(x.shape[1]) % TABLE).unsqueeze(0)


def _clamp(x: torch.Tensor) -> torch.Tensor:
    return torch.arange(x.shape[1]).clamp(max=TABLE - 1).unsqueeze(0)


def _packed(x: torch.Tensor) -> torch.Tensor:
    """Per-document positions of packed sequences: each document fits the table."""
    t = x.shape[1]
    cut = min(t, 30)
    return torch.cat([torch.arange(cut), torch.arange(t - cut)]).unsqueeze(0)


class Wrapped(nn.Module):
    """A user's wrapper around an HF model: no config of its own."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.lm = inner

    def forward(self, **kwargs: torch.Tensor):  # type: ignore[no-untyped-def]
        return self.lm(**kwargs)


#: name -> (run, code, severity, what the message must say); the fault starts at step 15.
FAULTS: dict[str, tuple[Callable[[], Run], str, Severity, str]] = {
    "gpt2-script-wraps": (
        lambda: train(gpt2(), data=Longer(), steps=25, position_ids=_wrap),
        "R091",
        Severity.ERROR,
        "wrapped by the training script in the position_ids it passes (position = i mod 64",
    ),
    "gpt2-script-clamps": (
        lambda: train(gpt2(), data=Longer(), steps=25, position_ids=_clamp),
        "R091",
        Severity.ERROR,
        "clamped by the training script in the position_ids it passes at 63: the last 16",
    ),
    "llama-script-wraps-rope": (
        lambda: train(llama(), data=Longer(), steps=25, position_ids=_wrap),
        "R091",
        Severity.WARNING,
        "RoPE (no rope_scaling) was trained on 64 positions",
    ),
    "nanogpt-wraps-inside-the-model": (
        lambda: train(nanogpt(positions="wrap"), data=Longer(), steps=25),
        "R091",
        Severity.ERROR,
        "wrapped inside the model at transformer.wpe (position = i mod 64",
    ),
    "nanogpt-clamps-inside-the-model": (
        lambda: train(nanogpt(positions="clamp"), data=Longer(), steps=25),
        "R091",
        Severity.ERROR,
        "(config.block_size)",
    ),
    "wrapped-hf-model-script-wraps": (
        lambda: train(Wrapped(gpt2()), data=Longer(), steps=25, position_ids=_wrap),
        "R091",
        Severity.ERROR,
        "(config.n_positions)",
    ),
    "llama-rope-past-context": (
        lambda: train(llama(), data=Longer(), steps=25),
        "R090",
        Severity.WARNING,
        "position index 79",
    ),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_position_fault_is_named_at_onset(name: str) -> None:
    make, code, severity, says = FAULTS[name]
    run = make()
    finding = next((f for f in run.monitor.findings if f.code == code), None)
    assert finding is not None, [(f.code, f.message) for f in run.monitor.findings]
    # Caught on the first over-long batch, before its forward pass.
    assert finding.step == ONSET and finding.severity == severity
    assert says in finding.message, finding.message
    assert finding.fix
    assert not ({"R090", "R091"} - {code}) & run.codes()  # one cause, one code


def test_learned_table_overflow_inside_nanogpt_halts_before_the_lookup() -> None:
    run = train(nanogpt(), data=Longer(), steps=25, monitor={"halt_on": ["R090"]})
    assert isinstance(run.error, SapperHalt), run.error
    (finding,) = run.error.findings
    assert finding.step == ONSET and "position index 79" in finding.message
    assert "(config.block_size)" in finding.message


HEALTHY: dict[str, Callable[[], Run]] = {
    "gpt2-explicit-positions": lambda: train(
        gpt2(), steps=20, position_ids=lambda x: torch.arange(x.shape[1]).unsqueeze(0)
    ),
    "gpt2-packed-documents-longer-than-the-table": lambda: train(
        gpt2(), data=Longer(start=0), steps=20, position_ids=_packed
    ),
    "nanogpt-wrap-code-within-the-table": lambda: train(nanogpt(positions="wrap"), steps=20),
    "llama-wrap-code-within-the-context": lambda: train(llama(), steps=20, position_ids=_wrap),
}


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_positions_stay_quiet(name: str) -> None:
    run = HEALTHY[name]()
    assert run.error is None
    assert not {"R090", "R091"} & run.codes(), [f.message for f in run.monitor.findings]


def test_hf_trainer_names_wrapped_positions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    from sapper.monitor.hf import SapperCallback

    rows = Markov(batch=32, seq=80, seed=3).sample(32, 80)
    data = [{"input_ids": r, "labels": r, "position_ids": torch.arange(80) % TABLE} for r in rows]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    cb = SapperCallback(console=False, detector_options=FAST, log_every=2)
    Trainer(model=gpt2(), args=args, train_dataset=data, callbacks=[cb]).train()
    assert cb.monitor is not None
    found = next(f for f in cb.monitor.findings if f.code == "R091")
    # The Trainer's first step is global_step 1, as in its trainer_state.json.
    assert found.step == 1 and "wrapped" in found.message


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: gpt2(), (64, "learned", "config.n_positions")),
        (lambda: llama(), (64, "rope", "config.max_position_embeddings")),
        (lambda: nanogpt(block_size=48), (48, "learned", "config.block_size")),
        (lambda: Wrapped(gpt2(positions=32)), (32, "learned", "config.n_positions")),
    ],
)
def test_position_limit_by_family(make, expected) -> None:  # type: ignore[no-untyped-def]
    info = position_limit(make())
    assert info is not None and (info.limit, info.kind, info.source) == expected


def test_position_limit_from_the_table_and_rope_scaling() -> None:
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos_emb = nn.Embedding(10, 4), nn.Embedding(24, 4)

    info = position_limit(Bare())
    assert info is not None and (info.limit, info.kind, info.source) == (24, "learned", "pos_emb")
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=64,
        max_position_embeddings=256,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    )
    scaled = position_limit(transformers.LlamaForCausalLM(cfg))
    assert scaled is not None and (scaled.limit, scaled.factor, scaled.trained) == (256, 4.0, 64)
