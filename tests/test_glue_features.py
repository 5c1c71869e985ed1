"""The frozen-feature benchmarks of benchmarks/glue_probe.py on the tiny pretrained run (tests/glue_support.py): a
linear probe, zero-shot similarity, next-word log-probabilities of padded batches, the label-word probe, whitening."""

import random

import numpy as np

from tests.benchmark_scripts import load
from tests.glue_support import easy_glue as easy_glue  # a module fixture, re-exported
from tests.glue_support import pretrained as pretrained  # a module fixture, re-exported
from tests.glue_support import sentence, write_tsv


def test_linear_probe_of_frozen_features(pretrained, easy_glue):
    """benchmarks/glue_probe.py: logistic regression on pooled frozen features, pretrained and random init."""
    glue_probe = load("glue_probe")
    rows = glue_probe.probe(str(pretrained / "run"), "sst2", 0, 24, str(easy_glue))
    assert set(rows) == {(w, p) for w in ("pretrained", "random init") for p in ("mean", "last")}
    # One sentiment word among fillers: its embedding moves the mean, so even random features separate
    # the classes well; the last token (a filler or the word) sees the word only through attention.
    assert rows[("random init", "mean")][1] > 75 and rows[("pretrained", "mean")][1] > 75
    assert all(0 <= acc <= 100 for pair in rows.values() for acc in pair)


def test_zero_shot_similarity_of_frozen_features(pretrained, tmp_path):
    """benchmarks/glue_probe.py on STS-B: cos of each sentence's pooled features, read alone, against the
    dev scores; no training. Half the pairs are a sentence and itself (score 5, cos exactly 1), half two
    different sentences (score 0, cos below 1): every weight and pooling correlates strongly, raw or
    whitened (fit on the training pairs, which are built the same way)."""
    rng = random.Random(3)
    for split in ("train", "dev"):
        rows = [
            [i, s, s if i % 2 else sentence(rng, 1 - i % 2), 5.0 * (i % 2)]
            for i, s in enumerate(sentence(rng, i % 2) for i in range(60))
        ]
        write_tsv(tmp_path / "STS-B" / f"{split}.tsv", ["index", "sentence1", "sentence2", "score"], rows)
    glue_probe = load("glue_probe")
    got = glue_probe.similarity(str(pretrained / "run"), "stsb", 24, str(tmp_path))
    weights, poolings = ("pretrained", "random init"), ("mean", "weighted_mean", "last")
    assert set(got) == {(w, p, k) for w in weights for p in poolings for k in ("raw", "whitened")}
    assert all(r > 50 for pair in got.values() for r in pair), got


def test_next_word_logprobs_of_right_padded_batches_are_each_sequence_alone(pretrained):
    """benchmarks/glue_probe.py --label-words: a batch of sequences of different lengths, right-padded, gives
    each one the next-word log-probabilities it gets alone (a causal model's real positions never see pads)."""
    from lm.eval.saved import load_model

    glue_probe = load("glue_probe")
    model, tok = load_model(pretrained / "run")
    ids = [tok.encode(t) for t in ("a good film . It was", "bad . It was", "the plot is fine and the cast good")]
    batched = glue_probe.next_word_logprobs(model, ids, tok.pad_id, batch=3)  # (3, V)
    alone = np.concatenate([glue_probe.next_word_logprobs(model, [x], tok.pad_id, batch=1) for x in ids])
    assert batched.shape == (3, model.cfg.vocab_size)
    np.testing.assert_allclose(batched, alone, atol=1e-4)
    np.testing.assert_allclose(np.exp(batched).sum(1), 1.0, atol=1e-4)


def test_label_word_probe_scores_each_template_and_word_pair(pretrained, easy_glue):
    glue_probe = load("glue_probe")
    rows = glue_probe.label_words(str(pretrained / "run"), str(easy_glue), max_len=24)
    pairs = [f"{a.strip()}/{b.strip()}" for a, b in glue_probe.LABEL_WORDS]
    weights = ("pretrained", "random init")
    assert set(rows) == {(w, t, p) for w in weights for t in glue_probe.TEMPLATES for p in pairs}
    assert all(0 <= auc <= 100 for auc in rows.values())


def test_whitening_gives_identity_covariance():
    glue_probe = load("glue_probe")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 4)) @ rng.normal(size=(4, 4)) + 3.0  # correlated, off-centre
    m, w = glue_probe.whitening(x)
    np.testing.assert_allclose(np.cov(((x - m) @ w).T), np.eye(4), atol=1e-4)
    np.testing.assert_allclose(m, x.mean(0))
