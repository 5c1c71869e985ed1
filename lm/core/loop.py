"""The training loop, shared by pretraining and finetuning, the same for every engine and task.

    for each optimizer step:
        set the learning rate (a pure function of the step)
        take the task's micro-batches for the step (prefetched by a background thread: lm/core/prefetch.py)
        forward + backward each, weighted by its share of the step's label tokens over all ranks
            (lm/core/objectives.py says why); a NaN/inf loss poisons the step's gradients
        engine.step(): clip, update unless the gradient norm is NaN/inf (decided on the device), zero gradients
        at sync points only: apply the NaN/inf policy (to each step's loss and gradient norm), log, evaluate
            (and keep the best), checkpoint

No host sync per step. Each step leaves its loss and gradient norm on the device; the host reads them
(two all-reduces, one copy) only at sync points: log steps, evaluations, checkpoints, the
last step, and a preemption stop. The NaN/inf guarantee (a non-finite loss never updates the weights) holds without a
per-step check: a rank whose loss is non-finite multiplies its backward by NaN, so every gradient, and
after the engine's reduction every rank's gradient norm, is NaN, and the engine skips the update on the
device (fused AdamW's `found_inf`, as torch's GradScaler drives it: lm/engine/base.py). A finite loss
can still give a NaN/inf gradient norm (a too-high learning rate overflows the gradients): that update
is skipped on the device too, and the policy treats the step like a non-finite loss, since a run whose
every update is skipped would otherwise finish with frozen weights and exit 0 (under fp16's loss scaler
such a step is an overflow the scaler handles, not counted). The policy (stop, or skip up to
max_nonfinite in a row, each logged) is then applied at the next sync point, step by step, as it would
have been at each step; the steps in between trained on with their own (finite) updates. Engines that
cannot skip on the device (DeepSpeed) check each step's loss on the host before their update, and its
gradient norm at the next sync.
The preemption flag is checked every train.stop_check_interval steps (a collective), and at each log,
evaluation or checkpoint step but the last, beside the token count; every rank checks at the same steps, so
every rank stops at the same step.
A signal after the last check (in the run's last steps: its final evaluation and checkpoint) lets the run complete;
the next loop of the same process (lm finetune's next task/seed, lm transfer's finetuning) then stops before its
first step, so the request is not lost with the finished loop's handlers.
Ctrl-C (SIGINT) is a stop request like SIGTERM; a second Ctrl-C aborts at once (Aborted, a KeyboardInterrupt
naming the checkpoint the same command resumes from, which the console scripts print on one line:
lm/cli/errors.py entry).

What is trained is a `lm.core.task.TrainTask` (pretraining: lm/core/pretrain_task.py; GLUE: lm/glue/trainer.py).
Everything engine-specific (no_sync, accumulation boundaries, loss scaling, sharding) is behind
`engine`; everything about files is behind `tracker` and `checkpointer`.
"""

import functools
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

from lm.constants import IGNORE_INDEX
from lm.core import objectives
from lm.core.config import TrainConfig
from lm.core.hooks import Hooks
from lm.core.prefetch import Prefetcher
from lm.core.setup import FILE_ONLY
from lm.core.task import EvalFailed
from lm.core.tracking import ModelMetrics, memory_gib, mfu
from lm.engine import dist as dist_utils

log = logging.getLogger("lm")


class LossDiverged(RuntimeError):
    """The loss or the gradient norm became NaN/inf; no update was applied and the last checkpoint is intact."""


class Aborted(KeyboardInterrupt):
    """A second Ctrl-C stopped the run at once, without a checkpoint of the step in flight; the message says what
    the same command resumes from (the apps print it on the one line lm/cli/errors.py's entry writes)."""


def aborted(checkpointer) -> Aborted:
    latest = checkpointer.latest() if checkpointer is not None else None
    if latest is None:
        return Aborted("no checkpoint was written yet: the same command starts the run again")
    return Aborted(f"run the same command to resume from {latest}")


class Preempted(RuntimeError):
    """SIGTERM or SIGUSR1 (a scheduler's preemption or time-limit warning) or SIGINT (Ctrl-C) arrived; the step
    in flight finished and was checkpointed, so the same command resumes without losing it."""


