"""No host sync in the training hot path between sync points (lm/core/loop.py), single process and DDP.

Every way the host can wait for the device or for other ranks is counted while lm train runs: reading a
tensor (`item`, `tolist`, `cpu`, `numpy`, `float()`, `int()`, `bool()`, indexing with a tensor) and the
torch.distributed collectives the Python side calls (DDP's gradient all-reduce inside backward is
C++ and is the step's own work). Each call is attributed to the step in flight (the loop asks for the
step's learning rate first); steps whose end is no sync point (log, evaluation, checkpoint, last step,
stop check) must have none.
"""

import os

import pytest
import torch

from tests.engine_support import compose, free_port, loaders, tiny_overrides

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all",
    "barrier",
    "broadcast_object_list",
    "all_gather_object",
    "reduce",
    "gather",
    "scatter",
    "_broadcast_coalesced",
)


def count_syncs(overrides, rank=0, world=1, objective="clm"):
    """Run lm train with every read and collective counted; returns {0-based step: [call names]}."""
    import torch.distributed as dist

    from lm.cli.train import train
    from lm.core import optim

    per_step, current = {}, {"step": None}
    real_lr = optim.lr_multiplier

    def lr_multiplier(step, *args):
        current["step"] = step
        return real_lr(step, *args)

    def counted(name, real):
        def wrapper(*args, **kwargs):
            if current["step"] is not None:
                per_step.setdefault(current["step"], []).append(name)
            return real(*args, **kwargs)

        return wrapper

    saved = [(torch.Tensor, n, getattr(torch.Tensor, n)) for n in READS]
    saved += [(dist, n, getattr(dist, n)) for n in COLLECTIVES if hasattr(dist, n)]
    saved.append((optim, "lr_multiplier", real_lr))
    try:
        for owner, name, real in saved[:-1]:
            setattr(owner, name, counted(name, real))
        optim.lr_multiplier = lr_multiplier
        cfg = compose(overrides)
        train(cfg, loaders=loaders(cfg, rank, world, objective))
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)
    return per_step


def unsynced_steps(max_steps, log_interval, stop_check_interval):
    """0-based steps after which the loop has no reason to touch the host."""
    return [
        s for s in range(max_steps) if (s + 1) % log_interval and (s + 1) % stop_check_interval and s + 1 != max_steps
    ]


OVERRIDES = dict(steps=12, log_interval=6, stop_check_interval=6, ckpt_interval=0, eval_interval=0)


@pytest.mark.parametrize(
    "extra, objective",
    [
        ([], "clm"),
        (["train.grad_accum=2", "train.prefetch=2"], "clm"),
        (["train.prefetch=0"], "clm"),
        (["model.arch=encoder"], "mlm"),  # counts label tokens on the device
    ],
)
def test_single_process_steps_between_log_steps_never_sync(tmp_path, extra, objective):
    per_step = count_syncs(tiny_overrides(tmp_path, **OVERRIDES) + extra, objective=objective)
    quiet = unsynced_steps(12, 6, 6)
    assert quiet == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert {s: per_step[s] for s in quiet if s in per_step} == {}
    assert per_step.get(5), "the log step reads the losses"  # the test does see syncs where they are


def test_a_non_fused_optimizer_costs_one_read_per_step(tmp_path):
    """torch's for-loop AdamW cannot skip on the device: the engine reads the norm's finiteness (stated cost)."""
    per_step = count_syncs(tiny_overrides(tmp_path, **OVERRIDES) + ["optim.fused=false"])
    assert all(per_step[s].count("__bool__") == 1 for s in unsynced_steps(12, 6, 6))


def _ddp_worker(rank, world, port, overrides, out):
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled",
        }
    )
    torch.set_num_threads(1)
    from lm.engine import dist as dist_utils

    try:
        out.put((rank, "ok", count_syncs(overrides, rank, world)))
    except BaseException:
        import traceback

        out.put((rank, "error", traceback.format_exc()))
    finally:
        dist_utils.shutdown()


@pytest.mark.parametrize(
    "model",
    [
        [],
        [
            "model=llama",
            "model.dim=32",
            "model.n_layers=2",
            "model.n_heads=4",
            "model.vocab_size=64",
            "model.max_seq_len=64",
        ],
    ],
)
def test_ddp_steps_between_log_steps_never_sync(tmp_path, model):
    """2 gloo ranks: no collective and no read between log steps (llama: RoPE buffers are not re-broadcast)."""
    import torch.multiprocessing as mp

    overrides = tiny_overrides(tmp_path, **OVERRIDES) + ["engine=ddp", "train.grad_accum=2"] + model
    ctx = mp.get_context("spawn")
    out, port = ctx.SimpleQueue(), free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, port, overrides, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    reports = sorted(out.get() for _ in range(2))
    assert all(r[1] == "ok" for r in reports), reports
    for _, _, per_step in reports:
        assert {s: per_step[s] for s in unsynced_steps(12, 6, 6) if s in per_step} == {}
        assert "all_reduce" in per_step[5]  # the log step's all-reduces (losses; tokens and stop flag) are seen
