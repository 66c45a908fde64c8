"""Model structure at step 0 (seed §2.4): activation growth across layers, Pre-LN vs
Post-LN, and Post-LN without warmup.

The live monitor hooks the transformer blocks for the training forward pass only and records
``extra["activation_std"]`` (the std of the stack's input, the embeddings, then of each
block's output), ``extra["norm_placement"]`` (``pre`` / ``post`` / ``sandwich`` /
``res-post`` / ``none`` / ``unknown``, read from where the first block's norms sit
relative to its residual adds, :mod:`sapper.monitor.residual`) and ``extra["num_blocks"]``.
The warmup test reads the LR of the first records.
"""

from __future__ import annotations

import itertools
import math

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.records import StepRecord

__all__ = ["ACTIVATION_GROWTH", "NORM_STRUCTURE", "POSTLN_NO_WARMUP", "StructureDetector"]

ACTIVATION_GROWTH = register(
    Rule(
        code="R100",
        name="activation-std-growth",
        check="init",
        severity=Severity.WARNING,
        title="Activations grow (or vanish) layer by layer at initialisation",
        why="""\
With too large an init variance each block multiplies the scale of its output, and deep
stacks overflow fp16 (65504) or saturate; with too small a variance activations vanish
and gradients do not flow back. Residual projections scaled down with depth keep the
residual stream's scale stable.

Frameworks: any PyTorch model the live monitor watches (activation stds at step 0).""",
        signs="""\
The std of block outputs at step 0 rising (or falling) by a large factor from the first
block to the last.""",
        fix="""\
Init weights with N(0, 0.02) (GPT-style) and scale residual output projections by
1/√(2·layers); prefer Pre-LN.""",
        seed="§2.4",
    )
)

POSTLN_NO_WARMUP = register(
    Rule(
        code="R101",
        name="post-ln-without-warmup",
        check="normalization",
        severity=Severity.WARNING,
        title="A deep Post-LN stack trains without LR warmup",
        why="""\
In Post-LN the norm sits after the residual add, so gradients near the output are large
and there is no clean identity path; at full LR from step 0 the first Adam updates (with
poor second-moment estimates) blow deep Post-LN stacks up. It needs a careful warmup.

Frameworks: any; the norm placement from the live model or the plan, the LR from the
log.""",
        signs="""\
Loss spikes or NaN in the first hundreds of steps; gradient norms of the last layers far
above the first ones.""",
        fix="""\
Switch to Pre-LN (norm before attention and MLP); or add a linear warmup of a few
thousand steps and a lower peak LR.""",
        seed="§2.4",
    )
)

NORM_STRUCTURE = register(
    Rule(
        code="R102",
        name="norm-placement-found",
        check="normalization",
        severity=Severity.INFO,
        title="Normalization placement found in the live model",
        why="""\
Pre-LN keeps a clean identity path and is far more stable than Post-LN; what the code
really builds can differ from what the config or the plan says.

Frameworks: any PyTorch model the live monitor watches.""",
        signs="""\
Where a block's norms sit relative to its residual adds: on the residual path (Post-LN),
on the branch input only (Pre-LN), on the branch input and output (sandwich).""",
        fix="""\
Nothing to do when it matches the plan; otherwise correct the plan or the model.""",
        seed="§2.4",
    )
)


