"""The K family: what ``sapper inspect`` finds in a checkpoint, documentation only.

Kept free of torch (and of the readers) so ``sapper rules`` and ``sapper explain K001``
stay instant: this module is what the ``sapper.rules`` entry point names; the checks that
fire these rules (:mod:`sapper.checkpoint.checks`, :mod:`sapper.checkpoint.optim`,
:mod:`sapper.checkpoint.resume`, :mod:`sapper.checkpoint.diff`) import them from here.
"""

from __future__ import annotations

from sapper.rules.model import Rule, Severity
from sapper.rules.registry import register

__all__ = [
    "ADAM_UPDATE_JUMP",
    "ADAM_V_UNDERFLOW",
    "CHANGED_WHILE_FROZEN",
    "CHECKPOINT_RULES",
    "DEAD_TENSOR",
    "DTYPE_VS_CONFIG",
    "INIT_SCALE_OFF",
    "LAYER_FROZEN",
    "LAYER_MOVED",
    "LOSS_SCALE_COLLAPSED",
    "MODEL_MISMATCH",
    "NONFINITE_APPEARED",
    "NONFINITE_TENSOR",
    "NO_GRADIENT",
    "RESUME_INCOMPLETE",
    "RESUME_LR_MISMATCH",
    "RESUME_STEP_MISMATCH",
    "SATURATED_TENSOR",
    "SCALE_OUTLIER",
    "TIED_UNTIED",
    "UNEXPECTED_TENSORS",
]

NONFINITE_TENSOR = Rule(
    code="K001",
    name="nonfinite-in-checkpoint",
    check="checkpoint",
    severity=Severity.ERROR,
    title="The checkpoint holds NaN or Inf values",
    why="""\
A NaN or Inf saved in a weight, an fp32 master copy or an optimizer moment is restored
into every attempt that resumes from this checkpoint: the first forward (or the first
Adam update) spreads it to the whole model, so the run blows up again at the same place
however often it is restarted.""",
    signs="""\
A resumed run whose loss is NaN from its first step; restarts that all fail at once;
an fp16 loss scale that collapses right after resuming.""",
    fix="""\
Do not resume from this checkpoint: go back to the last one that inspects clean (run
`sapper inspect OLD NEW` to see where the values first appear), and fix the cause of
the blow-up (learning rate, loss scaling, clipping) before training on.""",
    seed="§2.1, §5.2",
)

SCALE_OUTLIER = Rule(
    code="K002",
    name="layer-scale-outlier",
    check="checkpoint",
    severity=Severity.WARNING,
    title="One layer's weights are far larger or smaller than its peers'",
    why="""\
Layers of the same role (every q_proj, every down_proj, every norm) start from the same
initialisation and are trained by the same optimizer; their weight scales stay within a
small factor of each other. One layer whose RMS grew many times its peers' has run away
(an attention logit growth, a residual branch that dominates the stream): it is where
the next loss spike starts.""",
    signs="""\
Loss spikes that recur after restarts; attention entropy collapsing in one layer; growing
activation norms at one depth.""",
    fix="""\
Look at the named layer's weights and activations; add QK-norm or logit soft-capping,
lower the learning rate or raise weight decay for it, and check that its initialisation
matches the others'.""",
    seed="§2.1, §4.1",
)

DEAD_TENSOR = Rule(
    code="K003",
    name="dead-tensor",
    check="checkpoint",
    severity=Severity.WARNING,
    title="A tensor is all zeros or one constant",
    why="""\
A trained weight that is exactly zero (or one constant everywhere) carries no
information: a layer zeroed by an overflow that a scaler turned into zeros, a module
never reached by the gradient, a load that silently failed and left an initial value. The
model trains around it and ends up smaller than planned.""",
    signs="""\
A layer whose gradient norm is always zero; a model that underperforms its size; weights
identical between checkpoints.""",
    fix="""\
Check that the tensor is meant to train (requires_grad, in the optimizer's param groups),
that its initialisation is not zero, and that the checkpoint loaded into it is the right
one. Biases that start at zero and a layer-scale of one are exempt if they are meant to
be.""",
    seed="§4.1, §5.2",
)

