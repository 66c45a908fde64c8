"""The causal map over the rule catalogue: which causes a rule is a sign of, and which
symptoms each cause produces (``sapper diagnose`` reasons over it; ``sapper explain``
shows it).

A blow-up prints many true findings at once: the loss scale collapsing, a spike, a
gradient-norm surge, NaN. They are symptoms of one cause, and what tells the causes apart
is a *sign*: a finding that a cause produces and the others do not (clipping before
``unscale_`` for a scaler bug, wrapped position ids for a position bug), a pre-flight
finding on the run's config that predicts it (fp16 with a static loss scale), or a
finding of ``sapper inspect`` on its checkpoint (a scheduler a step behind the optimizer,
a weight frozen while its peers moved). Each
:class:`Cause` lists:

- ``signs``: codes that point at this cause, each ``STRONG`` (specific to it) or ``WEAK``
  (it is one of several causes that produce the same sign, such as a gradient-norm surge
  before a spike for a learning rate that is too high);
- ``symptoms``: the codes it can produce, so a cause that explains every symptom seen
  outranks one that explains a few;
- ``next_test``: the experiment that confirms or rules it out when the inputs cannot.

One place: every code named here is a registered rule (tests/diagnose checks it), and a
new rule joins diagnose by being named in a cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "BLOW_UP",
    "CAUSES",
    "CHECKS",
    "MIN_SIZE",
    "MONITOR_OWN",
    "QUESTIONS",
    "STRONG",
    "WEAK",
    "Cause",
    "causal_links",
    "causes_of",
    "produced_by",
    "question_of",
]

STRONG = "strong"
WEAK = "weak"

#: The ``check`` a cause belongs to (the JSON contract of ``sapper diagnose``).
CHECKS: tuple[str, ...] = (
    "precision", "scaler", "clipping", "init", "normalization", "lr", "data",
    "accumulation", "memory", "parallel", "distributed", "hardware", "unknown",
)

#: Findings that mean the run blew up or broke (what ``diagnose`` sets out to explain):
#: non-finite values, spikes and surges, a collapsing scale, a loss that does not fall,
#: a throughput collapse, a rank that stopped. Other findings are evidence, not symptoms.
BLOW_UP: frozenset[str] = frozenset({
    "R001", "R002", "R003", "R010", "R011", "R013", "R020", "R030", "R031", "R060",
    "R061", "X001", "X003", "X005",
})


#: Findings the monitor reports about itself (a part switched off, a log it cannot
#: write): news about sapper, not about the run.
MONITOR_OWN: frozenset[str] = frozenset({"R190", "R191", "R192"})

#: The three questions people ask of a run that went wrong (seed §1), by the findings
#: that raise them: why does the loss not go down (or the model only memorise), why is
#: it slow, and — everything else at warning or error — why did it blow up.
QUESTIONS: dict[str, frozenset[str]] = {
    "not-learning": frozenset({"R003", "R012", "R021", "R110", "R111", "R080", "R081"}),
    "slow": frozenset({"R060", "R061", "R062", "X002"}),
    "memory": frozenset({"R050", "R051", "X005"}),
}

#: Signs that count only when large: the largest value over threshold among the
#: findings of the code must reach this. An eval loss a few percent above its best
#: (R110's threshold is 2 %) is evaluation noise as often as memorisation; one rising a
#: sixth above its best while the training loss falls is not.
MIN_SIZE: dict[str, float] = {"R110": 1.15}


def question_of(codes: set[str] | frozenset[str]) -> str:
    """Which of the questions a set of problems raises: a blow-up when any is one, else
    the kind most of them are."""
    quiet = frozenset().union(*QUESTIONS.values())
    if codes & (BLOW_UP - quiet):
        return "blow-up"
    counts = {q: len(codes & members) for q, members in QUESTIONS.items()}
    best = max(counts, key=lambda q: counts[q])
    return best if counts[best] else "blow-up"


@dataclass(frozen=True)
class Cause:
    """One root cause: its checklist topic, what points at it and what it produces."""

    id: str
    check: str
    title: str
    fix: str
    signs: dict[str, str]
    symptoms: frozenset[str]
    next_test: str
    #: When only this framework's mechanics can produce it (loss scaling exists only
    #: where fp16 runs): the run's precision must be one of these, or unknown.
    needs_precision: tuple[str, ...] = field(default=())


def _c(
    id: str, check: str, title: str, fix: str, *, strong: str = "", weak: str = "",
    symptoms: str, next_test: str, needs_precision: tuple[str, ...] = (),
) -> Cause:
    signs = {code: STRONG for code in strong.split()} | {code: WEAK for code in weak.split()}
    return Cause(id, check, title, fix, signs, frozenset(symptoms.split()), next_test,
                 needs_precision)


CAUSES: tuple[Cause, ...] = (
    _c("fp16-overflow", "precision",
       "fp16's range is exceeded: activations or gradients overflow 65504",
       "Train in bf16 where the GPU has it; otherwise find the overflowing module (the "
       "monitor's first non-finite module) and keep it in fp32, or lower the LR there.",
       strong="R030 S006 N107 K006 K011", weak="R020 R031 K004",
       symptoms="R001 R002 R010 R013 R020 R030 R031 X001",
       next_test="re-run the last good checkpoint in bf16 (or fp32) over the same batches: "
                 "if the blow-up does not come back, fp16's range was the cause",
       needs_precision=("fp16",)),
    _c("loss-scaling", "scaler",
       "fp16 without a working dynamic loss scale (none, static, or out-of-range settings)",
       "Use dynamic loss scaling with the framework's defaults (initial 2^16, growth "
       "interval 1000-2000, hysteresis 2).",
       strong="N102 N103 N104 R022", weak="R031",
       symptoms="R001 R003 R010 R012 R021 R022 R031",
       next_test="re-run with dynamic loss scaling at the framework's defaults",
       needs_precision=("fp16",)),
    _c("scaler-misuse", "scaler",
       "Gradients are clipped or applied while still multiplied by the loss scale",
       "Call scaler.unscale_(optimizer) before clip_grad_norm_, then scaler.step(optimizer).",
       strong="R032",
       symptoms="R001 R002 R003 R010 R011 R013",
       next_test="log the gradient norm right before clipping: if it carries the loss "
                 "scale (10^4 and more), unscale_ is missing",
       needs_precision=("fp16",)),
    _c("clip-before-unscale", "scaler",
       "Gradients are clipped before scaler.unscale_: the threshold meets a norm of the "
       "order of the loss scale, so every update shrinks to threshold / scale",
       "Call scaler.unscale_(optimizer) right before clip_grad_norm_, then "
       "scaler.step(optimizer) and scaler.update().",
       strong="R033 N203",
       symptoms="R003 R011 R012",
       next_test="print the norm clip_grad_norm_ returns on one step: of the order of the "
                 "loss scale (10^3 and more) before unscale_, O(1) after it",
       needs_precision=("fp16",)),
    _c("no-clipping", "clipping",
       "No (or a far too loose) gradient clipping let a surge into the weights",
       "Clip the global gradient norm at about 1.0.",
       strong="N201", weak="N202",
       symptoms="R001 R002 R010 R013",
       next_test="re-run the surge's steps from the last good checkpoint with clipping at 1.0"),
    _c("init-scale", "init",
       "The initialisation is too wide for the width or the depth: activations grow layer "
       "by layer",
       "Use std ≈ 0.02 (or 1/sqrt(hidden)) and scale the residual output projections by "
       "1/sqrt(2·layers).",
       strong="R100 S009", weak="N301 N302 N303 K002 K015",
       symptoms="R001 R002 R003 R013 R020",
       next_test="measure per-layer activation RMS at step 0 (sapper smoke's init check)"),
    _c("optimizer-setup", "init",
       "The training is set up so that the model cannot learn: the optimizer holds none "
       "(or none trainable) of the model's parameters, or no gradient reaches them",
       "Build the optimizer on the model you train, after freezing and wrapping "
       "(model.parameters() of the same object), and call backward on the loss.",
       strong="R120 R121 R122 K016 K022", weak="R021 R012 K003 K023",
       symptoms="R003 R012",
       next_test="compare the parameters in optimizer.param_groups with the model's "
                 "trainable parameters (id() of each tensor)"),
    _c("post-ln-warmup", "normalization",
       "A Post-LN stack trained without (enough) learning-rate warmup",
       "Warm the LR up over the first 1-5% of steps, or move to Pre-LN.",
       strong="R101 N401", weak="N402 N403 N404",
       symptoms="R001 R002 R003 R010 R013",
       next_test="re-run the first steps with a linear warmup of a few thousand steps"),
    _c("lr-too-high", "lr",
       "The learning rate is too high for this batch and model (or its warmup is missing)",
       "Lower the peak LR (scale it with the batch size you train at) and keep a warmup.",
       strong="R041 R043 R082 D105 N501", weak="R013 R042 K005 K020 N404",
       symptoms="R001 R002 R004 R010 R013",
       next_test="re-run from the last good checkpoint at half the LR: if the blow-up does "
                 "not come back at the same LR level, the LR was the cause"),
    _c("lr-schedule", "lr",
       "The learning-rate schedule is not the one declared (stuck, past its end, stepped "
       "per micro-batch)",
       "Step the scheduler once per optimizer step and make its length match the run's.",
       strong="R040 R042 R044 R045 K007 K008",
       symptoms="R002 R003 R004 R111",
       next_test="plot the logged LR against the declared schedule"),
    _c("positions", "data",
       "Sequences run past the position table or the trained context (wrapped or clamped "
       "position ids)",
       "Truncate or pack to the model's context, or extend positions (RoPE scaling) and "
       "train on it.",
       strong="R090 R091 D101", weak="D102",
       symptoms="R001 R002 R003",
       next_test="print the longest sequence length the loader emits against "
                 "max_position_embeddings"),
    _c("data-repeat", "data",
       "The loader serves the same samples again (duplicated shards, a short cycle, ranks "
       "that read the same data)",
       "Shard by rank (DistributedSampler with set_epoch), check the dataset's length and "
       "the resume position.",
       strong="R070 R072 X004 S008", weak="K009",
       symptoms="R003 R110",
       next_test="hash the samples of two epochs and of two ranks and compare"),
    _c("bad-data", "data",
       "A bad batch: token ids outside the vocabulary, or a sample that breaks the step "
       "every time it is read",
       "Filter the dataset (token ids < vocab size, lengths, empty samples); skip the "
       "batch at the step it recurs.",
       strong="D103",
       symptoms="R001 R002 R010 R020",
       next_test="re-run the step from the checkpoint before it with the same batch, then "
                 "with a different one"),
    _c("accumulation", "accumulation",
       "Gradient accumulation does not give the large batch's gradient (loss not divided, "
       "per-micro-batch means over uneven tokens)",
       "Divide the loss by the accumulation steps, or sum token losses and divide by the "
       "batch's token count.",
       strong="R080 S003 C101 C102", weak="R081",
       symptoms="R002 R004 R011 R013",
       next_test="compare one step at accumulation N with one step of the N-times batch"),
    _c("memory", "memory",
       "Memory runs out: the layout does not fit, or memory leaks from step to step",
       "Lower the micro-batch, recompute activations, shard optimizer states (ZeRO), or "
       "release what the loop keeps (losses kept as tensors).",
       strong="R051 M001 M002", weak="R050 M003",
       symptoms="R061 X005",
       next_test="log torch.cuda.max_memory_allocated per step"),
    _c("parallel-layout", "parallel",
       "The parallel layout puts heavy communication on slow links (TP across nodes, "
       "little overlap)",
       "Keep tensor parallelism inside a node; order ranks TP-first.",
       strong="P103 P112 X006 X008", weak="P114 X007",
       symptoms="R060 R061 X002",
       next_test="time one step with TP inside a node"),
    _c("rank-desync", "distributed",
       "Ranks disagree: replicas hold different parameters, count steps differently, or "
       "one stopped answering",
       "Check that every rank runs the same code path and seed for parameters; look at "
       "the stopped rank's own log.",
       strong="X003 X009 X005", weak="X002",
       symptoms="R001 X001 X005",
       next_test="compare parameter checksums across data-parallel ranks"),
    _c("frozen-layer", "init",
       "A part of the model stopped learning: no gradient reaches it (detached from the "
       "graph, frozen by mistake, or dead activations)",
       "Find where the graph is cut before those parameters (.detach(), torch.no_grad(), "
       "requires_grad=False, a branch the forward skips) and reconnect it; dead "
       "activations call for a lower LR or another activation.",
       strong="R021 K022", weak="K016",
       symptoms="R003 R012 R021",
       next_test="list the parameters whose .grad is None or all zeros after one backward, "
                 "and follow their module's output back through the forward"),
    _c("overfitting", "data",
       "The model memorises its training data: the eval loss turned up while the training "
       "loss kept falling (too many passes over too little data)",
       "Keep the checkpoint of the best eval step (early stopping); train on more or "
       "deduplicated data, fewer epochs, or with more regularisation (dropout, weight "
       "decay).",
       strong="R110",
       symptoms="R110 R111",
       next_test="evaluate the checkpoint of the best eval step and the last on a held-out "
                 "set, and count the epochs the run made over its data"),
    _c("data-stall", "data",
       "The input pipeline cannot keep up: steps wait for the next batch",
       "Raise DataLoader num_workers, pin memory and prefetch, pre-tokenise the data, "
       "or read it from faster storage.",
       strong="R062 D104",
       symptoms="R060 R061 R062",
       next_test="time the loader alone (iterate it without the model): if it yields "
                 "batches slower than the steps consume them, it is the bottleneck"),
    _c("memory-pressure", "memory",
       "Memory pressure slows the steps: near the device limit the caching allocator "
       "frees its cache and retries allocations (fragmentation)",
       "Lower the micro-batch or recompute activations to leave headroom; set "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.",
       weak="R050 M003",
       symptoms="R050 R060 R061",
       next_test="log torch.cuda.memory_stats()['num_alloc_retries'] per step: retries "
                 "that rise with the step time confirm it"),
    _c("hardware", "hardware",
       "A hardware or transient fault: one slow or failing GPU, a bit flip that did not "
       "come back",
       "Find the node (per-rank step times, ECC and Xid errors), exclude it, resume from "
       "the last good checkpoint.",
       strong="X002", weak="X001",
       symptoms="R001 R002 R010 R020 R060 R061 X001 X002",
       next_test="re-run the step from the checkpoint before it with the same batch: if it "
                 "does not reproduce, suspect the hardware"),
)


def causes_of(code: str) -> list[tuple[Cause, str]]:
    """The causes ``code`` is a sign of, with the sign's strength."""
    return [(c, c.signs[code]) for c in CAUSES if code in c.signs]


def produced_by(code: str) -> list[Cause]:
    """The causes that can produce ``code`` as a symptom."""
    return [c for c in CAUSES if code in c.symptoms]


def causal_links(code: str) -> dict[str, list[dict[str, str]]]:
    """Where ``code`` stands in the map, for ``sapper explain``: the causes it is a sign
    of (with the sign's strength) and the causes that can produce it as a symptom."""
    return {
        "sign_of": [
            {"cause": c.id, "check": c.check, "title": c.title, "strength": strength}
            for c, strength in causes_of(code)
        ],
        "symptom_of": [
            {"cause": c.id, "check": c.check, "title": c.title} for c in produced_by(code)
        ],
    }
