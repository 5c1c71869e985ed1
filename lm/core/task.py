"""What `lm.core.loop.run` trains: a task supplies batches, the loss, evaluation and "keep best by metric".

The loop owns everything that is the same for every task: the learning rate of each step, the forward
and backward of each micro-batch (weighted by label tokens over all ranks), the NaN/inf policy, the
progress bar, throughput, evaluation and checkpoints at their intervals, and preemption. A task owns
what differs: pretraining (lm.core.pretrain_task) reads packed token windows and reports val loss;
GLUE finetuning (lm.glue.trainer) reads shuffled epochs of examples and scores dev with the
leaderboard's metrics, keeping the best epoch's test predictions.

Exact resume: `state_dict()` is saved with every checkpoint (one per rank) and `load_state_dict()`
restores it before the loop continues, so the next step's batches, and what the task kept about
earlier evaluations (history, best results), are those of an uninterrupted run.
"""

from __future__ import annotations

from typing import Protocol

import torch


class StepBatches(Protocol):
    """An endless iterator over optimizer steps: each item is one step's micro-batches on this rank
    (every rank gets the same number, since engines count accumulation boundaries)."""

    def __next__(self) -> list[dict[str, torch.Tensor]]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class TrainTask(Protocol):
    batches: StepBatches
    # The key of evaluate()'s record that model selection maximises; None = no "best" (pretraining).
    best_metric: str | None

    def loss(self, model, batch: dict[str, torch.Tensor], metrics=None) -> torch.Tensor:
        """Token-mean (or example-mean) loss of one micro-batch; lm.core.objectives.loss for every task today.
        The model's own metrics go to `metrics` (a lm.core.tracking.ModelMetrics, or None)."""
        ...

    def evaluate(self, engine, step: int) -> dict:
        """Metrics after `step` optimizer steps (every rank calls it; sharded engines need every rank's
        forwards). The loop logs the record with step and tokens added."""
        ...

    def on_best(self, engine, step: int, record: dict) -> None:
        """Called after evaluate() when record[best_metric] beats every earlier evaluation, e.g. to
        predict the test set or save the weights with the same parameters."""
        ...

    def state_dict(self) -> dict:
        """Everything needed to continue exactly (the batches' position, what the task kept)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...


class EvalFailed(RuntimeError):
    """An EvalCallback's pass failed (on rank 0, told to every rank): the loop saves the step's training first,
    then raises `cause` (rank 0) or this. An evaluation is read-only: its failure must not cost the training."""

    def __init__(self, what: str, step: int, why: str, cause: BaseException | None = None):
        super().__init__(f"{what} at step {step} failed: {why}")
        self.cause = cause


class EvalCallback(Protocol):
    """An evaluation beside the task's own, at its own interval (`loop.run(evals=...)`; the GLUE probes of
    lm/eval/probe.py). Its step is a sync point, and the loop logs its record with step and tokens added.
    It must leave the training state alone (weights, RNG, the task's batches), so that a run with it
    trains exactly as one without it and resumes exactly."""

    def due(self, step: int, last: bool) -> bool:
        """Whether to run after optimizer step `step` (`last`: the run's final step)."""
        ...

    def __call__(self, engine, step: int) -> dict:
        """The metrics to log (every rank calls it; ranks that compute nothing return {})."""
        ...
