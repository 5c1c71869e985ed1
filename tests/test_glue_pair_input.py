"""A pair task's pair_input. "both_orders" (GPT-1's similarity input, Radford et al. 2018): each pair is
encoded as (a, b) and (b, a), batched as 2B rows, and the classifier adds the two pooled vectors, so its
prediction does not depend on which sentence comes first. "siamese" (Sentence-BERT, Reimers & Gurevych
2019): a and b are encoded apart; classes come from [u; v; |u - v|], a score from cos(u, v). A
single-sentence task refuses both."""

import pytest
import torch
import torch.nn.functional as F

from lm.config import ConfigError
from lm.glue import collate, encode_examples, encode_pair, load_split
from lm.glue.config import GlueTaskConfig, validate_glue_task
from lm.glue.readers import Example
from lm.model import SequenceClassifier, build_model
from lm.model.config import ModelConfig
from tests.test_glue_encode import FIXTURES, WordTokenizer


def tiny_decoder():
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", vocab_size=10 + 64, dim=32, n_layers=1, n_heads=4, max_seq_len=24, dropout=0.0)
    return build_model(cfg)


def test_a_pair_is_encoded_in_both_orders_and_a_single_sentence_once():
    tok = WordTokenizer()
    rows = [Example(0, "a b c", "d e", 1), Example(1, "f", None, 0)]
    pair, single = encode_examples(tok, rows, max_len=16, arch="decoder", pair_input="both_orders")
    assert pair["second"] == encode_pair(tok, "d e", "a b c", 16, "decoder")
    assert pair["second"]["input_ids"] == [1, 14, 15, 4, 10, 11, 12, 2]  # [BOS] d e [SEP] a b c [EOS]; f is 13
    assert "labels" not in pair["second"] and pair["labels"] == 1
    assert "second" not in single
    assert all("second" not in f for f in encode_examples(tok, rows, 16, "decoder"))  # joint by default


def test_siamese_encodes_each_sentence_alone():
    tok = WordTokenizer()
    rows = [Example(0, "a b c", "d e", 1), Example(1, "f", None, 0)]
    pair, single = encode_examples(tok, rows, max_len=16, arch="decoder", pair_input="siamese")
    assert {k: v for k, v in pair.items() if k not in ("second", "labels")} == encode_pair(
        tok, "a b c", None, 16, "decoder"
    )
    assert pair["second"] == encode_pair(tok, "d e", None, 16, "decoder")
    assert pair["second"]["input_ids"] == [1, 14, 15, 2]  # [BOS] d e [EOS]
    assert single == {**encode_pair(tok, "f", None, 16, "decoder"), "labels": 0}


def test_collate_stacks_the_second_rows_under_the_first():
    tok = WordTokenizer()
    rows = [Example(0, "a b c", "d", 4.5), Example(1, "e", "f g", 0.25)]
    feats = encode_examples(tok, rows, max_len=16, arch="decoder", pair_input="both_orders")
    batch = collate(feats, tok.pad_id)
    assert batch["input_ids"].shape == (4, 7)  # 2 pairs x 2 orders, padded to the longest of the four
    for i, f in enumerate(feats):
        for row, enc in ((i, f), (i + 2, f["second"])):
            n = len(enc["input_ids"])
            assert batch["input_ids"][row, :n].tolist() == enc["input_ids"]
            assert batch["attention_mask"][row].sum() == n
    assert batch["labels"].tolist() == [4.5, 0.25]  # one label per pair
    with pytest.raises(ValueError, match="read twice"):
        collate([feats[0], {k: v for k, v in feats[1].items() if k != "second"}], tok.pad_id)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_the_classifier_adds_both_orders_so_its_prediction_ignores_which_comes_first(pooling):
    tok = WordTokenizer()
    qqp = load_split("qqp", "train", root=FIXTURES, hf=False)
    clf = SequenceClassifier(tiny_decoder(), n_labels=2, pooling=pooling, dropout=0.0, pair_input="both_orders")
    clf.eval()
    feats = encode_examples(tok, qqp, max_len=24, arch="decoder", pair_input="both_orders")
    out = clf(**collate(feats, tok.pad_id))
    assert out.logits.shape == (len(qqp), 2) and torch.isfinite(out.loss)
    # the same pairs with a and b exchanged: the same logits, which one order alone does not give
    flipped = [Example(e.index, e.text_b, e.text_a, e.label) for e in qqp]
    torch.testing.assert_close(
        clf(**collate(encode_examples(tok, flipped, 24, "decoder", "both_orders"), tok.pad_id)).logits,
        out.logits,
        rtol=0,
        atol=1e-5,
    )
    one_order = SequenceClassifier(clf.backbone, n_labels=2, pooling=pooling, dropout=0.0).eval()
    one_order.classifier = clf.classifier
    given, swapped = (one_order(**collate(encode_examples(tok, r, 24, "decoder"), tok.pad_id)) for r in (qqp, flipped))
    assert not torch.allclose(given.logits, swapped.logits, atol=1e-3)  # a causal decoder reads order

    # what it adds: the head applied to the sum of the two orders' pooled vectors
    def pooled(rows):
        batch = collate(encode_examples(tok, rows, 24, "decoder"), tok.pad_id)
        return clf.backbone.pooled(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], pooling)

    torch.testing.assert_close(out.logits, clf.classifier(pooled(qqp) + pooled(flipped)), rtol=0, atol=1e-5)


