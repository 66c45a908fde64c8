"""Fault injection: each failure of issue 5's list, injected on purpose into a tiny real
training run, must be named with the right code within a bounded number of steps after
its onset; clean runs of the same models must raise no warning."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from tinytrain import Markov, Run, gpt2, llama, post_ln, train

from sapper.monitor import SapperHalt

# The faulty loops do what torch warns about (a scheduler stepped before the optimizer).
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")


def _clean_runs() -> dict[str, Callable[[], Run]]:
    return {
        "gpt2-fp32": lambda: train(gpt2()),
        "llama-fp32": lambda: train(llama()),
        "gpt2-fp16-scaler": lambda: train(gpt2(), fp16=True),
        "llama-ga2-warmup": lambda: train(
            llama(), ga=2, schedule=lambda s: min(1.0, (s + 1) / 10), steps=30
        ),
        "postln-warmup": lambda: train(post_ln(), schedule=lambda s: min(1.0, s / 20)),
    }


@pytest.mark.parametrize("name", sorted(_clean_runs()))
def test_clean_run_raises_no_warning(name: str) -> None:
    run = _clean_runs()[name]()
    assert run.error is None
    assert run.warnings() == set(), [f.message for f in run.monitor.findings]
    assert len(run.monitor.history) == len(run.losses)
    assert run.losses[-1] < run.losses[0]


class DoubledBatches:
    """A broken sampler: from micro-batch ``start`` on, every batch is served twice."""

    def __init__(self, start: int = 20) -> None:
        self.data, self.start, self.i, self.last = Markov(), start, 0, None

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        self.i += 1
        if self.i > self.start and self.i % 2 == 0 and self.last is not None:
            return self.last
        self.last = next(self.data)
        return self.last


class LongerSequences(Markov):
    """From batch ``start`` on, sequences of ``length`` tokens (past the position table)."""

    def __init__(self, start: int = 15, length: int = 80) -> None:
        super().__init__()
        self.i, self.start, self.length = 0, start, length

    def __next__(self) -> torch.Tensor:
        self.i += 1
        return self.sample(8, self.length if self.i > self.start else 32)


def _overflow(step: int, model: torch.nn.Module) -> None:
    if step == 10:  # an fp16 overflow in layer 1's MLP from step 10 on
        with torch.no_grad():
            model.transformer.h[1].mlp.c_fc.weight.mul_(1e4)


def _poison(step: int, model: torch.nn.Module) -> None:
    if step == 10:
        with torch.no_grad():
            model.transformer.h[1].mlp.c_fc.weight.fill_(float("inf"))


def _wide_init() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=256,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg)


#: name -> (run, expected code, onset step, steps allowed from onset to the finding)
FAULTS: dict[str, tuple[Callable[[], Run], str, int, int]] = {
    "lr-too-high": (lambda: train(gpt2(), lr=0.1), "R003", 0, 40),
    "lr-too-low": (lambda: train(gpt2(), lr=1e-7), "R003", 0, 40),
    "fp16-overflow-scaler-collapse": (
        lambda: train(gpt2(), fp16=True, inject=_overflow),
        "R030",
        10,
        15,
    ),
    "fp16-overflow-localised": (
        lambda: train(gpt2(), fp16=True, inject=_overflow),
        "R020",
        10,
        10,
    ),
    "non-finite-weights": (lambda: train(gpt2(), inject=_poison), "R001", 10, 0),
    "missing-unscale": (
        lambda: train(gpt2(), fp16=True, bare_step=True, clip=None, steps=15),
        "R032",
        0,
        5,
    ),
    "clip-before-unscale": (
        lambda: train(gpt2(), fp16=True, clip_before_unscale=True, steps=15),
        "R033",
        0,
        5,
    ),
    "deep-post-ln-without-warmup": (lambda: train(post_ln(), steps=15), "R101", 0, 10),
    "duplicated-batches": (lambda: train(gpt2(), data=DoubledBatches()), "R070", 20, 5),
    "ga-loss-not-divided": (
        lambda: train(gpt2(), ga=4, divide_loss=False, steps=15),
        "R080",
        0,
        5,
    ),
    "position-overflow-rope": (
        lambda: train(llama(), data=LongerSequences(), steps=25),
        "R090",
        15,
        0,
    ),
    "data-loader-stall": (
        lambda: train(gpt2(), stall=lambda s: 0.05 if s >= 15 else 0.0, steps=30),
        "R062",
        15,
        10,
    ),
    "memory-growth": (
        lambda: train(gpt2(), leak=lambda s: (16 << 20) if s >= 10 else 0, steps=35),
        "R051",
        10,
        20,
    ),
    "scheduler-per-micro-batch": (
        lambda: train(
            gpt2(),
            ga=4,
            steps=15,
            schedule=lambda s: min(1.0, (s + 1) / 100),
            scheduler_per_micro=True,
        ),
        "R042",
        0,
        5,
    ),
    "fp16-underflow-dead-layers": (
        lambda: train(gpt2(), fp16=True, scaler=False, loss_factor=1e-6, clip=None, steps=20),
        "R021",
        0,
        15,
    ),
    "fp16-underflow-zero-share": (
        lambda: train(gpt2(), fp16=True, scaler=False, loss_factor=1e-6, clip=None, steps=20),
        "R022",
        0,
        15,
    ),
    "activation-growth-at-init": (lambda: train(_wide_init(), steps=3), "R100", 0, 0),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_is_named_in_time(name: str) -> None:
    make, code, onset, allowed = FAULTS[name]
    run = make()
    assert code in run.codes(), (name, [(f.code, f.step, f.message) for f in run.monitor.findings])
    step = run.first_step(code)
    assert step is not None and onset <= step <= onset + allowed, (code, step)
    finding = next(f for f in run.monitor.findings if f.code == code)
    assert finding.fix and finding.message


def test_overflow_names_the_module() -> None:
    run = train(gpt2(), fp16=True, inject=_overflow)
    origin = next(f for f in run.monitor.findings if f.code == "R020")
    assert "transformer.h.1.mlp" in origin.message


def test_poisoned_weights_name_the_first_module() -> None:
    run = train(gpt2(), inject=_poison, steps=15)
    origin = next(f for f in run.monitor.findings if f.code == "R020")
    assert "transformer.h.1.mlp.c_fc" in origin.message and "finite inputs" in origin.message


def test_position_overflow_halts_before_the_embedding_breaks() -> None:
    run = train(gpt2(), data=LongerSequences(), steps=25, monitor={"halt_on": ["R090"]})
    assert isinstance(run.error, SapperHalt)
    assert run.error.findings[0].code == "R090" and run.error.findings[0].step == 15
    # Without the monitor's halt the learned table is indexed past its end.
    unmonitored = train(gpt2(), data=LongerSequences(), steps=25)
    assert isinstance(unmonitored.error, IndexError)
    assert "R090" in unmonitored.codes()
