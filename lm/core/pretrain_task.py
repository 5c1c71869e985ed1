"""Pretraining as a `lm.core.task.TrainTask`: packed token windows in, token-mean val loss out.

Each optimizer step takes grad_accum micro-batches of the train loader (during a batch ramp fewer: growing
linearly, grad_accum / batch_ramp_steps rounded up and at least 1 at the first step, to grad_accum at step
batch_ramp_steps); evaluation is the token-mean loss over the first eval_batches x micro_batch_size x world size
windows of the val loader's fixed order (lm.core.loop.evaluate; a uniform sample of the split: lm.data.packed), the
same windows at every pass. That count is fixed when the run starts and kept in the task state, so a resume on
another world size scores the same windows (lm/core/elastic.py). There is no "best": pretraining keeps its latest
checkpoints.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from typing import Protocol, cast

import torch

from lm.config_base import ConfigError
from lm.core import objectives
from lm.core.elastic import SAMPLES_PER_STEP, kept_grad_accum, kept_val_windows
from lm.core.tracking import perplexity

log = logging.getLogger("lm")


RAMP_STEP = "ramp_step"  # the task state's count of steps taken, while a batch ramp runs
# ... and the world size it ran on: the ramp counts micro-batches per rank, so its steps hold other samples on
# another world size (an elastic resume waits for the ramp's end)
RAMP_WORLD = "ramp_world_size"
# How validation reads the val split: a fixed uniform sample (lm.data.packed VAL_ORDER) since 2026-11-30, its first
# train.eval_batches micro-batches before. A checkpoint without this key may be of the earlier reading.
VAL_SAMPLE, FIXED_SAMPLE = "val_sample", "fixed"
# How many of those windows a pass scores, fixed when the run starts (since 2026-12-01: before, train.eval_batches
# micro-batches per rank, so a resume on another world size scored another number), and the train.eval_batches it
# was fixed from: that setting changed on resume asks for another sample.
VAL_WINDOWS, VAL_EVAL_BATCHES = "val_windows", "val_eval_batches"


def ramp_accum(step: int, grad_accum: int, ramp_steps: int) -> int:
    """Micro-batches at 0-based `step` of a linear ramp to grad_accum over ramp_steps steps: ceil(grad_accum x
    (step + 1) / ramp_steps), at least 1 (so 1 at the first step only when ramp_steps >= grad_accum)."""
    if step >= ramp_steps:
        return grad_accum
    return max(1, math.ceil(grad_accum * (step + 1) / ramp_steps))


class LoaderSteps:
    """grad_accum micro-batches of a resumable loader per step (fewer during a batch ramp); its state is the
    loader's own, plus the steps taken while a ramp is set."""

    def __init__(self, loader, grad_accum: int, ramp_steps: int = 0):
        self.loader, self.grad_accum, self.ramp_steps, self.step = loader, grad_accum, ramp_steps, 0
        # every label a target, the same shapes on every rank: the loop knows the global label count
        # without an all-reduce (lm/core/loop.py train_step)
        self.dense_labels = bool(getattr(loader, "dense_labels", False))
        self._it = None

    def __iter__(self):
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        if self._it is None:  # created on first use: after load_state_dict, from the restored position
            self._it = iter(self.loader)
        n = ramp_accum(self.step, self.grad_accum, self.ramp_steps) if self.ramp_steps else self.grad_accum
        micro = [next(self._it) for _ in range(n)]
        self.step += 1
        return micro

    @property
    def samples_per_step(self):
        """The global batch G = micro-batch x grad_accum x world size (None: a loader without those sizes);
        after the ramp, if there is one."""
        b, w = getattr(self.loader, "micro_batch_size", None), getattr(self.loader, "world_size", None)
        return None if b is None or w is None else b * w * self.grad_accum

    def state_dict(self) -> dict:
        state = self.loader.state_dict()
        state = state if self.samples_per_step is None else {**state, SAMPLES_PER_STEP: self.samples_per_step}
        world = getattr(self.loader, "world_size", None)
        return {**state, RAMP_STEP: self.step, RAMP_WORLD: world} if self.ramp_steps else state

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
        if self.ramp_steps and RAMP_STEP not in state:
            raise ConfigError(
                f"train.batch_ramp_steps={self.ramp_steps} on a run that was started without a ramp: resume "
                f"it with train.batch_ramp_steps=0, or start a new run_dir"
            )
        self.step = state.get(RAMP_STEP, 0)
        self._check_ramp_world(state.get(RAMP_WORLD))
        self.loader.load_state_dict({k: v for k, v in state.items() if k not in (RAMP_STEP, RAMP_WORLD)})
        self._it = None

    def _check_ramp_world(self, saved_world: int | None) -> None:
        """Refuse a resume inside the ramp on another world size: ramp_accum counts micro-batches per rank, so
        the ramp's remaining steps would hold other numbers of samples than the run's (None: not recorded)."""
        world = getattr(self.loader, "world_size", None)
        if not self.ramp_steps or self.step >= self.ramp_steps or saved_world is None or saved_world == world:
            return
        raise ConfigError(
            f"the checkpoint is at step {self.step} of its batch ramp (train.batch_ramp_steps={self.ramp_steps}), "
            f"which counts micro-batches per rank: on {world} rank(s) instead of {saved_world} its steps would hold "
            f"other samples than the run's. Resume on {saved_world} rank(s) until step {self.ramp_steps}, then on any"
        )


