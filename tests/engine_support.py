"""Shared helpers of the engine/train/checkpoint tests: a synthetic loader with the PackedLoader
interface, config composition as `lm train` does it, and metrics reading.

The synthetic stream is defined per global sample index, and rank r's micro-batch i holds samples
[(i * world + r) * b, ... + b): the union over ranks of one micro-step is exactly the micro-batch
of a single process with batch b * world. That is what makes single-vs-distributed losses comparable.
"""

import json
import os
import socket
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MASK_ID = 3


class SyntheticLoader:
    """Random walks over the vocabulary (learnable: the next token is near the current one)."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        micro_batch_size: int,
        objective: str = "clm",
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        split: str = "train",
        n_batches: int | None = None,
    ):
        self.vocab_size, self.seq_len, self.b = vocab_size, seq_len, micro_batch_size
        self.objective, self.rank, self.world = objective, rank, world_size
        self.seed = seed + (0 if split == "train" else 10_000_000)
        self.finite = split != "train"
        self.n_batches = n_batches or (4 if self.finite else None)
        self.index = 0

    def _sample(self, s: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed + s)
        steps = torch.randint(-2, 3, (self.seq_len + 1,), generator=g)
        start = torch.randint(8, self.vocab_size, (1,), generator=g)
        return (start + steps.cumsum(0)) % (self.vocab_size - 8) + 8  # ids 0-7 stay special

    def batch(self, i: int) -> dict[str, torch.Tensor]:
        first = (i * self.world + self.rank) * self.b
        x = torch.stack([self._sample(s) for s in range(first, first + self.b)])  # (B, T + 1)
        if self.objective == "clm":
            return {"input_ids": x[:, :-1], "labels": x[:, 1:]}
        g = torch.Generator().manual_seed(self.seed + 7 * first + 1)
        if self.objective == "mlm":
            masked = torch.rand(x[:, :-1].shape, generator=g) < 0.15
            inputs = x[:, :-1].masked_fill(masked, MASK_ID)
            return {"input_ids": inputs, "labels": x[:, :-1].masked_fill(~masked, -100)}
        half = self.seq_len // 2  # span-like: read the first half, predict the second
        return {"input_ids": x[:, :half], "labels": x[:, half:-1]}

    @property
    def dense_labels(self) -> bool:  # as PackedLoader's: only mlm batches hold -100 labels
        return self.objective != "mlm"

    def __iter__(self):
        if self.finite:
            return (self.batch(i) for i in range(self.n_batches))
        return self._stream()

    def _stream(self):
        while True:
            batch = self.batch(self.index)
            self.index += 1
            yield batch

    def state_dict(self) -> dict:
        return {"index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.index = state["index"]


def loaders(cfg, rank: int = 0, world_size: int = 1, objective: str = "clm"):
    t = cfg.train
    kw = dict(
        vocab_size=cfg.model.vocab_size,
        seq_len=t.seq_len,
        micro_batch_size=t.micro_batch_size,
        objective=objective,
        rank=rank,
        world_size=world_size,
        seed=cfg.seed,
    )
    return SyntheticLoader(split="train", **kw), SyntheticLoader(split="val", **kw)


def compose(overrides: list[str]):
    """The config `lm train <overrides>` would run, without the data group (tests inject loaders)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lm.config import conf_dir, register_train_configs

    register_train_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name="train", overrides=["~data", *overrides])


def tiny_overrides(run_dir, steps: int = 10, **train) -> list[str]:
    base = {
        "micro_batch_size": 4,
        "seq_len": 32,
        "max_steps": steps,
        "log_interval": 1,
        "eval_interval": 0,
        "eval_batches": 2,
        "ckpt_interval": 0,
        "progress": False,
    }
    base.update(train)
    return [f"run_dir={run_dir}", "model=tiny", "model.max_seq_len=64", "sched.warmup_steps=2"] + [
        f"train.{k}={v}" for k, v in base.items()
    ]


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def train_losses(run_dir) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run_dir) if "loss" in m}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LM_RUN_STAMP")}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", **extra})
    return env


def _worker(rank: int, world: int, port: int, overrides: list[str], objective: str, out) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled",
        }
    )
    torch.set_num_threads(1)
    from lm.cli.train import train
    from lm.engine import dist as dist_utils

    try:
        cfg = compose(overrides)
        result = train(cfg, loaders=loaders(cfg, rank, world, objective))
        engine = result.engine
        out.put(
            (
                rank,
                "ok",
                {
                    "world_size": engine.world_size,
                    "local_numel": engine.local_numel(),
                    "numel": engine.numel() if engine.format != "dcp" else None,
                    "engine": engine.name,
                },
            )
        )
    except BaseException:  # report, then let the parent fail the test
        import traceback

        out.put((rank, "error", traceback.format_exc()))
    finally:
        dist_utils.shutdown()


def spawn(world: int, overrides: list[str], objective: str = "clm", timeout: float = 300) -> list:
    """Run lm.cli.train.train on `world` gloo ranks (torch.multiprocessing spawn); returns each rank's report."""
    reports = spawn_reports(world, overrides, objective, timeout)
    errors = [r for r in reports if r[1] != "ok"]
    assert not errors and len(reports) == world, f"ranks failed: {errors or reports}"
    return reports


def spawn_reports(world: int, overrides: list[str], objective: str = "clm", timeout: float = 300) -> list:
    """spawn's reports, each rank's (rank, "ok", info) or (rank, "error", traceback), whatever they say."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, overrides, objective, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    reports = []
    while not out.empty():
        reports.append(out.get())
    return sorted(reports, key=lambda r: r[0])