ADAM_V_UNDERFLOW = Rule(
    code="K004",
    name="adam-second-moment-underflow",
    check="checkpoint",
    severity=Severity.WARNING,
    title="Adam's second moment underflowed to zero where the first moment is not zero",
    why="""\
Adam divides the first moment by the square root of the second. When exp_avg_sq is
stored in fp16/bf16, or the squared gradients are tiny, it underflows to zero while
exp_avg does not; the update for those elements becomes m/eps — orders of magnitude
larger than the learning rate intends — and the next step throws those weights far.""",
    signs="""\
A loss spike on the first step after resuming or right after a quiet stretch; the
weights of one layer jumping in a checkpoint diff.""",
    fix="""\
Keep optimizer states in fp32 (master weights and moments), raise eps (1e-8 to 1e-6 in
low precision), and resume from a checkpoint whose moments are healthy.""",
    seed="§2.1",
)

ADAM_UPDATE_JUMP = Rule(
    code="K005",
    name="adam-update-jump",
    check="checkpoint",
    severity=Severity.ERROR,
    title="Adam's stored moments imply an update far beyond the learning rate",
    why="""\
Adam's normalised update |m̂|/(√v̂+ε) stays below about 3 in steady state with the
usual betas: it is what makes the learning rate a step size. A value of 10 or more
means the moments disagree (the second moment lost or reset, the first inflated), and
the next optimizer step moves the named layer by that many learning rates.""",
    signs="""\
The first step after resuming spikes the loss; the layer named here moves far more
than its peers in `sapper inspect A B`.""",
    fix="""\
Do not resume with these optimizer states: go back to an earlier checkpoint, or reset
the moments and warm the learning rate up again; keep moments in fp32 and eps large
enough for the dtype.""",
    seed="§2.1, §5.2",
)

LOSS_SCALE_COLLAPSED = Rule(
    code="K006",
    name="loss-scale-collapsed",
    check="checkpoint",
    severity=Severity.ERROR,
    title="The saved fp16 loss scale is at its floor or collapsed",
    why="""\
Dynamic loss scaling halves the scale on every overflowing step. A scale saved at 1 or
below (or non-finite) means the run kept overflowing: gradients now underflow in fp16 and
every step either overflows or learns nothing. Resuming restores the collapsed scale.""",
    signs="""\
Long runs of skipped steps; a flat loss with the loss scale pinned at its minimum;
'Gradient overflow. Skipping step' on every step.""",
    fix="""\
Find the overflow's source (an LR spike, a layer's logits growing, attention in fp16)
before resuming; switch to bf16 where the hardware has it, or reset the scale from a
healthy checkpoint.""",
    seed="§2.1",
)

RESUME_STEP_MISMATCH = Rule(
    code="K007",
    name="resume-step-mismatch",
    check="checkpoint",
    severity=Severity.ERROR,
    title="The optimizer, scheduler and trainer disagree on the step",
    why="""\
An exact resume needs the optimizer's step (Adam's bias correction), the scheduler's
position (the learning rate) and the trainer's global step (the data position) to be
the same number. When they differ the resumed run uses a warmup already done, a learning
rate from another point of the schedule, or data it has already seen.""",
    signs="""\
A loss jump at the resume point; a learning rate curve with a kink or a restart of the
warmup after resuming.""",
    fix="""\
Save and restore the optimizer, scheduler and trainer state together (the trainer's own
save/resume does this); do not mix pieces from different checkpoints.""",
    seed="§5.2",
)

