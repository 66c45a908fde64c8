"""Checklist item 7, data (seed §5.1 item 7, §5.3): positions, vocabulary, throughput, batch.

The silent killers of seed §5.3 that a plan can reveal before the first step: a sequence
longer than the position table, token ids the embedding does not have, a loader slower
than the GPUs, and a batch that grew (through gradient accumulation or more GPUs) while
the learning rate stayed where it was tuned.
"""

from __future__ import annotations

import math

from sapper.checks.engine import CheckOutput, not_evaluated, plan_check
from sapper.model.derived import plan_architecture
from sapper.model.flops import model_flops_per_token
from sapper.plan.schema import Plan, PositionEncoding
from sapper.rules.model import Rule, Severity

__all__ = [
    "ASSUMED_MFU",
    "LOADER_TOO_SLOW",
    "LR_NOT_RESCALED",
    "POSITION_OVERFLOW",
    "ROPE_BEYOND_CONTEXT",
    "TOKEN_IDS_OUT_OF_VOCAB",
    "effective_batch",
    "planned_tokens_per_sec_per_gpu",
    "training_flops_per_token",
]

#: Model FLOP utilization assumed for the planned step rate: a well-tuned large run
#: reaches 0.4–0.55, so 0.4 is a rate the loader must at least sustain.
ASSUMED_MFU = 0.4
#: Batch ratios closer to 1 than this are not reported (√1.25 ≈ 1.12: an LR change of
#: about 10% under the square-root rule).
BATCH_RATIO_LIMIT = 1.25
#: Time the dataset scan may take in ``sapper check``.
SCAN_BUDGET_S = 20.0

POSITION_OVERFLOW = Rule(
    code="D101",
    name="sequence-beyond-position-table",
    check="data",
    severity=Severity.ERROR,
    title="Sequence length exceeds the learned position table",
    why="""\
A learned absolute position table has max_position_embeddings rows. Positions past the
last row do not exist: PyTorch's embedding lookup raises IndexError on CPU and a
device-side assert on CUDA (an opaque "CUDA error: device-side assert triggered" that
kills the job), and pipelines that avoid the crash do it silently — the tokenizer
truncates every sequence to the table, or position ids are clamped or wrapped, so the
model sees wrong positions and a shorter context than planned (seed §5.3).""",
    signs="""\
A device-side assert in the embedding at the first long batch; or, silently, token counts
per step below the plan and a loss on long documents that never improves.""",
    fix="""\
Train at seq_len ≤ max_position_embeddings, or extend the table (interpolate the learned
positions and fine-tune) before training longer.""",
    seed="§5.1, §5.3",
)

ROPE_BEYOND_CONTEXT = Rule(
    code="D102",
    name="rope-beyond-trained-context",
    check="data",
    severity=Severity.WARNING,
    title="Sequence length exceeds a RoPE model's trained context without scaling",
    why="""\
RoPE computes positions on the fly, so nothing crashes past the trained context; but the
rotations beyond it are angles the attention never saw. Without position interpolation
(linear, NTK/dynamic, YaRN, llama3 rope_scaling) quality collapses past the trained length:
perplexity on long sequences explodes and the model silently trains on garbage positions
until it relearns them (seed §5.3).""",
    signs="""\
Loss on long sequences far above short ones in the first steps; attention that ignores
distant tokens.""",
    fix="""\
Add rope_scaling with factor ≥ seq_len / trained context (e.g. {type: yarn, factor: 4,
original_max_position_embeddings: 4096}) and raise max_position_embeddings, or keep
seq_len within the trained context.""",
    seed="§5.3",
)

TOKEN_IDS_OUT_OF_VOCAB = Rule(
    code="D103",
    name="token-ids-out-of-vocab",
    check="data",
    severity=Severity.ERROR,
    title="The dataset contains token ids ≥ the vocabulary size",
    why="""\
A dataset tokenized with a different tokenizer (or a model whose vocab was trimmed)
holds ids the embedding has no row for. A plain embedding raises IndexError / a CUDA
device-side assert at the first such batch; vocabulary-parallel embeddings (Megatron TP)
mask out-of-range ids to a zero vector without an error, so the model silently trains on
holes in its input, and the loss of those tokens is computed against the wrong class
(seed §5.1 item 7: the data format must match the model input).""",
    signs="""\
A device-side assert hours into the run when the first bad shard arrives; or a loss
that stays high on some documents; a maximum token id in the data near another
tokenizer's vocabulary size (50256: GPT-2, 32000: Llama-2, 128255: Llama-3).""",
    fix="""\
Re-tokenize the dataset with the model's tokenizer, or use the model that matches the
tokenizer; check data.token_dtype when reading raw .bin files (uint16 data read as uint32
gives huge ids).""",
    seed="§5.1",
)

