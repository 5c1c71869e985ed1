"""Tokenizers: fixed special ids, save/load, char-level vocabulary of a real corpus, foreign files."""

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from lm.data.tokenizer import SPECIAL_TOKENS, Tokenizer, TokenizerError, char_symbols, train

TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs!",
    "Sphinx of black quartz, judge my vow.",
    "How vexingly quick daft zebras jump.",
] * 50


@pytest.mark.parametrize("kind,vocab", [("bpe", 400), ("unigram", 150), ("char", 0)])
def test_special_ids_are_fixed_and_first(kind, vocab):
    tok = train(kind, TEXT, vocab_size=vocab, n_sentinels=5)
    assert [tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id, tok.sep_id, tok.cls_id, tok.unk_id] == list(range(7))
    assert tok.sentinel_ids == [7, 8, 9, 10, 11]
    assert [tok.id_to_token(i) for i in range(7)] == list(SPECIAL_TOKENS.values())
    assert tok.id_to_token(11) == "<extra_id_4>"
    if kind == "bpe":
        assert 256 + 12 < tok.vocab_size <= 400  # bytes + specials + merges (this tiny text runs out of pairs)


@pytest.mark.parametrize("kind,vocab", [("bpe", 400), ("unigram", 150), ("char", 0)])
def test_save_load_roundtrip(tmp_path, kind, vocab):
    tok = train(kind, TEXT, vocab_size=vocab, n_sentinels=3)
    tok.save(tmp_path)
    back = Tokenizer.load(tmp_path)
    assert back.sha256 == tok.sha256 and back.vocab_size == tok.vocab_size and back.kind == kind
    text = "Sphinx of black quartz, judge my vow."
    assert back.encode(text) == tok.encode(text)
    assert back.decode(back.encode(text)).strip() == text
    assert back.encode_batch([text, "How"]) == [tok.encode(text), tok.encode("How")]


SPELLED = "a <eos> b <pad> c <extra_id_0> d <unk> e <mask>"  # WikiText-2's .tokens files spell <unk> 11,718 times


@pytest.mark.parametrize("kind,vocab", [("bpe", 400), ("unigram", 150), ("char", 0)])
def test_special_strings_in_text_are_plain_text(kind, vocab):
    """A unigram model holds each special token as a piece of score 0, the best: "<eos>" in a document was the
    end-of-document id (WikiText-2 valid + one line spelling <eos> and <pad>: 2,463 EOS for 2,462 documents)."""
    tok = train(kind, [*TEXT, "<a_b0>"], vocab_size=vocab, n_sentinels=2)  # "<", "_", "0", ">": known symbols
    for ids in (tok.encode(SPELLED), tok.encode_batch([SPELLED])[0]):
        assert set(ids).isdisjoint(tok.special_ids), [tok.id_to_token(i) for i in ids if i in tok.special_ids]
        assert tok.decode(ids) == SPELLED
    assert tok.token_to_id("<eos>") == tok.eos_id == 2 and tok.decode([2, 7]) == "<eos><extra_id_0>"


def foreign_whole_word(path, kind: str) -> Tokenizer:
    """Foreign files whose model matches a whole vocabulary entry: T5's unigram (</s> <pad> <unk> first), a BERT
    WordPiece after a whitespace-only pre-tokenizer, a BPE with ignore_merges (a vocabulary word is one token)."""
    from tokenizers import decoders, trainers

    if kind == "unigram":
        hf = HFTokenizer(models.Unigram())
        hf.pre_tokenizer, hf.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    elif kind == "bpe":
        hf = HFTokenizer(models.BPE(unk_token="<unk>", ignore_merges=True))
        hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<pad>", "</s>", "<unk>"])
    else:
        hf = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
        hf.pre_tokenizer, hf.decoder = pre_tokenizers.WhitespaceSplit(), decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        )
    hf.train_from_iterator([*TEXT, "< / > [ ] MASK SEP pad s"], trainer)
    hf.save(str(path))
    return Tokenizer.load(path)


