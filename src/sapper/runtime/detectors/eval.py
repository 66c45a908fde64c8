"""Eval loss (seed §5.2, §5.3): overfitting and plateaus, over sparse evaluations.

Evaluations are rare (every few hundred steps), so the tests count evaluations, not
steps, and compare the eval loss with the training loss around the same step (the median
of the recent training losses, which smooths the per-step noise). Overfitting is an eval
loss that keeps rising above its best while the training loss keeps falling: the model
memorizes its training data — after too many epochs, or because the pipeline repeats
samples (§5.3). A plateau is an eval loss that has not improved by a meaningful margin
for several evaluations: the LR has decayed too far, is too low, or the data is spent.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["EVAL_OVERFIT", "EVAL_PLATEAU", "EvalLossDetector"]

EVAL_OVERFIT = register(
    Rule(
        code="R110",
        name="eval-loss-rising",
        check="eval",
        severity=Severity.WARNING,
        title="The eval loss rises while the training loss falls",
        why="""\
When the training loss keeps falling but the loss on held-out data turns up, every
further step fits the training set at the expense of everything else: the model is
memorizing. Common causes are too many epochs over a small set, an LR kept high for
too long, and a data pipeline that repeats samples or batches (seed §5.3: the loss falls
fast, the model memorizes), which no error message will ever report.

Frameworks: any; the eval loss as logged (HF eval_loss, Megatron's validation lm loss).""",
        signs="""\
The gap between eval and training loss widens evaluation after evaluation; the training
loss falls faster than expected for the model size; the best checkpoint is several
evaluations old.""",
        fix="""\
Keep the checkpoint with the best eval loss (early stopping); check the data pipeline for
repeated samples (sample IDs or token hashes per step) and the number of epochs; lower
the LR or its decay horizon, or add regularization (weight decay, dropout) for
fine-tuning.""",
        seed="§5.2, §5.3",
    )
)

EVAL_PLATEAU = register(
    Rule(
        code="R111",
        name="eval-loss-plateau",
        check="eval",
        severity=Severity.INFO,
        title="The eval loss has stopped improving",
        why="""\
An eval loss that no longer improves means the steps being paid for buy nothing: the LR
has decayed to a value too small to move the weights, it was too low from the start, or
the training data has nothing more to teach at this model size. Late in a decayed
schedule this is expected; early in training it is not.

Frameworks: any; the eval loss as logged (HF eval_loss, Megatron's validation lm loss).""",
        signs="""\
Several evaluations in a row within about 1% of the best eval loss; a training loss
that is flat as well (LR, data) or still falling (overfitting next).""",
        fix="""\
Compare with the LR curve: if the LR is still high, check the data (mix, repeated
shards) and the LR value; if it has decayed, the run is done at this budget — stop, or
plan a longer schedule or more data rather than more steps at this LR.""",
        seed="§5.2",
    )
)