def pooled_alone(clf, tok, texts):
    """(N, D): each text encoded alone as one sentence, pooled as the classifier pools."""
    batch = collate(encode_examples(tok, [Example(i, t, None, None) for i, t in enumerate(texts)], 24, "decoder"), 0)
    return clf.backbone.pooled(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], clf.pooling)


def test_siamese_classes_come_from_u_v_and_their_distance():
    tok = WordTokenizer()
    qqp = load_split("qqp", "train", root=FIXTURES, hf=False)
    clf = SequenceClassifier(tiny_decoder(), n_labels=2, pooling="mean", dropout=0.0, pair_input="siamese").eval()
    assert clf.classifier.in_features == 3 * 32
    out = clf(**collate(encode_examples(tok, qqp, 24, "decoder", "siamese"), tok.pad_id))
    assert out.logits.shape == (len(qqp), 2) and torch.isfinite(out.loss)
    u, v = pooled_alone(clf, tok, [e.text_a for e in qqp]), pooled_alone(clf, tok, [e.text_b for e in qqp])
    torch.testing.assert_close(out.logits, clf.classifier(torch.cat([u, v, (u - v).abs()], -1)), rtol=0, atol=1e-5)
    assert out.loss.item() == pytest.approx(F.cross_entropy(out.logits, torch.tensor([e.label for e in qqp])).item())


def test_a_siamese_score_starts_as_the_cosine_mapped_onto_the_label_range():
    tok = WordTokenizer()
    pairs = [Example(0, "a b c", "a b c", 5.0), Example(1, "a b", "d e f g", 1.0), Example(2, "f", "g h", 2.5)]
    clf = SequenceClassifier(
        tiny_decoder(), n_labels=1, pooling="mean", dropout=0.0, pair_input="siamese", score_range=(0.0, 5.0)
    ).eval()
    out = clf(**collate(encode_examples(tok, pairs, 24, "decoder", "siamese"), tok.pad_id))
    u, v = pooled_alone(clf, tok, [e.text_a for e in pairs]), pooled_alone(clf, tok, [e.text_b for e in pairs])
    cos = F.cosine_similarity(u, v, dim=-1)
    torch.testing.assert_close(out.logits.squeeze(-1), 2.5 + 2.5 * cos, rtol=0, atol=1e-5)
    assert out.logits[0].item() == pytest.approx(5.0, abs=1e-4)  # a sentence and itself: cos 1, the top score
    assert out.loss.item() == pytest.approx(F.mse_loss(out.logits.squeeze(-1), torch.tensor([5.0, 1.0, 2.5])).item())
    out.loss.backward()  # the score trains the backbone and the scale and shift
    assert clf.classifier.weight.grad is not None and clf.backbone.embed.tok.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("pair_input", ["both_orders", "siamese"])
