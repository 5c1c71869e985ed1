"""The STS-B / sentence-pair path of lm finetune, checked against what BERT's run_glue does (issue 50):
dev predictions come back in dev order, the regression head is trained with MSE on the raw 0-5 scores,
segment ids reach a model that has segment embeddings, and the dev score is Pearson/Spearman of the
aligned arrays. benchmarks/hf_glue_check.py is the end-to-end version against Hugging Face's Trainer."""

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from lm.glue import collate
from lm.glue.metrics import compute_metrics
from lm.glue.trainer import predict
from lm.model import SequenceClassifier, build_model
from lm.model.config import ModelConfig
from lm.model.heads import LMOutput


class SumModel(torch.nn.Module):
    """Scores a row by the sum of its real ids: a prediction that names its row."""

    def forward(self, input_ids, attention_mask, token_type_ids):
        return LMOutput(logits=(input_ids * attention_mask).sum(1, keepdim=True).float())  # (B, 1)


def engine_of(model):
    return SimpleNamespace(
        model=model, device=torch.device("cpu"), autocast=lambda: torch.autocast("cpu", enabled=False)
    )


def pair(ids, label=None):
    f = {"input_ids": ids, "attention_mask": [1] * len(ids), "token_type_ids": [0] * len(ids)}
    return f if label is None else {**f, "labels": label}


def test_predict_returns_rows_in_dev_order_across_length_sorted_batches():
    rng = np.random.default_rng(0)
    feats = [pair(list(rng.integers(1, 50, size=rng.integers(3, 30)))) for _ in range(37)]
    out = predict(engine_of(SumModel()), feats, pad_id=0, batch_size=5)  # 8 batches, sorted by length
    assert out.shape == (37, 1)
    assert out[:, 0].tolist() == [float(sum(f["input_ids"])) for f in feats]


def test_stsb_dev_score_is_the_correlation_of_aligned_unscaled_predictions():
    labels = np.linspace(0.0, 5.0, 11)

    def score(preds):
        return compute_metrics("stsb", preds, labels)["score"]

    assert abs(score(labels[:, None]) - 100.0) < 1e-9
    assert abs(score(labels[::-1, None].copy()) + 100.0) < 1e-9  # the rows' order is the labels' order
    # an affine map of the labels (a head that has not learned the scale yet) is still a perfect score
    assert abs(score(0.5 * labels + 1.0) - 100.0) < 1e-9


def tiny_bert(**kw):
    cfg = ModelConfig(
        arch="encoder", vocab_size=64, dim=32, n_layers=1, n_heads=4, max_seq_len=16, n_segments=2, dropout=0.0, **kw
    )
    torch.manual_seed(0)
    return SequenceClassifier(build_model(cfg), n_labels=1, dropout=0.0).eval()


def test_regression_loss_is_mse_on_the_raw_scores():
    clf = tiny_bert()
    batch = collate([pair([5, 10, 11, 4, 12, 4], 4.75), pair([5, 13, 4, 14, 15, 4], 0.0)], pad_id=0)
    assert batch["labels"].dtype == torch.float32 and batch["labels"].tolist() == [4.75, 0.0]
    out = clf(**batch)
    assert out.logits.shape == (2, 1)
    assert torch.allclose(out.loss, F.mse_loss(out.logits[:, 0], torch.tensor([4.75, 0.0])))


def test_segment_ids_reach_a_model_with_segment_embeddings():
    clf = tiny_bert()
    ids = [5, 10, 11, 4, 12, 13, 4]
    a = collate([{"input_ids": ids, "attention_mask": [1] * 7, "token_type_ids": [0, 0, 0, 0, 1, 1, 1]}], 0)
    b = collate([{"input_ids": ids, "attention_mask": [1] * 7, "token_type_ids": [0] * 7}], 0)
    assert not torch.allclose(clf(**a).logits, clf(**b).logits)
