"""Where the numerics broke (seed §2.1): the first non-finite module or gradient, dead
parameters, fp16 underflow.

These come from the live monitor's sampled or fault-armed hooks: after a non-finite
value, forward hooks are armed on every module for the next step and the monitor records
``extra["nonfinite_module"]`` (the first module, in execution order, whose output was
non-finite), whether that module's input was still finite, and the parameters holding
non-finite values or gradients. On sampled steps it records ``extra["zero_grad_params"]``
(parameters whose gradient is entirely zero or missing) and ``extra["grad_zero_share"]``
(the share of exactly-zero gradient elements outside embedding tables).

Per-layer series: records may carry ``extra["grad_norm_layers"]`` (layer → gradient
norm; the live monitor writes it on sampled steps, log readers fill it from per-layer
columns). A layer whose norm is exactly 0, or below ``dead_layer_ratio`` (1e-3) × the
median of all layers, on ``dead_layer_records`` consecutive records that carry the
series is a dead layer (R021), offline as live. An exploding layer is R013's
(:mod:`sapper.runtime.detectors.gradnorm`).

Frameworks: none; the fields come from the live monitor's hooks or per-layer columns.
"""

from __future__ import annotations

import math

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.detectors.stats import median
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
cannot tell.

Frameworks: any PyTorch model the live monitor watches (its hooks); not readable from a
log.""",
        signs="""\
A module whose inputs are finite and whose output is not; parameters whose values or
gradients hold NaN/Inf. Finiteness is judged on the values themselves: a weight of 1e30
is finite (its fp32 norm is not); such finite-but-huge values (|x| ≥ 1e10) are a warning
of this rule, naming the parameter and its largest magnitude, before they overflow.""",
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
parameter that takes no part in the loss.

Frameworks: any; from the live monitor's per-parameter gradients, or per-layer gradient
norms in any log.""",
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
in any dtype it means many dead units.