LOADER_TOO_SLOW = Rule(
    code="D104",
    name="loader-slower-than-gpus",
    check="data",
    severity=Severity.WARNING,
    title="The data loader is slower than the planned step rate",
    why="""\
Each GPU consumes tokens at the rate its compute allows: 6·N FLOPs per token (plus
attention) at the GPU's peak for the dtype times a realistic utilization. sapper assumes
40% MFU, a well-tuned large run. The GPUs of one model-parallel group (tp·pp·cp) share
one batch stream, so one rank's loader must feed the whole replica. A loader below that
rate leaves the GPUs idle every step; nothing fails, the run just takes longer and the
throughput falls short of expectations (seed §5.1 item 7, §5.2).""",
    signs="""\
Step time dominated by data time (data_time_s close to step_time_s); GPU utilization
dipping between steps; tokens/s far below the estimate.""",
    fix="""\
More loader workers, pinned memory and prefetching; pre-tokenize into memory-mapped
binary files instead of tokenizing on the fly; faster storage or a local cache.""",
    seed="§5.1, §5.2",
)

LR_NOT_RESCALED = Rule(
    code="D105",
    name="lr-not-rescaled-for-batch",
    check="data",
    severity=Severity.WARNING,
    title="Effective batch differs from the one the LR was tuned at, LR unchanged",
    why="""\
Gradient accumulation and more data-parallel GPUs multiply the effective batch
(micro × GA × DP). A larger batch averages more samples, the gradient noise drops, and
the learning rate that was right at the reference batch is now too small (or, for a
smaller batch, too large and unstable). Nothing raises an error: the run simply learns at
the wrong speed (seed §5.3). The linear rule (Goyal et al. 2017, for SGD) scales the LR
with the batch; the square-root rule (Malladi et al. 2022, for Adam-type optimizers)
scales it with √batch. Both are starting points for a short sweep, not guarantees.""",
    signs="""\
The loss falls more slowly than in the reference run at the same token count (LR too
small for the larger batch), or spikes early (LR too large for a smaller one).""",
    fix="""\
Rescale the LR by the batch ratio (√ratio for Adam, the ratio for SGD) and run a short
sweep around it; keep warmup at least as long in tokens.""",
    seed="§5.3",
)


# ---- position tables --------------------------------------------------------------


@plan_check(POSITION_OVERFLOW)
def position_overflow(plan: Plan) -> CheckOutput:
    m, s = plan.model, plan.batch.seq_len
    if m is None or s is None:
        missing = [f for f, v in (("model", m), ("batch.seq_len", s)) if v is None]
        yield not_evaluated("the sequence length against the position table", *missing)
        return
    if m.position_encoding != PositionEncoding.LEARNED:
        return
    if m.max_position_embeddings is None:
        yield not_evaluated(
            "the sequence length against the learned position table",
            "model.max_position_embeddings",
        )
        return
    if s <= m.max_position_embeddings:
        return
    table = m.max_position_embeddings
    yield POSITION_OVERFLOW.finding(
        f"seq_len {s} > max_position_embeddings {table} of the learned position table: "
        f"positions {table}–{s - 1} have no row (IndexError / CUDA device-side assert, or "
        "silent truncation/wrapping)",
        fix=f"set batch.seq_len ≤ {table}, or extend the position table and fine-tune",
        value=s,
        threshold=table,
        source="batch.seq_len",
    )


def _rope_supported(plan: Plan) -> tuple[int, int, float | None] | None:
    """(trained context, context supported with the configured scaling, factor)."""
    m = plan.model
    if m is None or m.position_encoding != PositionEncoding.ROPE:
        return None
    trained = m.trained_context
    if trained is None:
        return None
    if m.rope_scaling is None:
        return trained, trained, None
    scaled = int(trained * m.rope_scaling.factor)
    return trained, max(scaled, m.max_position_embeddings or 0), m.rope_scaling.factor


