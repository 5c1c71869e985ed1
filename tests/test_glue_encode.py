"""Pair encoding, longest-first truncation and padding, with a fake word tokenizer, the project's real
Tokenizer, and the classifier head the batches are made for."""

from pathlib import Path

import pytest
import torch

from lm.data.tokenizer import train
from lm.glue import collate, encode_examples, encode_pair, load_split, truncate_longest_first
from lm.model import SequenceClassifier, build_model
from lm.model.config import ModelConfig

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


class WordTokenizer:
    """One id per whitespace word, 10 + its position in a growing vocabulary; special ids as in lm.data.tokenizer."""

    pad_id, bos_id, eos_id, mask_id, sep_id, cls_id = 0, 1, 2, 3, 4, 5

    def __init__(self):
        self.vocab = {}

    def encode(self, text):
        return [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]


def test_encoder_layout():
    tok = WordTokenizer()
    f = encode_pair(tok, "a b c", "d e", max_len=16, arch="encoder")
    assert f == {
        "input_ids": [5, 10, 11, 12, 4, 13, 14, 4],  # [CLS] a b c [SEP] d e [SEP]
        "attention_mask": [1] * 8,
        "token_type_ids": [0, 0, 0, 0, 0, 1, 1, 1],
    }
    single = encode_pair(tok, "a b", None, max_len=16, arch="encoder")
    assert single == {"input_ids": [5, 10, 11, 4], "attention_mask": [1] * 4, "token_type_ids": [0] * 4}


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_decoder_layout_ends_with_eos(arch):
    tok = WordTokenizer()
    f = encode_pair(tok, "a b c", "d e", max_len=16, arch=arch)
    assert f["input_ids"] == [1, 10, 11, 12, 4, 13, 14, 2]  # [BOS] a b c [SEP] d e [EOS]
    assert f["token_type_ids"] == [0, 0, 0, 0, 0, 1, 1, 1]
    assert encode_pair(tok, "a", None, max_len=16, arch=arch)["input_ids"] == [1, 10, 2]


def test_longest_first_truncation_by_hand():
    # budget 5: 6+3 -> trim a (5+3, 4+3, 3+3), tie -> trim b (3+2)
    assert truncate_longest_first(range(6), range(100, 103), 5) == ([0, 1, 2], [100, 101])
    assert truncate_longest_first(range(2), range(100, 110), 5) == ([0, 1], [100, 101, 102])
    assert truncate_longest_first(range(4), [], 3) == ([0, 1, 2], [])
    assert truncate_longest_first(range(2), range(3), 9) == ([0, 1], [0, 1, 2])  # fits: untouched


def test_encode_pair_respects_max_len():
    tok = WordTokenizer()
    a, b = " ".join(f"a{i}" for i in range(6)), " ".join(f"b{i}" for i in range(3))
    f = encode_pair(tok, a, b, max_len=8, arch="encoder")  # 3 specials + 5 text tokens
    assert f["input_ids"] == [5, 10, 11, 12, 4, 16, 17, 4]  # a0 a1 a2 | b0 b1
    assert f["token_type_ids"] == [0, 0, 0, 0, 0, 1, 1, 1]
    for max_len in (4, 5, 9, 30):
        assert len(encode_pair(tok, a, b, max_len, "decoder")["input_ids"]) == min(max_len, 12)
    with pytest.raises(ValueError, match="max_len=3"):
        encode_pair(tok, a, b, max_len=3, arch="encoder")
    with pytest.raises(ValueError, match="arch='gpt'"):
        encode_pair(tok, a, b, max_len=8, arch="gpt")


def test_collate_pads_right_and_types_labels():
    tok = WordTokenizer()
    feats = [encode_pair(tok, "a b c", "d", 16, "encoder"), encode_pair(tok, "e", None, 16, "encoder")]
    feats[0]["labels"], feats[1]["labels"] = 1, 0
    batch = collate(feats, pad_id=tok.pad_id)
    assert batch["input_ids"].tolist() == [[5, 10, 11, 12, 4, 13, 4], [5, 14, 4, 0, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1], [0] * 7]
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    assert all(batch[k].dtype == torch.long for k in ("input_ids", "attention_mask", "token_type_ids"))
    feats[0]["labels"], feats[1]["labels"] = 4.75, 0.0
    assert collate(feats, 0)["labels"].dtype == torch.float32
    assert "labels" not in collate([encode_pair(tok, "a", "b", 8, "decoder")], 0)
    del feats[1]["labels"]
    with pytest.raises(ValueError, match="some examples have labels"):
        collate(feats, 0)


def test_encode_examples_from_reader_rows():
    tok = WordTokenizer()
    mnli = load_split("mnli", "dev_matched", root=FIXTURES, hf=False)
    feats = encode_examples(tok, mnli, max_len=12, arch="decoder")
    assert [f["labels"] for f in feats] == [1, 2, 0, 0]
    for e, f in zip(mnli, feats):
        assert f == {**encode_pair(tok, e.text_a, e.text_b, 12, "decoder"), "labels": e.label}
        assert len(f["input_ids"]) <= 12 and f["input_ids"][-1] == tok.eos_id
    test = encode_examples(tok, load_split("mnli", "test_matched", root=FIXTURES, hf=False), 12, "decoder")
    assert all("labels" not in f for f in test)


def test_real_tokenizer_layout():
    tok = train("char", ["the cat sat", "a dog"], n_sentinels=0)
    f = encode_pair(tok, "cat", "dog", max_len=32, arch="encoder")
    assert f["input_ids"][0] == tok.cls_id and f["input_ids"].count(tok.sep_id) == 2
    assert tok.decode(f["input_ids"]) == "<cls>cat<sep>dog<sep>"
    g = encode_pair(tok, "cat", "dog", max_len=32, arch="decoder")
    assert tok.decode(g["input_ids"]) == "<bos>cat<sep>dog<eos>"
    # encode_batch (the fast path of encode_examples) gives the same ids as encode
    rows = load_split("wnli", "train", root=FIXTURES, hf=False)
    tok = train("char", [t for e in rows for t in (e.text_a, e.text_b)], n_sentinels=0)
    feats = encode_examples(tok, rows, max_len=40, arch="encoder")
    assert feats == [{**encode_pair(tok, e.text_a, e.text_b, 40, "encoder"), "labels": e.label} for e in rows]


@pytest.mark.parametrize("arch", ["encoder", "decoder", "encoder_decoder"])
def test_batches_fit_the_classifier_and_padding_does_not_change_logits(arch):
    torch.manual_seed(0)
    tok = WordTokenizer()
    qqp = load_split("qqp", "train", root=FIXTURES, hf=False)
    feats = encode_examples(tok, qqp, max_len=24, arch=arch)
    cfg = ModelConfig(
        arch=arch,
        vocab_size=10 + 64,
        dim=32,
        n_layers=1,
        n_heads=4,
        max_seq_len=24,
        n_segments=2 if arch == "encoder" else 0,
        pad_token_id=tok.pad_id,
    )
    clf = SequenceClassifier(build_model(cfg), n_labels=2, dropout=0.0).eval()
    batch = collate(feats, tok.pad_id)
    out = clf(**batch)
    assert out.logits.shape == (6, 2) and torch.isfinite(out.loss)
    lengths = batch["attention_mask"].sum(1)
    assert lengths.min() < lengths.max()  # the batch really is padded
    for i, f in enumerate(feats):  # each example alone, unpadded, gives the same logits
        alone = collate([f], tok.pad_id)
        alone.pop("labels")
        torch.testing.assert_close(clf(**alone).logits[0], out.logits[i], rtol=0, atol=1e-5)
