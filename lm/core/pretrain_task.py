"""Pretraining as a `lm.core.task.TrainTask`: packed token windows in, token-mean val loss out.

Each optimizer step takes grad_accum micro-batches of the train loader; evaluation is the token-mean
loss over at most eval_batches micro-batches of the val loader (lm.core.loop.evaluate). There is
no "best": pretraining keeps its latest checkpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from lm.config_base import ConfigError
from lm.core import objectives
from lm.core.elastic import SAMPLES_PER_STEP, kept_grad_accum
from lm.core.tracking import perplexity

log = logging.getLogger("lm")


class LoaderSteps:
    """grad_accum micro-batches of a resumable loader per step; its state is the loader's own."""

    def __init__(self, loader, grad_accum: int):
        self.loader, self.grad_accum = loader, grad_accum
        # every label a target, the same shapes on every rank: the loop knows the global label count
        # without an all-reduce (lm/core/loop.py train_step)
        self.dense_labels = bool(getattr(loader, "dense_labels", False))
        self._it = None

    def __iter__(self):
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        if self._it is None:  # created on first use: after load_state_dict, from the restored position
            self._it = iter(self.loader)
        return [next(self._it) for _ in range(self.grad_accum)]

    @property
    def samples_per_step(self):
        """The global batch G = micro-batch x grad_accum x world size (None: a loader without those sizes)."""
        b, w = getattr(self.loader, "micro_batch_size", None), getattr(self.loader, "world_size", None)
        return None if b is None or w is None else b * w * self.grad_accum

    def state_dict(self) -> dict:
        state = self.loader.state_dict()
        return state if self.samples_per_step is None else {**state, SAMPLES_PER_STEP: self.samples_per_step}

    def load_state_dict(self, state: dict) -> None:
        """The loader continues at the saved global position; another global batch would put other samples
        in each step than the run had (lm/core/elastic.py), so it is refused."""
        saved = state.get(SAMPLES_PER_STEP)
        if saved is not None and self.samples_per_step is not None and saved != self.samples_per_step:
            kept = kept_grad_accum(saved, self.loader.micro_batch_size, self.loader.world_size)
            raise ConfigError(
                f"the checkpoint trained on {saved} sequences per step, this run on "
                f"{self.samples_per_step}: set train.grad_accum={kept} (or leave train.grad_accum "
                f"and train.global_batch_size as the run had them)"
            )
        self.loader.load_state_dict(state)
        self._it = None


class PretrainTask:
    best_metric = None

    def __init__(self, train_loader, val_loader: Iterable, grad_accum: int, eval_batches: int):
        self.batches = LoaderSteps(train_loader, grad_accum)
        self.val_loader, self.eval_batches = val_loader, eval_batches

    def loss(self, model, batch: dict[str, torch.Tensor], metrics=None) -> torch.Tensor:
        return objectives.loss(model, batch, metrics)

    def evaluate(self, engine, step: int) -> dict:
        from lm.core.loop import evaluate

        val_loss = evaluate(engine, self.val_loader, self.eval_batches)
        if engine.is_main:
            log.info("step %d: val_loss %.4f, val_ppl %.2f", step, val_loss, perplexity(val_loss))
        return {"val_loss": val_loss, "val_ppl": perplexity(val_loss)}

    def on_best(self, engine, step: int, record: dict) -> None:  # best_metric is None: never called
        pass

    def state_dict(self) -> dict:  # the checkpoint's loader state, as before tasks existed
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)
