"""benchmarks/glue_baselines.py: GLUE scored by word identity alone (TF-IDF / lexical overlap), no network."""

import random

import pytest

from tests.benchmark_scripts import load
from tests.glue_support import sentence, write_tsv

baselines = load("glue_baselines")


def test_overlap_features_of_one_pair():
    # A = {the, cat, sat}, B = {the, cat, ran, off}: |A&B| = 2, |A|B| = 5
    got = baselines.overlap("The cat sat.", "the CAT ran off")
    assert got == pytest.approx([2 / 4, 2 / 3, 2 / 5, (3 - 4) / 7, 2 / 4])
    assert baselines.overlap("", "") == [0.0, 0.0, 0.0, 0.0, 0.0]


def test_a_single_sentence_task_one_word_decides(tmp_path):
    """SST-2 where one sentiment word decides the label (tests/glue_support.py's sentences): the TF-IDF
    classifier finds it, the majority class is half right, and --max-train's budget is honoured."""
    rng = random.Random(0)
    for split, n in (("train", 300), ("dev", 100)):
        rows = [[sentence(rng, i % 2), i % 2] for i in range(n)]
        write_tsv(tmp_path / "SST-2" / f"{split}.tsv", ["sentence", "label"], rows)
    got = baselines.baselines("sst2", tmp_path, max_train=120)
    assert got["train_rows"] == 120
    assert got["majority"]["acc"] == 50.0
    assert got["lexical"]["acc"] >= 95.0, got


def pair_task(root, rng, n: int, split: str):
    """RTE-like rows: entailment (0) when the hypothesis repeats premise words, else (1) new words."""
    words = [f"w{i}" for i in range(200)]
    rows = []
    for i in range(n):
        premise = rng.sample(words, 8)
        hypothesis = rng.sample(premise, 4) if i % 2 == 0 else rng.sample(words, 4)
        rows.append([i, " ".join(premise), " ".join(hypothesis), ["entailment", "not_entailment"][i % 2]])
    write_tsv(root / "RTE" / f"{split}.tsv", ["index", "sentence1", "sentence2", "label"], rows)


def test_a_pair_task_overlap_decides(tmp_path):
    rng = random.Random(1)
    pair_task(tmp_path, rng, 200, "train")
    pair_task(tmp_path, rng, 100, "dev")
    got = baselines.baselines("rte", tmp_path)
    assert got["majority"]["acc"] == 50.0
    assert got["lexical"]["acc"] >= 95.0, got


def test_stsb_jaccard_needs_no_training(tmp_path):
    """Scores that ARE 5 x the word Jaccard: the untrained baseline correlates perfectly, the ridge nearly."""
    rng = random.Random(2)
    words = [f"w{i}" for i in range(50)]
    for split, n in (("train", 200), ("dev", 80)):
        rows = []
        for i in range(n):
            a, b = rng.sample(words, 6), rng.sample(words, 6)
            rows.append([i, " ".join(a), " ".join(b), 5 * len(set(a) & set(b)) / len(set(a) | set(b))])
        write_tsv(tmp_path / "STS-B" / f"{split}.tsv", ["index", "sentence1", "sentence2", "score"], rows)
    got = baselines.baselines("stsb", tmp_path)
    assert got["jaccard"]["pearson"] == pytest.approx(100.0)
    assert got["lexical"]["pearson"] > 95.0, got
    assert got["majority"]["score"] == 0.0  # a constant correlates with nothing


def test_rte_on_the_real_dev_set(data_mirror):
    """The numbers docs/glue_transfer.md quotes: RTE's majority class and its lexical-overlap baseline."""
    got = baselines.baselines("rte", data_mirror / "glue_data")
    assert got["train_rows"] == 2490
    assert got["majority"]["acc"] == pytest.approx(52.7, abs=0.05)
    assert got["lexical"]["acc"] == pytest.approx(57.4, abs=0.5)


def test_bad_budgets_name_the_form():
    assert baselines.parse_budgets("sst2=5000,stsb=2000") == {"sst2": 5000, "stsb": 2000}
    for bad in ("sst2", "mnli=10", "sst2=ten"):
        with pytest.raises(SystemExit, match="<task>=<rows>"):
            baselines.parse_budgets(bad)
