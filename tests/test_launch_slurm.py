"""launch/slurm.sbatch on a real single-host SLURM cluster (Debian's slurmctld + slurmd + munge),
started by the fixture below on loopback ports and torn down after: the job runs 2 gloo ranks
through srun and torchrun, and its run directory holds the metrics of a correct run; a USR1 (what
`--signal=B:USR1@300` sends before the time limit) requeues it and it resumes from its checkpoint.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.engine_support import REPO, free_port, train_losses
from tests.test_launch_multinode import (
    MICRO,
    STEPS,
    TINY,
    WORLD,
    assert_same_losses,
    launch_env,
    reference,  # noqa: F401 - the fixture: one process, same global batch
)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun", "sinfo", "scancel")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}

SLURM_CONF = """\
ClusterName=lmtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PlugStackConfig=/dev/null
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=lmtest Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _missing_reason():
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} not found): apt-get install slurmctld slurmd "
            f"slurm-client munge (.ci/extra-installs does this in CI)"
        )
    if os.geteuid() != 0:
        return "slurmd must run as root to start job steps; run this test as root (CI does)"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
    """One controller and one compute node on this host, all state under a private directory."""

    def __init__(self, root: Path):
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        r = self.root
        (r / "state").mkdir()
        (r / "spool").mkdir()
        (r / "munge.key").write_bytes(os.urandom(1024))
        (r / "munge.key").chmod(0o600)
        subprocess.run(
            [
                _exe("munged"),
                f"--key-file={r}/munge.key",
                f"--socket={r}/munge.sock",
                f"--pid-file={r}/munged.pid",
                f"--log-file={r}/munged.log",
                f"--seed-file={r}/munged.seed",
            ],
            check=True,
            capture_output=True,
        )
        self.conf.write_text(
            SLURM_CONF.format(
                host=self.host, root=r, ctld_port=free_port(), slurmd_port=free_port(), cpus=os.cpu_count()
            )
        )
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([_exe(daemon), "-f", str(self.conf)], check=True, capture_output=True, env=self.environ())
        self._wait_idle()

    def environ(self, **extra) -> dict[str, str]:
        return {**os.environ, **self.env, **extra}

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        state = ""
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.environ())
            state = out.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        logs = {
            n: (self.root / n).read_text()[-2000:] for n in ("slurmctld.log", "slurmd.log") if (self.root / n).exists()
        }
        raise AssertionError(f"the test cluster's node is {state!r}, not idle, after {timeout} s: {logs}")

    def stop(self) -> None:
        for pid_file in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
            path = self.root / pid_file
            if path.exists():
                try:
                    os.kill(int(path.read_text().split()[0]), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass
        time.sleep(1)

    def logs(self, lines: int = 40) -> str:
        """The daemons' last lines: why SLURM ended a job the way it did."""
        return "\n".join(
            f"== {n}\n" + "\n".join((self.root / n).read_text().splitlines()[-lines:])
            for n in ("slurmctld.log", "slurmd.log")
            if (self.root / n).exists()
        )

    def job(self, job_id: str) -> dict[str, str]:
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, env=self.environ(), check=True
        ).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)


@pytest.fixture(scope="module")
def cluster():
    reason = _missing_reason()
    if reason:
        pytest.skip(reason)
    # munged wants every directory on its socket's path searchable by all (pytest's tmp dirs are 0700).
    root = Path(tempfile.mkdtemp(prefix="lm-slurm-", dir="/tmp"))
    root.chmod(0o711)
    c = Cluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def submit(cluster: Cluster, cwd: Path, *overrides: str, **env) -> str:
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--job-name=lmtest",
            "--time=15",
            f"--output={cwd}/job-%j.out",
            str(REPO / "launch/slurm.sbatch"),
            *overrides,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=cluster.environ(**launch_env(NPROC_PER_NODE=str(WORLD), LM_LAUNCH_DIR=str(REPO / "launch"), **env)),
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def wait(cluster: Cluster, job_id: str, timeout: float = 400, on_pending=None) -> dict[str, str]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = cluster.job(job_id)
        if job["JobState"] in TERMINAL:
            return job
        if job["JobState"] == "PENDING" and on_pending:
            on_pending(job)
        time.sleep(1)
    subprocess.run(["scancel", job_id], env=cluster.environ())
    raise AssertionError(f"job {job_id} still {cluster.job(job_id)['JobState']} after {timeout} s")