RESUME_LR_MISMATCH = Rule(
    code="K008",
    name="resume-lr-mismatch",
    check="checkpoint",
    severity=Severity.WARNING,
    title="The optimizer's learning rate disagrees with the scheduler's or the log's",
    why="""\
The optimizer's param groups hold the learning rate the next step uses; the scheduler
recomputes it from its own position. When they differ, the resumed run jumps to another
learning rate at its first step — the classic sign of a scheduler re-created instead of
restored, or of an LR overridden by hand.""",
    signs="""\
A learning-rate curve that jumps at the resume; a loss spike right after resuming.""",
    fix="""\
Restore the scheduler's state_dict after the optimizer's, and do not change the LR in
the param groups by hand on resume.""",
    seed="§5.2",
)

RESUME_INCOMPLETE = Rule(
    code="K009",
    name="resume-incomplete",
    check="checkpoint",
    severity=Severity.WARNING,
    title="Pieces needed for an exact resume are missing",
    why="""\
Resuming from weights alone is a new run, not a continuation: without the optimizer's
moments Adam restarts its statistics (a large first update), without the scheduler the
LR restarts its schedule, without the loss scaler fp16 restarts at 65536 and overflows,
without RNG and data position the model sees other batches and dropout masks. A piece the
framework does not need is not asked for: nanoGPT and LitGPT compute the LR from the saved
``iter_num``, and a run without a scheduler saves its key empty (DeepSpeed's
``lr_scheduler: None``, Lightning's ``lr_schedulers: []``).""",
    signs="""\
A loss spike right after resuming; curves that do not overlay the original run.""",
    fix="""\
Save the optimizer, scheduler, scaler, RNG and trainer state with every checkpoint
(the HF Trainer and Lightning do so by default); if they are gone, warm the LR up again
after resuming.""",
    seed="§5.2",
)

TIED_UNTIED = Rule(
    code="K010",
    name="tied-weights-untied",
    check="checkpoint",
    severity=Severity.WARNING,
    title="Weights the config ties are stored different",
    why="""\
With tie_word_embeddings the input embedding and the output head are one tensor. Two
different copies in the checkpoint mean the tie was broken (a model re-created before
loading, an FSDP wrap that copied one of them): the model trains two matrices, and a
loader that re-ties them silently drops one.""",
    signs="""\
A loss that jumps after loading; embedding and head norms that drift apart.""",
    fix="""\
Re-tie the weights after building the model and before wrapping it (model.tie_weights()),
or set tie_word_embeddings to false if untied weights are meant.""",
    seed="§5.2",
)

SATURATED_TENSOR = Rule(
    code="K011",
    name="saturated-at-dtype-limit",
    check="checkpoint",
    severity=Severity.WARNING,
    title="Values sit at the largest number the dtype can hold",
    why="""\
An fp16 value of exactly ±65504 (or the bf16/fp8 limit) is a value that overflowed and
was clamped: it has lost its magnitude, and the next operation on it makes Inf.""",
    signs="""\
Inf appearing in activations of that layer; fp16 loss-scale drops.""",
    fix="""\
Keep master weights in fp32, find what grew the tensor (LR, a runaway layer), and resume
from a checkpoint whose values are in range.""",
    seed="§2.1",
)

DTYPE_VS_CONFIG = Rule(
    code="K012",
    name="dtype-disagrees-with-config",
    check="checkpoint",
    severity=Severity.WARNING,
    title="The weights are stored in another dtype than config.json says",
    why="""\
Loaders build the model in the config's dtype (``dtype``/``torch_dtype``) and cast the
stored weights into it. Weights saved in fp16 under a bf16 config (or bf16 under an fp16
one) come back in a dtype whose range or precision they were not trained in: bf16 values
above 65504 overflow to Inf in fp16, and fp16's fine steps are rounded away in bf16; fp32
master weights saved under a half-precision config lose their low bits on the next load.""",
    signs="""\
A loss jump right after loading; Inf in the first forward of a resumed or fine-tuned
run.""",
    fix="""\
Save with the dtype the model trained in and set config.json's dtype to it (or pass the
dtype explicitly when loading).""",
    seed="§2.1, §5.2",
)

