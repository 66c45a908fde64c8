"""Lightning integration: one callback.

    trainer = lightning.Trainer(..., callbacks=[SapperCallback(run_log="run.jsonl")])

At ``on_train_start`` the callback builds a :class:`~sapper.monitor.Monitor` on the
LightningModule, its first optimizer, LR scheduler and (under 16-mixed precision) the
precision plugin's GradScaler; ``on_train_batch_end`` feeds it the batch loss (the
monitor closes a step at each optimizer step, so gradient accumulation is handled);
``on_train_end`` closes it. Requires ``lightning`` (or ``pytorch_lightning``):
``pip install 'sapper[lightning]'``.

Step numbers are Lightning's ``trainer.global_step`` (optimizer steps taken): the record
of a step carries the ``global_step`` the Trainer reports once that step's optimizer
step has run, so the first is step 1, as in its checkpoints and logged metrics.

``SapperCallback(inspect_on_save=True)`` scans every file Lightning's ``ModelCheckpoint``
callbacks write. Lightning tells callbacks of a save (``on_save_checkpoint``) before the
file exists, and runs ``ModelCheckpoint`` after the other callbacks' hooks, so the files
its callbacks name (``last_model_path``, ``best_model_path``, ``best_k_models``) are
looked at in the next hook: a new or rewritten file is handed to the monitor, which scans
it off the training thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

from sapper.monitor.monitor import Monitor
from sapper.monitor.plan_input import PlanLike, resolve_plan

__all__ = ["SapperCallback"]


class SapperCallback(Callback):
    """Attach sapper's monitor to a Lightning ``Trainer``.

    Args:
        plan: the declared job, for the detectors: a Plan, a LoadedPlan or a path (plan
            YAML, config.json, DeepSpeed JSON), as for :class:`~sapper.monitor.Monitor`.
        module: attribute of the LightningModule whose forward receives the batch
            (default: a child holding ≥ 90% of the parameters, e.g. ``self.model``, else
            the LightningModule itself).
        eval_key: the metric the validation loss is logged under (default: the first of
            ``val_loss``, ``val/loss``, ``validation_loss``, ``valid_loss``,
            ``eval_loss`` found in ``trainer.callback_metrics``), for R110/R111.
        **monitor_options: keyword arguments of :class:`~sapper.monitor.Monitor`.
    """

    def __init__(
        self,
        plan: PlanLike = None,
        module: str | None = None,
        eval_key: str | None = None,
        **monitor_options: Any,
    ) -> None:
        super().__init__()
        self.plan = resolve_plan(plan)
        self.module = module
        self.eval_key = eval_key
        self.options = monitor_options
        self.monitor: Monitor | None = None
        #: Checkpoint files handed to the monitor, with the mtime they had then.
        self._saved: dict[str, int] = {}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            return
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        configs = list(getattr(trainer, "lr_scheduler_configs", []) or [])
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        options = dict(self.options)
        options.setdefault("framework", "lightning")
        # global_step counts optimizer steps done: the first one to run is number + 1.
        options.setdefault("start_step", trainer.global_step + 1)
        if getattr(trainer, "world_size", 1) > 1:
            options.setdefault("rank", trainer.global_rank)
        options.setdefault("console", trainer.is_global_zero)
        self.monitor = Monitor(
            _watched(pl_module, self.module),
            optimizers[0] if optimizers else None,
            scaler=scaler,
            scheduler=configs[0].scheduler if configs else None,
            plan=self.plan,
            **options,
        )

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        # Lightning has fetched the batch: what came before was data wait.
        if self.monitor is not None:
            self.monitor.batch_ready()
            self._new_checkpoints(trainer)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.monitor is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.monitor.step(loss, batch)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is None or getattr(trainer, "sanity_checking", False):
            return
        metrics = getattr(trainer, "callback_metrics", None) or {}
        keys = (self.eval_key,) if self.eval_key else _EVAL_KEYS
        key = next((k for k in keys if k in metrics), None)
        if key is not None:
            self.monitor.eval_loss(metrics[key])

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self._new_checkpoints(trainer)
            self.monitor.close()

    def _new_checkpoints(self, trainer: Any) -> None:
        """Hand the monitor each checkpoint file written since the last look."""
        assert self.monitor is not None
        for cb in list(getattr(trainer, "checkpoint_callbacks", None) or []):
            best = getattr(cb, "best_k_models", None)
            names = [
                getattr(cb, "last_model_path", ""),
                getattr(cb, "best_model_path", ""),  # the file of a save with no monitor
                *(best if isinstance(best, dict) else ()),
            ]
            for name in names:
                if not isinstance(name, str) or not name:
                    continue
                try:
                    mtime = Path(name).stat().st_mtime_ns
                except OSError:  # not written (yet), or already removed by save_top_k
                    continue
                if self._saved.get(name) != mtime:
                    self._saved[name] = mtime
                    self.monitor.checkpoint_saved(name)


#: Names LightningModules commonly log their validation loss under (``self.log(...)``).
_EVAL_KEYS = ("val_loss", "val/loss", "validation_loss", "valid_loss", "eval_loss")


def _watched(pl_module: Any, name: str | None) -> Any:
    """The module whose forward sees each batch: training steps usually call a wrapped
    model (``self.model(**batch)``), not the LightningModule's own forward."""
    if name:
        return getattr(pl_module, name)
    total = sum(p.numel() for p in pl_module.parameters())
    for child in pl_module.children():
        if total and sum(p.numel() for p in child.parameters()) >= 0.9 * total:
            return child
    return pl_module
