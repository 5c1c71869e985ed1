"""A GLUE step's batch over several ranks: every rank runs the same number of micro-batches, whatever the batch
size, the world size and train.micro_batch_size. FSDP2 and ZeRO-3 all-gather parameters in every forward, so a
rank with one micro-batch more than another waits for it forever (a batch of 5 on 2 ranks with micro-batch 1 hung
FSDP2 at step 1 before lm.glue.trainer.micro_batches capped the parts at the smallest share)."""

import itertools
import signal
import subprocess
import sys

import numpy as np
import pytest

from lm.config_base import ConfigError
from lm.glue.trainer import micro_batches
from tests.engine_support import REPO, free_port, subprocess_env, train_losses


def parts(n: int, world: int, micro: int) -> list[list[int]]:
    """Each rank's micro-batch sizes for a batch of n examples."""
    return [[len(c) for c in micro_batches(np.arange(n), r, world, micro)] for r in range(world)]


def test_a_batch_the_ranks_do_not_divide_gives_every_rank_the_same_number_of_micro_batches():
    assert parts(5, 2, 1) == [[2, 1], [1, 1]]  # was [[1, 1, 1], [1, 1]]: rank 0 ran a third forward alone
    assert parts(3, 2, 1) == [[2], [1]]
    assert parts(6, 4, 1) == [[2], [2], [1], [1]]
    assert parts(7, 2, 2) == [[2, 2], [2, 1]]  # micro-batch 2 and more: unchanged, never above the micro-batch
    for n, world, micro in itertools.product(range(1, 40), (2, 3, 4), (1, 2, 3, 8)):
        if n < world:
            continue  # GlueTask refuses such a batch, and steps_per_epoch drops such a tail
        got = [micro_batches(np.arange(n), r, world, micro) for r in range(world)]
        assert len({len(rank) for rank in got}) == 1, (n, world, micro)
        assert sorted(int(i) for rank in got for chunk in rank for i in chunk) == list(range(n))  # each example once
        biggest = max(len(chunk) for rank in got for chunk in rank)
        assert biggest <= (micro if micro > 1 or n % world == 0 else 2), (n, world, micro)


def test_a_batch_smaller_than_the_ranks_is_refused_naming_the_task():
    from tests.test_elastic import glue_task

    with pytest.raises(ConfigError, match=r"tasks\.sst2\.batch_size=16 is smaller than the 32 ranks"):
        glue_task(100, 32)


def test_fewer_training_examples_than_ranks_is_refused_naming_the_task():
    """3 examples on 4 ranks (glue.max_train_examples=3, a smoke run): steps_per_epoch gives one step of 3, and
    micro_batches gave rank 3 no micro-batch, so it skipped the forward and backward the other ranks waited in."""
    from tests.test_elastic import glue_task

    assert parts(3, 4, 8) == [[1], [1], [1], []]  # why: the fourth rank has nothing to run
    with pytest.raises(ConfigError, match=r"tasks\.sst2: 3 training example\(s\) for 4 ranks"):
        glue_task(3, 4)
    glue_task(4, 4)  # one example each: trained


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_on_two_ranks_finetunes_a_batch_of_5_with_micro_batch_1_as_one_process(tmp_path):
    """20 examples in batches of 5 (4 steps), train.micro_batch_size=1: rank shares of 3 and 2 each step. One
    process gave losses 0.7261, 1.0210, 0.7796, 0.5834; FSDP2 on 2 ranks hung in step 1; now the same to 1e-5."""
    from tests.test_elastic_resume import _finetune_args, _finetune_files

    files = _finetune_files(tmp_path / "files")

    def run(world: int, engine: str):
        args = [a for a in _finetune_args(files, tmp_path / engine) if not a.startswith(("tasks.sst2.", "engine="))]
        args += ["tasks.sst2.epochs=1", "tasks.sst2.batch_size=5", "tasks.sst2.max_len=24", "tasks.sst2.dropout=0.0"]
        args += ["tasks.sst2.seeds=[0]", "glue.max_train_examples=20", "train.micro_batch_size=1", f"engine={engine}"]
        launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr", "127.0.0.1"]
        launcher += ["--master_port", str(free_port())]
        cmd = [sys.executable, *(launcher if world > 1 else []), "-m", "lm.cli.finetune", *args]
        env = subprocess_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5")
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # torchrun passes it on, then SIGKILLs its ranks after 5 s
            proc.communicate(timeout=60)
            pytest.fail(f"{engine} on {world} rank(s) hung")
        assert proc.returncode == 0, err[-3000:]
        return train_losses(tmp_path / engine / "sst2" / "seed0")

    single, sharded = run(1, "single"), run(2, "fsdp2")
    assert list(single) == list(sharded) == [1, 2, 3, 4]
    worst = max(abs(single[s] - sharded[s]) for s in single)
    assert worst < 1e-5, f"max |loss(fsdp2, 2 ranks) - loss(1 process)| = {worst:.2e}"
