"""The rules a Plan's readers raise while they build it: C0xx, what loading the user's own
files finds (DeepSpeed JSON, HF ``config.json``, the launch configs of Megatron-LM, NeMo,
torchtitan, accelerate, Axolotl and the HF Trainer), and C1xx, the batch arithmetic that
both a reader (DeepSpeed derives micro or GA from ``train_batch_size``) and the checklist
over the merged Plan (:mod:`sapper.checks.consistency`) report.

They live in the plan package, not in :mod:`sapper.checks`, because the readers sit below
the checks: a reader imports its rules from here, and so do the checks that share them.
The C0xx rules fire while a source is read, not over the merged Plan: the readers in
:mod:`sapper.plan.readers` attach their findings to ``PlanSource.findings`` and the
checklist reports them with the rest. The module is listed under the ``sapper.rules``
entry points so ``sapper rules`` and ``sapper explain`` list them like every other rule;
it imports nothing but :mod:`sapper.rules`, so listing them loads no reader.

DeepSpeed's own batch triple (``train_batch_size`` = micro × GA × DP) has no rule here:
the loader keeps all three values as given and the generic batch-arithmetic rule reports
a mismatch with the arithmetic, which is the check DeepSpeed itself makes at launch.
"""

from __future__ import annotations

from sapper.rules.model import Rule, Severity
from sapper.rules.registry import register

__all__ = [
    "BOTH_FP16_BF16",
    "DEPRECATED_KEY",
    "GLOBAL_BATCH_INDIVISIBLE",
    "GLOBAL_BATCH_MISMATCH",
    "UNKNOWN_CONFIG_KEY",
    "UNKNOWN_KEY",
    "UNRESOLVED_AUTO",
    "UNRESOLVED_VALUE",
]

UNKNOWN_KEY = register(
    Rule(
        code="C001",
        name="unknown-deepspeed-key",
        check="config",
        severity=Severity.WARNING,
        title="A DeepSpeed config key that DeepSpeed does not know (likely a typo)",
        why="""\
DeepSpeed reads most of its JSON with dict.get: a misspelled key is never read and the
default applies instead. "gradient_cliping": 1.0 trains without clipping;
"stage3_param_persitance_threshold" leaves the persistence threshold at its default; a
mistyped "loss_scale_windw" keeps the default growth window. Recent versions validate a few
sections (zero_optimization, fp16, bf16) strictly and refuse to start, older ones ignore the
key: the same file behaves differently depending on the installed version.""",
        signs="""\
Nothing at launch on older versions; later, the behaviour the key was meant to change is
missing: gradient norms above the intended threshold, memory or communication different from
the plan, a loss scale that moves on the default schedule.""",
        fix="""\
Rename the key to the documented spelling sapper suggests (see the DeepSpeed configuration
JSON reference) or delete it.""",
        seed="§5.1",
    )
)

UNRESOLVED_AUTO = register(
    Rule(
        code="C002",
        name="unresolved-auto-value",
        check="config",
        severity=Severity.INFO,
        title='A DeepSpeed value is "auto": resolved at launch, not checked here',
        why="""\
"auto" values are filled in by the launcher (the Hugging Face Trainer copies its
TrainingArguments into the DeepSpeed config). The file alone does not say what the job
will run with, so every check that needs the value is skipped rather than run on a guess.""",
        signs="""\
The checklist reports fewer findings than expected for the items that depend on the value
(batch arithmetic, learning rate, clipping, precision).""",
        fix="""\
Pass the value sapper cannot see on the command line (--micro-batch, --grad-accum,
--global-batch, --lr, --max-norm, --dtype, --warmup) or write it into the config, so the
checks that need it run.""",
        seed="§5.1",
    )
)

BOTH_FP16_BF16 = register(
    Rule(
        code="C003",
        name="fp16-and-bf16-enabled",
        check="precision",
        severity=Severity.ERROR,
        title="DeepSpeed config enables both fp16 and bf16",
        why="""\
fp16 and bf16 are exclusive training modes: fp16 needs loss scaling against its narrow
range, bf16 has fp32's range but fewer mantissa bits. DeepSpeed refuses a config that
enables both, so the job fails at launch after waiting in the queue; a config that is only
patched at launch leaves it unclear which precision actually ran.""",
        signs="""\
An assertion at engine initialization ("bf16 and fp16 modes cannot be simultaneously
enabled"), or a run whose precision differs from what the config suggests.""",
        fix="""\
Keep exactly one: "bf16": {"enabled": true} on GPUs with bf16 (A100, H100 and later), else
"fp16" with dynamic loss scaling ("loss_scale": 0).""",
        seed="§2.1",
    )
)

