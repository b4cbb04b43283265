"""Where SIGINT/SIGTERM stops a training run: at a step boundary, after a checkpoint."""

from __future__ import annotations

from typing import Any

from meta.lv2 import CheckpointEvent, Event, Trainer
from meta.run.errors import SIGNALS, Interrupted


class StopOnSignal(Event):
    """Where SIGINT/SIGTERM stops a training run: at the first step boundary after the signal
    (``meta.run.errors.SIGNALS``), after a checkpoint of exactly that step (rank 0, which writes
    the outputs), so ``--resume`` continues from it. Runs last of all events."""

    priority = -10_000

    def on_train_begin(self, trainer: Trainer) -> None:
        SIGNALS.deferring = True

    def on_step_end(self, trainer: Trainer, observation: dict[str, Any]) -> None:
        self.stop_if_asked(trainer)

    def on_epoch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        self.stop_if_asked(trainer)

    def on_eval_batch(self, trainer: Trainer) -> None:
        # between evaluation batches: the trainer's position is still the epoch's last step,
        # so the checkpoint resumes with this evaluation (it took 7.5-19.6 s to act on)
        self.stop_if_asked(trainer, " (evaluating)")

    def stop_if_asked(self, trainer: Trainer, doing: str = "") -> None:
        """After a SIGINT/SIGTERM, checkpoint (if the run checkpoints) and stop at this step
        boundary."""
        if SIGNALS.pending is None or not SIGNALS.deferring:
            return
        SIGNALS.deferring = False
        where = f"at epoch {len(trainer.history) + 1}, step {trainer.step}{doing}"
        saver = next((e for e in trainer.events if isinstance(e, CheckpointEvent)), None)
        if saver is not None:
            try:
                saver.write(trainer)
                where += f"; checkpoint written to {saver.path} (continue with --resume)"
            except Exception as err:  # noqa: BLE001 - the interrupt is what is reported
                where += f"; no checkpoint written ({err})"
        raise Interrupted(SIGNALS.pending, where)

    def finalize(self, trainer: Trainer) -> None:
        SIGNALS.deferring = False
