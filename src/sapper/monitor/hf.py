"""Hugging Face ``Trainer`` integration: one callback.

    trainer = Trainer(..., callbacks=[SapperCallback(run_log="run.jsonl")])

The callback builds a :class:`~sapper.monitor.Monitor` on the Trainer's model, optimizer
and scheduler when training begins, closes one step per ``on_step_end`` (the Trainer calls
it once per optimizer step, also when its loss scaler skipped the update), reads the
device values at each ``on_log`` (the Trainer synchronises there anyway), hands it each
evaluation's loss (``on_evaluate``) and closes the monitor at the end. Requires
``transformers``.

Step numbers are the Trainer's: the Trainer increments ``state.global_step`` before
``on_step_end``, so the first optimizer step is step 1, and the record of each step
carries the ``global_step`` that ``trainer_state.json``'s ``log_history`` logs for it
(also after ``resume_from_checkpoint``). A run log and the Trainer's own logs line up.

``SapperCallback(inspect_on_save=True)`` scans every ``checkpoint-N`` the Trainer saves,
in the background, for what makes it unfit to resume from (sapper.monitor.checkpoints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from sapper.monitor.monitor import Monitor
from sapper.monitor.plan_input import PlanLike, resolve_plan

__all__ = ["SapperCallback"]


class SapperCallback(TrainerCallback):
    """Attach sapper's monitor to a ``transformers.Trainer``.

    Args:
        plan: the declared job, for the detectors (schedule, clipping, GPU ...): a Plan,
            a LoadedPlan or a path (plan YAML, config.json, DeepSpeed JSON), as for
            :class:`~sapper.monitor.Monitor`; a bad file raises here.
        **monitor_options: keyword arguments of :class:`~sapper.monitor.Monitor`
            (``run_log``, ``tensorboard``, ``halt_on``, ``log_every`` ...).
    """

    def __init__(self, plan: PlanLike = None, **monitor_options: Any) -> None:
        self.plan = resolve_plan(plan)
        self.options = monitor_options
        self.monitor: Monitor | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if self.monitor is not None or model is None:
            return
        options = dict(self.options)
        options.setdefault("framework", "hf-trainer")
        # The step about to run is global_step + 1 once the Trainer has counted it.
        options.setdefault("start_step", state.global_step + 1)
        if getattr(args, "world_size", 1) > 1:
            options.setdefault("rank", args.process_index)
        options.setdefault("console", args.process_index == 0)
        self.monitor = Monitor(
            model,
            kwargs.get("optimizer"),
            scheduler=kwargs.get("lr_scheduler"),
            plan=self.plan,
            step_on_call=True,
            **options,
        )
        self._optimizer = kwargs.get("optimizer")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The Trainer has fetched the step's batches: what came before was data wait.
        if self.monitor is not None:
            self.monitor.batch_ready()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            # Already incremented for this step: number the record with it.
            self.monitor.next_step = state.global_step
            skipped = getattr(self._optimizer, "step_was_skipped", None)
            self.monitor.step(skipped=skipped if isinstance(skipped, bool) else None)

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.flush()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # ``eval_loss``, or ``eval_<name>_loss`` per set when the Trainer evaluates a dict
        # of datasets.
        metrics = kwargs.get("metrics") or {}
        if self.monitor is None or not isinstance(metrics, dict):
            return
        for key, value in metrics.items():
            if key == "eval_loss":
                self.monitor.eval_loss(value)
            elif key.startswith("eval_") and key.endswith("_loss"):
                self.monitor.eval_loss(value, name=key[len("eval_") : -len("_loss")])

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The Trainer has written checkpoint-<global_step> (transformers' _save_checkpoint)
        # and calls on_save after it: with inspect_on_save the monitor scans it.
        if self.monitor is not None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                self.monitor.checkpoint_saved(folder)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()
