"""Where the numerics broke (seed §2.1): the first non-finite module or gradient, dead
parameters, fp16 underflow.

These come from the live monitor's sampled or fault-armed hooks: after a non-finite
value, forward hooks are armed on every module for the next step and the monitor records
``extra["nonfinite_module"]`` (the first module, in execution order, whose output was
non-finite), whether that module's input was still finite, and the parameters holding
non-finite values or gradients. On sampled steps it records ``extra["zero_grad_params"]``
(parameters whose gradient is entirely zero or missing) and ``extra["grad_zero_share"]``
(the share of exactly-zero gradient elements outside embedding tables).
"""

from __future__ import annotations

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.records import StepRecord

__all__ = ["DEAD_PARAMS", "NONFINITE_ORIGIN", "ZERO_GRAD_SHARE", "NumericsDetector"]

NONFINITE_ORIGIN = register(
    Rule(
        code="R020",
        name="non-finite-origin",
        check="numerics",
        severity=Severity.ERROR,
        title="First module or parameter that went non-finite",
        why="""\
A NaN spreads: one overflowing matmul makes its block's output Inf, the next norm makes
it NaN, the loss and every gradient follow. The fix depends on where it started (an
attention softmax in fp16, an exploding MLP, a bad embedding row), which the loss alone
cannot tell.""",
        signs="""\
A module whose inputs are finite and whose output is not; parameters whose values or
gradients hold NaN/Inf.""",
        fix="""\
Keep the named module's computation in fp32 (autocast(enabled=False) around it) or use
bf16; lower the LR; check its init and inputs; restore a checkpoint from before the fault.""",
        seed="§2.1",
    )
)

DEAD_PARAMS = register(
    Rule(
        code="R021",
        name="dead-parameters",
        check="numerics",
        severity=Severity.WARNING,
        title="Parameters whose gradient stays entirely zero",
        why="""\
A parameter whose gradient is all zeros step after step does not learn: fp16 underflow
(gradients below 6e-8 round to zero), a path cut off (detach, a mask, dead ReLUs), or a
parameter that takes no part in the loss.""",
        signs="""\
The gradient of the same parameters reads exactly zero (or None) on every sampled step.""",
        fix="""\
Under fp16 enable dynamic loss scaling or use bf16; otherwise check the forward path of
the named parameters (detach, masking, unused modules) and the init.""",
        seed="§2.1",
    )
)

ZERO_GRAD_SHARE = register(
    Rule(
        code="R022",
        name="zero-gradient-share",
        check="numerics",
        severity=Severity.WARNING,
        title="A large share of gradient elements is exactly zero (fp16 underflow)",
        why="""\
Outside embedding tables, exact zeros in a gradient are rare. A large share of them in
fp16 means small gradients underflowed (below ≈6e-8) and those weights no longer learn;
in any dtype it means many dead units.""",
        signs="""\
The share of exactly-zero gradient elements rising; the loss scale low or absent in fp16.""",
        fix="""\
Enable dynamic loss scaling (GradScaler) or train in bf16; check activations for dead
ReLUs and the init scale.""",
        seed="§2.1, §2.2",
    )
)


class NumericsDetector(RuleDetector):
    """R020-R022 over the live monitor's localisation and sampled gradient statistics."""

    name = "numerics"
    rules = (NONFINITE_ORIGIN, DEAD_PARAMS, ZERO_GRAD_SHARE)
    cooldown = None

    def __init__(self, *, dead_samples: int = 3, zero_share: float = 0.25, patience: int = 2):
        super().__init__()
        self.dead_samples = dead_samples
        self.zero_share = zero_share
        self.patience = patience
        self.zero_runs: dict[str, int] = {}
        self.high_share = 0
        self.localised = False

    def update(self, record: StepRecord) -> list[Finding]:
        return self._origin(record) + self._dead(record) + self._share(record)

    def _origin(self, record: StepRecord) -> list[Finding]:
        extra = record.extra
        module = extra.get("nonfinite_module")
        grad_module = extra.get("nonfinite_grad_module")
        params = extra.get("nonfinite_params") or []
        grads = extra.get("nonfinite_grads") or []
        if not module and not grad_module and not params and not grads:
            return []
        if (module or grad_module) and not self.localised:
            # A module name is new information even after a parameters-only report.
            self.localised = True
            self.fired.pop(NONFINITE_ORIGIN.code, None)
        parts = []
        if module:
            clean_in = extra.get("nonfinite_module_input_finite")
            how = " from finite inputs" if clean_in else ""
            parts.append(f"first non-finite output{how} in module '{module}'")
        elif grad_module:
            parts.append(
                "forward finite; in backward the gradient first went non-finite at the output "
                f"of module '{grad_module}' (the layer consuming that output overflows)"
            )
        if params:
            parts.append(f"{len(params)} parameter(s) hold non-finite values (first: {params[0]})")
        if grads:
            parts.append(f"{len(grads)} parameter(s) got non-finite gradients (first: {grads[0]})")
        since = extra.get("nonfinite_first_step")
        when = f" (non-finite since step {since})" if isinstance(since, int) else ""
        return self.fire(
            NONFINITE_ORIGIN,
            record.step,
            "; ".join(parts) + when,
            module=module or grad_module,
            params=params[:20],
            grads=grads[:20],
        )

    def _dead(self, record: StepRecord) -> list[Finding]:
        if not record.extra.get("grad_sampled"):
            return []
        zero = record.extra.get("zero_grad_params")
        names = set(zero) if isinstance(zero, list) else set()
        self.zero_runs = {n: self.zero_runs.get(n, 0) + 1 for n in names}
        dead = sorted(n for n, k in self.zero_runs.items() if k >= self.dead_samples)
        if not dead:
            return []
        shown = ", ".join(dead[:5]) + (f" … (+{len(dead) - 5})" if len(dead) > 5 else "")
        return self.fire(
            DEAD_PARAMS,
            record.step,
            f"{len(dead)} parameter(s) had all-zero gradients on {self.dead_samples} sampled "
            f"steps in a row: {shown}",
            value=len(dead),
            params=dead[:50],
        )

    def _share(self, record: StepRecord) -> list[Finding]:
        share = record.extra.get("grad_zero_share")
        if not isinstance(share, (int, float)):
            return []
        self.high_share = self.high_share + 1 if share >= self.zero_share else 0
        if self.high_share < self.patience:
            return []
        dtype = record.extra.get("compute_dtype")
        hint = " under fp16: gradients underflow" if dtype == "float16" else ""
        return self.fire(
            ZERO_GRAD_SHARE,
            record.step,
            f"{fmt(100 * share)}% of gradient elements (embeddings excluded) are exactly zero"
            f"{hint}",
            value=share,
            threshold=self.zero_share,
        )