def test_a_single_sentence_task_refuses_a_pair_input(pair_input):
    validate_glue_task(GlueTaskConfig(name="stsb", n_labels=1, pair_input=pair_input))
    with pytest.raises(ConfigError, match=rf"tasks\.sst2\.pair_input={pair_input} .* one sentence") as refused:
        validate_glue_task(GlueTaskConfig(name="sst2", pair_input=pair_input))
    # the fix it names is one that exists: text_b is task=own's field (tasks.sst2.text_b is refused itself)
    assert str(refused.value).endswith("and task=own with tasks.own.text_b)")


def test_a_whitened_siamese_score_is_the_cosine_of_whitened_vectors():
    """whiten=True: identity until fit; fit_siamese_head (lm.glue.init) sets m and W from the training pairs'
    pooled sentences so that they have zero mean and identity covariance; the score is then the cosine of
    (u - m) W and (v - m) W, and m and W are buffers (saved and resumed with the model, never trained)."""
    from lm.glue.init import fit_siamese_head

    tok = WordTokenizer()
    words = ["a", "b", "c", "d", "e", "f", "g", "h"]
    rows = [Example(i, " ".join(words[i % 8 : i % 8 + 3]), " ".join(words[i * 3 % 7 :][:2]), 1.0) for i in range(80)]
    feats = encode_examples(tok, rows, 24, "decoder", "siamese")
    clf = SequenceClassifier(
        tiny_decoder(), 1, "mean", dropout=0.0, pair_input="siamese", score_range=(0.0, 5.0), whiten=True
    ).train()
    assert {"white_mean", "white_map"} <= set(clf.state_dict())
    assert not any("white" in name for name, _ in clf.named_parameters())
    torch.testing.assert_close(clf.white_map, torch.eye(32))
    fit_siamese_head(clf, feats, tok.pad_id, whiten=True, fit_head=False, batch_size=16)
    assert clf.training  # back in the mode it was in
    with torch.no_grad():
        u, v = pooled_pairs(clf, tok, feats)  # (N, D) each, before whitening
        z = clf._whitened(torch.cat([u, v])).double()  # (2N, D)
        x = torch.cat([u, v]).double()
    torch.testing.assert_close(z.mean(0), torch.zeros(32, dtype=torch.float64), atol=1e-4, rtol=0)
    rank = torch.linalg.matrix_rank(torch.cov(x.T)).item()  # 8 words in a few dozen texts: a few directions
    top = torch.linalg.eigvalsh(torch.cov(z.T))[-rank:]  # the directions the texts span have unit variance
    torch.testing.assert_close(top, torch.ones(rank, dtype=torch.float64), atol=1e-2, rtol=0)
    out = clf.eval()(**collate(feats, tok.pad_id))
    cos = F.cosine_similarity(clf._whitened(u), clf._whitened(v), dim=-1)
    torch.testing.assert_close(out.logits.squeeze(-1), 2.5 + 2.5 * cos, rtol=0, atol=1e-4)


def pooled_pairs(clf, tok, feats):
    batch = collate(feats, tok.pad_id)
    return clf.pooled_pairs(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])


