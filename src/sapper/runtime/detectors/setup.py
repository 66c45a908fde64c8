"""Training setup at the first step: an optimizer that cannot change the model.

Three mistakes leave every step a no-op without raising: the optimizer was built on
other parameters (a model copy, a model rebuilt after the optimizer), nothing is
trainable (everything frozen, or the optimizer holds only the frozen part), or no
gradient ever reaches a parameter (backward not called, or the gradients cleared
between backward and ``optimizer.step()``). The loss does not move; days later it
looks like a bad learning rate.

The live monitor records host-side counts, read without a device sync, into the first
step's record and reports them at once (the run log keeps them, so ``sapper analyze``
finds the same): at the first training forward pass ``extra["model_params"]`` (parameter
tensors of the model), ``extra["trainable_params"]`` (those with ``requires_grad``),
``extra["opt_params"]``, ``extra["opt_model_params"]`` (the optimizer's tensors that are
the model's own) and ``extra["opt_trainable_params"]``; at the first optimizer step
``extra["opt_params_with_grad"]`` and ``extra["model_params_with_grad"]`` (tensors whose
``.grad`` is not None).

Mixed-precision master weights and sharded optimizers (DeepSpeed ZeRO, FSDP with flat
parameters) step on copies that are not the model's tensors: those copies receive the
gradients before the step, so R120 needs both signs, no shared tensor *and* no gradient
on any of the optimizer's parameters at its first step.
"""

from __future__ import annotations

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector
from sapper.runtime.records import StepRecord

__all__ = ["NO_BACKWARD", "NO_TRAINABLE", "OPTIMIZER_FOREIGN", "SetupDetector"]

OPTIMIZER_FOREIGN = register(
    Rule(
        code="R120",
        name="optimizer-holds-no-model-parameters",
        check="setup",
        severity=Severity.ERROR,
        title="The optimizer holds none of the model's parameters",
        why="""\
An optimizer updates the tensors it was given. Built on a copy of the model (a
deepcopy, a model re-created or reloaded after the optimizer, the EMA or teacher model),
it steps on tensors that never receive this model's gradients: the trained model never
changes, the loss stays where it started, and nothing raises.

Frameworks: any loop or framework the live monitor watches (the optimizer passed to it,
framework wrappers unwrapped); master-weight copies that receive gradients are not
reported.""",
        signs="""\
A loss that does not move from step 0; gradients on the model's parameters but none on
the optimizer's; the optimizer's state stays empty.""",
        fix="""\
Build the optimizer after the model is final, on the very model that is trained:
torch.optim.AdamW(model.parameters(), ...) (after .to(device), PEFT wrapping or loading
a checkpoint into the same object).""",
    )
)

NO_TRAINABLE = register(
    Rule(
        code="R121",
        name="no-trainable-parameters",
        check="setup",
        severity=Severity.ERROR,
        title="No parameter the optimizer holds is trainable",
        why="""\
With every parameter frozen (requires_grad=False) backward has nothing to compute and
fails ("element 0 of tensors does not require grad"), or, when something else in the
graph requires grad, silently leaves every parameter untouched. An optimizer that holds
only the frozen part of a model (built before adapters were added or layers unfrozen)
trains nothing either.

Frameworks: any loop or framework the live monitor watches; partial freezing (LoRA,
frozen embeddings or backbone) is fine and not reported.""",
        signs="""\
The first backward raises, or the loss does not move and no parameter has a gradient;
trainable parameter count 0 in the model summary.""",
        fix="""\
Unfreeze what should train (requires_grad_(True) on adapters or heads) and build the
optimizer after freezing and adapter insertion, on the trainable parameters:
AdamW(p for p in model.parameters() if p.requires_grad).""",
    )
)

NO_BACKWARD = register(
    Rule(
        code="R122",
        name="no-backward",
        check="setup",
        severity=Severity.ERROR,
        title="The optimizer steps but no gradient reached any parameter",
        why="""\
An optimizer step with no gradient on any parameter is a no-op (torch skips parameters
whose .grad is None): backward was never called, was called on a detached tensor or
under no_grad, or the gradients were cleared (zero_grad(set_to_none=True)) between
backward and optimizer.step(). The loop runs, the loss is logged, the model never
learns.

Frameworks: any loop the live monitor watches with a torch optimizer; read at the first
optimizer step from .grad being None on every parameter (host-side, no sync).""",
        signs="""\
A loss that does not move from step 0; every parameter's .grad is None at
optimizer.step().""",
        fix="""\
Call loss.backward() (or scaler.scale(loss).backward()) on every micro-batch before
optimizer.step(), and zero_grad() after the step (or before the forward), never between
backward and step.""",
    )
)

