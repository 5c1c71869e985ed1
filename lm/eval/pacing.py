"""Downstream evaluations in the training loop, paced by a budget: the GLUE probes (lm/eval/probe.py) and the
LM Evaluation Harness's tasks (lm/eval/harness_loop.py) run every `interval` steps and at the last step, but
a pass due at an interval step is postponed while it would take more than `budget` of the training time
(train.downstream_budget; within_budget says how). Rank 0 decides from its clock and every rank follows its
decision, since a due step is a sync point on every rank. Budget 0: every `interval` steps.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("lm")


def within_budget(spent: float, cost: float, elapsed: float, remaining: float, budget: float) -> bool:
    """Whether one more pass of `cost` seconds keeps the passes within `budget` (a share of training time):
    the passes so far plus this one within the budget of the training time so far (`elapsed`, passes
    excluded), and, with the last step's pass (same cost) added, within the budget of the whole run's projected
    training time (`elapsed` + `remaining`). The first keeps the passes spread over the run; the second keeps
    room for the final pass, which always runs."""
    return spent + cost <= budget * elapsed and spent + 2 * cost <= budget * (elapsed + remaining)


class PacedEval:
    """The budget half of an lm.core.task.EvalCallback: due() and the timing of each pass. A subclass names
    itself (`what`) and implements evaluate(engine, step) -> record, which runs on rank 0 only.

    A pass's cost is the last pass's measured seconds; before the first, `work_tokens` (the pass's forward
    tokens, when known) at a third of a training step's cost per token (forward only), else nothing: the
    first pass then runs at its first due step. `setup`: the seconds spent setting the evaluation up before
    training (reading and encoding its data, importing its libraries), counted against the budget like a pass."""

    what = "evaluation"

    def __init__(
        self,
        interval: int,
        budget: float = 0.0,
        max_steps: int = 0,
        tokens_per_step: int = 1,
        work_tokens: int | None = None,
        setup: float = 0.0,
        clock=time.perf_counter,
    ):
        self.interval, self.budget, self.max_steps = interval, budget, max_steps
        self.tokens_per_step, self.work_tokens, self.clock = tokens_per_step, work_tokens, clock
        self.start: tuple[int, float] | None = None  # (step, time) of the first step seen by this process
        self.setup = setup  # before the first step: charged to the budget, not part of `elapsed`
        self.spent = 0.0  # seconds of the passes so far
        self.cost: float | None = None  # the last pass's seconds
        self.postponed = 0

    def due(self, step: int, last: bool) -> bool:
        if self.start is None:
            self.start = (step - 1, self.clock())  # called after `step`: its own time is not counted
        if last:
            return True
        if not self.interval or step % self.interval:
            return False
        if not self.budget:
            return True
        from lm.engine import dist as dist_utils

        return dist_utils.broadcast_object(self._affordable(step))  # rank 0's clock decides for every rank

    def _affordable(self, step: int) -> bool:
        first_step, t0 = self.start or (step - 1, self.clock())
        elapsed = self.clock() - t0 - self.spent
        step_seconds = elapsed / max(step - first_step, 1)
        cost = self.cost
        if cost is None and self.work_tokens is not None:
            cost = step_seconds * self.work_tokens / (3 * self.tokens_per_step)
        if cost is None:
            return True
        remaining = step_seconds * max(self.max_steps - step, 0)
        ok = within_budget(self.setup + self.spent, cost, elapsed, remaining, self.budget)
        if not ok:
            self.postponed += 1
            (log.info if self.postponed == 1 else log.debug)(
                "step %d: %s postponed: a pass (~%.1f s) would take more than train.downstream_budget=%g of the "
                "training time (train.downstream_budget=0 runs it at every interval)",
                step,
                self.what,
                cost,
                self.budget,
            )
        return ok

    def __call__(self, engine, step: int) -> dict:
        from lm.core.task import EvalFailed
        from lm.engine import dist as dist_utils

        t0 = self.clock()
        record, failure = {}, None
        if engine.is_main:
            try:
                record = self.evaluate(engine, step)
            except Exception as e:  # noqa: BLE001 - told to every rank, and the loop saves the training first
                failure = e
        why = dist_utils.broadcast_object(None if failure is None else f"{type(failure).__name__}: {failure}")
        if why is not None:
            raise EvalFailed(self.what, step, why, failure)
        self.cost = self.clock() - t0
        self.spent += self.cost
        return record

    def evaluate(self, engine, step: int) -> dict:
        raise NotImplementedError


def pacing_of(train_cfg, engine) -> dict:
    """PacedEval's keyword arguments for this run (train.downstream_budget)."""
    return dict(
        budget=train_cfg.downstream_budget,
        max_steps=train_cfg.max_steps,
        tokens_per_step=train_cfg.micro_batch_size * train_cfg.grad_accum * train_cfg.seq_len * engine.world_size,
    )
