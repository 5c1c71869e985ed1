"""benchmarks/gpu_transfer.sh on the CPU with a tiny model: its lanes, narrowed scratch tasks, and one arm per
call joined with lm transfer --join (all slow)."""

import json
from pathlib import Path

import pytest


def _gpu_transfer_tiny(tmp_path, data_mirror, out_name="out", **env_extra):
    """benchmarks/gpu_transfer.sh on the CPU with a tiny model and 1 seed; returns OUT (tmp_path/out_name).
    Calls in one tmp_path share the mirror, the cache and (unless RUN_DIR is given) the run directory."""
    import os
    import subprocess

    repo = Path(__file__).parents[1]
    mirror_home = tmp_path / "mirror"
    if not mirror_home.is_dir():
        mirror_home.mkdir()
        subprocess.run(
            ["bash", str(repo / "benchmarks" / "gpu_transfer_data.sh"), "1", str(data_mirror)],
            cwd=mirror_home,
            check=True,
            capture_output=True,
            timeout=300,
        )
    few = dict.fromkeys(("cola", "mrpc", "stsb", "rte"), "100")
    env = {
        **os.environ,
        "LM_CACHE": str(tmp_path / "cache"),
        "LM_DATA_MIRROR": str(mirror_home / ".gpu_data"),
        "RUN_DIR": str(tmp_path / "run"),
        "TOKENS": "20000",
        "LIMIT": "900",
        "COMPILE": "0",
        "FINETUNE_SST2": "tasks.sst2.max_train_examples=200 tasks.sst2.epochs=1",
        "FINETUNE_OTHER": " ".join(f"tasks.{t}.max_train_examples={n} tasks.{t}.epochs=1" for t, n in few.items()),
        **env_extra,
    }
    out = tmp_path / out_name
    done = subprocess.run(
        [
            "bash",
            "benchmarks/gpu_transfer.sh",
            str(out),
            "--seeds",
            "0",
            "--pretrain",
            "model.dim=32",
            "model.n_layers=1",
            "model.n_heads=2",
            "train.micro_batch_size=8",
            "train.precision=fp32",
            "train.eval_batches=2",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_gpu_transfer_script_runs_its_four_lanes_and_merges_them_tiny(tmp_path, data_mirror):
    """benchmarks/gpu_transfer.sh on the CPU with a tiny model: the four lanes run, the second lanes' task
    directories merge into the first lanes' arms, and the table's call finds every task/seed pair finished
    (nothing is trained twice); OUT holds five files (a device call brings back at most 8)."""
    import tarfile

    out = _gpu_transfer_tiny(tmp_path, data_mirror)
    assert sorted(p.name for p in out.iterdir()) == [
        "details.tgz",
        "env.txt",
        "log.txt",
        "transfer.json",
        "transfer.md",
    ]
    summary = json.loads((out / "transfer.json").read_text())
    rows = summary["comparison"]["tasks"]
    assert sorted(rows) == ["cola", "mrpc", "rte", "sst2", "stsb"]
    with tarfile.open(out / "details.tgz") as tar:
        table_log = tar.extractfile("details/table.log").read().decode()
        names = set(tar.getnames())
    assert {"details/scratch_sst2.log", "details/pretrained_other.log", "details/pretrain_metrics.jsonl"} <= names
    assert table_log.count("done in an earlier run") == 10  # 5 tasks x 2 arms x 1 seed, none trained again
    assert "lm transfer (the table) exit status 0" in (out / "log.txt").read_text()


@pytest.mark.slow
def test_the_gpu_transfer_script_narrowed_to_some_scratch_tasks_tiny(tmp_path, data_mirror):
    """SCRATCH_SST2=0 SCRATCH_TASKS=cola,stsb: the scratch arm finetunes only CoLA and STS-B (the other tasks'
    overrides are dropped from its lane, which would refuse them), the pretrained arm all five, and no table is
    written (it needs every task in both arms): the lanes' results come back in details.tgz, and the pretrained
    arm's record, whole, in OUT."""
    import tarfile

    out = _gpu_transfer_tiny(tmp_path, data_mirror, SCRATCH_SST2="0", SCRATCH_TASKS="cola,stsb", COMPILE="1")
    assert sorted(p.name for p in out.iterdir()) == ["details.tgz", "env.txt", "log.txt", "transfer_pretrained.json"]
    with tarfile.open(out / "details.tgz") as tar:
        results = {
            n: json.loads(tar.extractfile(f"details/{n}_results.json").read())["columns"]
            for n in ("scratch_other", "pretrained_other", "pretrained")
        }
        names = set(tar.getnames())
    assert "details/scratch_sst2.log" not in names
    assert sorted(results["scratch_other"]) == ["cola", "stsb"]
    assert sorted(results["pretrained_other"]) == ["cola", "mrpc", "rte", "stsb"]
    assert sorted(results["pretrained"]) == ["cola", "mrpc", "rte", "sst2", "stsb"]  # the arm, whole
    log = (out / "log.txt").read_text()
    assert "lanes finished (any failed or stopped: 0)" in log and "the table" not in log
    record = json.loads((out / "transfer_pretrained.json").read_text())
    assert sorted(record["results"]["columns"]) == ["cola", "mrpc", "rte", "sst2", "stsb"]  # whole: for --join
    # COMPILE=1: the pretraining compiled, after the call's own --pretrain overrides
    assert record["recipe"]["pretrain_overrides"][-2:] == ["train.eval_batches=2", "train.compile=true"]


@pytest.mark.slow
def test_the_gpu_transfer_script_one_arm_per_call_tiny(tmp_path, data_mirror):
    """ARMS=pretrained, then ARMS=scratch on the same machine (RUN_DIR): the second call finds the first's arm
    whole and writes the table, training nothing twice. ARMS=scratch on another machine (a fresh RUN_DIR) brings
    back its arm's record instead, which lm transfer --join puts together with the first call's into the same
    table."""
    import tarfile

    from lm.cli.transfer_join import join_arms

    first = _gpu_transfer_tiny(tmp_path, data_mirror, "first", ARMS="pretrained")
    assert sorted(p.name for p in first.iterdir()) == ["details.tgz", "env.txt", "log.txt", "transfer_pretrained.json"]
    with tarfile.open(first / "details.tgz") as tar:
        assert not any("scratch_" in n for n in tar.getnames())  # no scratch lane ran
    second = _gpu_transfer_tiny(tmp_path, data_mirror, "second", ARMS="scratch")
    assert sorted(p.name for p in second.iterdir()) == [
        "details.tgz",
        "env.txt",
        "log.txt",
        "transfer.json",
        "transfer.md",
    ]
    with tarfile.open(second / "details.tgz") as tar:
        assert tar.extractfile("details/table.log").read().decode().count("done in an earlier run") == 10
        assert not {"details/pretrained_sst2.log", "details/pretrained_other.log"} & set(tar.getnames())  # no lane
    elsewhere = _gpu_transfer_tiny(tmp_path, data_mirror, "elsewhere", ARMS="scratch", RUN_DIR=str(tmp_path / "run2"))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["details.tgz", "env.txt", "log.txt", "transfer_scratch.json"]
    joined = join_arms([first / "transfer_pretrained.json", elsewhere / "transfer_scratch.json"], tmp_path / "j", "")
    table = json.loads((second / "transfer.json").read_text())
    assert joined["comparison"] == table["comparison"]
    assert joined["recipe"]["val_loss"] == table["recipe"]["val_loss"] is not None