Frameworks: any PyTorch model the live monitor watches (sampled gradient statistics);
not readable from a log.""",
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

    def __init__(
        self,
        *,
        dead_samples: int = 3,
        zero_share: float = 0.25,
        patience: int = 2,
        dead_layer_records: int = 5,
        dead_layer_ratio: float = 1e-3,
    ):
        super().__init__()
        self.dead_samples = dead_samples
        self.dead_layer_records = dead_layer_records
        self.dead_layer_ratio = dead_layer_ratio
        #: Per layer, the consecutive records (with the series) on which it was dead.
        self.layer_runs: dict[str, int] = {}
        self.seen_fields: set[str] = set()
        self.zero_share = zero_share
        self.patience = patience
        self.zero_runs: dict[str, int] = {}
        self.high_share = 0
        self.localised = False
        self.huge_reported = False

    def update(self, record: StepRecord) -> list[Finding]:
        extra = record.extra
        if not extra or _reads_nothing(extra):  # every rule here reads the live monitor's
            return []
        if len(self.seen_fields) < 4:  # what the stream carries, until all seen
            for key in ("grad_sampled", "grad_norm_layers", "grad_zero_share"):
                if key in extra:
                    self.seen_fields.add(key)
            if any(k.startswith(("nonfinite_", "huge_")) for k in extra):
                self.seen_fields.add("nonfinite")
        return (
            self._origin(record)
            + self._dead(record)
            + self._dead_layers(record)
            + self._share(record)
        )

    def _origin(self, record: StepRecord) -> list[Finding]:
        extra = record.extra
        module = extra.get("nonfinite_module")
        grad_module = extra.get("nonfinite_grad_module")
        params = extra.get("nonfinite_params") or []
        grads = extra.get("nonfinite_grads") or []
        huge = _huge(extra.get("huge_params")), _huge(extra.get("huge_grads"))
        if not module and not grad_module and not params and not grads:
            return self._huge_only(record.step, *huge) if any(huge) else []
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
        parts.extend(_huge_parts(*huge))
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

    def _huge_only(
        self, step: int, values: dict[str, float], grads: dict[str, float]
    ) -> list[Finding]:
        """Finite but huge weights or gradients, nothing non-finite yet: a warning, once
        per run, that leaves R020 free to fire when a value does go non-finite."""
        if self.huge_reported:
            return []
        self.huge_reported = True
        found = self.fire(
            NONFINITE_ORIGIN,
            step,
            "; ".join(_huge_parts(values, grads))
            + " (not non-finite yet; the next matmul in fp16, or a square in fp32, overflows)",
            severity=Severity.WARNING,
            params=sorted(values, key=values.__getitem__, reverse=True)[:20],
            grads=sorted(grads, key=grads.__getitem__, reverse=True)[:20],
        )
        if found:
            self.fired.pop(NONFINITE_ORIGIN.code, None)
        return found

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

    def _dead_layers(self, record: StepRecord) -> list[Finding]:
        """R021 from the per-layer norms: layers at exactly 0 or ≪ the median of all
        layers on ``dead_layer_records`` consecutive records (see the module doc)."""
        raw = record.extra.get("grad_norm_layers")
        if not isinstance(raw, dict) or len(raw) < 2:
            return []
        layers = {
            str(k): float(v)
            for k, v in raw.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        if len(layers) < 2:
            return []
        mid = median(list(layers.values()))
        limit = self.dead_layer_ratio * mid
        dead_now = {k for k, v in layers.items() if v == 0 or v < limit}
        self.layer_runs = {k: self.layer_runs.get(k, 0) + 1 for k in dead_now}
        dead = sorted(k for k, n in self.layer_runs.items() if n >= self.dead_layer_records)
        if not dead or len(dead) == len(layers):
            return []  # every layer "dead" at once is a tiny global norm: R012's business
        zero = [k for k in dead if layers[k] == 0]
        shown = ", ".join(dead[:5]) + (f" … (+{len(dead) - 5})" if len(dead) > 5 else "")
        how = (
            "a gradient norm of exactly 0"
            if len(zero) == len(dead)
            else f"a gradient norm of 0 or below {fmt(self.dead_layer_ratio)}× the median "
            f"layer ({fmt(mid)})"
        )
        return self.fire(
            DEAD_PARAMS,
            record.step,
            f"{len(dead)} layer(s) had {how} on {self.dead_layer_records} logged steps in a "
            f"row: {shown}",
            value=len(dead),
            layers=dead[:50],
            median_layer_norm=mid,
        )

    def unevaluated(self) -> list[str]:
        """What R020-R022 could not look at: they read the live monitor's hooks (and R021
        also per-layer norms); a log without those fields cannot show them."""
        seen = self.seen_fields
        out = []
        if "nonfinite" not in seen:
            out.append(
                "R020 non-finite origin: not evaluated — needs the live monitor's hooks "
                "(no non-finite localisation in the log)"
            )
        if not seen & {"grad_sampled", "grad_norm_layers"}:
            out.append(
                "R021 dead parameters: not evaluated — no per-parameter or per-layer "
                "gradient norms in the log"
            )
        if "grad_zero_share" not in seen:
            out.append(
                "R022 zero-gradient share: not evaluated — needs the live monitor's sampled "
                "gradient statistics"
            )
        return out

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


#: The ``extra`` keys without which every rule here stays silent.
_GATES = frozenset({
    "nonfinite_module", "nonfinite_grad_module", "nonfinite_params", "nonfinite_grads",
    "huge_params", "huge_grads", "grad_sampled", "grad_norm_layers", "grad_zero_share",
})
_PREFIXES = ("nonfinite_", "huge_")
_quiet_keys: dict[tuple[str, ...], bool] = {}


def _reads_nothing(extra: dict[str, object]) -> bool:
    """Whether ``extra`` holds no key a rule here reads or notes as seen (see
    :meth:`NumericsDetector.unevaluated`). Cached per key tuple: a log's records repeat
    one set of keys (a Megatron line's consumed samples and NaN count)."""
    keys = tuple(extra)
    quiet = _quiet_keys.get(keys)
    if quiet is None:
        if len(_quiet_keys) >= 256:
            _quiet_keys.clear()
        quiet = _GATES.isdisjoint(keys) and not any(k.startswith(_PREFIXES) for k in keys)
        _quiet_keys[keys] = quiet
    return quiet


def _huge(raw: object) -> dict[str, float]:
    """``extra["huge_params"]``/``["huge_grads"]``: parameter name -> largest |value|."""
    if not isinstance(raw, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in raw.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def _huge_parts(values: dict[str, float], grads: dict[str, float]) -> list[str]:
    parts = []
    for what, table in (("values", values), ("gradients", grads)):
        if table:
            name = max(table, key=table.__getitem__)
            symbol = "w" if what == "values" else "g"
            parts.append(
                f"{len(table)} parameter(s) hold finite but huge {what} "
                f"(max |{symbol}| = {table[name]:.3g} in {name})"
            )
    return parts