@dataclass
class State:
    step: int = 0  # optimizer steps done
    tokens: int = 0  # input tokens seen, all ranks
    nonfinite: int = 0  # consecutive steps skipped for a NaN/inf loss or gradient norm
    best: float | None = None  # the task's best_metric so far (None: no evaluation yet, or no best_metric)

    @classmethod
    def from_checkpoint(cls, trainer: dict[str, Any]) -> "State":
        return cls(step=trainer["step"], tokens=trainer["tokens"], best=trainer.get("best"))

    def to_checkpoint(self) -> dict[str, Any]:
        out = asdict(self)
        if out["best"] is None:  # pretraining (no best_metric): trainer.json keeps the layout it had without `best`
            del out["best"]
        return out


@dataclass(frozen=True)  # a value: safe as run()'s default argument
class Speed:
    """Per-device FLOPs per token and peak, for MFU (peak None = unknown, MFU not reported)."""

    flops_per_token: float = 0.0
    peak_flops: float | None = None


@dataclass
class _Pending:
    """What the steps since the last sync point left on the device, and the host's view of the last one."""

    first_step: int = 0  # 1-based step number of losses[0]
    losses: list[torch.Tensor] = field(default_factory=list)  # each step's local share of its global loss
    tokens: int = 0  # this rank's input tokens since the last sync point
    grad_norm: torch.Tensor = field(default_factory=lambda: torch.tensor(math.nan))  # the last step's (device)
    norms: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (1-based step, its gradient norm)
    last_loss: float = math.nan  # the last synced step's global loss


def run(
    cfg: TrainConfig,
    engine,
    task,
    lr_at: Callable[[int], float],
    tracker,
    checkpointer,
    state: State,
    speed: Speed = Speed(),
    evals: Sequence = (),
    hooks: Hooks | None = None,
) -> State:
    """Train `task` (lm.core.task.TrainTask) from `state` to cfg.max_steps; cfg gives the intervals and the NaN policy.
    evals: extra evaluations at their own intervals (lm.core.task.EvalCallback: the GLUE probes); `hooks`
    (lm.core.hooks) are called at their points."""
    _stop_left_over()
    source = task.batches
    task.batches = Prefetcher(source, engine.device, cfg.prefetch)  # task.state_dict() reads the consumed position
    try:
        with _StopSignals() as stop:
            try:
                state = _run(
                    cfg, engine, task, lr_at, tracker, checkpointer, state, speed, stop, evals, hooks or Hooks()
                )
            except KeyboardInterrupt:
                raise  # a second Ctrl-C aborts at once, without the write in flight (a .tmp-* directory at worst)
            except BaseException:
                _finish_write(checkpointer)  # the checkpoint in flight still completes; the run's error wins
                raise
            checkpointer.wait()  # the final checkpoint is complete (or its error raised) when the run returns
            _leave_over(stop.name)
            return state
    except KeyboardInterrupt as e:  # the second Ctrl-C (_StopSignals): say where the same command resumes from
        if isinstance(e, Aborted):
            raise
        raise aborted(checkpointer) from None
    finally:
        task.batches.close()
        task.batches = source