_FORWARD = ("model_params", "trainable_params")
_STEP = ("opt_params_with_grad", "model_params_with_grad")
#: Every count the detector reads (a log's records hold none: one set test skips them).
_COUNTS = (*_FORWARD, "opt_params", "opt_model_params", "opt_trainable_params", *_STEP)


def _count(extra: dict, key: str) -> int | None:
    value = extra.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class SetupDetector(RuleDetector):
    """R120-R122 over the parameter and gradient counts of the first step."""

    name = "setup"
    rules = (OPTIMIZER_FOREIGN, NO_TRAINABLE, NO_BACKWARD)
    cooldown = None

    def __init__(self) -> None:
        super().__init__()
        self.facts: dict[str, int] = {}
        self.seen_forward = False
        self.seen_step = False

    def unevaluated(self) -> list[str]:
        """R120-R122 read the live monitor's parameter and gradient counts of the first
        step; a log has none."""
        if self.seen_step:
            return []
        return [
            "R120-R122 training setup: not evaluated — needs the live monitor's parameter "
            "and gradient counts at the first optimizer step"
        ]

    def update(self, record: StepRecord) -> list[Finding]:
        extra = record.extra
        if extra.keys().isdisjoint(_COUNTS):
            return []  # nothing new: the findings wait on counts not seen yet
        for key in _COUNTS:
            n = _count(extra, key)
            if n is not None and key not in self.facts:
                self.facts[key] = n
        out: list[Finding] = []
        if not self.seen_forward and all(k in self.facts for k in _FORWARD):
            self.seen_forward = True
            out += self._trainable(record.step)
        if not self.seen_step and all(k in self.facts for k in _STEP):
            self.seen_step = True
            out += self._gradients(record.step)
        return out

    def _trainable(self, step: int) -> list[Finding]:
        f = self.facts
        total, trainable = f["model_params"], f["trainable_params"]
        opt, shared = f.get("opt_params"), f.get("opt_model_params")
        opt_trainable = f.get("opt_trainable_params")
        if total and trainable == 0:
            return self.fire(
                NO_TRAINABLE,
                step,
                f"all {total} parameter tensors of the model are frozen (requires_grad=False): "
                "backward has nothing to train",
                value=0,
                model_params=total,
            )
        if opt and shared and opt_trainable == 0:
            return self.fire(
                NO_TRAINABLE,
                step,
                f"the optimizer's {opt} parameter tensors are all frozen (requires_grad=False); "
                f"the model's {trainable} trainable tensors are not in the optimizer",
                value=0,
                opt_params=opt,
                trainable_params=trainable,
            )
        return []

    def _gradients(self, step: int) -> list[Finding]:
        f = self.facts
        opt, shared = f.get("opt_params"), f.get("opt_model_params")
        with_grad, model_grad = f["opt_params_with_grad"], f["model_params_with_grad"]
        if not opt or with_grad:
            return []  # no optimizer seen, or gradients reach what it steps
        if self.fired.get(NO_TRAINABLE.code) is not None:
            return []  # nothing trainable: that is the cause, already named
        if shared == 0:
            also = (
                f"the model's own {model_grad} tensors with gradients are never stepped"
                if model_grad
                else "no gradient reached the model's parameters either"
            )
            return self.fire(
                OPTIMIZER_FOREIGN,
                step,
                f"the optimizer holds {opt} parameter tensors, none of them the model's, and "
                f"none received a gradient by its first step: {also} (an optimizer built on "
                "another model copy)",
                value=0,
                opt_params=opt,
                model_params_with_grad=model_grad,
            )
        if model_grad:
            return []  # gradients exist, only on tensors the optimizer does not hold
        return self.fire(
            NO_BACKWARD,
            step,
            f"optimizer.step() at step {step} found no gradient on any of its {opt} "
            "parameter tensors (every .grad is None): backward was not called, or the "
            "gradients were cleared between backward and optimizer.step()",
            value=0,
            opt_params=opt,
        )