DEPRECATED_KEY = register(
    Rule(
        code="C004",
        name="deprecated-deepspeed-key",
        check="config",
        severity=Severity.INFO,
        title="A deprecated DeepSpeed key: still read today, removed in a future version",
        why="""\
Deprecated keys (cpu_offload, bfloat16, stage3_gather_fp16_weights_on_model_save ...) are
translated by the DeepSpeed version in use; when support is dropped, the key becomes an
unknown one and is ignored or rejected, and the offload or precision it requested silently
disappears after an upgrade.""",
        signs="""\
Deprecation warnings in the launch log; after a DeepSpeed upgrade, more memory per GPU
(offload gone) or a different precision.""",
        fix="""\
Replace the key with the one DeepSpeed's documentation names (sapper shows it).""",
        seed="§3.4",
    )
)

UNKNOWN_CONFIG_KEY = register(
    Rule(
        code="C005",
        name="unknown-launch-config-key",
        check="config",
        severity=Severity.WARNING,
        title="A launch-config key its framework does not know (likely a typo)",
        why="""\
Launch configs are read leniently in most places: a YAML or TOML key a trainer never looks
up, an accelerate or Axolotl option spelled differently from its documentation, is dropped
and the default applies. "gradient_acumulation_steps: 8" trains with no accumulation and an
eighth of the intended batch; "max_grad_nrom" trains without the intended clipping. Where a
framework is strict (Megatron's argparse, torchtitan's job config, the Trainer's
HfArgumentParser), the same typo stops the job only after it has waited in the queue.""",
        signs="""\
Nothing at launch on lenient readers; later, the behaviour the key should have changed is
missing (batch, clipping, warmup, precision as the defaults, not as written). On strict ones,
an "unrecognized arguments" or "unexpected keyword" error at start.""",
        fix="""\
Rename the key to the spelling sapper suggests (the framework's documented name) or delete
it.""",
        seed="§5.1",
    )
)

UNRESOLVED_VALUE = register(
    Rule(
        code="C006",
        name="unresolved-launch-value",
        check="config",
        severity=Severity.INFO,
        title="A launch-config value sapper cannot know from the file: left unknown",
        why="""\
Launch scripts and configs take values from outside the file: a shell variable set by the
scheduler, a Hydra interpolation into another file, a model named by its hub id whose
config.json is not on this machine. sapper never guesses them and never downloads: the field
stays unknown and every check that needs it says so instead of passing.""",
        signs="""\
Checks report "not evaluated" for the items that need the value (model shape, batch,
layout), naming the field.""",
        fix="""\
Give the value another way: --model config.json for a model named by its hub id, the plan
options (--gpus, --micro-batch, --tp ...) for values set by the environment, or set the
variable in the script.""",
        seed="§5.1",
    )
)

# ---- batch arithmetic (run over the merged Plan by sapper.checks.consistency) ----

GLOBAL_BATCH_MISMATCH = register(
    Rule(
        code="C101",
        name="global-batch-mismatch",
        check="parallel",
        severity=Severity.ERROR,
        title="Global batch ≠ micro batch × gradient accumulation × DP",
        why="""\
One optimizer step consumes micro × GA × DP sequences. When the configured global batch
says otherwise, the framework either refuses to start (DeepSpeed asserts
train_batch_size == micro × GA × world/(tp·pp)), or silently recomputes one of the numbers
— usually gradient accumulation — so the run trains at a batch, and so an effective
learning rate and a token budget, nobody chose (seed §5.3).""",
        signs="""\
A different number of steps per epoch than planned; tokens per step in the log that do
not match the plan; a learning-rate schedule that ends early or late.""",
        fix="""\
Make the numbers agree: set gradient accumulation to global / (micro × DP), or change
the global batch (and retune the learning rate if it moves).""",
        seed="§5.1, §5.3",
    )
)

GLOBAL_BATCH_INDIVISIBLE = register(
    Rule(
        code="C102",
        name="global-batch-indivisible",
        check="parallel",
        severity=Severity.ERROR,
        title="Global batch is not divisible by micro batch × DP",
        why="""\
Gradient accumulation must be an integer: GA = global / (micro × DP). When it does not
divide, frameworks stop at start-up (Megatron, DeepSpeed) or round GA down and train at a
smaller batch than planned, dropping the remainder of every step.""",
        signs="""\
A start-up assertion about batch divisibility, or fewer tokens per step than planned.""",
        fix="""\
Pick a global batch that is a multiple of micro × DP, or change the micro batch or the
data-parallel degree so it divides.""",
        seed="§5.1",
    )
)