MODEL_MISMATCH = Rule(
    code="K013",
    name="checkpoint-does-not-fit-model",
    check="checkpoint-model",
    severity=Severity.ERROR,
    title="The checkpoint lacks weights the config's model has, or stores them in another shape",
    why="""\
Loading a checkpoint into a model whose weights it does not all hold does not fail:
``from_pretrained`` initialises each missing weight at random and logs one line, and a
training script's ``load_state_dict(strict=False)`` says nothing at all. The run then
fine-tunes (or resumes) a model part of which is noise: a head, a layer, every expert of
a layer. Shapes that differ mean the checkpoint belongs to another architecture (another
width, vocabulary, head count); with ``ignore_mismatched_sizes`` those weights are
re-initialised too.""",
    signs="""\
A loss at the start of fine-tuning near ln(vocab) instead of the pretrained model's; the
"newly initialized" warning in the log; a resumed run whose loss jumps back up.""",
    fix="""\
Load with the config the checkpoint was saved with, or find the missing shard or the
piece the save left out; load with strict=True so a missing weight is an error.""",
    seed="§5.2",
)

UNEXPECTED_TENSORS = Rule(
    code="K014",
    name="checkpoint-holds-unknown-tensors",
    check="checkpoint-model",
    severity=Severity.WARNING,
    title="The checkpoint holds tensors the config's model does not have",
    why="""\
Tensors whose names the model does not know are dropped on load, silently with
``strict=False`` and with one log line from ``from_pretrained``. When they are the trained
weights under another name (a wrapper's prefix, a renamed module, an adapter not merged)
the model loads without them and runs on its initial values.""",
    signs="""\
"Some weights of the model checkpoint were not used" in the log; a fine-tuned model that
behaves like the base model.""",
    fix="""\
Rename the keys to the model's (strip the wrapper's prefix), merge the adapter, or load
with the model class that wrote them; if they are leftovers (an old buffer), nothing to
do.""",
    seed="§5.2",
)

INIT_SCALE_OFF = Rule(
    code="K015",
    name="weights-far-from-planned-init",
    check="checkpoint-model",
    severity=Severity.WARNING,
    title="Weights are far from the scale the config's init plans",
    why="""\
The config's ``initializer_range`` is the std its model draws every matrix from (output
projections often scaled down by 1/sqrt(2L)). At step 0 the weights are that init: a role
many times off it was initialised some other way (an nn.Embedding's default N(0, 1) is 50x
0.02, a module the init never reached keeps torch's default), and the activation growth
the init was chosen to avoid follows (seed §2.4). Trained weights stay within a few times
their init; twenty times off means they grew without bound (no weight decay, a runaway
layer) or the checkpoint is not of this model.""",
    signs="""\
Activation RMS growing layer by layer at step 0; a loss spike or NaN in the first hundred
steps; after training, K002 on the same role or a loss that drifts up.""",
    fix="""\
Make sure the model's init runs on every module (post_init / _init_weights, or your own
init with the planned std), and that what you load was written by this config's model.""",
    seed="§2.4",
)

NO_GRADIENT = Rule(
    code="K016",
    name="parameter-never-got-a-gradient",
    check="checkpoint",
    severity=Severity.WARNING,
    title="Parameters the optimizer trains never received a gradient",
    why="""\
A torch optimizer creates a parameter's state (Adam's moments, its step) at the first
step in which that parameter has a gradient. A parameter of the optimizer's groups
without any state after the others have stepped, or with moments that are exactly zero,
has never had a non-zero gradient: its module is not on the forward path, its output is
detached, or, for an MoE expert, the router never sends it a token. It is meant to train
and does not.""",
    signs="""\
A zero gradient norm for the named parameters; an MoE layer whose load concentrates on a
few experts; K022 on the same tensor between two checkpoints.""",
    fix="""\
Check that the named module is called in forward and its output reaches the loss; for an
expert, add or raise the router's load-balancing loss; if it is unused on purpose, leave
it out of the optimizer.""",
    seed="§5.2",
)

