"""Global gradient norm (seed §2.3, §5.2): non-finite, saturated clipping, tiny, surges.

The norm is the one before clipping (what ``clip_grad_norm_`` returns). Steps that a loss
scaler skipped are left to the scaler rules: an Inf there is the scaler doing its job.
"""

from __future__ import annotations

import math
from collections import deque

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.detectors.stats import RollingRobust, median
from sapper.runtime.records import StepRecord

__all__ = [
    "CLIP_SATURATED",
    "GRAD_NONFINITE",
    "GRAD_SURGE",
    "GRAD_TINY",
    "GradNormDetector",
]

GRAD_NONFINITE = register(
    Rule(
        code="R010",
        name="grad-norm-non-finite",
        check="gradnorm",
        severity=Severity.ERROR,
        title="The gradient norm is NaN or Inf on an applied step",
        why="""\
A non-finite gradient that reaches the optimizer (no loss scaler skipped the step) writes
NaN into the weights and the optimizer moments; every later step is NaN too. Clipping
does not help: the norm it divides by is itself non-finite.""",
        signs="""\
Gradient norm rising over the previous steps; loss spikes; fp16 activations near 65504.""",
        fix="""\
Restore the last good checkpoint; find the first module or parameter that went non-finite
(sapper names it when the monitor is attached); lower the LR, clip at ≈1.0, use bf16 or a
dynamic loss scaler that skips such steps.""",
        seed="§2.1, §2.3",
    )
)

CLIP_SATURATED = register(
    Rule(
        code="R011",
        name="clipping-saturated",
        check="gradnorm",
        severity=Severity.WARNING,
        title="Gradient clipping engages on most steps",
        why="""\
Clipping is a safety net for rare spikes. When the norm is above the threshold on most
steps, every update is rescaled: the effective LR is no longer the one you set and the
run is fighting an LR that is too high or bad data. Raising the threshold hides it.""",
        signs="""\
The pre-clip gradient norm sits above the threshold (often 5–10× a threshold of 1.0)
step after step, past the first few dozen steps.""",
        fix="""\
Lower the LR (or lengthen warmup) and inspect the data; keep the threshold near 1.0
rather than raising it.""",
        seed="§2.3",
    )
)

GRAD_TINY = register(
    Rule(
        code="R012",
        name="grad-norm-tiny",
        check="gradnorm",
        severity=Severity.WARNING,
        title="The gradient norm stays tiny",
        why="""\
Gradients that stay orders of magnitude below the usual 0.1–1.0 do not move the weights:
an init that is too small (activations vanish layer by layer), a loss accidentally scaled
down, fp16 underflow, or frozen parameters.""",
        signs="""\
The gradient norm stays below the threshold for many steps and the loss barely moves.""",
        fix="""\
Check the init std (≈0.02 for GPT-style models), that the loss is not divided twice, and
the share of exactly-zero gradient elements (fp16 underflow: use loss scaling or bf16).""",
        seed="§2.3, §2.4",
    )
)

GRAD_SURGE = register(
    Rule(
        code="R013",
        name="grad-norm-surge",
        check="gradnorm",
        severity=Severity.WARNING,
        title="Sudden growth of the gradient norm",
        why="""\
A gradient norm that jumps far above its recent level announces a loss spike or an
overflow one or a few steps later: the loss surface got sharp where the weights are, or
a batch is anomalous.""",
        signs="""\
The norm jumps to several times its rolling median, often in one layer first.""",
        fix="""\
Keep clipping on (≈1.0); lower the LR if surges repeat; inspect the batch at that step.""",
        seed="§2.3, §5.2",
    )
)