def _run(
    cfg, engine, task, lr_at, tracker, checkpointer, state: State, speed: Speed, stop, evals, hooks: Hooks
) -> State:
    bar = _progress_bar(cfg, engine, state.step)
    meter = _Meter()
    pending = _Pending(first_step=state.step + 1)
    dense = task.batches.dense_labels
    model_metrics = ModelMetrics()  # the model's own metrics (MoE load), logged as means per log interval
    for step in range(state.step, cfg.max_steps):
        for hook in hooks.step_begin:
            hook(step)
        lr = lr_at(step)
        engine.set_lr(lr)
        t0 = time.perf_counter()  # the step's time includes fetching its batches: data is part of the cost
        micro = next(task.batches)
        for hook in hooks.step_batches:
            hook(step, micro)
        loss = train_step(
            engine,
            micro,
            loss_fn=task.loss,
            dense_labels=dense,
            metrics=model_metrics,
            after_backward=[functools.partial(hook, step) for hook in hooks.after_backward],
        )
        pending.losses.append(loss)
        pending.tokens += task.batches.tokens  # counted on the host (lm/core/prefetch.py): no device read
        if engine.skips_nonfinite_updates:
            pending.grad_norm = norm = engine.step()
            pending.norms.append((step + 1, norm))
        else:  # the engine cannot skip on the device: the policy acts on the host before the update (a sync)
            meter.tokens += _sync(cfg, engine, state, pending, checkpointer)[0]
            if math.isfinite(pending.last_loss):
                pending.grad_norm = norm = engine.step()
                pending.norms.append((step + 1, norm))  # checked at the next sync
            else:
                pending.grad_norm = engine.skip_step()
        state.step = step + 1

        # Is this step a sync point? There the host reads the pending steps (_sync), then logs, evaluates, saves.
        last = state.step == cfg.max_steps
        log_now = state.step % cfg.log_interval == 0 or last
        eval_now = (cfg.eval_interval and state.step % cfg.eval_interval == 0) or last
        saved = (cfg.ckpt_interval and state.step % cfg.ckpt_interval == 0) or last
        extra = [e for e in evals if e.due(state.step, last)]  # a sync point too: their records carry the tokens
        stopping = False
        if log_now or eval_now or saved or extra:
            tokens, stopping = _sync(cfg, engine, state, pending, checkpointer, stop, check_stop=not last)
            meter.tokens += tokens
        elif state.step % cfg.stop_check_interval == 0 and stop.requested():
            meter.tokens += _sync(cfg, engine, state, pending, checkpointer)[0]  # the policy before the checkpoint
            stopping = True
        meter.seconds += time.perf_counter() - t0  # with the sync: what the device took for these steps
        meter.steps += 1

        if log_now:
            record = {
                "step": state.step,
                "tokens": state.tokens,
                "loss": pending.last_loss,
                "lr": lr,
                "grad_norm": float(pending.grad_norm),
                **meter.rates(speed, engine.world_size),
                "memory": round(memory_gib(engine.device), 4),
                **model_metrics.pop(dist_utils.all_reduce_sum),
            }
            tracker.log(record)
            _show(bar, record, engine)
        if eval_now:
            _evaluate(engine, task, tracker, state)
        try:
            for e in extra:
                tracker.log({"step": state.step, "tokens": state.tokens, **e(engine, state.step)})
        except EvalFailed as e:  # a probe or harness pass failed: the training up to here is kept, then it ends
            path = checkpointer.save(state.to_checkpoint(), task.state_dict())
            checkpointer.wait()
            log.error(
                "%s; the training up to step %d is saved in %s (the same command goes on from it)", e, state.step, path
            )
            raise e.cause or e from None
        path = checkpointer.save(state.to_checkpoint(), task.state_dict()) if saved else None
        if stopping:  # never at the last step (check_stop=not last): a signal then is left over to the next loop
            path = path or checkpointer.save(state.to_checkpoint(), task.state_dict())  # unless this step saved
            checkpointer.wait()  # an asynchronous write completes before the process stops
            raise Preempted(
                f"{stop.name} received: stopped after step {state.step} with checkpoint {path}; "
                f"run the same command to resume"
            )
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return state


def _finish_write(checkpointer) -> None:
    """Wait for a checkpoint write in flight while another error ends the run; its own failure is logged."""
    try:
        checkpointer.wait()
    except Exception as e:  # noqa: BLE001 - the error that ended the run is the one raised
        log.error("the checkpoint written in the background failed too: %s", e)