def test_sbatch_job_completes_with_the_metrics_of_a_correct_run(cluster, tmp_path, reference):  # noqa: F811
    # No run_dir: the script pins runs/<job name>-<job id> (under the submit directory) itself.
    job_id = submit(cluster, tmp_path, "engine=ddp", f"train.micro_batch_size={MICRO}", *TINY)
    job = wait(cluster, job_id)
    out = (tmp_path / f"job-{job_id}.out").read_text()
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", out[-3000:]
    host = cluster.host
    assert (
        f"lm slurm: job {job_id} (restart 0), 1 node(s) [{host}], rendezvous {host}:{20000 + int(job_id) % 20000}"
        in out
    )
    run_dir = tmp_path / "runs" / f"lmtest-{job_id}"
    assert (run_dir / "config.yaml").exists() and (run_dir / "checkpoints" / "latest").exists()
    assert_same_losses(run_dir, reference)
    assert len(train_losses(run_dir)) == STEPS


def test_usr1_requeues_the_job_and_it_resumes_from_its_checkpoint(cluster, tmp_path):
    steps, every = 150, 25
    common = [
        "engine=ddp",
        f"train.micro_batch_size={MICRO}",
        *[o for o in TINY if not o.startswith("train.max_steps")],
        f"train.max_steps={steps}",
        f"train.ckpt_interval={every}",
    ]
    # ports of their own: the sbatch's default, 20000 + job id, is the other test's (each test's cluster starts at
    # job 1), which may run beside this one (pytest -n)
    straight = submit(cluster, tmp_path, *common, f"run_dir={tmp_path}/straight", MASTER_PORT=str(free_port()))
    interrupted = submit(cluster, tmp_path, *common, f"run_dir={tmp_path}/interrupted", MASTER_PORT=str(free_port()))
    latest = tmp_path / "interrupted" / "checkpoints" / "latest"
    deadline = time.time() + 300
    while not latest.exists():
        assert time.time() < deadline and cluster.job(interrupted)["JobState"] in ("PENDING", "RUNNING"), (
            f"no checkpoint before the job ended: {(tmp_path / f'job-{interrupted}.out').read_text()[-3000:]}"
        )
        time.sleep(0.2)
    # What SLURM sends 300 s before the time limit (--signal=B:USR1@300), to the batch shell only.
    subprocess.run(["scancel", "--batch", "--signal=USR1", interrupted], env=cluster.environ(), check=True)

    moved = []

    def start_now(job):
        # SLURM holds a requeued job for ~2 minutes (BeginTime): slurmd refuses a job credential made in the second
        # the job's last one was revoked (at the requeue), and StartTime=now failed one run in about seven
        # ("Killing non-startable batch JobId=..: Job credential revoked", the job FAILED). A few seconds suffice.
        if job.get("Reason") == "BeginTime" and not moved:
            subprocess.run(["scontrol", "update", f"JobId={interrupted}", "StartTime=now+3"], env=cluster.environ())
            moved.append(True)  # once: each call would move the start 3 s on again

    job = wait(cluster, interrupted, on_pending=start_now)
    out = (tmp_path / f"job-{interrupted}.out").read_text()
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", f"{job}\n{out[-3000:]}\n{cluster.logs()}"
    assert f"then job {interrupted} is requeued" in out and f"job {interrupted} (restart 1)" in out
    # (rank 0's stdout: lm/cli/train.py logs "resumed from" before it opens <run_dir>/train.log)
    resumed = [ln for ln in out.splitlines() if "resumed from" in ln]
    assert len(resumed) == 1, resumed
    resumed_step = int(resumed[0].rsplit("(step ", 1)[1].rstrip(")"))
    assert 0 < resumed_step < steps
    # The batch script hands USR1 on to the ranks (scancel --signal=USR1, torchrun ignoring it) and requeues once
    # they exit: lm train finishes the step in flight and checkpoints it (lm/core/loop.py _StopSignals), so the
    # job resumes from where it was stopped, not from the last multiple of ckpt_interval.
    assert f"SIGUSR1 received: stopped after step {resumed_step} with checkpoint" in out, out[-3000:]

    assert wait(cluster, straight)["JobState"] == "COMPLETED"
    expected, got = train_losses(tmp_path / "straight"), train_losses(tmp_path / "interrupted")
    assert sorted(got) == list(range(1, steps + 1)) == sorted(expected)
    for step in expected:  # bit-exact resume: the same losses as the run that was never stopped
        assert got[step] == pytest.approx(expected[step], abs=1e-6), f"step {step}"
