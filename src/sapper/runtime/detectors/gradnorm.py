"""Global gradient norm (seed §2.3, §5.2): non-finite, saturated clipping, tiny, surges.

The norm is the one before clipping (what ``clip_grad_norm_`` returns). Steps that a loss
scaler skipped are left to the scaler rules: an Inf there is the scaler doing its job.

Frameworks: none of these rules depends on one. The norm must be the unscaled one, which
is what Megatron, DeepSpeed, the HF Trainer and Lightning log and what a correct
GradScaler loop measures after ``scaler.unscale_``; a norm measured on scaled gradients
is the scaler rules' business (R032/R033).

Clipping saturation (R011) is decided on the clip *rate* over a window, the measure the
literature uses (Zhang et al. 2020, "Why gradient clipping accelerates training": a
clipped step is a normalised-gradient step; Pascanu et al. 2013), together with its
*size*. Past ``max(skip_first, warmup_steps)`` and over the last ``saturate_window``
norms: clipping engaged (norm > threshold, the clip coefficient threshold/norm below 1)
on at least ``saturate_share`` (90%) of them *and* their median is at least
``saturate_ratio`` (2×) the threshold. Why both: healthy runs clip on many steps early
on and hover near the threshold (a coefficient of 0.95 scales the update by 5%, nothing
an LR schedule would notice); saturation is the state where the coefficient is small on
essentially every step, so the optimizer follows the gradient's direction only and the
LR no longer sets the step. 90% leaves room for the odd unclipped step of a saturated
run; 2× means every typical update at least halved, well below the 5–10× such runs
usually show, so the warning comes early.

Cold start: with fewer than ``surge_min_history`` norms the rolling median does not
exist yet (a pasted excerpt of a few records); a norm at least ``cold_ratio`` (10×) the
median of the few before still counts as a surge. A run's first steps are the
exception: from step 0 the norm moves by large factors (the first norms are the
largest, Adam's first updates overshoot), so a log that starts within the first
``run_start_steps`` (100) steps needs ``cold_ratio_start`` (100×). The median, not the
previous norm, is the reference so that a surge building over a few steps (BLOOM-176B's
first spike: 0.24 → 0.95 → 2.4 → 15.9, tests/fixtures/logs) is seen when it passes 10×.

Per-layer series: records may carry ``extra["grad_norm_layers"]`` (layer → norm). A
layer whose norm surges to ``layer_ratio``× its own rolling median and above
``layer_ratio``× the median of the other layers is named as an exploding layer (R013),
even while the global norm, dominated by the other layers, barely moves. Dead layers
(norm zero or ≪ the others) are R021's (numerics).
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
does not help: the norm it divides by is itself non-finite.

Frameworks: any. A non-finite norm on a step marked skipped (a dynamic loss scaler
skipping the overflow: torch-amp, DeepSpeed, Megatron fp16) is left to R030/R031.""",
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
        title="Gradient clipping engages on nearly every step, and by a large factor",
        why="""\
Clipping is a safety net for rare spikes. When it engages on nearly every step and cuts
the norm by a large factor, every update is g·c/‖g‖: the optimizer runs as normalised
SGD (sign-like under Adam), the LR you set is not the step you take, and a real spike
is no longer told apart from an ordinary step. The run is fighting an LR that is too
high or bad data; raising the threshold hides it. A norm just above the threshold
(clip coefficient near 1) changes nothing and is common early in training: the rule
needs both the rate and the size over a whole window past the warmup.

Frameworks: any, on the norm before clipping as Megatron, DeepSpeed, the HF Trainer and
Lightning log it (unscaled); a torch-amp loop that clips still-scaled gradients is
R033's.""",
        signs="""\
Past the warmup, clipping engaged on at least 90% of the steps of a window (the pre-clip
norm above the threshold) and the window's median norm at least 2× the threshold (every
update scaled by ½ or less); runs that saturate usually sit at 5–10× a threshold of 1.0.""",
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
down, fp16 underflow, or frozen parameters.