def _sync(
    cfg: TrainConfig,
    engine,
    state: State,
    pending: _Pending,
    checkpointer,
    stop: Optional["_StopSignals"] = None,
    check_stop: bool = False,
) -> tuple[int, bool]:
    """The host catches up with the device: each pending step's global loss (one all-reduce) and gradient norm
    (global already: every rank computed it from the reduced gradients), read in one copy; the NaN/inf policy
    applied to each step in order; state.tokens (a second all-reduce, of the token count, with check_stop the stop
    flag, and whether a background checkpoint write failed on any rank: then every rank raises its error here, not a
    whole ckpt_interval later at the next save, training on while no checkpoint can be written).
    Returns (the global input tokens of the pending steps, whether the ranks agreed to stop)."""
    losses = dist_utils.all_reduce_sum(torch.stack(pending.losses)) if pending.losses else None  # (n,) global losses
    asked = stop if check_stop else None
    asking = float(asked is not None and asked.name is not None)
    flags = torch.tensor([pending.tokens, asking, float(checkpointer.write_failed())], dtype=torch.float64)
    dist_utils.all_reduce_sum(flags)
    if flags[2] > 0:  # every rank's write failed (they agreed inside it): wait() raises it, on every rank
        checkpointer.wait()
    tokens, stopping = int(flags[0]), bool(asked is not None and asked.agree(float(flags[1]) > 0))
    parts = [] if losses is None else [losses.float()]
    parts += [torch.stack([n.detach().float().to(engine.device) for _, n in pending.norms])] if pending.norms else []
    read = torch.cat(parts).tolist() if parts else []  # one device-to-host copy
    values, norm_values = read[: len(pending.losses)], read[len(pending.losses) :]
    by_step = {pending.first_step + i: [loss, None] for i, loss in enumerate(values)}
    for (step, _), norm in zip(pending.norms, norm_values):
        by_step.setdefault(step, [None, None])[1] = norm
    for step in sorted(by_step):
        loss, norm = by_step[step]
        _policy(cfg, engine, state, step, loss, norm, checkpointer)
    if values:
        pending.last_loss = values[-1]
    state.tokens += tokens
    pending.losses, pending.tokens, pending.first_step = [], 0, pending.first_step + len(values)
    pending.norms = []
    return tokens, stopping


def _policy(
    cfg: TrainConfig, engine, state: State, step: int, loss: float | None, norm: float | None, checkpointer
) -> None:
    """What a NaN/inf loss or gradient norm at `step` does (its update was already skipped): stop, or skip while
    allowed. None: not read at this sync (DeepSpeed reads a step's loss before its update, its norm after)."""
    bad_loss = loss is not None and not math.isfinite(loss)
    bad_norm = norm is not None and not math.isfinite(norm) and not engine.scales_loss  # fp16: the scaler's
    if not (bad_loss or bad_norm):
        state.nonfinite = 0
        return
    state.nonfinite += 1
    what = (
        f"loss is {loss}"
        if bad_loss
        else f"gradient norm is {norm} with a finite loss" + (f" ({loss:.4g})" if loss is not None else "")
    )
    applied = (
        "no update was applied"
        if bad_loss or engine.skips_nonfinite_updates
        else "its update may have reached the weights"
    )
    if cfg.on_nonfinite == "stop" or state.nonfinite > cfg.max_nonfinite:
        try:
            checkpointer.wait()  # an asynchronous write in flight: the message names it once `latest` does
        except Exception as e:  # that write failed: no new checkpoint to name; the divergence stays the error
            log.error("the checkpoint write in flight failed: %s", e)
        latest = checkpointer.latest() if engine.is_main else None
        seen = (
            f" (seen at the sync point after step {state.step}; the steps between trained on, skipping "
            f"non-finite updates, in memory only)"
            if state.step > step
            else ""
        )
        raise LossDiverged(
            f"{what} at step {step}; {applied}"
            + (f" and the last good checkpoint {latest} is intact" if latest else "")
            + (f" ({state.nonfinite} consecutive non-finite steps)" if state.nonfinite > 1 else "")
            + seen
            + ". Lower optim.lr, lengthen sched.warmup_steps, or "
            + ("set train.on_nonfinite=skip" if cfg.on_nonfinite == "stop" else "raise train.max_nonfinite")
        )
    if engine.is_main:
        log.warning("step %d: %s, update skipped (%d/%d in a row)", step, what, state.nonfinite, cfg.max_nonfinite)


def _evaluate(engine, task, tracker, state: State) -> None:
    """Log the task's metrics; when its best_metric improves on every earlier evaluation, call on_best."""
    record = task.evaluate(engine, state.step)
    tracker.log({"step": state.step, "tokens": state.tokens, **record})
    if task.best_metric is None:
        return
    value = record[task.best_metric]
    if state.best is None or value > state.best:
        state.best = value
        task.on_best(engine, state.step, record)