@plan_check(ROPE_BEYOND_CONTEXT)
def rope_beyond_context(plan: Plan) -> CheckOutput:
    s = plan.batch.seq_len
    info = _rope_supported(plan)
    if s is None or info is None:
        return
    trained, supported, factor = info
    if s <= supported:
        return
    need = s / trained
    if factor is None:
        message = (
            f"seq_len {s} > the {trained} tokens RoPE was trained at, with no rope_scaling: "
            f"positions past {trained} are unseen rotations; a factor ≥ {need:.3g} is needed"
        )
    else:
        message = (
            f"seq_len {s} > the {supported} tokens supported by rope_scaling factor "
            f"{factor:g} over {trained}: a factor ≥ {need:.3g} is needed"
        )
    yield ROPE_BEYOND_CONTEXT.finding(
        message,
        fix=f"set model.rope_scaling (e.g. type yarn, factor {math.ceil(need)}, "
        f"original_max_position_embeddings {trained}) or seq_len ≤ {supported}",
        value=s,
        threshold=supported,
        source="batch.seq_len",
        factor_needed=round(need, 4),
    )


# ---- dataset contents --------------------------------------------------------------


@plan_check(TOKEN_IDS_OUT_OF_VOCAB)
def token_ids_out_of_vocab(plan: Plan) -> CheckOutput:
    m, d = plan.model, plan.data
    if m is None or d.path is None:
        missing = [f for f, v in (("model", m), ("data.path", d.path)) if v is None]
        yield not_evaluated("the dataset's token ids against the model's vocabulary", *missing)
        return
    # The scanner needs numpy; a plan without a dataset (and ``sapper rules``) should not.
    from sapper.data.tokens import scan_token_ids

    scan = scan_token_ids(
        d.path, m.vocab_size, fmt=d.format, token_dtype=d.token_dtype, budget_s=SCAN_BUDGET_S
    )
    if scan.out_of_range == 0:
        return
    read = f"{scan.tokens_read:,}"
    if not scan.complete and scan.coverage is not None:
        read += f" read ({scan.coverage:.1%} of {scan.total_tokens:,}, time budget)"
    kind = ", ".join(filter(None, (scan.format, scan.dtype)))
    neg = f", min id {scan.min_id}" if scan.min_id is not None and scan.min_id < 0 else ""
    yield TOKEN_IDS_OUT_OF_VOCAB.finding(
        f"{scan.out_of_range:,} of {read} tokens in {d.path} ({kind}) are "
        f"outside the vocabulary of {m.vocab_size}: max id {scan.max_id}{neg}",
        fix=f"re-tokenize with the model's tokenizer (vocab {m.vocab_size}) or fix "
        "data.token_dtype",
        value=scan.max_id,
        threshold=m.vocab_size,
        source="data.path",
        out_of_range=scan.out_of_range,
        tokens_read=scan.tokens_read,
        complete=scan.complete,
        notes=scan.notes,
    )


# ---- throughput ----------------------------------------------------------------------


def training_flops_per_token(plan: Plan) -> float | None:
    """Forward + backward FLOPs per token in the reported convention (PaLM's MFU:
    6·N + 12·L·(a·d_head)·s, N the parameters a token's matmuls touch), the count the
    step-cost model reports MFU over (:func:`sapper.model.flops.model_flops_per_token`)."""
    arch, s = plan_architecture(plan), plan.batch.seq_len
    if arch is None or s is None:
        return None
    return model_flops_per_token(arch, s)


def planned_tokens_per_sec_per_gpu(plan: Plan) -> float | None:
    """Tokens/s one GPU processes at the plan's dtype: peak TFLOP/s × ASSUMED_MFU divided
    by the training FLOPs per token; None when the model, GPU or seq_len is unknown."""
    gpu = plan.gpu
    flops = training_flops_per_token(plan)
    if gpu is None or flops is None:
        return None
    peak = gpu.peak_tflops(plan.precision.dtype) * 1e12
    if peak <= 0:
        return None
    return peak * ASSUMED_MFU / flops


