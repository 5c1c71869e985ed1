"""lm train prepares a corpus on first use on rank 0 while the other ranks wait, for as long as the corpus takes: the
default group's timeout (30 minutes for gloo, 2 seconds here) must not end the wait."""

import os
import time
from datetime import timedelta

import pytest

from tests.engine_support import free_port

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TIMEOUT_S = 2  # the default group's timeout in this test
PREPARE_S = 2 * TIMEOUT_S  # rank 0's preparation outlasts it


def _slow_prepare(data_cfg):
    time.sleep(PREPARE_S)


def _rank(rank: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    from lm.cli import train
    from lm.data import prepare
    from lm.data.config import DataConfig
    from lm.engine.dist import Dist

    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    prepare.ensure_prepared = _slow_prepare
    try:
        t0 = time.monotonic()
        train._prepare_on_main(DataConfig(), Dist(rank, 2, rank, torch.device("cpu")))
        out.put((rank, "ok", time.monotonic() - t0))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.put((rank, "error", f"{type(e).__name__}: {e}"[:300]))
    finally:
        dist.destroy_process_group()


def test_the_other_ranks_wait_for_a_preparation_longer_than_the_default_timeout():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out, port = ctx.SimpleQueue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    reports = []
    while not out.empty():
        reports.append(out.get())
    reports.sort()
    assert [r[:2] for r in reports] == [(0, "ok"), (1, "ok")], reports
    assert reports[1][2] >= PREPARE_S - 0.5  # rank 1 really waited for rank 0, past the default timeout