def train_step(
    engine,
    micro: list[dict[str, torch.Tensor]],
    loss_fn: Callable = objectives.loss,
    dense_labels: bool = False,
    metrics: ModelMetrics | None = None,
    after_backward: Sequence[Callable[[int], None]] = (),
):
    """Forward and backward over one step's micro-batches without a host sync; returns this rank's share of
    the step's global token-mean loss, a device tensor (the step's input tokens are counted on the host, before
    the copy: lm/core/prefetch.py). `loss_fn(model, batch, metrics)` adds the model's own metrics to `metrics`;
    each of `after_backward` gets the micro-batch's index.

    dense_labels: every label position is a target and every rank's micro-batches have the same shapes
    (packed clm/span batches), so the global label count is known on the host; otherwise the counts are
    summed over ranks on the device (one all-reduce per step when there are several ranks).
    """
    micro = [{k: v.to(engine.device, non_blocking=True) for k, v in b.items()} for b in micro]
    weights = _weights(micro, engine.world_size, dense_labels)
    total = torch.zeros((), device=engine.device)
    for i, batch in enumerate(micro):
        with engine.micro_step(last=i == len(micro) - 1):
            share = loss_fn(engine.model, batch, metrics) * weights[i]
            engine.backward(_poison_nonfinite(share))
        total += share.detach().float()
        for hook in after_backward:
            hook(i)
    return total


def _weights(micro: list[dict[str, torch.Tensor]], world_size: int, dense_labels: bool) -> list:
    """Each micro-batch's share of the step's global label tokens (python floats, or device scalars)."""
    if dense_labels:
        local = [b["labels"].numel() for b in micro]
        return objectives.weights(local, sum(local) * world_size)
    counts = torch.stack([(b["labels"] != IGNORE_INDEX).sum() for b in micro]).double()  # (n_micro,)
    total = dist_utils.all_reduce_sum(counts.sum().reshape(1))  # no labels at all gives 0/0 = NaN: the NaN policy
    return list((counts / total).float().unbind())


def _poison_nonfinite(share: torch.Tensor) -> torch.Tensor:
    """share, whose gradient is NaN everywhere when share is NaN/inf. Gradients, once reduced over ranks,
    then carry one rank's non-finite loss to every rank's gradient norm, which decides the skip on the
    device (an inf loss can have finite gradients, so the loss itself must taint them). x1.0 otherwise: exact."""
    return share * torch.where(torch.isfinite(share), 1.0, math.nan)


@torch.no_grad()
def evaluate(engine, val_loader: Iterable, max_batches: int) -> float:
    """Token-mean validation loss over at most max_batches micro-batches per rank.

    Every rank runs the same number of forwards (sharded engines all-gather inside each one), so the
    pass ends for all when any rank's split runs out.
    """
    engine.model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=engine.device)
    count = torch.zeros((), dtype=torch.float64, device=engine.device)
    batches = iter(val_loader)
    for _ in range(max_batches):
        batch = next(batches, None)
        if dist_utils.any_rank(batch is None):
            break
        assert batch is not None  # any_rank was true had this rank run out
        batch = {k: v.to(engine.device, non_blocking=True) for k, v in batch.items()}
        with engine.autocast():
            loss = objectives.loss(engine.model, batch)
        n = objectives.label_tokens(batch)
        loss_sum += loss.double() * n
        count += n
    engine.model.train()
    dist_utils.all_reduce_sum(loss_sum)
    dist_utils.all_reduce_sum(count)
    if count.item() == 0:
        raise ValueError("the validation split gave no batches; check the data's val split and train.seq_len")
    return float(loss_sum / count)


class _Meter:
    """Training time and tokens since the last logged step (validation and checkpoints excluded)."""

    def __init__(self):
        self.seconds, self.tokens, self.steps = 0.0, 0, 0

    def rates(self, speed: Speed, world_size: int) -> dict:
        tokens_per_s = self.tokens / self.seconds if self.seconds else 0.0
        out = {
            "tokens_per_s": round(tokens_per_s, 2),
            "steps_per_s": round(self.steps / self.seconds, 4) if self.seconds else 0.0,
            "mfu": mfu(speed.flops_per_token, tokens_per_s, speed.peak_flops, world_size),
        }
        self.seconds, self.tokens, self.steps = 0.0, 0, 0
        return out


