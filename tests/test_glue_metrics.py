"""GLUE metrics against hand-computed values, and the GLUE score against published leaderboard rows."""

import math

import numpy as np
import pytest
import torch

from lm.glue import compute_metrics, glue_score, main_metric, task_score
from lm.glue.metrics import metric_keys


def test_binary_confusion_matrix_by_hand():
    # y = 1 1 1 1 0 0, p = 1 1 1 0 1 0  ->  TP 3, FN 1, FP 1, TN 1
    y, p = [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0]
    mcc = (3 * 1 - 1 * 1) / math.sqrt((3 + 1) * (3 + 1) * (1 + 1) * (1 + 1))  # (TP.TN - FP.FN) / sqrt(...) = 0.25
    assert compute_metrics("cola", p, y) == pytest.approx({"mcc": 100 * mcc, "score": 25.0})
    f1 = 2 * 3 / (2 * 3 + 1 + 1)  # 0.75
    acc = 4 / 6
    assert compute_metrics("mrpc", p, y) == pytest.approx(
        {"f1": 100 * f1, "acc": 100 * acc, "score": (100 * f1 + 100 * acc) / 2}
    )
    assert compute_metrics("qqp", p, y)["score"] == pytest.approx(70.8333333)
    for name in ("sst2", "qnli", "rte", "wnli", "mnli_m", "mnli_mm"):
        assert compute_metrics(name, p, y) == pytest.approx({"acc": 100 * acc, "score": 100 * acc})


def test_three_class_mcc_for_ax_by_hand():
    # Gorodkin's R_K: (c.s - sum_k p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2))
    y, p = [0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]
    c, s, t_k, p_k = 4, 6, [2, 2, 2], [2, 3, 1]
    r3 = (c * s - sum(a * b for a, b in zip(p_k, t_k))) / math.sqrt(
        (s * s - sum(x * x for x in p_k)) * (s * s - sum(x * x for x in t_k))
    )
    assert r3 == pytest.approx(12 / math.sqrt(528))
    assert compute_metrics("ax", p, y)["mcc"] == pytest.approx(100 * r3)


def test_stsb_pearson_spearman_by_hand():
    p, y = [1.0, 2.0, 3.0, 4.0], [1.0, 2.5, 2.0, 4.5]
    # deviations from the means (2.5, 2.5): p -1.5 -.5 .5 1.5; y -1.5 0 -.5 2
    # sum dp.dy = 2.25 + 0 - .25 + 3 = 5; sum dp^2 = 5; sum dy^2 = 2.25 + 0 + .25 + 4 = 6.5
    pearson = 5 / math.sqrt(5 * 6.5)
    spearman = 1 - 6 * (0 + 1 + 1 + 0) / (4 * (16 - 1))  # rank differences 0 1 1 0 -> 0.8
    m = compute_metrics("stsb", p, y)
    assert m == pytest.approx({"pearson": 100 * pearson, "spearman": 80.0, "score": (100 * pearson + 80) / 2})
    assert spearman == 0.8


def test_stsb_predictions_are_clipped_like_the_submission():
    y = [0.5, 2.0, 3.0, 4.5]
    clipped = compute_metrics("stsb", [0.0, 2.0, 3.1, 5.0], y)
    assert compute_metrics("stsb", [-1.0, 2.0, 3.1, 7.0], y) == clipped
    # (N, 1) float32 head output
    assert compute_metrics("stsb", torch.tensor([[-1.0], [2.0], [3.1], [7.0]]), y) == pytest.approx(clipped)
    raw = 100 * np.corrcoef([-1.0, 2.0, 3.1, 7.0], y)[0, 1]
    assert abs(raw - clipped["pearson"]) > 0.5  # clipping changes the number, so it must match the submission


def test_degenerate_predictions_score_zero_not_nan():
    assert compute_metrics("stsb", [2.0, 2.0, 2.0], [1.0, 2.0, 3.0])["pearson"] == 0.0
    assert compute_metrics("cola", [1, 1, 1], [0, 1, 1])["mcc"] == 0.0
    assert compute_metrics("mrpc", [0, 0, 0], [0, 1, 1])["f1"] == 0.0


def test_logits_and_tensors_are_accepted():
    logits = torch.tensor([[2.0, -1.0, 0.0], [0.0, 0.1, 3.0], [0.0, 5.0, 1.0]])
    assert compute_metrics("mnli_m", logits, [0, 2, 2]) == pytest.approx({"acc": 200 / 3, "score": 200 / 3})
    assert compute_metrics("sst2", np.array([0, 1]), torch.tensor([0, 0]))["acc"] == 50.0


