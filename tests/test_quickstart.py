"""lm quickstart: lm transfer's recipe on a budget (the pretrained arm alone, or both arms with --compare),
the comparison table, and (slow) the whole command end to end on a tiny budget."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lm.cli.quickstart import compare_table, run
from tests.test_finetune import easy_glue  # noqa: F401 - the easy SST-2-shaped task (a fixture)
from tests.test_transfer import corpus, recipe  # noqa: F401 - the tiny corpus (a fixture) and recipe


def _results(path: Path, col: str, metrics: list, seeds: dict):
    path.mkdir()
    keys = {k: sorted(m[k] for m in seeds.values())[len(seeds) // 2] for k in metrics}  # odd counts: the median
    median = {**keys, "score": sum(keys.values()) / len(keys)}
    (path / "results.json").write_text(json.dumps({"columns": {col: {"metrics": metrics, "seeds": seeds,
                                                                      "median": median}}}))


def test_compare_table_reports_seeds_medians_and_the_gain(tmp_path):
    _results(tmp_path / "pre_sst2", "sst2", ["acc"], {"0": {"acc": 80.0}, "1": {"acc": 78.0}, "2": {"acc": 81.0}})
    _results(tmp_path / "pre_stsb", "stsb", ["pearson", "spearman"], {"0": {"pearson": 40.0, "spearman": 38.0}})
    _results(tmp_path / "scr_sst2", "sst2", ["acc"], {"0": {"acc": 70.5}, "1": {"acc": 72.0}, "2": {"acc": 69.0}})
    _results(tmp_path / "scr_stsb", "stsb", ["pearson", "spearman"], {"0": {"pearson": 10.0, "spearman": 9.0}})
    table = compare_table([tmp_path / "pre_sst2", tmp_path / "pre_stsb"], [tmp_path / "scr_sst2", tmp_path / "scr_stsb"])
    assert "| sst2 | acc | 70.5 / 72.0 / 69.0 | 70.5 | 80.0 / 78.0 / 81.0 | 80.0 | +9.5 |" in table
    assert "| stsb | pearson/spearman | 9.5 | 9.5 | 39.0 | 39.0 | +29.5 |" in table


def test_the_pretrained_arm_alone_then_both_arms_with_compare(tmp_path, corpus, easy_glue):  # noqa: F811
    r = recipe(tmp_path / "q", corpus, easy_glue, seeds=[0])
    arms = run(r, compare=False)
    assert list(arms) == ["pretrained"] and not (tmp_path / "q" / "finetune" / "scratch").exists()
    assert (tmp_path / "q" / "pretrain" / "checkpoints" / "latest").read_text() == "step_00000004"
    cfg = (arms["pretrained"] / "config.yaml").read_text()
    assert "pooling: mean" in cfg and "epochs: 2" in cfg and str(tmp_path / "q" / "pretrain") in cfg
    mtime = (arms["pretrained"] / "sst2" / "seed0" / "result.pt").stat().st_mtime_ns
    arms = run(recipe(tmp_path / "q", corpus, easy_glue, seeds=[0]), compare=True)  # resumes, adds the scratch arm
    assert list(arms) == ["pretrained", "scratch"]
    assert (arms["pretrained"] / "sst2" / "seed0" / "result.pt").stat().st_mtime_ns == mtime  # not finetuned again
    scratch = (arms["scratch"] / "config.yaml").read_text()
    assert "init: none" in scratch and "dim: 32" in scratch and "tokenizer.json" in scratch
    table = compare_table(arms["pretrained"], arms["scratch"])
    assert table.count("| sst2 | acc |") == 1


def test_zero_tokens_runs_only_the_scratch_arm(tmp_path, corpus, easy_glue):  # noqa: F811
    arms = run(recipe(tmp_path / "z", corpus, easy_glue, tokens=0, seeds=[0]), compare=False)
    assert list(arms) == ["scratch"] and not (tmp_path / "z" / "pretrain").exists()


def test_help_describes_the_job():
    out = subprocess.run([sys.executable, "-m", "lm.cli.quickstart", "--help"], capture_output=True, text=True, check=True)
    assert "--tokens" in out.stdout and "task-adaptive" in out.stdout and "--compare" in out.stdout


# The curve script's --tiny pretraining (benchmarks/glue_transfer_curve.py): the TinyStories slice, a 1 x 32 model
TINY_PRETRAIN = ["data=tinystories_sample_bpe", "data.vocab_size=512", "model.vocab_size=512", "model.dim=32",
                 "model.n_layers=1", "model.n_heads=2", "train.progress=false", "train.eval_interval=0",
                 "sched.warmup_steps=1"]


@pytest.mark.slow
def test_quickstart_end_to_end_on_a_tiny_budget(tmp_path):
    env = {**os.environ, "LM_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "lm.cli.quickstart", "--out", str(tmp_path / "qs"), "--tasks", "rte",
                          "--tokens", "8192", "--compare", "--pretrain", *TINY_PRETRAIN, "--set", "glue.max_train_examples=48",
                          "tasks.rte.epochs=1"],
                         capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| RTE | acc |" in out.stdout and "| rte | acc |" in out.stdout  # both tables and the comparison
    for arm in ("pretrained", "scratch"):
        r = json.loads((tmp_path / "qs" / "finetune" / arm / "results.json").read_text())
        assert 0.0 <= r["columns"]["rte"]["median"]["acc"] <= 100.0
    assert (tmp_path / "qs" / "pretrain" / "checkpoints" / "latest").read_text() == "step_00000004"  # 8,192 tokens / 2,048