def _progress_bar(cfg: TrainConfig, engine, start: int):
    if not (engine.is_main and cfg.progress and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.max_steps, initial=start, unit="step", dynamic_ncols=True)


def _show(bar, record: dict, engine) -> None:
    if not engine.is_main:
        return
    mfu_text = f", mfu {record['mfu']:.1%}" if record["mfu"] is not None else ""
    line = (
        f"step {record['step']}: loss {record['loss']:.4f}, lr {record['lr']:.3g}, "
        f"grad_norm {record['grad_norm']:.3f}, {record['tokens_per_s']:.0f} tok/s{mfu_text}, {record['memory']:.2f} GiB"
    )
    if bar:  # the bar shows the loss; train.log still gets the whole line
        bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
        FILE_ONLY.info("%s", line)
    else:  # no terminal: a log line instead of a bar
        log.info("%s", line)


class _StopSignals:
    """SIGTERM/SIGUSR1/SIGINT set a flag that the loop reads every train.stop_check_interval steps and at sync
    points, so a preempted job writes a checkpoint instead of losing up to ckpt_interval steps (SLURM sends
    SIGTERM, then SIGKILL after KillWait; launch/slurm.sbatch sends the ranks USR1 before the time limit). Ctrl-C
    stops the same way (Python's KeyboardInterrupt would leave a traceback and no checkpoint); a second
    Ctrl-C raises KeyboardInterrupt at once. Every rank stops at the same step: the flag is OR-reduced over
    ranks at steps every rank checks."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self):
        self.name: str | None = None
        self.interrupted = False  # a first Ctrl-C arrived
        self.previous = {}

    def __enter__(self):
        global _signals
        if threading.current_thread() is threading.main_thread():  # signal.signal works only there
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)
        _signals = self
        return self

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            if self.interrupted:
                raise KeyboardInterrupt  # the second Ctrl-C: abort now (the apps print one line)
            self.interrupted = True
            if os.environ.get("RANK", "0") == "0":  # os.write: unbuffered, safe inside a signal handler
                os.write(
                    2,
                    b"\nCtrl-C: stopping after the step in flight with a checkpoint (Ctrl-C again aborts "
                    b"at once, without it)\n",
                )
            self.name = "SIGINT (Ctrl-C)"
            return
        self.name = signal.Signals(signum).name

    def requested(self) -> bool:
        return self.agree(dist_utils.any_rank(self.name is not None))

    def agree(self, stop: bool) -> bool:
        """Record the ranks' OR-reduced flag."""
        if stop and self.name is None:
            self.name = "a stop signal (on another rank)"
        return stop

    def __exit__(self, *exc) -> None:
        global _signals
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        _signals = None


_signals: _StopSignals | None = None  # the running loop's

# A stop signal that reached a loop after its last stop check (in its last steps): that loop completed anyway, so
# the next loop of the process (lm finetune's next task/seed pair, lm transfer's finetuning after its pretraining)
# stops before its first step instead of dropping the request with the finished loop's signal handlers.
_unheeded: str | None = None


def _leave_over(name: str | None) -> None:
    global _unheeded
    _unheeded = name


def _stop_left_over() -> None:
    """Raise Preempted (on every rank: a collective, as every rank starts each loop) when a stop signal reached an
    earlier loop of this process on some rank after that loop's last stop check; nothing of this loop ran yet."""
    global _unheeded
    name, _unheeded = _unheeded, None
    if dist_utils.any_rank(name is not None):
        raise Preempted(
            f"{name or 'a stop signal (on another rank)'} received in the last steps of the run before, which "
            f"completed with its checkpoint; stopped before the next one started: run the same command to resume"
        )


def stop_requested() -> bool:
    """Whether a stop signal (SIGTERM, SIGUSR1, Ctrl-C) reached the loop running in this process: a plugin that
    parks a step (benchmarks/fault_pause.py) lets it go on, and the loop stops after it as it would have."""
    return _signals is not None and _signals.name is not None
