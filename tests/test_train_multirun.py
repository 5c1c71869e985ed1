"""`lm train -m` without an experiment: one run directory per cell, and a failing cell does not end the
sweep (the next cells still train)."""

import subprocess
import sys

import pytest

from tests.engine_support import REPO, metrics, subprocess_env

pytestmark = pytest.mark.slow


def test_plain_multirun_gives_each_cell_its_own_run_dir_and_survives_a_bad_cell(tmp_path):
    args = [
        "-m",
        "model=tiny",
        "data=shakespeare_char",
        "train.seq_len=32",
        "train.micro_batch_size=2",
        "train.max_steps=2",
        "train.log_interval=1",
        "train.eval_batches=1",
        "sched.warmup_steps=1",
        "model.n_heads=3,4",
        "seed=0,1",
    ]  # n_heads=3 does not divide dim=64: those two cells fail
    proc = subprocess.run(
        [sys.executable, "-m", "lm.cli.train", *args],
        cwd=tmp_path,
        timeout=900,
        text=True,
        capture_output=True,
        env=subprocess_env(LM_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO)),
    )
    assert proc.returncode != 0  # Hydra re-raises the first failure once the sweep is over
    assert "n_heads" in proc.stdout + proc.stderr
    sweep = list((tmp_path / "runs").iterdir())
    assert len(sweep) == 1, sweep
    cells = {p.name: p for p in sweep[0].iterdir() if p.is_dir()}
    trained = {name for name, p in cells.items() if (p / "metrics.jsonl").exists()}
    assert trained == {"2", "3"}, cells  # jobs 0, 1 = n_heads 3 (failed); 2, 3 = n_heads 4 with seeds 0, 1
    first, second = ([m["loss"] for m in metrics(cells[c]) if "loss" in m] for c in ("2", "3"))
    assert len(first) == len(second) == 2 and first != second  # separate runs (different seeds), not a resume


def test_a_multirun_with_an_explicit_run_dir_gives_each_cell_its_own_directory(tmp_path):
    args = [
        "-m",
        "model=tiny",
        "data=shakespeare_char",
        "train.seq_len=32",
        "train.micro_batch_size=2",
        "train.max_steps=1",
        "train.eval_batches=1",
        "sched.warmup_steps=1",
        "seed=0,1",
        "run_dir=sweep",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "lm", "train", *args],
        cwd=tmp_path,
        timeout=900,
        text=True,
        capture_output=True,
        env=subprocess_env(LM_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr
    cells = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert cells == ["0", "1"]
    first, second = ([m["loss"] for m in metrics(tmp_path / "sweep" / c) if "loss" in m] for c in cells)
    assert len(first) == len(second) == 1 and first != second  # two runs (seeds 0 and 1), neither resumed
    assert "resumed from" not in proc.stdout + proc.stderr
