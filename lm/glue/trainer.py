"""One GLUE task, one seed, as a `lm.core.task.TrainTask` that `lm.core.loop.run` trains (on any engine).

    steps: epochs x ceil(N / batch_size) (AdamW and the lr schedule of the optim/sched groups, the
        schedule's length computed from the epochs; lm.glue.run builds them)
    each step: a batch of `batch_size` examples from the epoch's shuffled order (a seeded RNG, the same
        on every rank), this rank's share cut into micro-batches; the loop weights each by its share of
        the global batch, so the step's gradient is the example mean over all ranks
    at the end of every epoch: predict dev, score with the leaderboard's metrics; when the task's
    main metric improves, keep those dev metrics and predict the test set(s) with the same weights
    (the predictions of the best epoch are the submission; optionally the weights are saved too).

Every rank predicts the whole dev/test set: sharded engines (ZeRO-3, FSDP2) must run the same
forwards on every rank, and GLUE dev sets are small.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lm.config_base import ConfigError
from lm.core import objectives
from lm.glue.config import GlueTaskConfig
from lm.glue.encode import collate, encode_examples
from lm.glue.metrics import Metrics, compute_metrics, main_metric
from lm.glue.readers import GlueDataError, GlueDataMissing, load_split
from lm.glue.tasks import EVALS, GlueTaskSpec, get_task

log = logging.getLogger("lm")

Features = dict[str, list]


@dataclass
class Split:
    """Encoded examples of one split; `labels` for dev (scoring), `indices` for test (submission ids)."""

    features: list[Features]
    labels: np.ndarray | None = None
    indices: list[int] | None = None


@dataclass
class TaskData:
    task: GlueTaskSpec
    train: Split
    dev: dict[str, Split]  # leaderboard column -> dev split (MNLI: mnli_m, mnli_mm)
    test: dict[str, Split]  # leaderboard column -> test split (MNLI: mnli_m, mnli_mm, ax)
    missing_test: list[str] = field(default_factory=list)  # "column: why" for test files not found


def load_task_data(
    cfg: GlueTaskConfig, tokenizer, arch: str, max_len: int, hf: bool = True, with_test: bool = True
) -> TaskData:
    """Read and encode train, every dev column and (when there) every test column of one task.

    Missing train/dev files are errors (GlueDataMissing names the path and how to get the data);
    a missing test file only means no submission file for that column (listed in missing_test).
    """
    task = get_task(cfg.name)
    train = load_split(task.name, "train", cfg.data_root, hf)
    if cfg.max_train_examples:
        train = train[: cfg.max_train_examples]
    dev, test, missing, pair = {}, {}, [], str(cfg.pair_input)
    for col in task.evals:
        e = EVALS[col]
        if e.dev is not None:
            rows = load_split(e.task, e.dev, cfg.data_root, hf)
            labels = np.array([r.label for r in rows])
            dev[col] = Split(encode(tokenizer, rows, max_len, arch, pair_input=pair), labels=labels)
        if with_test and e.test in get_task(e.task).files:  # task=own has no test split (said as it is read)
            try:
                rows = load_split(e.task, e.test, cfg.data_root, hf)
            except GlueDataMissing as err:
                missing.append(f"{e.submission}: {err}")
                continue
            test[col] = Split(
                encode(tokenizer, rows, max_len, arch, labels=False, pair_input=pair), indices=[r.index for r in rows]
            )
    if not train:  # a local TSV with no rows is refused by read_tsv with its path; this is the HF copy
        raise GlueDataError(f"GLUE {task.dir}: the train split has no examples")
    return TaskData(task, Split(encode(tokenizer, train, max_len, arch, pair_input=pair)), dev, test, missing)


def encode(tokenizer, rows, max_len: int, arch: str, labels: bool = True, pair_input: str = "joint") -> list[Features]:
    feats = encode_examples(tokenizer, rows, max_len, arch, pair_input)
    if not labels:
        for f in feats:
            f.pop("labels", None)
    return feats


# -- batches -----------------------------------------------------------------------------------------


def micro_batches(indices: np.ndarray, rank: int, world_size: int, micro_batch_size: int) -> list[np.ndarray]:
    """This rank's share of one batch, cut into micro-batches. Every rank gets the same number of them: FSDP2
    and ZeRO-3 gather parameters in every forward (a rank with one forward more waits for the others forever),
    and engines count accumulation boundaries. That is ceil(B / (world x micro)) parts, but never more than the
    smallest share holds examples: with micro_batch_size=1 and a batch that the ranks do not divide evenly (5 on 2
    ranks: shares of 3 and 2), one micro-batch of a larger share holds 2 examples, not one rank 3 forwards to 2."""
    fewest = len(indices) // world_size  # >= 1: GlueTask refuses a batch smaller than the ranks, steps drop such tails
    n_micro = max(1, min(math.ceil(len(indices) / (world_size * micro_batch_size)), fewest))
    mine = indices[rank::world_size]
    return [chunk for chunk in np.array_split(mine, n_micro) if len(chunk)]


def steps_per_epoch(batch_size: int, n_train: int, world_size: int = 1) -> int:
    """Optimizer steps per epoch; a tail batch smaller than the number of ranks would leave a rank
    without data, so it is dropped."""
    return max(1, n_train // batch_size + (1 if n_train % batch_size >= world_size else 0))


def total_steps(epochs: float, per_epoch: int) -> int:
    return max(1, math.ceil(epochs * per_epoch))


class EpochBatches:
    """The steps' micro-batches: epoch e's order is the (e+1)-th permutation of default_rng(seed), the same
    on every rank. The state is the next step; loading it replays the permutations up to its epoch."""

    def __init__(
        self,
        features: list[Features],
        batch_size: int,
        per_epoch: int,
        seed: int,
        rank: int,
        world_size: int,
        micro_batch_size: int,
        pad_id: int,
        pad: tuple[int, int | None] = (1, None),
    ):
        self.features, self.batch_size, self.per_epoch, self.seed = features, batch_size, per_epoch, seed
        self.rank, self.world_size, self.micro_batch_size, self.pad_id = rank, world_size, micro_batch_size, pad_id
        self.pad = pad  # (multiple, cap) of lm.glue.encode.collate
        self.load_state_dict({"step": 0})

    def __iter__(self):
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        epoch, i = divmod(self.step, self.per_epoch)
        batch = self._order(epoch)[i * self.batch_size : (i + 1) * self.batch_size]
        self.step += 1
        return [
            collate([self.features[j] for j in chunk], self.pad_id, *self.pad)
            for chunk in micro_batches(batch, self.rank, self.world_size, self.micro_batch_size)
        ]

    def _order(self, epoch: int) -> np.ndarray:
        while self._drawn <= epoch:
            self._perm, self._drawn = self._rng.permutation(len(self.features)), self._drawn + 1
        return self._perm

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step, self._rng, self._drawn, self._perm = state["step"], np.random.default_rng(self.seed), 0, None


# -- prediction --------------------------------------------------------------------------------------


@torch.no_grad()
def predict(
    engine, features: Sequence[Features], pad_id: int, batch_size: int = 128, pad: tuple[int, int | None] = (1, None)
) -> np.ndarray:
    """(N, n_labels) logits (STS-B: (N, 1) scores) in the order of `features`.

    Batches are sorted by length so padding costs little; the output is put back in input order.
    `pad`: (multiple, cap) of lm.glue.encode.collate.
    """
    order = np.argsort([len(f["input_ids"]) for f in features], kind="stable")
    out = [None] * len(features)
    engine.model.eval()
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = collate([{k: v for k, v in features[i].items() if k != "labels"} for i in idx], pad_id, *pad)
            batch = {k: v.to(engine.device) for k, v in batch.items()}
            with engine.autocast():
                logits = engine.model(**batch).logits.float().cpu().numpy()  # (b, n_labels)
            for j, i in enumerate(idx):
                out[i] = logits[j]
    finally:
        engine.model.train()
    return np.stack(out)


def score_dev(
    engine, data: TaskData, pad_id: int, batch_size: int, pad: tuple[int, int | None] = (1, None)
) -> dict[str, Metrics]:
    return {
        col: compute_metrics(col, predict(engine, s.features, pad_id, batch_size, pad), s.labels)
        for col, s in data.dev.items()
    }


# -- one seed ------------------------------------------------------------------------------------------


@dataclass
class SeedResult:
    seed: int
    dev: dict[str, Metrics]  # leaderboard column -> metrics of the best epoch
    main: float  # the task's main metric at the best epoch
    best_epoch: int
    test: dict[str, np.ndarray]  # leaderboard column -> test logits/scores of the best epoch
    history: list[dict] = field(default_factory=list)  # per epoch: {"epoch", "step", "main", "dev"}
    seconds: float = 0.0


class GlueTask:
    """One task and seed for lm.core.loop.run: dev scoring at each epoch end, best epoch by the main metric."""

    best_metric = "dev/main"

    def __init__(
        self,
        cfg: GlueTaskConfig,
        data: TaskData,
        seed: int,
        rank: int,
        world_size: int,
        micro_batch_size: int,
        pad_id: int,
        eval_batch_size: int = 128,
        save_best: Callable[[int, dict], None] | None = None,
        pad_to_multiple_of: int = 1,
    ):
        self.cfg, self.data, self.seed, self.pad_id, self.eval_batch_size = cfg, data, seed, pad_id, eval_batch_size
        self.pad = (pad_to_multiple_of, cfg.max_len)  # batch lengths: lm.glue.encode.collate
        if cfg.batch_size < world_size:  # a rank without an example would skip the forwards the others wait in
            raise ConfigError(
                f"tasks.{cfg.name}.batch_size={cfg.batch_size} is smaller than the {world_size} ranks: every rank "
                f"needs an example per step; set tasks.{cfg.name}.batch_size={world_size} or more, or use fewer ranks"
            )
        if len(data.train.features) < world_size:  # steps_per_epoch's one step would leave a rank without one too
            raise ConfigError(
                f"tasks.{cfg.name}: {len(data.train.features)} training example(s) for {world_size} ranks: every rank "
                f"needs an example per step; train on more examples (glue.max_train_examples, "
                f"tasks.{cfg.name}.max_train_examples) or use fewer ranks"
            )
        self.per_epoch = steps_per_epoch(cfg.batch_size, len(data.train.features), world_size)
        self.total = total_steps(cfg.epochs, self.per_epoch)
        self.batches = EpochBatches(
            data.train.features,
            cfg.batch_size,
            self.per_epoch,
            seed,
            rank,
            world_size,
            micro_batch_size,
            pad_id,
            self.pad,
        )
        self.save_best = save_best
        self.history: list[dict] = []
        self.best: dict | None = None  # {"epoch", "main", "dev", "test"} of the best epoch so far
        self.seconds, self._t0 = 0.0, time.perf_counter()  # training time over every process that ran it

    def loss(self, model, batch: dict[str, torch.Tensor], metrics=None) -> torch.Tensor:
        return objectives.loss(model, batch, metrics)

    def evaluate(self, engine, step: int) -> dict:
        epoch = math.ceil(step / self.per_epoch)
        dev = score_dev(engine, self.data, self.pad_id, self.eval_batch_size, self.pad)
        main = main_metric(self.data.task.name, dev, self.cfg.main_metric)
        self.history.append({"epoch": epoch, "step": step, "main": main, "dev": dev})
        if engine.is_main:
            log.info(
                "%s seed %d epoch %d (step %d/%d): dev %s = %.2f",
                self.data.task.dir,
                self.seed,
                epoch,
                step,
                self.total,
                self.cfg.main_metric,
                main,
            )
        return {"epoch": epoch, "dev/main": main, **{f"dev/{c}/{k}": v for c, m in dev.items() for k, v in m.items()}}

    def on_best(self, engine, step: int, record: dict) -> None:
        last = self.history[-1]
        test = {
            c: predict(engine, s.features, self.pad_id, self.eval_batch_size, self.pad)
            for c, s in self.data.test.items()
        }
        self.best = {"epoch": last["epoch"], "main": last["main"], "dev": last["dev"], "test": test}
        if self.save_best:
            self.save_best(step, {"epoch": last["epoch"], "main": last["main"], "dev": last["dev"]})

    def state_dict(self) -> dict:
        return {
            "batches": self.batches.state_dict(),
            "history": self.history,
            "best": self.best,
            "seconds": self._seconds(),
            "per_epoch": self.per_epoch,
        }

    def load_state_dict(self, state: dict) -> None:
        """The state is the next step of a global order (every rank's file holds the same), so it continues on
        any world size that cuts epochs into the same steps; a world size that keeps or drops the tail batch
        where the run did not would change the schedule and is refused."""
        saved = state.get("per_epoch", self.per_epoch)
        if saved != self.per_epoch:
            n, b = len(self.data.train.features), self.cfg.batch_size
            raise ConfigError(
                f"{self.data.task.dir} seed {self.seed}: the checkpoint ran {saved} steps per epoch, this world size "
                f"gives {self.per_epoch} (the last batch of {n % b} examples is trained only on at most that many "
                f"ranks): resume on at most {n % b} rank(s)"
                if self.per_epoch < saved
                else f"{self.data.task.dir} seed {self.seed}: the checkpoint ran {saved} steps per epoch, this world "
                f"size gives {self.per_epoch} (the last batch of {n % b} examples is dropped on more ranks than that): "
                f"resume on more than {n % b} rank(s)"
            )
        self.batches.load_state_dict(state["batches"])
        self.history, self.best = state["history"], state["best"]
        self.seconds, self._t0 = state["seconds"], time.perf_counter()

    def _seconds(self) -> float:
        return self.seconds + time.perf_counter() - self._t0

    def result(self) -> SeedResult:
        b = self.best
        return SeedResult(self.seed, b["dev"], b["main"], b["epoch"], b["test"], self.history, self._seconds())
