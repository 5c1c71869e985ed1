"""The launch scripts, run for real on CPU (gloo): every rank trains the same tiny model on tiny
Shakespeare, and the per-step losses equal one process with the same global batch.

Two node ranks of launch/torchrun_multinode.sh are two separate launcher processes on 127.0.0.1
with the c10d rendezvous, exactly as two machines would run it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine_support import REPO, free_port, subprocess_env, train_losses

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

WORLD = 2
MICRO = 2  # per rank; the reference runs one process with MICRO * WORLD
STEPS = 5
# A high constant learning rate so that every step moves the loss: a wrong gradient shows at step 2.
TINY = [
    "model=tiny",
    "data=shakespeare_char",
    "train.seq_len=32",
    f"train.max_steps={STEPS}",
    "train.log_interval=1",
    "train.eval_interval=0",
    "train.ckpt_interval=0",
    "sched=constant",
    "sched.warmup_steps=0",
    "optim.lr=0.01",
]
TIMEOUT = 300


def launch_env(**extra) -> dict[str, str]:
    """The test environment, with this interpreter's bin/ (torchrun, accelerate, deepspeed) first on PATH."""
    env = subprocess_env(**extra)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def finish(procs: list[subprocess.Popen], logs: list[Path]) -> None:
    try:
        for p in procs:
            p.wait(TIMEOUT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(log.name, log.read_text()[-3000:]) for p, log in zip(procs, logs) if p.returncode != 0]
    assert not failed, f"launcher(s) failed: {failed}"


def ranks_trained(run_dir: Path) -> int:
    """The world size rank 0 reported in train.log (never trust that N ranks ran: a launcher can start fewer)."""
    line = next(ln for ln in (run_dir / "train.log").read_text().splitlines() if " rank(s), " in ln)
    return int(line.split(" on ", 1)[1].split(" rank(s)")[0])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    """One process, micro-batch MICRO * WORLD: the losses every launch must reproduce."""
    run_dir = tmp_path_factory.mktemp("single")
    log = run_dir.parent / "single.log"
    finish(
        [
            run(
                [
                    sys.executable,
                    "-m",
                    "lm.cli.train",
                    f"run_dir={run_dir}",
                    f"train.micro_batch_size={MICRO * WORLD}",
                    *TINY,
                ],
                launch_env(),
                log,
            )
        ],
        [log],
    )
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1] - 0.5  # it learns, so equal losses mean equal updates
    return losses


def assert_same_losses(run_dir: Path, reference: dict[int, float]) -> None:
    assert ranks_trained(run_dir) == WORLD
    losses = train_losses(run_dir)
    assert sorted(losses) == sorted(reference)
    for step, loss in reference.items():
        assert losses[step] == pytest.approx(loss, abs=1e-5), f"step {step}"


@pytest.mark.parametrize("script", ["torchrun_multinode.sh", "accelerate.sh"])  # accelerate: multi_node.yaml
def test_two_node_ranks_on_loopback_match_one_process(tmp_path, reference, script):
    run_dir = tmp_path / "run"
    port = free_port()
    overrides = ["engine=ddp", f"run_dir={run_dir}", f"train.micro_batch_size={MICRO}", *TINY]
    logs = [tmp_path / f"node{r}.log" for r in range(WORLD)]
    # Node 1 first: the rendezvous must wait for node 0, whichever starts first.
    procs = [
        run(
            [str(REPO / "launch" / script), *overrides],
            launch_env(
                NNODES=str(WORLD),
                NODE_RANK=str(r),
                NPROC_PER_NODE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                LOCAL_ADDR="127.0.0.1",
                RDZV_ID=f"test-{port}",
            ),
            logs[r],
        )
        for r in reversed(range(WORLD))
    ]
    finish(procs, list(reversed(logs)))
    assert_same_losses(run_dir, reference)
    for r in range(WORLD):  # each launcher started one local process of the two-node job
        expected = (
            f"node {r}/{WORLD}, 1 process(es), rendezvous 127.0.0.1:{port}"
            if script == "torchrun_multinode.sh"
            else f"{WORLD} process(es) on {WORLD} node(s) with accelerate ({REPO}/launch/accelerate/multi_node.yaml)"
        )
        assert expected in logs[r].read_text()


@pytest.mark.parametrize(
    "script,engine",
    [("torchrun.sh", "ddp"), ("accelerate.sh", "ddp"), ("deepspeed.sh", "zero2"), ("deepspeed_hostfile.sh", "zero2")],
)
def test_single_node_scripts_match_one_process(tmp_path, reference, script, engine):
    run_dir = tmp_path / "run"
    env = launch_env(NPROC_PER_NODE=str(WORLD), MASTER_PORT=str(free_port()))
    if script == "deepspeed_hostfile.sh":  # one host: the launcher starts its slots locally (no ssh here)
        hostfile = tmp_path / "hostfile"
        hostfile.write_text(f"# test\nlocalhost slots={WORLD}\n")
        env.update(HOSTFILE=str(hostfile), DS_ARGS="--no_ssh_check")
    log = tmp_path / "launch.log"
    finish(
        [
            run(
                [
                    str(REPO / "launch" / script),
                    f"engine={engine}",
                    f"run_dir={run_dir}",
                    f"train.micro_batch_size={MICRO}",
                    *TINY,
                ],
                env,
                log,
            )
        ],
        [log],
    )
    assert_same_losses(run_dir, reference)
