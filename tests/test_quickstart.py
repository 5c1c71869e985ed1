"""lm-quickstart: the task-adaptive corpus holds only unlabelled TRAIN text, the comparison table, and (slow)
the whole command end to end on a tiny budget."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lm.glue.readers import load_split
from lm.cli.quickstart import compare_table, glue_sentences


def test_task_adaptive_corpus_is_train_text_only(tmp_path, data_mirror):
    root = data_mirror / "glue_data"
    path = glue_sentences(tmp_path, ["rte", "cola"], root)
    lines = path.read_text().splitlines()
    train_rte = load_split("rte", "train", root, hf=False)
    train_cola = load_split("cola", "train", root, hf=False)
    assert len(lines) == 2 * len(train_rte) + len(train_cola)  # RTE: both sentences of each pair
    assert lines[0] == train_rte[0].text_a and lines[1] == train_rte[0].text_b
    assert lines[-1] == train_cola[-1].text_a
    text = set(lines)
    dev_only = [e.text_a for e in load_split("cola", "dev", root, hf=False) if e.text_a not in
                {t.text_a for t in train_cola}]
    assert dev_only and not any(s in text for s in dev_only)  # no dev sentence leaks into pretraining
    assert not any("\t" in line for line in lines)  # text only: no label or source columns (CoLA has both)


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


def test_help_describes_the_job():
    out = subprocess.run([sys.executable, "-m", "lm.cli.quickstart", "--help"], capture_output=True, text=True, check=True)
    assert "--pretrain-steps" in out.stdout and "task-adaptive" in out.stdout and "--compare" in out.stdout


@pytest.mark.slow
def test_quickstart_end_to_end_on_a_tiny_budget(tmp_path):
    env = {**os.environ, "LM_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "lm.cli.quickstart", "--out", str(tmp_path / "qs"), "--tasks", "rte",
                          "--pretrain-steps", "4", "--compare", "--set", "glue.max_train_examples=48",
                          "tasks.rte.epochs=1", "predict_test=false"],
                         capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| RTE | acc |" in out.stdout and "| rte | acc |" in out.stdout  # both tables and the comparison
    for arm in ("pretrained", "scratch"):
        r = json.loads((tmp_path / "qs" / "finetune" / arm / "results.json").read_text())
        assert 0.0 <= r["columns"]["rte"]["median"]["acc"] <= 100.0
    assert (tmp_path / "qs" / "pretrain" / "checkpoints" / "latest").read_text() == "step_00000004"