@plan_check(LOADER_TOO_SLOW)
def loader_too_slow(plan: Plan) -> CheckOutput:
    d, s = plan.data, plan.batch.seq_len
    if d.loader_tokens_per_sec is not None:
        have, unit = d.loader_tokens_per_sec, "data.loader_tokens_per_sec"
    elif d.loader_samples_per_sec is not None and s is not None:
        have, unit = d.loader_samples_per_sec * s, "data.loader_samples_per_sec"
    else:
        yield not_evaluated(
            "whether the data loader keeps up with the GPUs (sapper.Monitor measures the "
            "data wait at runtime)",
            "data.loader_tokens_per_sec",
        )
        return
    per_gpu = planned_tokens_per_sec_per_gpu(plan)
    flops = training_flops_per_token(plan)
    if per_gpu is None or flops is None or plan.gpu is None:
        needed = (("model", plan.model), ("batch.seq_len", s), ("hardware.gpu", plan.gpu))
        yield not_evaluated(
            "the loader's throughput against what the GPUs consume",
            *(f for f, v in needed if v is None),
        )
        return
    group = plan.model_parallel_size
    need = per_gpu * group
    if have >= need:
        return
    dtype = plan.precision.dtype
    shared = f" × {group} GPUs per replica (tp·pp·cp)" if group > 1 else ""
    yield LOADER_TOO_SLOW.finding(
        f"loader delivers {have:,.0f} tokens/s per GPU; the plan needs ~{need:,.0f}{shared} "
        f"({flops / 1e9:.3g} GFLOP/token at {ASSUMED_MFU:.0%} MFU of {plan.gpu.name}'s "
        f"{plan.gpu.peak_tflops(dtype):g} {dtype} TFLOP/s): GPUs idle ~{1 - have / need:.0%}",
        value=round(have, 3),
        threshold=round(need, 3),
        source=unit,
        tokens_per_sec_per_gpu=round(per_gpu, 3),
        assumed_mfu=ASSUMED_MFU,
    )


# ---- batch vs learning rate -------------------------------------------------------


def effective_batch(plan: Plan) -> tuple[int, str] | None:
    """Sequences per optimizer step and how it was obtained: micro × GA × DP when GA is
    given (or no global batch is), else the global batch as given."""
    b, dp = plan.batch, plan.dp_degree
    ga = b.gradient_accumulation_steps
    if b.micro_batch_size is not None and dp is not None and (ga or not b.global_batch_size):
        ga = ga or 1
        value = b.micro_batch_size * ga * dp
        return value, f"micro {b.micro_batch_size} × GA {ga} × DP {dp} = {value}"
    if b.global_batch_size is not None:
        return b.global_batch_size, f"global batch {b.global_batch_size}"
    return None


_ADAPTIVE = ("adam", "lamb", "lion", "adafactor", "sophia", "came", "muon")


@plan_check(LR_NOT_RESCALED)
def lr_not_rescaled(plan: Plan) -> CheckOutput:
    b, lr = plan.batch, plan.optimizer.lr
    if b.reference_global_batch is None or b.reference_lr is None or lr is None:
        return
    if not math.isclose(lr, b.reference_lr, rel_tol=1e-6):
        return
    got = effective_batch(plan)
    if got is None:
        return
    batch, how = got
    ratio = batch / b.reference_global_batch
    if 1 / BATCH_RATIO_LIMIT < ratio < BATCH_RATIO_LIMIT:
        return
    linear, sqrt = lr * ratio, lr * math.sqrt(ratio)
    adaptive = plan.optimizer.type.startswith(_ADAPTIVE)
    first = f"{sqrt:.3g} (√ rule, Adam-type)" if adaptive else f"{linear:.3g} (linear rule)"
    yield LR_NOT_RESCALED.finding(
        f"{how} sequences is {ratio:.3g}× the reference batch {b.reference_global_batch} the "
        f"LR {lr:g} was tuned at, LR unchanged: linear rule → {linear:.3g}, "
        f"square-root rule → {sqrt:.3g}",
        fix=f"set optimizer.lr ≈ {first} and sweep around it",
        value=batch,
        threshold=b.reference_global_batch,
        source="optimizer.lr",
        linear_lr=linear,
        sqrt_lr=sqrt,
    )