Frameworks: any, on the unscaled norm (what Megatron, recent DeepSpeed, the HF Trainer and
Lightning log).""",
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
a batch is anomalous.

Frameworks: any, on the unscaled norm; per-layer norms come from the live monitor or
per-layer columns of a log.""",
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
        saturate_window: int = 50,
        saturate_share: float = 0.9,
        saturate_ratio: float = 2.0,
        tiny: float = 1e-3,
        tiny_window: int = 20,
        surge_window: int = 50,
        surge_min_history: int = 10,
        surge_k: float = 6.0,
        surge_ratio: float = 3.0,
        cold_ratio: float = 10.0,
        cold_ratio_start: float = 100.0,
        run_start_steps: int = 100,
        layer_window: int = 20,
        layer_min_history: int = 5,
        layer_ratio: float = 10.0,
    ) -> None:
        super().__init__()
        self.clip_threshold = clip_threshold
        self.warmup_steps = warmup_steps
        self.skip_first = skip_first
        self.saturate_window = saturate_window
        self.saturate_share = saturate_share
        self.saturate_ratio = saturate_ratio
        self.tiny = tiny
        self.tiny_window = tiny_window
        self.surge_window = surge_window
        self.surge_min_history = surge_min_history
        self.surge_k = surge_k
        self.surge_ratio = surge_ratio
        self.cold_ratio = cold_ratio
        self.cold_ratio_start = cold_ratio_start
        self.run_start_steps = run_start_steps
        self.layer_window = layer_window
        self.layer_min_history = layer_min_history
        self.layer_ratio = layer_ratio
        #: Per layer, its recent log-norms (bounded: one window per layer name).
        self.layer_logs: dict[str, deque[float]] = {}
        self.count = 0
        self.prev_gn: float | None = None
        self.saturation_seen = 0
        self.clipped: deque[bool] = deque(maxlen=saturate_window)
        #: norm / threshold of the same records (0 where the threshold is NaN).
        self.clip_ratios: deque[float] = deque(maxlen=saturate_window)
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
            return self._layer_surge(record)
        if self.first_step is None:
            self.first_step = step
        if not math.isfinite(gn):
            if record.skipped:
                return []
            return self.fire(
                GRAD_NONFINITE, step, f"gradient norm is {gn} at step {step}", value=gn
            )
        self.count += 1
        out = self._saturation(record, gn, step)
        if gn > 0:
            log_gn = math.log(gn)
            log_norms = self.log_norms
            if len(log_norms.values) >= self.surge_min_history:
                out += self._surge(gn, log_gn, step, record)
            else:
                out += self._cold_surge(gn, step, record)
            log_norms.add(log_gn)
            self.prev_gn = gn
        if "grad_norm_layers" in record.extra:  # per-layer norms; most records have none
            out += self._layer_surge(record)
        norms, tiny = self.norms, self.tiny
        if len(norms) == norms.maxlen and norms:
            self.tiny_count -= norms[0] < tiny
        norms.append(gn)
        self.tiny_count += gn < tiny
        n = len(norms)
        if n >= self.tiny_window and self.tiny_count >= (n + 1) // 2:  # enough, half tiny
            out += self._tiny(step)
        return out

    def _saturation(self, record: StepRecord, gn: float, step: int) -> list[Finding]:
        threshold = record.clip_threshold or self.clip_threshold
        if not threshold or threshold <= 0:
            return []
        skip = self.skip_first if self.skip_first >= self.warmup_steps else self.warmup_steps
        if step - (self.first_step or 0) < skip:
            return []
        self.saturation_seen += 1
        clipped = self.clipped
        count = self.clipped_count
        if len(clipped) == clipped.maxlen and clipped:
            count -= clipped[0]
        over = gn > threshold
        clipped.append(over)
        n = len(clipped)
        self.clipped_count = count = count + over
        ratio = gn / threshold
        self.clip_ratios.append(0.0 if ratio != ratio else ratio)  # NaN → 0
        if n < self.saturate_window:
            return []
        share = count / n
        if share < self.saturate_share:
            return []
        size = median(self.clip_ratios)
        if not size >= self.saturate_ratio:
            return []
        return self.fire(
            CLIP_SATURATED,
            step,
            saturation_message(self, share, len(clipped), size, threshold, gn),
            value=share,
            threshold=self.saturate_share,
            grad_norm=gn,
            clip_threshold=threshold,
            median_ratio=size,
        )

    def _tiny(self, step: int) -> list[Finding]:
        """R012 once :meth:`update` has found the window full enough and at least half
        of it below ``tiny``: whether the median is below it too."""
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


    def _cold_surge(self, gn: float, step: int, record: StepRecord) -> list[Finding]:
        """The surge test while fewer than ``surge_min_history`` norms are known: a norm
        ``cold_ratio``× the median of the short history (see the module doc)."""
        if self.prev_gn is None or not len(self.log_norms):
            return []
        # the short history: the positive norms among the last tiny_window ones
        ref = median([v for v in self.norms if v > 0])
        ratio = self._cold_ratio()
        if not ref > 0 or gn < ratio * ref:
            return []
        layer = _largest_layer(record)
        where = f"; largest in {layer}" if layer else ""
        return self.fire(
            GRAD_SURGE,
            step,
            f"gradient norm {fmt(gn)} at step {step} is {fmt(gn / ref)}× the median "
            f"{fmt(ref)} of the {len(self.log_norms)} logged step(s) before it; cold start: "
            f"too few for the rolling test, the jump alone exceeds ×{fmt(ratio)}{where}",
            value=gn,
            threshold=ref * ratio,
            median=ref,
            cold_start=True,
        )

    def _cold_ratio(self) -> float:
        """``cold_ratio_start`` (100×) when the log starts within the run's first
        ``run_start_steps`` steps (the first norms move by large factors), else
        ``cold_ratio`` (10×): an excerpt from the middle of a run."""
        first = self.first_step if self.first_step is not None else 0
        return self.cold_ratio_start if first <= self.run_start_steps else self.cold_ratio

    def _layer_surge(self, record: StepRecord) -> list[Finding]:
        """One layer's norm ≫ its own history and ≫ the other layers (see the module doc);
        the largest such surge is reported."""
        layers = _layer_norms(record)
        if len(layers) < 2:
            return []
        worst: tuple[float, str, float, float, float] | None = None
        for name, value in layers.items():
            hist = self.layer_logs.get(name)
            if hist is None:
                hist = self.layer_logs[name] = deque(maxlen=self.layer_window)
            if value > 0 and len(hist) >= self.layer_min_history:
                own = math.exp(median(hist))
                # the other layers' median only for a layer already far above its own past
                others = (
                    median([v for k, v in layers.items() if k != name])
                    if value >= self.layer_ratio * own
                    else math.inf
                )
                if value >= self.layer_ratio * others:
                    ratio = value / own
                    if worst is None or ratio > worst[0]:
                        worst = (ratio, name, value, own, others)
            if value > 0:
                hist.append(math.log(value))
        if worst is None:
            return []
        ratio, name, value, own, others = worst
        return self.fire(
            GRAD_SURGE,
            record.step,
            f"layer {name}: gradient norm {fmt(value)} at step {record.step} is "
            f"{fmt(ratio)}× its own rolling median {fmt(own)} and {fmt(value / others)}× "
            f"the median of the other layers ({fmt(others)})",
            value=value,
            threshold=self.layer_ratio * max(own, others),
            median=own,
            layer=name,
        )

    def unevaluated(self) -> list[str]:
        """What R010-R013 could not look at: no gradient norm in the log, no clipping
        threshold (R011), too few norms for the windows."""
        if self.count == 0 and self.first_step is not None:
            # R010 read the norms: every one was non-finite, so nothing else can be judged.
            return ["R011-R013 gradient norm: not evaluated — no finite grad_norm in the log"]
        if self.count == 0:
            if self.layer_logs:
                return ["R010-R012 gradient norm: not evaluated — the log has no global grad_norm"]
            return ["R010-R013 gradient norm: not evaluated — the log has no grad_norm"]
        out = []
        if self.saturation_seen == 0 and not self.clip_threshold:
            out.append(
                "R011 clipping saturated: not evaluated — no clipping threshold known "
                "(clip_threshold in the log, or the plan's clipping.max_norm)"
            )
        elif 0 < self.saturation_seen < self.saturate_window:
            out.append(
                f"R011 clipping saturated: not evaluated — {self.saturation_seen} record(s) "
                f"past the first steps, needs {self.saturate_window}"
            )
        if self.count < self.tiny_window:
            out.append(
                f"R012 gradient norm tiny: not evaluated — {self.count} grad_norm record(s), "
                f"needs {self.tiny_window}"
            )
        if self.count <= self.surge_min_history:
            out.append(
                f"R013 gradient norm surge: not evaluated by the rolling test — {self.count} "
                f"grad_norm record(s), needs {self.surge_min_history + 1}; only the "
                f"cold-start check ran (a jump of ×{fmt(self._cold_ratio())})"
            )
        return out


def saturation_message(
    det: GradNormDetector, share: float, n: int, size: float, threshold: float, gn: float
) -> str:
    """R011's message: the clip rate, the median size and the limits they crossed."""
    scaled = f"every update scaled by about {fmt(1 / size)}; " if size > 0 else ""
    return (
        f"clipping engaged on {fmt(100 * share)}% of the last {n} logged steps and the "
        f"median pre-clip norm is {fmt(size)}× the threshold {fmt(threshold)} ({scaled}now "
        f"{fmt(gn)}); limits: {fmt(100 * det.saturate_share)}% of the steps and "
        f"{fmt(det.saturate_ratio)}×"
    )


def _layer_norms(record: StepRecord) -> dict[str, float]:
    """The record's finite per-layer norms (``extra["grad_norm_layers"]``), or {}."""
    layers = record.extra.get("grad_norm_layers")
    if not isinstance(layers, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in layers.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def _largest_layer(record: StepRecord) -> str | None:
    layers = _layer_norms(record)
    if not layers:
        return None
    return max(layers.items(), key=lambda kv: kv[1])[0]
