"""The run harness: what every training run does around the loop, written once. lm train (lm/cli/train.py),
each GLUE task/seed (lm/glue/run.py; lm transfer runs both) and the speed benchmarks (benchmarks/hf_step.py,
benchmarks/gpu_mfu.py) train through it, so a benchmark times what users run.

    engine = make_engine(run, instantiate, train_cfg, dist)   # lm.core.setup: refuses what the engine cannot do
    with Session(train_cfg, engine, task, run_dir, config_yaml) as session:
        session.build(lambda: build_model(model_cfg), seed, optim_cfg)  # same weights on every rank, then wrap
        session.resume_or_start(resume=True)     # the latest checkpoint: found, checked against the config, loaded
        session.track(logger_cfg, config)         # rank 0's metrics sinks, continued from the resumed step
        state = session.train(lr_at, speed)       # lm.core.loop.run, then every rank waits for the others
    # leaving the block closes the trackers, the engine and the log file, whatever happened

Hooks (lm/core/hooks.py) reach the loop and every checkpointer of the session; by default those the
LM_PLUGINS modules install.
"""

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lm.core import loop
from lm.core.checkpoint import Checkpointer
from lm.core.config import LoggerConfig, OptimConfig, TrainConfig
from lm.core.hooks import Hooks, from_env
from lm.core.resume import RESUMABLE, check_resume
from lm.core.setup import log_to_file, seed_everything, stop_logging_to_file
from lm.core.tracking import NullTracker, Tracker
from lm.engine import dist as dist_utils

log = logging.getLogger("lm")

# What a run leaves in its run_dir that the next run there would read (checkpoints: the resume point, keep_last;
# wandb_id: the wandb run a new run would continue, its steps dropped as already logged) or write over
# (metrics.jsonl, train.log, config.yaml; tensorboard/: its event files would draw both runs as one curve).
RUN_RECORDS = ("checkpoints", "metrics.jsonl", "train.log", "config.yaml", "wandb_id", "wandb", "tensorboard")
RUN_MARKS = ("checkpoints", "metrics.jsonl")  # a run was there (a config.yaml alone: a start that was refused)


def set_aside(run_dir: Path, records: Sequence[str] = RUN_RECORDS, marks: Sequence[str] = RUN_MARKS) -> Path | None:
    """resume=false in a run_dir that holds a run: that run's `records` moved to run_dir/previous/<UTC time>/, so the
    new run neither mixes with its checkpoints (a damaged `latest` would fall back to the old run's newest, keep_last
    would count them) nor writes over its metrics or results. A run is there when one of `marks` is. Returns where
    the records went, or None when there was no run."""
    found = [run_dir / name for name in records if (run_dir / name).exists()]
    if not any(p.name in marks for p in found):
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = run_dir / "previous" / stamp
    n = 1
    while aside.exists():  # two starts over in one second
        aside, n = run_dir / "previous" / f"{stamp}-{n}", n + 1
    aside.mkdir(parents=True)
    for p in found:
        shutil.move(str(p), str(aside / p.name))
    log.info("resume=false: the run already in %s moved to %s (delete it when you no longer need it)", run_dir, aside)
    return aside


class Session:
    """One run of `task` (lm.core.task.TrainTask) on `engine` (made, not yet wrapped), with its checkpoints under
    run_dir/checkpoints; `config_yaml` is the run's resolved config (copied into checkpoints, compared on resume)."""

    def __init__(
        self,
        train: TrainConfig,
        engine,
        task,
        run_dir: Path,
        config_yaml: str,
        hooks: Hooks | None = None,
        log_file: Path | None = None,
    ):
        self.train_cfg, self.engine, self.task = train, engine, task
        self.run_dir, self.config_yaml = Path(run_dir), config_yaml
        self.hooks = hooks if hooks is not None else from_env()
        asynchronous = engine.writes_async if train.async_checkpoint is None else train.async_checkpoint
        self.checkpointer = self.checkpointer_at(self.run_dir, train.keep_last, config_yaml, asynchronous=asynchronous)
        self.state = loop.State()
        self.tracker = NullTracker()
        # rank 0 logs to a file from here on (before resuming: the file says so)
        self._file_log = log_to_file(log_file) if log_file and engine.is_main else None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close(failed=exc_type is not None)

    def checkpointer_at(
        self, run_dir: Path, keep_last: int, config_yaml: str, asynchronous: bool = False
    ) -> Checkpointer:
        """A checkpointer of this session's engine under run_dir/checkpoints, with the session's hooks
        (asynchronous: written in the background, train.async_checkpoint; the loop waits for it)."""
        return Checkpointer(
            run_dir, self.engine, keep_last, config_yaml, on_phase=self.hooks.on_save_phase, asynchronous=asynchronous
        )

    def build(self, make_model: Callable[[], "object"], seed: int, optim: OptimConfig):
        """The model from `seed` on every rank (FSDP2/ZeRO-3 then shard identical copies), wrapped by the engine
        with AdamW; RNGs then seeded per rank (dropout differs). Returns the bare model."""
        import torch

        from lm.core.optim import adamw

        torch.manual_seed(seed)
        model = make_model()
        seed_everything(seed + self.engine.rank)
        self.engine.wrap(model, lambda m: adamw(m, optim))
        return model

    def resume_or_start(
        self,
        resume: bool = True,
        max_steps: int | None = None,
        may_change: Sequence[str] = RESUMABLE,
        start_over: str | None = None,
    ) -> Path | None:
        """Continue from the checkpoint to resume when `resume` and rank 0 finds one (every rank gets its answer;
        Checkpointer.resume_point: `latest` if intact, else the newest intact step_*, else a refusal): a config
        change outside `may_change` from that checkpoint's (or a max_steps below its step) is refused before
        anything is loaded; then the engine, the task and the loop state are restored. Returns the checkpoint."""
        latest = self.checkpointer.resume_point() if resume else None  # verified, and the one loaded below
        if latest:
            kw = {"start_over": start_over} if start_over else {}
            check_resume(latest, self.config_yaml, max_steps, self.engine.dist, may_change, **kw)
            trainer, task_state = self.checkpointer.load(latest)
            self.task.load_state_dict(task_state)
            self.state = loop.State.from_checkpoint(trainer)
        return latest

    def track(self, logger: LoggerConfig, config: dict) -> None:
        """Rank 0's metrics sinks under run_dir (metrics.jsonl cut back to the resumed step); `config` (plain
        types) is what wandb records."""
        if self.engine.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.tracker = Tracker(self.run_dir, logger, config, resume_step=self.state.step)

    def train(
        self, lr_at: Callable[[int], float], speed: loop.Speed = loop.Speed(), evals: Sequence = ()
    ) -> loop.State:
        """The loop from the current state to train.max_steps (`evals`: lm.core.task.EvalCallback, e.g. the GLUE
        probes); every rank finishes before any goes on (gloo aborts on exit races when one rank tears down its
        process group first)."""
        self.state = loop.run(
            self.train_cfg,
            self.engine,
            self.task,
            lr_at,
            self.tracker,
            self.checkpointer,
            self.state,
            speed,
            evals,
            self.hooks,
        )
        dist_utils.barrier()
        return self.state

    def close(self, failed: bool = False) -> None:
        """failed: an error ends the run (the trackers record it: a diverged or crashed run is not finished)."""
        self.tracker.close(failed)
        self.engine.close()
        if self._file_log:
            stop_logging_to_file(self._file_log)
            self._file_log = None