def _median(values: deque[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


class _Series:
    """The state of one eval series: the unnamed eval loss, or one named eval set."""

    def __init__(self, name: str | None) -> None:
        self.name = name
        #: [step, eval loss, training loss then] of the lowest eval loss so far.
        self.best: list[Any] | None = None
        #: Evaluations since the eval loss last improved by ``min_improvement``.
        self.since_gain = 0
        self.mark: float | None = None  # the eval loss of the last meaningful gain
        self.evals_since_best = 0
        self.overfit_fired = False
        self.plateau_fired = False
        #: Finite evaluations of this series (what ``unevaluated`` counts).
        self.evals = 0

    @property
    def label(self) -> str:
        return "eval loss" if self.name is None else f"eval loss on {self.name!r}"

    def data(self) -> dict[str, Any]:
        return {} if self.name is None else {"eval_set": self.name}


class EvalLossDetector(Detector):
    """R110 (overfitting) and R111 (plateau) over ``record.eval_loss`` and over each
    named eval set in ``record.extra["eval_losses"]`` (the HF Trainer's
    ``eval_<name>_loss`` for a dict of eval datasets), each judged on its own: one set
    can overfit while another still improves.

    ``patience``: evaluations the eval loss must stay above its best before R110 fires;
    ``min_rise``: how far above the best (relative) counts as rising; ``plateau_evals``:
    evaluations without an improvement of ``min_improvement`` (relative) before R111;
    ``train_window``: training losses in the median that stands for "the training loss
    now".
    """

    rules = (EVAL_OVERFIT, EVAL_PLATEAU)

    def __init__(
        self,
        *,
        patience: int = 3,
        min_rise: float = 0.02,
        plateau_evals: int = 5,
        min_improvement: float = 0.01,
        train_window: int = 20,
    ) -> None:
        self.patience = patience
        self.min_rise = min_rise
        self.plateau_evals = plateau_evals
        self.min_improvement = min_improvement
        self.train: deque[float] = deque(maxlen=train_window)
        self.series: dict[str | None, _Series] = {}

    def unevaluated(self) -> list[str]:
        """What R110-R111 could not look at: no evaluation in the log, or too few (in the
        eval set evaluated most often)."""
        evals = max((s.evals for s in self.series.values()), default=0)
        if evals == 0:
            return ["R110-R111 eval loss: not evaluated — the log has no eval loss"]
        out = []
        if evals <= self.patience:
            out.append(
                f"R110 eval loss rising: not evaluated — {evals} evaluation(s), needs "
                f"{self.patience + 1}"
            )
        if evals <= self.plateau_evals:
            out.append(
                f"R111 eval loss plateau: not evaluated — {evals} evaluation(s), needs "
                f"{self.plateau_evals + 1}"
            )
        return out

    def update(self, record: StepRecord) -> list[Finding]:
        if record.loss is not None and math.isfinite(record.loss):
            self.train.append(record.loss)
        out: list[Finding] = []
        if record.eval_loss is not None:
            out += self._judge(None, record.step, record.eval_loss)
        named = record.extra.get("eval_losses")
        if isinstance(named, dict):
            for name, value in named.items():
                if isinstance(value, (int, float)):
                    out += self._judge(str(name), record.step, float(value))
        return out

    def _judge(self, name: str | None, step: int, value: float) -> list[Finding]:
        if not math.isfinite(value):
            return []
        s = self.series.get(name)
        if s is None:
            s = self.series[name] = _Series(name)
        s.evals += 1
        train = _median(self.train)
        if s.best is None or value < s.best[1]:
            s.best = [step, value, train]
            s.evals_since_best = 0
            s.overfit_fired = False
        else:
            s.evals_since_best += 1
        if s.mark is None or value < s.mark * (1 - self.min_improvement):
            s.mark = value
            s.since_gain = 0
            s.plateau_fired = False
        else:
            s.since_gain += 1
        return self._overfit(s, step, value, train) or self._plateau(s, step, value)

    def _overfit(self, s: _Series, step: int, value: float, train: float | None) -> list[Finding]:
        assert s.best is not None
        best_step, best, best_train = s.best
        rise = value / best - 1 if best > 0 else 0.0
        if s.overfit_fired or s.evals_since_best < self.patience or rise < self.min_rise:
            return []
        if train is not None and best_train is not None and train >= best_train:
            return []  # both rising: divergence, not memorization (the loss rules say so)
        s.overfit_fired = True
        trend = (
            f" while the training loss fell from {best_train:.4g} to {train:.4g}"
            if train is not None and best_train is not None
            else ""
        )
        return [
            EVAL_OVERFIT.finding(
                f"{s.label} {value:.4g} at step {step} is {100 * rise:.1f}% above its best "
                f"{best:.4g} (step {best_step}), {s.evals_since_best} evaluations ago"
                f"{trend}",
                step=step,
                value=value,
                threshold=best * (1 + self.min_rise),
                best_step=best_step,
                best_eval_loss=best,
                train_loss=train,
                **s.data(),
            )
        ]

    def _plateau(self, s: _Series, step: int, value: float) -> list[Finding]:
        if s.plateau_fired or s.since_gain < self.plateau_evals or s.mark is None:
            return []
        if value > s.mark * (1 + self.min_rise):
            return []  # rising, not flat: R110's business
        s.plateau_fired = True
        return [
            EVAL_PLATEAU.finding(
                f"{s.label} {value:.4g} at step {step}: no improvement of "
                f"{100 * self.min_improvement:.0f}% over {s.mark:.4g} in the last "
                f"{s.since_gain} evaluations",
                step=step,
                value=value,
                threshold=s.mark * (1 - self.min_improvement),
                evaluations=s.since_gain,
                **s.data(),
            )
        ]
