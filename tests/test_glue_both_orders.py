"""A pair task's both_orders (GPT-1's similarity input, Radford et al. 2018): each pair is encoded as (a, b)
and (b, a), batched as 2B rows, and the classifier adds the two pooled vectors, so its prediction does
not depend on which sentence comes first; a single-sentence task refuses the option."""

import pytest
import torch

from lm.config import ConfigError
from lm.glue import collate, encode_examples, encode_pair, load_split
from lm.glue.config import GlueTaskConfig, validate_glue_task
from lm.glue.readers import Example
from lm.model import SequenceClassifier, build_model
from lm.model.config import ModelConfig
from tests.test_glue_encode import FIXTURES, WordTokenizer


def test_a_pair_is_encoded_in_both_orders_and_a_single_sentence_once():
    tok = WordTokenizer()
    rows = [Example(0, "a b c", "d e", 1), Example(1, "f", None, 0)]
    pair, single = encode_examples(tok, rows, max_len=16, arch="decoder", both_orders=True)
    assert pair["swapped"] == encode_pair(tok, "d e", "a b c", 16, "decoder")
    assert pair["swapped"]["input_ids"] == [1, 14, 15, 4, 10, 11, 12, 2]  # [BOS] d e [SEP] a b c [EOS]; f is 13
    assert "labels" not in pair["swapped"] and pair["labels"] == 1
    assert "swapped" not in single
    assert all("swapped" not in f for f in encode_examples(tok, rows, 16, "decoder"))  # off by default


def test_collate_stacks_the_swapped_rows_under_the_given_ones():
    tok = WordTokenizer()
    rows = [Example(0, "a b c", "d", 4.5), Example(1, "e", "f g", 0.25)]
    feats = encode_examples(tok, rows, max_len=16, arch="decoder", both_orders=True)
    batch = collate(feats, tok.pad_id)
    assert batch["input_ids"].shape == (4, 7)  # 2 pairs x 2 orders, padded to the longest of the four
    for i, f in enumerate(feats):
        for row, enc in ((i, f), (i + 2, f["swapped"])):
            n = len(enc["input_ids"])
            assert batch["input_ids"][row, :n].tolist() == enc["input_ids"]
            assert batch["attention_mask"][row].sum() == n
    assert batch["labels"].tolist() == [4.5, 0.25]  # one label per pair
    with pytest.raises(ValueError, match="both orders"):
        collate([feats[0], {k: v for k, v in feats[1].items() if k != "swapped"}], tok.pad_id)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_the_classifier_adds_both_orders_so_its_prediction_ignores_which_comes_first(pooling):
    tok = WordTokenizer()
    qqp = load_split("qqp", "train", root=FIXTURES, hf=False)
    cfg = ModelConfig(arch="decoder", vocab_size=10 + 64, dim=32, n_layers=1, n_heads=4, max_seq_len=24, dropout=0.0)
    torch.manual_seed(0)
    clf = SequenceClassifier(build_model(cfg), n_labels=2, pooling=pooling, dropout=0.0, both_orders=True).eval()
    feats = encode_examples(tok, qqp, max_len=24, arch="decoder", both_orders=True)
    out = clf(**collate(feats, tok.pad_id))
    assert out.logits.shape == (len(qqp), 2) and torch.isfinite(out.loss)
    # the same pairs with a and b exchanged: the same logits, which one order alone does not give
    flipped = [Example(e.index, e.text_b, e.text_a, e.label) for e in qqp]
    torch.testing.assert_close(
        clf(**collate(encode_examples(tok, flipped, 24, "decoder", both_orders=True), tok.pad_id)).logits,
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


def test_a_single_sentence_task_refuses_both_orders():
    validate_glue_task(GlueTaskConfig(name="stsb", n_labels=1, both_orders=True))
    with pytest.raises(ConfigError, match=r"tasks\.sst2\.both_orders=true .* one sentence"):
        validate_glue_task(GlueTaskConfig(name="sst2", both_orders=True))
