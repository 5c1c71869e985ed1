"""FixedTask: a task over a given list of micro-batches, one per step (step i trains on batches[i % n]), with
no evaluation. The speed benchmarks (benchmarks/hf_step.py, benchmarks/gpu_mfu.py) train it through the run harness
(lm/core/session.py), so what they time is lm's loop and engine on tokens they choose; a step_begin hook
times the steps and raises TimedStepsDone before the loop's last step (which would evaluate and write a
checkpoint), and Records keeps the loop's logged records in memory.
"""

import torch

from lm.core import objectives


class FixedBatches:
    def __init__(self, batches: list[dict[str, torch.Tensor]], dense_labels: bool):
        self.batches, self.index = batches, 0
        self.dense_labels = dense_labels  # every label a target (lm/core/loop.py train_step)

    def __iter__(self):
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        batch = self.batches[self.index % len(self.batches)]
        self.index += 1
        return [batch]

    def state_dict(self) -> dict:
        return {"index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.index = state["index"]


class FixedTask:
    best_metric = None

    def __init__(self, batches: list[dict[str, torch.Tensor]], dense_labels: bool = True):
        self.batches = FixedBatches(batches, dense_labels)

    def loss(self, model, batch: dict[str, torch.Tensor], metrics=None) -> torch.Tensor:
        return objectives.loss(model, batch, metrics)

    def evaluate(self, engine, step: int) -> dict:
        return {}

    def on_best(self, engine, step: int, record: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)


class TimedStepsDone(Exception):
    """Raised by a benchmark's step_begin hook once its timed steps are done: the run ends there."""


class Records:
    """A tracker that keeps the loop's records in memory (the benchmarks read the logged loss)."""

    def __init__(self):
        self.records: list[dict] = []

    def log(self, record: dict) -> None:
        self.records.append(record)

    def close(self, failed: bool = False) -> None:
        pass