@pytest.mark.parametrize("whiten", [False, True])
def test_fit_head_starts_the_score_at_the_least_squares_line_of_the_cosines(whiten):
    """fit_head: the score's scale and shift are the least-squares fit of the labels on the training pairs'
    cosines (whitened first when the head whitens), so the first predictions' squared error is the least any
    line through those cosines gives, and below the fixed [-1, 1] -> [0, 5] map's."""
    from lm.glue.init import fit_siamese_head

    tok = WordTokenizer()
    words = ["a", "b", "c", "d", "e", "f", "g", "h"]
    rows = [
        Example(i, " ".join(words[i % 8 : i % 8 + 3]), " ".join(words[i * 3 % 7 :][:2]), (i * 7 % 11) / 2.2)
        for i in range(60)
    ]
    feats = encode_examples(tok, rows, 24, "decoder", "siamese")
    labels = torch.tensor([r.label for r in rows], dtype=torch.float64)

    def head(fit):
        clf = SequenceClassifier(
            tiny_decoder(), 1, "mean", dropout=0.0, pair_input="siamese", score_range=(0.0, 5.0), whiten=whiten
        )
        fit_siamese_head(clf, feats, tok.pad_id, whiten=whiten, fit_head=fit, batch_size=16)
        with torch.no_grad():
            u, v = pooled_pairs(clf, tok, feats)
            u, v = (clf._whitened(u), clf._whitened(v)) if whiten else (u, v)
            cos = F.cosine_similarity(u, v, dim=-1).double()
            pred = clf.eval()(**collate(feats, tok.pad_id)).logits.squeeze(-1).double()
        return clf, cos, pred

    fixed, cos, fixed_pred = head(False)
    assert fixed.classifier.weight.item() == 2.5 and fixed.classifier.bias.item() == 2.5
    fitted, cos_fitted, pred = head(True)
    torch.testing.assert_close(cos_fitted, cos)
    a = torch.stack([cos, torch.ones_like(cos)], dim=1)  # (N, 2): the least-squares line by lstsq
    scale, shift = torch.linalg.lstsq(a, labels[:, None]).solution.squeeze(1).tolist()
    assert fitted.classifier.weight.item() == pytest.approx(scale, abs=1e-4)
    assert fitted.classifier.bias.item() == pytest.approx(shift, abs=1e-4)
    torch.testing.assert_close(pred, scale * cos + shift, atol=1e-4, rtol=0)
    assert F.mse_loss(pred, labels) < F.mse_loss(fixed_pred, labels)


def test_fit_head_needs_a_siamese_score():
    validate_glue_task(GlueTaskConfig(name="stsb", n_labels=1, pair_input="siamese", fit_head=True))
    with pytest.raises(ConfigError, match=r"tasks\.stsb\.fit_head=true .* pair_input=joint .* drop it"):
        validate_glue_task(GlueTaskConfig(name="stsb", n_labels=1, fit_head=True))
    with pytest.raises(ConfigError, match=r"tasks\.mrpc\.fit_head=true .* pair_input=siamese"):
        validate_glue_task(GlueTaskConfig(name="mrpc", pair_input="siamese", fit_head=True))
    with pytest.raises(ValueError, match="siamese regression"):
        SequenceClassifier(tiny_decoder(), n_labels=2, pair_input="siamese").fit_cosine_head(
            torch.ones(2, 32), torch.ones(2, 32), torch.ones(2)
        )


def test_whiten_needs_siamese_pairs():
    validate_glue_task(GlueTaskConfig(name="stsb", n_labels=1, pair_input="siamese", whiten=True))
    with pytest.raises(ConfigError, match=r"tasks\.stsb\.whiten=true .* tasks\.stsb\.pair_input=siamese"):
        validate_glue_task(GlueTaskConfig(name="stsb", n_labels=1, whiten=True))
    with pytest.raises(ValueError, match="siamese"):
        SequenceClassifier(tiny_decoder(), n_labels=1, pair_input="both_orders", whiten=True)


@pytest.mark.gpu
def test_whitening_fit_on_the_gpu_matches_the_cpu_and_leaves_the_model_home():
    """fit_siamese_head(device="cuda") reads the pairs on the GPU, leaves the model on the CPU, and the scores it
    then gives equal those of a fit on the CPU."""
    from lm.glue.init import fit_siamese_head

    tok = WordTokenizer()
    rows = [Example(i, "a b c d"[i % 4 :], "e f g h"[: 1 + i % 7], 1.0) for i in range(40)]
    feats = encode_examples(tok, rows, 24, "decoder", "siamese")
    scores, means = [], []
    for device in ("cpu", "cuda"):
        clf = SequenceClassifier(tiny_decoder(), 1, "mean", dropout=0.0, pair_input="siamese", whiten=True)
        fit_siamese_head(clf, feats, tok.pad_id, whiten=True, fit_head=False, device=device)
        assert clf.white_map.device.type == "cpu" and next(clf.parameters()).device.type == "cpu"
        means.append(clf.white_mean)
        scores.append(clf.eval()(**collate(feats, tok.pad_id)).logits)
    torch.testing.assert_close(means[1], means[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(scores[1], scores[0], atol=1e-2, rtol=0)
