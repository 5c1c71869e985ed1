"""Real `lm train -m` sweeps on the tiny model and real data, with one impossible cell: the other
cells still run, and lm report marks the bad cell failed and says why. Slow (a few tiny trainings,
and the local_gpus launcher starts a Python process per cell)."""

import csv
import json
import os
import subprocess
import sys

import pytest

from lm.cli.report import main as report

pytestmark = pytest.mark.slow

TINY = [
    "train.max_steps=4",
    "train.log_interval=2",
    "train.eval_interval=2",
    "train.eval_batches=2",
    "train.ckpt_interval=0",
    "train.keep_last=1",
    "train.micro_batch_size=4",
    "train.seq_len=32",
]
BAD_REASON = "ConfigError: model.dim=64 is not divisible by model.n_heads=3"


def sweep(tmp_path, *overrides, pin_dir=True):
    env = dict(os.environ, OMP_NUM_THREADS="1", LM_CACHE=os.environ.get("LM_CACHE", os.path.expanduser("~/.cache/lm")))
    env.pop("LM_RUN_STAMP", None)
    pin = [f"hydra.sweep.dir={tmp_path / 'sweep'}"] if pin_dir else []  # else runs/<logger.group> under tmp_path
    cmd = [sys.executable, "-m", "lm.cli.train", "-m", "experiment=ablate_base", *pin, *TINY, *overrides]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def last_step(cell) -> int:
    lines = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
    return max(e["step"] for e in lines)


def check_report(tmp_path, ok_labels, sweep_dir=None):
    sweep_dir = sweep_dir or tmp_path / "sweep"
    assert report([str(sweep_dir), "-o", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| `")}
    assert f"FAILED: {BAD_REASON}" in rows["`model.n_heads=3`"]
    assert rows["`model.n_heads=3`"].split("|")[2].strip() == "0/1"
    assert f"- `{sweep_dir / '0'}`: {BAD_REASON}" in md
    for label in ok_labels:
        assert rows[f"`{label}`"].rstrip(" |").endswith("| ok")
    assert "(baseline)" in rows[f"`{ok_labels[0]}`"]  # the first variant that finished
    per_run = {r["run"]: r for r in csv.DictReader((tmp_path / "report" / "runs.csv").read_text().splitlines())}
    assert per_run[str(sweep_dir / "0")]["status"] == "failed"
    return md


def test_sequential_sweep_goes_on_past_a_failed_cell(tmp_path):
    out = sweep(tmp_path, "model.n_heads=3,4,2")
    assert out.returncode != 0, "Hydra raises the failed cell's error once every cell has run"
    assert BAD_REASON in out.stderr  # lm train re-raises a cell's error under -m; Hydra raises it at the end
    # ... where it ends the sweep in one line, not in the traceback of what the cell logged as one line
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert (
        out.stderr.rstrip()
        .splitlines()[-1]
        .startswith(
            "lm train: a cell of the sweep failed (each failed cell logged its error; the other cells ran); "
            f"the first: {BAD_REASON}"
        )
    ), out.stderr[-3000:]
    cells = [tmp_path / "sweep" / str(i) for i in range(3)]
    assert (
        (cells[0] / "error.txt")
        .read_text()
        .rstrip()
        .endswith(BAD_REASON + "; choose n_heads among [1, 2, 4, 8, 16, 32, 64] or set model.head_dim")
    )
    assert not (cells[0] / "metrics.jsonl").exists()
    assert last_step(cells[1]) == 4 and last_step(cells[2]) == 4
    # each train.log holds its own cell's lines only (cells share one process)
    for i in (1, 2):
        log = (cells[i] / "train.log").read_text()
        assert f"run_dir {cells[i]}" in log and f"run_dir {cells[3 - i]}" not in log
    assert "- model.n_heads=2" in (cells[2] / "config.yaml").read_text()  # the cell's overrides are its wandb tags
    check_report(tmp_path, ["model.n_heads=4", "model.n_heads=2"])


def test_local_gpus_launcher_on_a_machine_without_gpus(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the `slurm` extra (in dev too)")
    out = sweep(tmp_path, "hydra/launcher=local_gpus", "model.n_heads=3,4", "hydra.launcher.poll_s=0.2", pin_dir=False)
    assert "no GPU found; 1 cell(s) at a time on the CPU" in out.stdout + out.stderr
    # each cell is its own process, yet all resolve the sweep's one ${lm.stamp:}: one directory, one group
    (sweep_dir,) = (tmp_path / "runs").iterdir()
    cells = [sweep_dir / str(i) for i in range(2)]
    assert BAD_REASON in (cells[0] / "error.txt").read_text()
    assert last_step(cells[1]) == 4
    assert f"  group: {sweep_dir.name}\n" in (cells[1] / "config.yaml").read_text()
    check_report(tmp_path, ["model.n_heads=4"], sweep_dir)


def test_a_rerun_with_another_grid_leaves_the_finished_cells_their_names_and_results(tmp_path):
    """The sweep run again with its grid reordered: every cell is refused (its run trained other overrides), and
    Hydra has rewritten each cell's .hydra/overrides.yaml before the refusal. lm report still names each run by
    what it trained with (lm train's overrides.yaml) and shows it finished: no error.txt beside a finished run.
    The original grid again skips the cells and drops an earlier attempt's error.txt."""
    assert sweep(tmp_path, "model/ffn=gelu,swiglu").returncode == 0
    before = check_labels(tmp_path)
    assert before == {"0": "model/ffn=gelu", "1": "model/ffn=swiglu"}
    out = sweep(tmp_path, "model/ffn=swiglu,gelu")
    assert out.returncode != 0 and "model.ffn" in out.stderr
    assert "model/ffn=swiglu" in (tmp_path / "sweep" / "0" / ".hydra" / "overrides.yaml").read_text()
    assert not any((tmp_path / "sweep" / c / "error.txt").exists() for c in ("0", "1"))
    assert check_labels(tmp_path) == before
    (tmp_path / "sweep" / "1" / "error.txt").write_text("overrides: ...\nRuntimeError: an earlier attempt\n")
    assert sweep(tmp_path, "model/ffn=gelu,swiglu").returncode == 0
    assert not (tmp_path / "sweep" / "1" / "error.txt").exists()
    assert check_labels(tmp_path) == before


def check_labels(tmp_path) -> dict:
    """{cell: variant} of a report of tmp_path/sweep whose runs all finished."""
    assert report([str(tmp_path / "sweep"), "-o", str(tmp_path / "report")]) == 0
    rows = list(csv.DictReader((tmp_path / "report" / "runs.csv").read_text().splitlines()))
    assert all(r["status"] == "ok" for r in rows), rows
    return {r["run"].rsplit("/", 1)[1]: r["variant"] for r in rows}