class WindowedVal(Protocol):
    """A val loader that scores the first given number of windows of a fixed order (lm.data.packed.PackedLoader)."""

    micro_batch_size: int
    world_size: int
    val_windows: int  # a whole pass's

    def first_windows(self, windows: int) -> Iterator[dict]: ...


class ValSample:
    """How many val windows a pass scores: fixed when the run starts (train.eval_batches micro-batches on every rank,
    at most the split), recorded in the task state, and kept on another world size (lm/core/elastic.py)."""

    def __init__(self, loader: WindowedVal, eval_batches: int):
        self.loader, self.eval_batches = loader, eval_batches
        self.recorded = min(eval_batches * loader.micro_batch_size * loader.world_size, loader.val_windows)
        self.scored = self.recorded  # differs after a resume on ranks that cannot split the recorded count

    def batches(self) -> tuple[Iterator[dict], int]:
        """The pass's micro-batches and how many each rank runs."""
        per_micro_step = self.loader.micro_batch_size * self.loader.world_size
        return self.loader.first_windows(self.scored), math.ceil(self.scored / per_micro_step)

    def state_dict(self) -> dict:
        return {VAL_WINDOWS: self.recorded, VAL_EVAL_BATCHES: self.eval_batches}

    def load_state_dict(self, state: dict) -> None:
        """Score the run's recorded windows on this world size (kept_val_windows: the nearest count its ranks split
        evenly, said when it differs); a checkpoint without the record, or a changed train.eval_batches, fixes this
        run's count from here on."""
        saved, world = state.get(VAL_WINDOWS), self.loader.world_size
        if saved is None:
            log.warning(
                "the checkpoint does not record how many val windows its validation scores (written before "
                "2026-12-01, when train.eval_batches counted micro-batches per rank): it scores %d from here on, "
                "so its val_loss may step at this resume if the run ran on another world size than %d",
                self.scored,
                world,
            )
        elif state.get(VAL_EVAL_BATCHES) != self.eval_batches:  # asked for another sample: this run's count
            log.info(
                "train.eval_batches %s -> %d: validation scores %d val windows from here on (%d before)",
                state.get(VAL_EVAL_BATCHES),
                self.eval_batches,
                self.scored,
                saved,
            )
        else:
            self.recorded, self.scored = saved, kept_val_windows(saved, world, self.loader.val_windows)
            if self.scored != saved:
                log.warning(
                    "validation scores %d val windows on %d rank(s) instead of the run's %d (the nearest count "
                    "they split evenly: %+d windows), so its val_loss may step at this resume",
                    self.scored,
                    world,
                    saved,
                    self.scored - saved,
                )


class PretrainTask:
    """The TrainTask (lm/core/task.py) of lm train: LoaderSteps' micro-batches, the objective's loss, val loss."""

    best_metric = None

    def __init__(
        self,
        train_loader,
        val_loader: Iterable,
        grad_accum: int,
        eval_batches: int,
        ramp_steps: int = 0,
        perplexity: bool = True,
    ):
        """perplexity: val_ppl = exp(val_loss) is logged too (False: a loss that is no per-token NLL, ELECTRA's)."""
        self.batches = LoaderSteps(train_loader, grad_accum, ramp_steps)
        self.val_loader, self.eval_batches, self.perplexity = val_loader, eval_batches, perplexity
        # None: a loader without first_windows (the tests' synthetic ones) reads eval_batches micro-batches per rank
        windowed = hasattr(val_loader, "first_windows")
        self.val_sample = ValSample(cast(WindowedVal, val_loader), eval_batches) if windowed else None

    def loss(self, model, batch: dict[str, torch.Tensor], metrics=None) -> torch.Tensor:
        return objectives.loss(model, batch, metrics)

    def evaluate(self, engine, step: int) -> dict:
        from lm.core.loop import evaluate

        if self.val_sample is None:
            val_loss = evaluate(engine, self.val_loader, self.eval_batches)
        else:
            val_loss = evaluate(engine, *self.val_sample.batches())
        record = {"val_loss": val_loss} | ({"val_ppl": perplexity(val_loss)} if self.perplexity else {})
        if engine.is_main:
            ppl = f", val_ppl {record['val_ppl']:.2f}" if self.perplexity else ""
            log.info("step %d: val_loss %.4f%s", step, val_loss, ppl)
        return record

    def on_best(self, engine, step: int, record: dict) -> None:  # best_metric is None: never called
        pass

    def state_dict(self) -> dict:  # the loader's position (+ the batch ramp's step), as the checkpoint stores it
        state = {**self.batches.state_dict(), VAL_SAMPLE: FIXED_SAMPLE}
        if self.val_sample is not None:
            state |= self.val_sample.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if VAL_SAMPLE not in state:
            log.warning(
                "the checkpoint does not say how its validation read the val split: a run started before "
                "2026-11-30 scored the split's first train.eval_batches micro-batches, and scores a fixed sample of "
                "it from here on, so its val_loss may step at this resume (training is unchanged)"
            )
        elif self.val_sample is not None:
            self.val_sample.load_state_dict(state)
        own = (VAL_SAMPLE, VAL_WINDOWS, VAL_EVAL_BATCHES)
        self.batches.load_state_dict({k: v for k, v in state.items() if k not in own})