def test_bad_predictions_are_rejected():
    with pytest.raises(ValueError, match="2 predictions for 3 labels"):
        compute_metrics("sst2", [0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match=r"class ids must be in \[0, 3\)"):
        compute_metrics("mnli_m", [0, 3], [0, 1])
    with pytest.raises(ValueError, match="class ids"):
        compute_metrics("rte", [0.2, 0.9], [0, 1])
    with pytest.raises(ValueError, match=r"STS-B predictions must be scores"):
        compute_metrics("stsb", [[0.2, 0.9], [1.0, 2.0]], [0.5, 1.0])


def _leaderboard(cola, sst2, mrpc, stsb, qqp, mnli_m, mnli_mm, qnli, rte, wnli):
    """A leaderboard row as {column: metrics}; pairs are in the leaderboard's order (F1/acc, P/S)."""
    return {
        "cola": {"mcc": cola},
        "sst2": {"acc": sst2},
        "mrpc": dict(zip(("f1", "acc"), mrpc)),
        "stsb": dict(zip(("pearson", "spearman"), stsb)),
        "qqp": dict(zip(("f1", "acc"), qqp)),
        "mnli_m": {"acc": mnli_m},
        "mnli_mm": {"acc": mnli_mm},
        "qnli": {"acc": qnli},
        "rte": {"acc": rte},
        "wnli": {"acc": wnli},
    }


# Published GLUE test-server rows (gluebenchmark.com leaderboard, as reproduced in the BERT, XLM and
# ERNIE 2.0 READMEs): the GLUE score is the unweighted mean of nine task scores, MNLI once.
BERT_LARGE = _leaderboard(60.5, 94.9, (89.3, 85.4), (87.6, 86.5), (72.1, 89.3), 86.7, 85.9, 92.7, 70.1, 65.1)
BERT_BASE = _leaderboard(52.1, 93.5, (88.9, 84.8), (87.1, 85.8), (71.2, 89.2), 84.6, 83.4, 90.5, 66.4, 65.1)
ERNIE2_LARGE = _leaderboard(63.5, 95.6, (90.2, 87.4), (91.2, 90.6), (73.8, 90.1), 88.7, 88.8, 94.6, 80.2, 67.8)


@pytest.mark.parametrize("row,published", [(BERT_LARGE, 80.5), (BERT_BASE, 78.3), (ERNIE2_LARGE, 83.6)])
def test_glue_score_matches_the_leaderboard(row, published):
    assert round(glue_score(row), 1) == published
    # MNLI-m and MNLI-mm as two of ten tasks would not reproduce the leaderboard:
    ten = [
        *(task_score(t, row) for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "qnli", "rte", "wnli")),
        row["mnli_m"]["acc"],
        row["mnli_mm"]["acc"],
    ]
    assert round(sum(ten) / 10, 1) != published


def test_task_scores():
    assert task_score("mrpc", BERT_LARGE) == pytest.approx((89.3 + 85.4) / 2)
    assert task_score("stsb", BERT_LARGE) == pytest.approx((87.6 + 86.5) / 2)
    assert task_score("mnli", BERT_LARGE) == pytest.approx((86.7 + 85.9) / 2)
    with pytest.raises(KeyError, match="mnli_mm"):
        task_score("mnli", {"mnli_m": {"acc": 80.0}})


def test_partial_glue_score_must_be_asked_for():
    row = {k: v for k, v in BERT_LARGE.items() if k not in ("qqp", "mnli_m", "mnli_mm")}
    with pytest.raises(KeyError, match=r"\['qqp', 'mnli'\]"):
        glue_score(row)
    seven = [60.5, 94.9, (89.3 + 85.4) / 2, (87.6 + 86.5) / 2, 92.7, 70.1, 65.1]
    assert glue_score(row, partial=True) == pytest.approx(sum(seven) / 7)
    ax_only = {"ax": {"mcc": 39.6}}  # AX never counts
    with pytest.raises(KeyError, match="no GLUE task"):
        glue_score(ax_only, partial=True)


def test_main_metric_keys():
    assert main_metric("mrpc", BERT_LARGE) == pytest.approx(87.35)
    assert main_metric("mrpc", BERT_LARGE, "f1") == 89.3
    assert main_metric("mnli", BERT_LARGE) == pytest.approx(86.3)
    assert main_metric("mnli", BERT_LARGE, "mnli_mm/acc") == 85.9
    with pytest.raises(KeyError, match="mnli_m/acc"):
        main_metric("mnli", BERT_LARGE, "acc")
    assert "mnli_m/acc" in metric_keys("mnli") and "acc" not in metric_keys("mnli")
    assert set(metric_keys("cola")) == {"score", "mcc", "cola/mcc", "cola/score"}
