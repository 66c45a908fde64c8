"""Metric names as the field writes them, mapped to :class:`StepRecord` fields.

Every logger spells the same metric its own way: HF Trainer ``train/loss``, Megatron
``lm loss`` and ``grad-norm``, Lightning ``lr-AdamW``, torchtitan
``memory/max_reserved(GiB)``, W&B exports ``run-name - train/loss``. One table maps
them all, with the unit conversion the name implies (``(ms)`` → seconds, ``bytes`` →
GiB), so the TensorBoard and table readers share it. A name the table does not know
goes to ``StepRecord.extra`` untouched; ``--map col=field`` covers the rest.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

__all__ = [
    "ALLOC_RETRIES",
    "GPU_MEMORY",
    "LAYER_KEYS",
    "RECORD_FIELDS",
    "STEP_NAMES",
    "FieldMap",
    "canonical",
    "describe",
    "eval_set",
    "layer_of",
    "memory_unit",
    "nearest_field",
    "normalize_name",
    "parse_mapping",
    "resolve",
]

#: StepRecord fields a column or tag may map to (besides ``step``).
RECORD_FIELDS: frozenset[str] = frozenset(
    {
        "loss",
        "grad_norm",
        "clip_threshold",
        "lr",
        "loss_scale",
        "skipped",
        "skipped_total",
        "memory_allocated_gib",
        "memory_reserved_gib",
        "memory_peak_gib",
        "memory_limit_gib",
        "rss_gib",
        "step_time_s",
        "data_time_s",
        "tokens",
        "samples",
        "tokens_per_s",
        "samples_per_s",
        "mfu",
        "eval_loss",
        "time",
    }
)

#: Column / tag names that hold the step, best first: an optimizer-step counter beats
#: W&B's ``_step`` (which counts ``wandb.log`` calls) and a row index.
STEP_NAMES: tuple[str, ...] = (
    "global_step",
    "train/global_step",
    "trainer/global_step",
    "step",
    "iteration",
    "iter",
    "steps",
    "optimizer_step",
    "num_updates",  # fairseq: the optimizer updates so far
    "_step",
)

_GIB = 1.0
_MIB = 1.0 / 1024
_BYTES = 1.0 / 2**30

# normalized name -> (field, factor, rank). Names are normalized by ``normalize_name``;
# the rank is the name's place in its list: the most canonical spelling wins a tie.
_ALIASES: dict[str, tuple[str, float, int]] = {}


def _add(target: str, factor: float, *names: str) -> None:
    for rank, name in enumerate(names):
        _ALIASES.setdefault(normalize_name(name), (target, factor, rank))


def normalize_name(name: str) -> str:
    """Lower case, separators unified to ``_``: ``Grad-Norm`` and ``grad norm`` meet."""
    text = name.strip().lower()
    text = re.sub(r"[\s\-\.]+", "_", text)
    return text


# Prefixes that only say where a metric was logged ("train/loss" is the loss).
_TRAIN_PREFIXES = ("train_", "training_")
_EVAL_NAMESPACE = re.compile(r"(^|[/_])(eval|evaluation|val|valid|validation|dev)($|[/_])")

_add("loss", 1.0, "loss", "lm loss", "lm_loss", "train_loss", "training_loss", "step loss",
     "loss/train", "global_avg_loss", "loss_metrics/global_avg_loss", "avg_loss", "total_loss",
     "train/lm loss", "reduced_train_loss", "train_loss_step", "loss_step")
_add("eval_loss", 1.0, "eval_loss", "eval/loss", "val_loss", "val/loss", "valid_loss",
     "valid/loss", "validation_loss", "validation/loss", "loss/val", "loss/eval",
     "lm loss validation", "lm_loss_validation", "val_loss_epoch", "eval/lm loss",
     "validation/lm loss", "eval_lm_loss")
_add("grad_norm", 1.0, "grad_norm", "grad-norm", "grad norm", "gradient_norm", "grad_norm_total",
     "grad_2.0_norm_total", "total_grad_norm", "global_grad_norm", "gradnorm", "grad_l2_norm",
     "gnorm", "optim/grad_norm", "l2_norm/grad/global", "grad_l2_norm/step",
     "l2_norm/grad/pre_clip_global")
_add("clip_threshold", 1.0, "max_grad_norm", "clip_threshold", "grad_clip", "clip_grad",
     "max_norm")
_add("lr", 1.0, "lr", "learning_rate", "learning-rate", "learning rate", "lr-adamw", "lr-adam",
     "lr-sgd", "lr_adamw", "lr/group_0", "lr/pg0", "lr-adamw/pg1", "learning_rate/group_0",
     "optimizer/lr", "lr_0", "current_lr")
_add("loss_scale", 1.0, "loss_scale", "loss-scale", "loss scale", "grad_scale", "scaler/scale",
     "amp/loss_scale", "loss_scaler")
_add("skipped", 1.0, "skipped", "skipped_step", "step_skipped", "overflow", "is_overflow")
_add("skipped_total", 1.0, "skipped_total", "skipped_steps", "skipped_iterations",
     "number of skipped iterations", "num_skipped", "skipped-iterations")
_add("memory_allocated_gib", _BYTES, "mem-allocated-bytes", "memory_allocated_bytes",
     "memory/allocated_bytes")
_add("memory_reserved_gib", _BYTES, "mem-reserved-bytes", "memory_reserved_bytes",
     "memory/reserved_bytes")
_add("memory_peak_gib", _BYTES, "mem-max-allocated-bytes", "max_memory_allocated_bytes",
     "memory/max_allocated_bytes")
_add("memory_allocated_gib", _GIB, "memory_allocated_gib", "memory/allocated(gib)",
     "memory_allocated", "mem_allocated", "gpu_mem_allocated", "memory/current_allocated(gib)",
     "memory_allocated_gb", "gpu_memory_allocated_gb", "memory/allocated")
_add("memory_reserved_gib", _GIB, "memory_reserved_gib", "memory/reserved(gib)",
     "memory_reserved", "mem_reserved", "memory_reserved_gb", "memory/max_reserved(gib)",
     "memory/reserved", "gpu_memory_reserved_gb")
_add("memory_peak_gib", _GIB, "memory_peak_gib", "memory/max_active(gib)", "max_memory_allocated",
     "peak_memory", "peak_memory_gb", "memory/peak", "max_memory_allocated_gb",
     "gpu_mem_peak", "memory/max_allocated(gib)", "mem_peak_gb")
_add("memory_allocated_gib", _MIB, "memory_allocated_mb", "mem_allocated_mb", "allocated_mb")
_add("memory_peak_gib", _MIB, "max_memory_allocated_mb", "peak_memory_mb", "memory_mb",
     "max_allocated_mb")
_add("memory_reserved_gib", _MIB, "memory_reserved_mb", "reserved_mb", "max_reserved_mb")
_add("memory_limit_gib", _GIB, "memory_limit_gib", "memory/limit(gib)", "memory_total_gb")
_add("rss_gib", _GIB, "rss_gib", "rss_gb", "memory/rss(gib)")
_add("step_time_s", 1.0, "step_time_s", "step_time", "iteration-time", "iteration_time",
     "time/step", "time_per_step", "train_step_time", "time_metrics/end_to_end(s)",
     "elapsed time per iteration (s)", "sec_per_step", "batch_time", "iter_time")
_add("step_time_s", 1e-3, "step_time_ms", "elapsed time per iteration (ms)", "iteration_time_ms",
     "time/step_ms", "dt_ms")
_add("data_time_s", 1.0, "data_time_s", "data_time", "data_loading_time",
     "time_metrics/data_loading(s)", "dataloader_time")
_add("data_time_s", 1e-3, "data_time_ms")
_add("tokens", 1.0, "tokens", "tokens_per_step", "num_tokens", "ntokens")
_add("samples", 1.0, "samples", "batch_size", "global batch size", "global_batch_size",
     "batch-size")
_add("tokens_per_s", 1.0, "tokens_per_s", "tokens_per_sec", "tokens_per_second", "tokens/s",
     "tok/s", "tps", "throughput(tps)", "throughput/tokens_per_sec", "train_tokens_per_second",
     "throughput_tokens", "wps")
_add("samples_per_s", 1.0, "samples_per_s", "samples_per_sec", "samples_per_second", "samples/s",
     "train_samples_per_second", "samples per second", "throughput/samples_per_sec",
     "throughput_samples")
# The names people give these in their own loops' tables (a name without a unit is read
# in the field's unit; a memory column whose values cannot be GiB is re-read by
# :func:`memory_unit`).
_add("memory_allocated_gib", _BYTES, "mem_bytes", "memory_bytes", "gpu_mem_bytes",
     "allocated_bytes", "gpu_memory_bytes", "cuda_mem_bytes")
_add("memory_allocated_gib", _GIB, "gpu_mem_gb", "mem_gb", "memory_gb", "gpu_memory_gb",
     "vram_gb", "gpu_mem_gib", "mem_gib", "gpu_mem", "gpu_memory", "cuda_memory",
     "gpu_memory_used")
_add("memory_allocated_gib", _MIB, "mem_mb", "gpu_mem_mb", "gpu_memory_mb", "vram_mb",
     "memory_used_mb")
_add("memory_peak_gib", _BYTES, "peak_mem_bytes", "max_mem_bytes", "peak_memory_bytes")
_add("memory_peak_gib", _GIB, "max_mem", "peak_mem", "max_mem_gb", "peak_mem_gb",
     "max_memory_reserved", "torch.cuda.max_memory_allocated")
_add("tokens_per_s", 1.0, "throughput", "tok_per_sec", "tokens/sec", "toks/s", "tok/sec",
     "tokens_per_s_per_gpu", "tokens_per_sec_per_gpu", "tps_per_gpu", "throughput/tokens_per_s",
     "perf/tokens_per_sec", "token_throughput")
_add("samples_per_s", 1.0, "samples/sec", "sample/s", "samples_per_sec_per_gpu",
     "imgs/s", "images_per_sec", "images/s", "seq/s", "sequences_per_sec",
     "sample_throughput")
_add("step_time_s", 1.0, "time_per_iter", "step_duration", "iteration_time_s",
     "iter_time_s", "step_time_sec")
_add("step_time_s", 1e-3, "iter_time_ms", "step_ms")
_add("data_time_s", 1.0, "data_wait", "data_wait_s", "dataloader_wait", "data_load_time",
     "time/data", "data_loading", "wait_data", "data_wait_time")
_add("data_time_s", 1e-3, "data_wait_ms", "dataloader_ms", "data_load_ms")
_add("mfu", 1.0, "mfu")
_add("mfu", 0.01, "mfu(%)", "mfu_percent", "mfu_pct")
_add("time", 1.0, "time", "timestamp", "_timestamp", "wall_time", "walltime")


# Lightning's LearningRateMonitor: "lr-AdamW", "lr-AdamW/pg1" (the first group).
_LR_GROUP = re.compile(r"^lr_[a-z0-9]+(/pg1)?$")


@dataclass(frozen=True)
class FieldMap:
    """Where one source column goes: a StepRecord field and the factor to its unit."""

    field: str
    factor: float = 1.0
    #: How canonical the source name is (0 = the plainest spelling); picks between two
    #: columns that mean the same field (``train/loss`` over ``train/train_loss``).
    rank: int = field(default=0, compare=False)
    #: For a dict field (``eval_losses``, ``grad_norm_layers``): the entry's name.
    key: str = ""


def canonical(name: str) -> FieldMap | None:
    """The StepRecord field a metric name means, or ``None`` if it is not known.

    ``train/loss``, ``Training/Loss``, ``lm loss``, ``perf/tokens_per_sec`` and ``loss``
    are looked up by their full name first, then by the last path part; a namespace that
    says evaluation (``eval/``, ``val/``, ``validation/``) turns a loss into ``eval_loss``
    and never maps to a training field.
    """
    key = normalize_name(name)
    hit = _ALIASES.get(key)
    if hit is None and _LR_GROUP.match(key):
        hit = ("lr", 1.0, 0)
    if hit is None and "/" in key:
        namespace, _, leaf = key.rpartition("/")
        inner = _ALIASES.get(leaf)
        if _EVAL_NAMESPACE.search(namespace):
            is_loss = inner is not None and inner[0] in ("loss", "eval_loss")
            hit = ("eval_loss", 1.0, inner[2]) if inner and is_loss else None
        elif (inner is not None and inner[0] != "eval_loss") or _LR_GROUP.match(leaf):
            hit = inner or ("lr", 1.0, 0)
    if hit is None:
        for prefix in _TRAIN_PREFIXES:
            if key.startswith(prefix):
                inner = _ALIASES.get(key[len(prefix):])
                if inner is not None and inner[0] != "eval_loss":
                    hit = inner
                break
    return None if hit is None else FieldMap(*hit)


# A named eval set, as the HF Trainer writes a dict of eval datasets: ``eval_<name>_loss``
# (``eval/<name>_loss`` after its TensorBoard / W&B callbacks), or ``eval_<name>/loss``.
_EVAL_SET = re.compile(
    r"^(?:eval|evaluation|val|valid|validation)[_/](?P<set>.+?)[_/ ](?:lm[_ ])?loss$", re.I
)
# Spellings of the one eval loss that the pattern above would read as a set.
_NOT_SETS = frozenset({"lm", "avg", "mean", "total", "train", "training", "step", "epoch"})

# Per-layer gradient norms: ``grad_norm/layers.3``, ``grad_norm/model.layers.3``,
# ``grad_2.0_norm/<parameter>`` (Lightning's grad_norm utility), ``l2_norm/grad/<name>``
# (Composer's OptimizerMonitor, LLM Foundry's ``layer_N``), ``layer_grad_l2_norm/<name>``
# (Composer's older GradMonitor), ``grad_norm_layer_3``, ``grad_norms/layer_3`` before the
# layer; ``layer_3/grad_norm``, ``layers.3.grad_norm`` after it. The layer part must name
# one (hold a digit or a dotted module path), so ``grad_norm/total`` and
# ``grad_norm_clipped`` stay what they are.
_LAYER_FIRST = re.compile(
    r"^(?:grad(?:ient)?[_ ]?norms?|grad_[\d.]+_norm|grad_norm_layers|layer_grad_norms?"
    r"|l2_norm/grad|layer_grad_l2_norm)"
    r"[/_.](?P<layer>.+)$",
    re.I,
)
_LAYER_LAST = re.compile(
    r"^(?P<layer>(?:.*[/_.])?(?:layers?|blocks?|h)[_.]?\d+)[/_.](?:grad(?:ient)?[_ ]?norm)$",
    re.I,
)
_LAYER_TOTALS = frozenset({"total", "global", "clipped", "norm", "max", "min", "mean", "avg"})
#: Keys holding all layers at once, as a list or a dict.
LAYER_KEYS = frozenset(
    {"grad_norm_layers", "layer_grad_norms", "grad_norms_per_layer", "per_layer_grad_norm"}
)


def eval_set(name: str) -> str | None:
    """The eval set a metric name is the loss of (``eval_wiki_loss`` → ``wiki``)."""
    match = _EVAL_SET.match(name.strip())
    if match is None:
        return None
    named = match["set"].strip()
    if not named or normalize_name(named) in _NOT_SETS:
        return None
    return named


def layer_of(name: str) -> str | None:
    """The layer a per-layer gradient-norm name is about, or ``None``."""
    text = name.strip()
    match = _LAYER_FIRST.match(text) or _LAYER_LAST.match(text)
    if match is None:
        return None
    layer = match["layer"].strip("/_. ")
    key = normalize_name(layer)
    if key in _LAYER_TOTALS or not any(c.isdigit() or c == "." for c in layer):
        return None
    if key.endswith("total") or (_ALIASES.get(key) or ("",))[0] == "grad_norm":
        return None  # ``grad_norm/grad_2.0_norm_total``: the global norm, renamed
    return layer


#: The GPU memory fields, whose unit a column's values can betray.
GPU_MEMORY = frozenset({"memory_allocated_gib", "memory_reserved_gib", "memory_peak_gib"})
#: A GPU holds at most a few hundred GiB: a "GiB" reading past this is MiB or bytes.
_MAX_GIB = 4096.0


def memory_unit(fm: FieldMap, value: float) -> tuple[float, str] | None:
    """A GPU memory column named without its unit whose first value cannot be GiB
    (``max_memory_allocated`` as ``torch.cuda.max_memory_allocated()`` returns it, in
    bytes): the factor its values really need and the unit, or ``None`` when the name's
    unit fits. Decided once per column, on its first value."""
    if fm.field not in GPU_MEMORY or fm.factor != _GIB or not value > _MAX_GIB:
        return None
    if value >= 2**30 / 8:  # an eighth of a GiB in bytes: no MiB reading is this large
        return _BYTES, "bytes"
    return _MIB, "MiB"


#: Words a field's name abbreviates: ``learning_rate`` says ``lr`` as plainly.
_SPELLED = {"lr": {"learning", "rate"}, "grad": {"gradient"}}


def _words(text: str) -> set[str]:
    words = {w for w in re.split(r"[/_()]+", normalize_name(text)) if w}
    return words.union(*(_SPELLED.get(w, set()) for w in words))


def describe(name: str, fm: FieldMap) -> str | None:
    """How a column was read, for the user's note (``mem_bytes → memory_allocated_gib
    (bytes → GiB)``), or ``None`` when there is nothing to say: the values are taken as
    they are and the name says the field (``train/loss`` is the loss)."""
    if fm.key or fm.field == "time":
        return None
    if fm.factor == 1.0 and _words(name) & _words(fm.field):
        return None
    factor = {_BYTES: " (bytes → GiB)", _MIB: " (MiB → GiB)", 1e-3: " (ms → s)",
              0.01: " (% → fraction)"}.get(fm.factor, "")
    return f"{name} → {fm.field}{factor}"


#: Extras sapper reads by name without a StepRecord field (``sapper diagnose`` splits a
#: slow step with the allocator's retry counter), normalised.
ALLOC_RETRIES = ("num_alloc_retries", "alloc_retries", "memory/num_alloc_retries",
                 "cuda_alloc_retries", "allocator_retries", "memory_num_alloc_retries")


def nearest_field(name: str) -> str | None:
    """The field an unrecognised column name comes closest to (by the spellings the
    table knows), for a note that suggests ``--map``; ``None`` when none is close."""
    import difflib

    key = normalize_name(name)
    if key in ALLOC_RETRIES:
        return None  # read by name, not a near miss
    if key.startswith("_") or _EVAL_NAMESPACE.search(key) or key in STEP_NAMES:
        return None  # a tracker's own counter, an eval metric, a step: not a near miss
    close = difflib.get_close_matches(key, list(_ALIASES), n=1, cutoff=0.6)
    return _ALIASES[close[0]][0] if close else None


@functools.lru_cache(maxsize=4096)
def resolve(name: str) -> FieldMap | None:
    """What a column or tag holds: a named eval set's loss, one layer's gradient norm,
    or a StepRecord field (:func:`canonical`). A log repeats its names on every line:
    the answer (a frozen FieldMap) is kept per name."""
    named = eval_set(name)
    if named is not None:
        return FieldMap("eval_losses", 1.0, 0, named)
    layer = layer_of(name)
    if layer is not None:
        return FieldMap("grad_norm_layers", 1.0, 0, layer)
    return canonical(name)


def parse_mapping(items: list[str]) -> dict[str, FieldMap]:
    """``--map`` values (``"col=field"`` or ``"col=field*factor"``) as a column map.

    Raises ``ValueError`` naming the problem; the caller turns it into an InputError.
    """
    out: dict[str, FieldMap] = {}
    for item in items:
        col, sep, target = item.rpartition("=")
        if not sep or not col.strip() or not target.strip():
            raise ValueError(f"{item!r} is not COLUMN=FIELD")
        name, star, factor_text = target.partition("*")
        name = name.strip()
        if name not in RECORD_FIELDS and name != "step" and name != "ignore":
            valid = ", ".join(sorted(RECORD_FIELDS | {"step", "ignore"}))
            raise ValueError(f"{item!r}: {name!r} is not a step-record field (valid: {valid})")
        factor = 1.0
        if star:
            try:
                factor = float(factor_text)
            except ValueError:
                raise ValueError(f"{factor_text!r} is not a number") from None
        out[col.strip()] = FieldMap(name, factor)
    return out