class StructureDetector(RuleDetector):
    """R100-R102 over the step-0 structure record and the first LRs."""

    name = "structure"
    rules = (ACTIVATION_GROWTH, POSTLN_NO_WARMUP, NORM_STRUCTURE)
    cooldown = None

    def __init__(
        self,
        *,
        declared_placement: str | None = None,
        growth_limit: float = 16.0,
        deep_layers: int = 6,
        warmup_probe_steps: int = 10,
        warmup_start_share: float = 0.5,
    ) -> None:
        super().__init__()
        self.declared_placement = declared_placement
        self.growth_limit = growth_limit
        self.deep_layers = deep_layers
        self.warmup_probe_steps = warmup_probe_steps
        self.warmup_start_share = warmup_start_share
        self.placement: str | None = None
        self.num_blocks: int | None = None
        self.lrs: list[tuple[int, float]] = []
        self.decided = False
        self.stds_seen = False

    def unevaluated(self) -> list[str]:
        """R100 reads per-block activation stds (live monitor, step 0); R101 the norm
        placement (live monitor or the plan)."""
        out = []
        if not self.stds_seen:
            out.append(
                "R100 activation growth at init: not evaluated — needs the live monitor's "
                "per-block activation stds"
            )
        if self.placement is None and self.declared_placement is None:
            out.append(
                "R101 Post-LN without warmup: not evaluated — the norm placement is not "
                "known (the live monitor, or the plan's model.norm_placement)"
            )
        return out

    def update(self, record: StepRecord) -> list[Finding]:
        out: list[Finding] = []
        extra = record.extra
        stds = extra.get("activation_std")
        self.stds_seen = self.stds_seen or isinstance(stds, list)
        if isinstance(stds, list) and len(stds) >= 2:
            out += self._growth(record.step, stds)
        placement = extra.get("norm_placement")
        if isinstance(placement, str):
            self.placement = placement
            blocks = extra.get("num_blocks")
            self.num_blocks = blocks if isinstance(blocks, int) else self.num_blocks
            out += self._found(record.step)
        out += self._warmup(record)
        return out

    def _growth(self, step: int, stds: list) -> list[Finding]:
        vals = [float(v) for v in stds if isinstance(v, (int, float))]
        if len(vals) < 2 or not all(math.isfinite(v) and v > 0 for v in vals):
            return []
        ratio = vals[-1] / vals[0]
        if 1 / self.growth_limit <= ratio <= self.growth_limit:
            return []
        jumps = [b / a for a, b in itertools.pairwise(vals)]
        worst = max(range(len(jumps)), key=lambda i: abs(math.log(jumps[i])))
        verb = "grows" if ratio > 1 else "shrinks"
        return self.fire(
            ACTIVATION_GROWTH,
            step,
            f"activation std {verb} from {fmt(vals[0])} at the input of the stack to "
            f"{fmt(vals[-1])} after block {len(vals) - 2}, {fmt(ratio)}× over "
            f"{len(vals) - 1} blocks; largest change {fmt(jumps[worst])}× at block {worst}",
            value=ratio,
            threshold=self.growth_limit if ratio > 1 else 1 / self.growth_limit,
            activation_std=vals,
        )

    def _found(self, step: int) -> list[Finding]:
        declared = self.declared_placement
        blocks = f"{self.num_blocks} blocks, " if self.num_blocks else ""
        message = f"{blocks}{self.placement}-norm placement found in the live model"
        severity = None
        fix = None
        known = self.placement in ("pre", "post", "sandwich")
        if declared and known and declared != self.placement:
            message += f", but the plan declares {declared}"
            severity = Severity.WARNING
            fix = "Correct the plan's model.norm_placement, or the model if the plan is right."
        return self.fire(NORM_STRUCTURE, step, message, severity=severity, fix=fix)

    def _warmup(self, record: StepRecord) -> list[Finding]:
        if self.decided or record.lr is None or not math.isfinite(record.lr):
            return []
        self.lrs.append((record.step, record.lr))
        first_step = self.lrs[0][0]
        if record.step - first_step < self.warmup_probe_steps:
            return []
        self.decided = True
        if self.placement != "post" or (self.num_blocks or 0) < self.deep_layers:
            return []
        first = self.lrs[0][1]
        peak = max(lr for _, lr in self.lrs)
        if peak <= 0 or first < self.warmup_start_share * peak:
            return []
        return self.fire(
            POSTLN_NO_WARMUP,
            record.step,
            f"Post-LN stack of {self.num_blocks} blocks starts at LR {fmt(first)} "
            f"({fmt(100 * first / peak)}% of the LR reached by step {record.step}): no warmup",
            value=first,
            threshold=self.warmup_start_share * peak,
        )