LAYER_MOVED = Rule(
    code="K020",
    name="layer-moved-far-more",
    check="checkpoint-diff",
    severity=Severity.WARNING,
    title="One layer changed far more between the checkpoints than its peers",
    why="""\
Between two checkpoints every layer of one role moves by a similar relative amount
||ΔW||/||W||. One that moved many times more took the jump: that is the layer where the
instability started (a runaway attention, an Adam update from an underflowed moment).""",
    signs="""\
A loss spike between the two checkpoints; K002 or K005 on the same layer in the later
one.""",
    fix="""\
Inspect the named layer in the later checkpoint (`sapper inspect NEW`), and lower the LR
or clip harder; add QK-norm when it is an attention projection.""",
    seed="§2.1, §5.2",
)

LAYER_FROZEN = Rule(
    code="K022",
    name="tensor-did-not-move",
    check="checkpoint-diff",
    severity=Severity.WARNING,
    title="A tensor did not change between the checkpoints while its peers did",
    why="""\
Every trained tensor moves between two checkpoints of a training run. One that is
bit-identical while the same role in the other layers moved is frozen: requires_grad off
by mistake, left out of the optimizer's param groups, or cut from the graph (a detach, a
module that is never called). The model trains with fewer parameters than planned.""",
    signs="""\
A layer whose gradient norm is zero; a model that underperforms its size; K003 on the
same tensor once it is a constant.""",
    fix="""\
Check requires_grad and the optimizer's param groups for the named tensor, and that its
module is on the forward path; if it is frozen on purpose, nothing to do.""",
    seed="§5.2",
)

NONFINITE_APPEARED = Rule(
    code="K021",
    name="nonfinite-appeared",
    check="checkpoint-diff",
    severity=Severity.ERROR,
    title="NaN or Inf values appear between the two checkpoints",
    why="""\
A tensor finite in the earlier checkpoint and not in the later one shows where the
poisoning entered; every tensor that is non-finite in both was poisoned earlier.""",
    signs="""\
A run that blew up between the two saves.""",
    fix="""\
Resume from the earlier checkpoint with a lower LR or tighter clipping, and watch the
named tensor's layer with `sapper.monitor`.""",
    seed="§2.1, §5.2",
)

CHANGED_WHILE_FROZEN = Rule(
    code="K023",
    name="frozen-tensor-changed",
    check="checkpoint-diff",
    severity=Severity.WARNING,
    title="A tensor that training does not update changed between the checkpoints",
    why="""\
Between two checkpoints of one run only what the optimizer trains may change. A buffer
(a rotary frequency table, an attention mask, position ids) or a parameter that is in no
optimizer group and still differs was written by something else: an in-place operation
on a frozen weight, a tied weight updated through its twin, a rotary table recomputed in
another dtype, an EMA or a load that replaced it. The model the optimizer believes in is
not the one that trains.""",
    signs="""\
A frozen base model whose outputs drift during adapter training; a loss that worsens
after a resume; long-context quality that changes with the dtype.""",
    fix="""\
Find what writes the named tensor (in-place ops, copy_, a hook, an EMA callback); compute
rotary tables in fp32 and keep them out of the state dict; freeze with requires_grad
False and keep it out of the optimizer.""",
    seed="§5.2",
)

CHECKPOINT_RULES: tuple[Rule, ...] = tuple(
    register(r)
    for r in (
        NONFINITE_TENSOR,
        SCALE_OUTLIER,
        DEAD_TENSOR,
        ADAM_V_UNDERFLOW,
        ADAM_UPDATE_JUMP,
        LOSS_SCALE_COLLAPSED,
        RESUME_STEP_MISMATCH,
        RESUME_LR_MISMATCH,
        RESUME_INCOMPLETE,
        TIED_UNTIED,
        SATURATED_TENSOR,
        DTYPE_VS_CONFIG,
        MODEL_MISMATCH,
        UNEXPECTED_TENSORS,
        INIT_SCALE_OFF,
        NO_GRADIENT,
        LAYER_MOVED,
        NONFINITE_APPEARED,
        LAYER_FROZEN,
        CHANGED_WHILE_FROZEN,
    )
)