@pytest.mark.parametrize("kind", ["unigram", "wordpiece", "bpe"])
def test_a_foreign_tokenizer_reads_special_strings_as_text(tmp_path, kind):
    tok = foreign_whole_word(tmp_path / "tokenizer.json", kind)
    text = "a [MASK] b [SEP] c [CLS] d [PAD]" if kind == "wordpiece" else "a </s> b <pad> c"
    ids = tok.encode(text)
    roles = {tok.pad_id, tok.eos_id, tok.mask_id, tok.sep_id, tok.cls_id}
    assert roles.isdisjoint(ids), [tok.id_to_token(i) for i in ids if i in roles]
    if kind == "unigram":  # WordPiece reads a word it cannot spell from its pieces ("[MASK]" here) as [UNK]
        assert tok.decode(ids) == text
    saved = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    pieces = saved if isinstance(saved, dict) else [p for p, _ in saved]
    model = json.loads(tok.to_str())["model"]["vocab"]
    assert pieces == (model if isinstance(model, dict) else [p for p, _ in model])  # the file's, ids and all


def test_char_vocab_of_tiny_shakespeare_is_its_65_symbols(data_mirror):
    text = (data_mirror / "text/tinyshakespeare/input.txt").read_text()
    symbols = char_symbols([text])
    assert len(symbols) == 65  # nanoGPT's shakespeare_char vocabulary
    tok = train("char", [text], n_sentinels=16)
    assert tok.vocab_size == 7 + 16 + 65
    ids = tok.encode(text[:1000])
    assert len(ids) == 1000 and tok.decode(ids) == text[:1000]
    assert ids == [7 + 16 + symbols.index(c) for c in text[:1000]]  # sorted symbols after the specials


def test_char_unknown_symbol_maps_to_unk():
    tok = train("char", ["abc"], n_sentinels=0)
    assert tok.encode("abz") == [tok.encode("a")[0], tok.encode("b")[0], tok.unk_id]


def test_bpe_vocab_too_small_is_a_clear_error():
    with pytest.raises(TokenizerError, match="vocab_size=100 is too small"):
        train("bpe", TEXT, vocab_size=100, n_sentinels=100)


def test_unigram_vocab_too_small_is_a_clear_error():
    """The unigram trainer's own 'The vocabulary is not large enough to contain all chars' was a traceback."""
    with pytest.raises(TokenizerError, match=r"vocab_size=10 is too small for a unigram tokenizer .*raise vocab_size"):
        train("unigram", TEXT, vocab_size=10, n_sentinels=2)


def test_unknown_kind_and_missing_file(tmp_path):
    with pytest.raises(TokenizerError, match="not one of"):
        train("wordpiece", TEXT)
    with pytest.raises(TokenizerError, match="no tokenizer file"):
        Tokenizer.load(tmp_path / "nope.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
        Tokenizer.load(tmp_path)


def test_foreign_tokenizer_keeps_its_ids_and_gets_missing_specials(tmp_path):
    vocab = {"<|endoftext|>": 0, "a": 1, "b": 2, "[UNK]": 3}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["<|endoftext|>"])
    hf.save(str(tmp_path / "gpt.json"))
    tok = Tokenizer.load(tmp_path / "gpt.json")
    assert tok.eos_id == 0 and tok.unk_id == 3  # found by their usual spellings
    assert {tok.pad_id, tok.bos_id, tok.mask_id, tok.sep_id, tok.cls_id} == {4, 5, 6, 7, 8}  # appended
    assert tok.sentinel_ids == [] and tok.vocab_size == 9
    saved = json.loads(tok.save(tmp_path / "adopted.json").read_text())
    assert {t["content"] for t in saved["added_tokens"]} >= {"<pad>", "<mask>", "<|endoftext|>"}


def bert_vocab_tokenizer(path):
    """A BERT-style WordPiece tokenizer.json: [PAD] [UNK] [CLS] [SEP] [MASK], no bos/eos, BERT's [CLS] a [SEP]."""
    from tokenizers import processors, trainers

    hf = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    hf.train_from_iterator(TEXT, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    hf.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    hf.save(str(path))
    return hf.get_vocab_size()


def test_a_bert_vocabulary_starts_and_ends_documents_with_cls_and_sep(tmp_path):
    """<bos>/<eos> were appended to a BERT vocabulary, 2 ids past a model of its size (bert-base: 30,524 for
    30,522 rows); [CLS]/[SEP] are its document start and end, as RoBERTa's <s>/</s> are both roles."""
    n = bert_vocab_tokenizer(tmp_path / "bert.json")
    tok = Tokenizer.load(tmp_path / "bert.json")
    assert tok.vocab_size == n and max(tok.special_ids) < n
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert (tok.bos_id, tok.eos_id) == (2, 3)
