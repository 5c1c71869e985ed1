"""lm preflight: one process here, 2 gloo ranks under torchrun and under the multi-node launch
script, and the verdict logic on rank layouts this machine cannot have (GPUs, several hosts)."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from lm.cli import preflight as preflight_cli
from tests.engine_support import REPO, free_port
from tests.test_launch_multinode import launch_env


def run_main(capsys, *argv):
    code = preflight_cli.main(list(argv))
    return code, capsys.readouterr().out


def statuses(out: str) -> dict:
    return {m.group(2): m.group(1) for m in re.finditer(r"^  (PASS|WARN|FAIL|SKIP)\s+(\S+(?: size)?)", out, re.M)}


def test_one_process_is_ready_and_reports_free_disk(tmp_path, capsys):
    code, out = run_main(
        capsys, "--ckpt-dir", str(tmp_path / "ckpt"), "--need-gb", "0.001", "--json", str(tmp_path / "r.json")
    )
    assert code == 0, out
    assert statuses(out) == {
        "rendezvous": "PASS",
        "world size": "PASS",
        "devices": "PASS",
        "all-reduce": "SKIP",
        "disk": "PASS",
    }
    assert out.rstrip().endswith("verdict: READY (4 passed)")
    free_gb = float(re.search(r"ckpt: ([\d.]+) GB free", out).group(1))
    assert free_gb == pytest.approx(shutil.disk_usage(tmp_path).free / 1e9, abs=0.5)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "ready" and report["world_size"] == 1 and len(report["checks"]) == 5
    assert list((tmp_path / "ckpt").iterdir()) == []  # its probe files are gone


def test_json_never_replaces_a_file_it_did_not_write(tmp_path, capsys):
    """--json overwrote any file (a config, notes) after every check had run, and a directory there failed only
    then; both are refused before the rendezvous. Its own report is replaced."""
    (tmp_path / "notes.json").write_text('{"mine": 1}')
    for path, why in (
        (tmp_path / "notes.json", "exists and is not a report lm preflight wrote; name another file, or move it"),
        (tmp_path, "is a directory; name a file"),
        (tmp_path / "notes.json" / "r.json", f"lies below {tmp_path / 'notes.json'}, which is a file"),
    ):
        with pytest.raises(SystemExit) as e:
            preflight_cli.main(["--ckpt-dir", str(tmp_path / "ckpt"), "--json", str(path)])
        assert e.value.code == 2 and f"argument --json: {path} {why}" in capsys.readouterr().err
    assert (tmp_path / "notes.json").read_text() == '{"mine": 1}' and not (tmp_path / "ckpt").exists()
    (tmp_path / "r.json.tmp").write_text("mine too")  # the fixed <name>.tmp it wrote through, then moved onto r.json
    for _ in range(2):
        argv = ["--ckpt-dir", str(tmp_path / "ckpt"), "--need-gb", "0.001", "--json", str(tmp_path / "r.json")]
        assert run_main(capsys, *argv)[0] == 0
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "ready"
    assert (tmp_path / "r.json.tmp").read_text() == "mine too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "notes.json", "r.json", "r.json.tmp"]


def test_too_little_disk_fails_with_the_numbers(tmp_path, capsys):
    code, out = run_main(capsys, "--ckpt-dir", str(tmp_path), "--need-gb", "1e9")
    assert code == 1
    assert statuses(out)["disk"] == "FAIL" and "1000000000.0 GB needed (--need-gb)" in out
    assert "verdict: NOT READY: disk failed" in out


def test_unwritable_checkpoint_dir_fails(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, out = run_main(capsys, "--ckpt-dir", str(blocker / "ckpt"))
    assert code == 1 and statuses(out)["disk"] == "FAIL" and "is not writable" in out


def test_checkpoint_size_is_estimated_from_the_model_preset(tmp_path, capsys):
    code, out = run_main(capsys, f"run_dir={tmp_path}", "--model", "gpt2", "--keep-last", "2")
    assert code == 0, out
    params = float(re.search(r"model=gpt2: ([\d.]+)M params", out).group(1)) * 1e6
    assert 124e6 < params < 125e6  # GPT-2 small (Radford et al. 2019): 124M parameters
    needed = float(re.search(r"([\d.]+) GB needed", out).group(1))
    assert needed == pytest.approx(params * 12 * 3 / 1e9, abs=0.06)  # fp32 weights + 2 Adam moments, 2 kept + 1
    assert f"{tmp_path}: " in out  # run_dir= (what launch/slurm.sbatch appends) names the directory


def test_bad_arguments_are_rejected(capsys):
    with pytest.raises(SystemExit) as e:
        preflight_cli.main(["train.max_steps=3"])
    assert e.value.code == 2 and "takes only run_dir=PATH" in capsys.readouterr().err
    assert preflight_cli.main(["--model", "no_such_preset"]) == 2
    assert "--model no_such_preset" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--iters", "0"),  # under torchrun this was a ZeroDivisionError traceback on every rank
        ("--size-mb", "-5"),  # reported "-5 MiB fp32" and passed
        ("--size-mb", "nan"),
        ("--timeout", "0"),
        ("--need-gb", "nan"),  # said "--model None: cannot convert float NaN to integer"
        ("--need-gb", "-1"),
        ("--keep-last", "0"),
        ("--expect-world-size", "0"),
        ("--min-busbw", "inf"),
    ],
)
def test_out_of_range_numbers_are_refused_in_one_line_before_any_rendezvous(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        preflight_cli.main([flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].startswith(f"lm preflight: error: argument {flag}: {value} is not a ")


def info(rank, host, local_rank, gpus=8, name="NVIDIA H100 80GB HBM3", free=500e9, local_world=8):
    return preflight_cli.RankInfo(
        rank=rank,
        host=host,
        local_rank=local_rank,
        local_world_size=local_world,
        gpus=gpus,
        gpu_name=name,
        free_bytes=int(free),
        writable="",
    )


def args(**kw):
    return preflight_cli.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


def test_devices_verdicts_on_gpu_layouts():
    two_nodes = [info(r, f"node{r // 8}", r % 8) for r in range(16)]
    check = preflight_cli._check_devices(args(), two_nodes)
    assert check.status == "PASS" and "16 rank(s), one GPU each: NVIDIA H100 80GB HBM3" in check.detail
    too_many = two_nodes + [info(16, "node1", 8, local_world=9)]
    check = preflight_cli._check_devices(args(), too_many)
    assert check.status == "FAIL" and "node1 local rank 8 (sees 8 GPU(s))" in check.detail
    mixed = [info(0, "a", 0, local_world=1, gpus=1), info(1, "b", 0, local_world=1, gpus=1, name="NVIDIA A100")]
    assert preflight_cli._check_devices(args(), mixed).status == "WARN"
    idle = [info(r, "a", r, local_world=4) for r in range(4)]
    check = preflight_cli._check_devices(args(), idle)
    assert check.status == "WARN" and "4 GPU(s) per node left idle" in check.detail
    cpu = [info(r, "a", r, gpus=0, name="", local_world=2) for r in range(2)]
    assert preflight_cli._check_devices(args(), cpu).status == "PASS"
    assert preflight_cli._check_devices(preflight_cli.parse_args(["--require-gpu"]), cpu).status == "FAIL"


def test_world_size_verdicts(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "16")
    even = [info(r, f"node{r // 8}", r % 8) for r in range(16)]
    check = preflight_cli._check_world(args(), even)
    assert check.status == "PASS" and check.detail == "16 rank(s) on 2 node(s): node0 x8, node1 x8"
    assert preflight_cli._check_world(args(expect_world_size=32), even).status == "FAIL"
    monkeypatch.setenv("WORLD_SIZE", "15")
    assert preflight_cli._check_world(args(), even[:15]).status == "WARN"  # 8 + 7: uneven
    assert "WORLD_SIZE=15" in preflight_cli._check_world(args(), even).detail


def test_disk_names_the_fullest_node_and_an_unshared_directory(tmp_path, monkeypatch):
    layout = [info(0, "node0", 0, free=900e9), info(1, "node1", 0, free=40e9)]
    monkeypatch.setattr(preflight_cli, "_shared_directory", lambda ckpt, infos: (True, []))
    check = preflight_cli._check_disk(args(ckpt_dir=tmp_path), layout, need=int(50e9), why="--need-gb")
    assert check.status == "FAIL" and "40.0 GB free (least: node1), 50.0 GB needed" in check.detail
    assert preflight_cli._check_disk(args(ckpt_dir=tmp_path), layout, need=int(30e9), why="x").status == "PASS"
    monkeypatch.setattr(preflight_cli, "_shared_directory", lambda ckpt, infos: (False, ["node1"]))
    check = preflight_cli._check_disk(args(ckpt_dir=tmp_path), layout, need=int(30e9), why="x")
    assert check.status == "FAIL" and "node1 do(es) not see rank 0's files" in check.detail


def _bus_bandwidth(out: str) -> float:
    return float(re.search(r"bus bandwidth ([\d.]+) GB/s", out).group(1))


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_under_torchrun_measure_bandwidth_and_fail_clearly(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "lm.cli.preflight",
        "--ckpt-dir",
        str(tmp_path),
        "--need-gb",
        "0.001",
        "--size-mb",
        "8",
        "--json",
        str(tmp_path / "r.json"),
    ]
    out = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert statuses(out.stdout) == {
        "rendezvous": "PASS",
        "world size": "PASS",
        "devices": "PASS",
        "all-reduce": "PASS",
        "disk": "PASS",
    }
    assert "2 rank(s) on 1 node(s)" in out.stdout and "verdict: READY (5 passed)" in out.stdout
    assert out.stdout.count("verdict:") == 1  # rank 0 reports, rank 1 does not repeat it
    busbw = _bus_bandwidth(out.stdout)
    algbw = float(re.search(r"algbw ([\d.]+) GB/s", out.stdout).group(1))
    assert busbw > 0 and busbw == pytest.approx(algbw, rel=0.02)  # 2(n-1)/n = 1 for n = 2
    ms = float(re.search(r"([\d.]+) ms per all-reduce", out.stdout).group(1))
    assert busbw == pytest.approx(8 * 2**20 / (ms / 1e3) / 1e9, rel=0.02)  # bytes / time, the figure is consistent

    bad = subprocess.run(
        cmd[:-2] + ["--expect-world-size", "3", "--min-busbw", "1e6"],
        cwd=REPO,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0  # every rank exits 1, so the launcher fails too
    assert statuses(bad.stdout) == {
        "rendezvous": "PASS",
        "world size": "FAIL",
        "devices": "PASS",
        "all-reduce": "FAIL",
        "disk": "PASS",
    }
    assert "expected 3 (--expect-world-size)" in bad.stdout and "< 1e+06 GB/s (--min-busbw)" in bad.stdout
    assert "verdict: NOT READY: world size, all-reduce failed" in bad.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_two_node_ranks_through_the_multinode_script(tmp_path):
    port = free_port()
    procs, logs = [], []
    for r in (1, 0):
        log = tmp_path / f"node{r}.log"
        env = launch_env(
            LM_ENTRY="lm.cli.preflight",
            NNODES="2",
            NODE_RANK=str(r),
            NPROC_PER_NODE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            LOCAL_ADDR="127.0.0.1",
        )
        procs.append(
            subprocess.Popen(
                [
                    str(REPO / "launch/torchrun_multinode.sh"),
                    f"run_dir={tmp_path}/run",
                    "--need-gb",
                    "0.001",
                    "--size-mb",
                    "4",
                ],
                cwd=REPO,
                env=env,
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
            )
        )
        logs.append(log)
    try:
        codes = [p.wait(300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    text = "".join(log.read_text() for log in logs)
    assert codes == [0, 0], text
    assert text.count("verdict: READY (5 passed)") == 1 and _bus_bandwidth(text) > 0
    assert f"{tmp_path}/run: " in text and "the same directory on all 1 node(s)" in text