class GradNormDetector(RuleDetector):
    """R010-R013 over ``record.grad_norm`` (and ``clip_threshold``)."""

    name = "gradnorm"
    rules = (GRAD_NONFINITE, CLIP_SATURATED, GRAD_TINY, GRAD_SURGE)
    cooldown = 100

    def __init__(
        self,
        *,
        clip_threshold: float | None = None,
        warmup_steps: int = 0,
        skip_first: int = 10,
        saturate_window: int = 20,
        saturate_share: float = 0.8,
        tiny: float = 1e-3,
        tiny_window: int = 20,
        surge_window: int = 50,
        surge_min_history: int = 10,
        surge_k: float = 6.0,
        surge_ratio: float = 3.0,
    ) -> None:
        super().__init__()
        self.clip_threshold = clip_threshold
        self.warmup_steps = warmup_steps
        self.skip_first = skip_first
        self.saturate_window = saturate_window
        self.saturate_share = saturate_share
        self.tiny = tiny
        self.tiny_window = tiny_window
        self.surge_window = surge_window
        self.surge_min_history = surge_min_history
        self.surge_k = surge_k
        self.surge_ratio = surge_ratio
        self.clipped: deque[bool] = deque(maxlen=saturate_window)
        self.log_norms = RollingRobust(surge_window)
        self.norms: deque[float] = deque(maxlen=tiny_window)
        # Running counts over the windows, so most records skip the window scans: the
        # share of clipped steps, and how many recent norms are below ``tiny`` (the
        # median can only be below it when at least half of them are).
        self.clipped_count = 0
        self.tiny_count = 0
        self.first_step: int | None = None

    def update(self, record: StepRecord) -> list[Finding]:
        gn, step = record.grad_norm, record.step
        if gn is None:
            return []
        if self.first_step is None:
            self.first_step = step
        if not math.isfinite(gn):
            if record.skipped:
                return []
            return self.fire(
                GRAD_NONFINITE, step, f"gradient norm is {gn} at step {step}", value=gn
            )
        out = self._saturation(record, gn, step)
        if gn > 0:
            log_gn = math.log(gn)
            if len(self.log_norms) >= self.surge_min_history:
                out += self._surge(gn, log_gn, step, record)
            self.log_norms.add(log_gn)
        norms = self.norms
        if len(norms) == norms.maxlen and norms:
            self.tiny_count -= norms[0] < self.tiny
        norms.append(gn)
        self.tiny_count += gn < self.tiny
        out += self._tiny(step)
        return out

    def _saturation(self, record: StepRecord, gn: float, step: int) -> list[Finding]:
        threshold = record.clip_threshold or self.clip_threshold
        if not threshold or threshold <= 0:
            return []
        if step - (self.first_step or 0) < max(self.skip_first, self.warmup_steps):
            return []
        clipped = self.clipped
        if len(clipped) == clipped.maxlen and clipped:
            self.clipped_count -= clipped[0]
        over = gn > threshold
        clipped.append(over)
        self.clipped_count += over
        if len(clipped) < self.saturate_window:
            return []
        share = self.clipped_count / len(clipped)
        if share < self.saturate_share:
            return []
        return self.fire(
            CLIP_SATURATED,
            step,
            f"the gradient norm exceeded the clipping threshold {fmt(threshold)} on "
            f"{fmt(100 * share)}% of the last {len(self.clipped)} logged steps "
            f"(now {fmt(gn)}, {fmt(gn / threshold)}× the threshold)",
            value=share,
            threshold=self.saturate_share,
            grad_norm=gn,
            clip_threshold=threshold,
        )

    def _tiny(self, step: int) -> list[Finding]:
        n = len(self.norms)
        if n < self.tiny_window or self.tiny_count < (n + 1) // 2:
            return []
        recent = list(self.norms)
        med = median(recent)
        if med >= self.tiny:
            return []
        return self.fire(
            GRAD_TINY,
            step,
            f"median gradient norm over the last {len(recent)} logged steps is {fmt(med)}, "
            f"below {fmt(self.tiny)}",
            value=med,
            threshold=self.tiny,
        )

    def _surge(self, gn: float, log_gn: float, step: int, record: StepRecord) -> list[Finding]:
        """Called for a positive norm once the window holds ``surge_min_history``."""
        med = self.log_norms.level()
        log_ratio = math.log(self.surge_ratio)
        if log_gn <= med + log_ratio:  # below the smallest possible margin
            return []
        sigma = self.log_norms.sigma()
        k = self.surge_k * (2.0 if step < self.warmup_steps else 1.0)
        if log_gn <= med + max(k * sigma, log_ratio):
            return []
        base = math.exp(med)
        layer = _largest_layer(record)
        where = f"; largest in {layer}" if layer else ""
        return self.fire(
            GRAD_SURGE,
            step,
            f"gradient norm {fmt(gn)} at step {step} is {fmt(gn / base)}× its rolling "
            f"median {fmt(base)}{where}",
            value=gn,
            threshold=base * self.surge_ratio,
            median=base,
        )


def _largest_layer(record: StepRecord) -> str | None:
    layers = record.extra.get("grad_norm_layers")
    if not isinstance(layers, dict) or not layers:
        return None
    name, _ = max(layers.items(), key=lambda kv: kv[1] if isinstance(kv[1], float) else -1.0)
    return str(name)
