"""The easy GLUE task and the tiny pretraining run the lm finetune tests share (tests/test_finetune*.py, and the
transfer, resume and zoo tests that finetune): fixtures `easy_glue` and `pretrained`, and the helpers that write and
read them.

The easy task is SST-2-shaped (official TSV layout, written to tmp): a sentence is positive when it
holds one of four positive words, negative when it holds one of four negative words, among neutral
filler; a bag-of-words model separates it, so a tiny decoder reaches far above chance in a few epochs.
"""

import csv
import json
import random
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from lm.cli.finetune import register
from lm.config import conf_dir

FIXTURES = Path(__file__).parent / "fixtures" / "glue"
POS, NEG = ["great", "lovely", "superb", "wonderful"], ["awful", "boring", "dreadful", "terrible"]
FILLER = [
    "the",
    "a",
    "film",
    "movie",
    "story",
    "plot",
    "actors",
    "scene",
    "was",
    "is",
    "and",
    "it",
    "this",
    "really",
    "quite",
]
TINY = ["model=tiny", "model.vocab_size=320", "model.dim=32", "model.n_layers=1", "model.n_heads=2"]


def sentence(rng, label):
    words = rng.choices(FILLER, k=rng.randint(3, 8))
    words.insert(rng.randrange(len(words) + 1), rng.choice(POS if label else NEG))
    return " ".join(words)


def write_tsv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        w.writerows([header, *rows])


@pytest.fixture(scope="module")
def easy_glue(tmp_path_factory):
    """glue_data/SST-2/{train,dev,test}.tsv of the easy task: 400 train, 100 dev, 30 test."""
    root = tmp_path_factory.mktemp("glue_data")
    rng = random.Random(0)
    for split, n in (("train", 400), ("dev", 100)):
        labels = [i % 2 for i in range(n)]
        write_tsv(root / "SST-2" / f"{split}.tsv", ["sentence", "label"], [[sentence(rng, y), y] for y in labels])
    write_tsv(root / "SST-2" / "test.tsv", ["index", "sentence"], [[i, sentence(rng, i % 2)] for i in range(30)])
    return root


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, easy_glue):
    """A 3-step lm train run (single engine) on a BPE tokenizer of 320 tokens; returns its run dir."""
    work = tmp_path_factory.mktemp("pretrain")
    rng = random.Random(1)
    text = "\n".join(sentence(rng, i % 2) for i in range(600)) + "\n"
    (work / "corpus.txt").write_text(text)
    pretrain(work, work / "run", max_steps=3)
    return work


def pretrain(work, run_dir, max_steps: int) -> None:
    """lm train of the `pretrained` fixture's run (its corpus and data dir under `work`) to max_steps in run_dir:
    the same command continues a copy of the run."""
    from lm.cli.train import train
    from lm.config import register_train_configs

    register_train_configs()
    overrides = [
        *TINY,
        f"run_dir={run_dir}",
        f"train.max_steps={max_steps}",
        "train.seq_len=32",
        "train.micro_batch_size=4",
        "train.eval_interval=0",
        "train.eval_batches=1",
        "train.ckpt_interval=3",
        "train.progress=false",
    ]
    overrides += corpus_data(work, "easy")
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    train(cfg)


def finetune_cfg(run_dir, overrides):
    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose(
            config_name="finetune", overrides=[f"run_dir={run_dir}", "hf=false", "train.progress=false", *overrides]
        )


def easy_task(root, **task):
    fields = {"epochs": 6, "lr": 3e-3, "batch_size": 16, "max_len": 24, "seeds": [0], **task}
    return ["task=glue/sst2", f"glue.data_root={root}", *(f"tasks.sst2.{k}={v}" for k, v in fields.items())]


def dev_acc(run_dir, seed="0"):
    return json.loads((Path(run_dir) / "results.json").read_text())["columns"]["sst2"]["seeds"][seed]["acc"]


def easy_pair_glue(root, similarity: bool = False):
    """glue_data/STS-B of an easy symmetric pair task: each sentence holds one sentiment word, the score
    is 2.5 x the number of positive ones (0, 2.5 or 5), whichever sentence comes first; with similarity,
    5 when the two words agree and 0 when not (what a siamese model's cosine can express)."""
    rng = random.Random(2)
    header = ["index", "sentence1", "sentence2", "score"]
    for split, n in (("train", 400), ("dev", 100)):
        labels = [(i % 2, (i // 2) % 2) for i in range(n)]
        score = (lambda a, b: 5.0 * (a == b)) if similarity else (lambda a, b: 2.5 * (a + b))
        rows = [[i, sentence(rng, a), sentence(rng, b), score(a, b)] for i, (a, b) in enumerate(labels)]
        write_tsv(root / "STS-B" / f"{split}.tsv", header, rows)
    test = [[i, sentence(rng, i % 2), sentence(rng, 1)] for i in range(20)]
    write_tsv(root / "STS-B" / "test.tsv", ["index", "sentence1", "sentence2"], test)
    return root


def corpus_data(work, name: str) -> list[str]:
    """The data overrides of a small BPE corpus: work/corpus.txt, one document per line, prepared into work/data.
    No preset: DataConfig's defaults + these."""
    data = {
        "name": name,
        "dir": work / "data",
        "source": work / "corpus.txt",
        "tokenizer": "bpe",
        "vocab_size": 320,
        "n_sentinels": 0,
        "workers": 1,
        "val_fraction": 0.1,
        "doc_split": "line",
    }
    return ["~data", *(f"data.{k}={v}" for k, v in data.items())]
