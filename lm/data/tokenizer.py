"""Tokenizers (byte-level BPE, unigram, character level), each saved as one tokenizer.json.

All three are built with the Hugging Face `tokenizers` library, so loading, encoding and saving
is the same code whatever the kind. Special tokens are defined ONCE here, with ids first so they
stay the same across vocabulary sizes and kinds:

    pad=0 bos=1 eos=2 mask=3 sep=4 cls=5 unk=6, then <extra_id_0>..<extra_id_{N-1}>
    (the span-corruption sentinels of T5, Raffel et al. 2020), then the learned vocabulary.

unk is reserved in every kind (byte-level BPE never emits it) so that sentinel ids do not depend
on the kind. A foreign tokenizer.json (GPT-2's, say) is adopted: its own special tokens are found
by their usual spellings and the missing ones are appended after its vocabulary. A BERT vocabulary, which has no
bos/eos, starts and ends a document with [CLS] and [SEP] (as BERT's inputs do; RoBERTa's <s> and </s> are both
roles): appending <bos>/<eos> made it 2 tokens longer than a model of its size (bert-base: 30,524 ids for 30,522
embedding rows), and lm export's hf/ then tokenized a spelled "<eos>" to an id past the embedding.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from lm.core.files import new_temporary

SPECIAL_TOKENS = {
    "pad": "<pad>",
    "bos": "<bos>",
    "eos": "<eos>",
    "mask": "<mask>",
    "sep": "<sep>",
    "cls": "<cls>",
    "unk": "<unk>",
}
# Other spellings of the same roles, so that a foreign tokenizer.json keeps its own ids for them.
ALIASES = {  # in order of preference; [CLS]/[SEP] last: a BERT vocabulary's document start and end (module doc)
    "pad": ("[PAD]", "<|padding|>"),
    "bos": ("<s>", "[BOS]", "<|startoftext|>", "[CLS]"),
    "eos": ("</s>", "<|endoftext|>", "[EOS]", "[SEP]"),
    "mask": ("[MASK]",),
    "sep": ("[SEP]",),
    "cls": ("[CLS]",),
    "unk": ("[UNK]",),
}
KINDS = ("bpe", "unigram", "char")
SENTINEL = re.compile(r"<extra_id_(\d+)>")
FILE_NAME = "tokenizer.json"


class TokenizerError(ValueError):
    """A tokenizer cannot be trained or loaded; the message names the file or setting and the fix."""


def sentinel(i: int) -> str:
    return f"<extra_id_{i}>"


def special_tokens(n_sentinels: int) -> list[str]:
    """The special tokens in id order: the roles, then the sentinels."""
    return [*SPECIAL_TOKENS.values(), *(sentinel(i) for i in range(n_sentinels))]


def _rebuild_hint(path: Path) -> str:
    """How to get a good file in place of a damaged one: lm prepare rebuilds its own (a meta.json beside it); a file
    given by path (lm prepare/export/eval --tokenizer) is not lm prepare's to rebuild."""
    if (path.parent / "meta.json").is_file():
        return f"re-run lm prepare --force --out {path.parent} to rebuild it"
    return "pass a tokenizer.json that lm prepare or the Hugging Face tokenizers library wrote"


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the special-token ids this project relies on.

    Text passed to encode() is always plain text: a corpus that spells "<eos>" gets the
    characters, not the end-of-document id, so only the pipeline inserts special ids. Two steps:
    `encode_special_tokens` keeps the added-token pass from matching the spelling, and encoding
    goes through a copy whose model cannot match it either (`_text_only`).
    """

    def __init__(self, tok: HFTokenizer, source: str = "<memory>"):
        tok.encode_special_tokens = True
        self._tok = tok
        self.source = source
        self._file_sha256: str | None = None
        missing = [r for r in SPECIAL_TOKENS if self._find(r) is None]
        if missing:
            tok.add_special_tokens([SPECIAL_TOKENS[r] for r in missing])
        self._ids = {role: self._find(role) for role in SPECIAL_TOKENS}
        vocab = tok.get_vocab(with_added_tokens=True)
        found = sorted((int(m.group(1)), i) for t, i in vocab.items() if (m := SENTINEL.fullmatch(t)))
        self.sentinel_ids = [i for _, i in found]
        self._enc = _text_only(tok)

    def _find(self, role: str) -> int | None:
        for name in (SPECIAL_TOKENS[role], *ALIASES[role]):
            i = self._tok.token_to_id(name)
            if i is not None:
                return i
        return None

    # -- loading and saving ------------------------------------------------------------------

    @classmethod
    def load(cls, path_or_dir: str | os.PathLike) -> Tokenizer:
        """Load tokenizer.json (or <dir>/tokenizer.json)."""
        path = Path(path_or_dir).expanduser()
        if path.is_dir():
            path = path / FILE_NAME
        if not path.is_file():
            raise TokenizerError(
                f"{path}: no tokenizer file there; run lm prepare to train one, or pass the path "
                f"of an existing tokenizer.json"
            )
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception
            raise TokenizerError(f"{path}: not a valid tokenizer.json ({e}); {_rebuild_hint(path)}") from None
        out = cls(tok, source=str(path))
        out._file_sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write tokenizer.json atomically (a reader never sees half a file)."""
        path = Path(path)
        if path.is_dir():
            path = path / FILE_NAME
        fd, tmp = new_temporary(path)  # its own name: another host sharing the directory may run our pid
        os.close(fd)
        try:
            self._tok.save(tmp)
            self._file_sha256 = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def to_str(self) -> str:
        return self._tok.to_str()

    @property
    def sha256(self) -> str:
        """Hash of tokenizer.json as written (or read); meta.json records it to catch tokenizer/shard
        mismatches. The file's bytes, not to_str(): a unigram model's scores do not re-serialise
        identically after a load."""
        return self._file_sha256 or hashlib.sha256(self.to_str().encode()).hexdigest()

    # -- ids ---------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def kind(self) -> str:
        model = type(self._tok.model).__name__
        return {"BPE": "bpe", "Unigram": "unigram", "WordLevel": "char"}.get(model, model.lower())

    pad_id = property(lambda self: self._ids["pad"])
    bos_id = property(lambda self: self._ids["bos"])
    eos_id = property(lambda self: self._ids["eos"])
    mask_id = property(lambda self: self._ids["mask"])
    sep_id = property(lambda self: self._ids["sep"])
    cls_id = property(lambda self: self._ids["cls"])
    unk_id = property(lambda self: self._ids["unk"])

    @property
    def special_ids(self) -> list[int]:
        return sorted({*self._ids.values(), *self.sentinel_ids})

    @property
    def specials(self) -> dict:
        """Role -> id, plus the sentinel ids; written to meta.json."""
        return {**self._ids, "sentinels": self.sentinel_ids}

    # -- encoding ----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast skips the character offsets that the pipeline never reads.
        return [e.ids for e in self._enc.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind}, vocab_size={self.vocab_size}, source={self.source})"


# A special token's entry in the encoding copy's model vocabulary is renamed to its spelling plus this: no pre-token
# holds a space after a whitespace-aware pre-tokenizer (Metaspace, Whitespace, BERT's), nor, in practice, a NUL.
_UNMATCHABLE = " \x00"


def _text_only(tok: HFTokenizer) -> HFTokenizer:
    """The tokenizer to encode text with: `tok`, or a copy whose model vocabulary no longer spells the special tokens.

    encode_special_tokens only skips the added-token pass; a model that matches a whole vocabulary entry still
    found "<eos>" in text: Unigram's Viterbi (lm's unigram, T5's; the entry scores 0, the best), WordPiece and
    WordLevel after a whitespace-only pre-tokenizer, BPE with ignore_merges (without it, only merges build a
    token, and none builds a special one). Renaming the entry (its id kept) leaves the text to the ordinary pieces;
    ids, decoding and the saved file stay the original's.
    """
    model = tok.model
    if isinstance(model, models.BPE) and not model.ignore_merges:
        return tok
    spelled = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    spelled = {content: i for content, i in spelled.items() if model.token_to_id(content) == i}
    if not spelled:
        return tok
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]  # Unigram: [piece, score] in id order; the others: {piece: id}
    for content, i in spelled.items():
        if isinstance(vocab, list):
            vocab[i][0] = content + _UNMATCHABLE
        else:
            vocab[content + _UNMATCHABLE] = vocab.pop(content)
        if data["model"].get("unk_token") == content:  # WordPiece, WordLevel and BPE name their unknown token
            data["model"]["unk_token"] = content + _UNMATCHABLE
    try:
        enc = HFTokenizer.from_str(json.dumps(data))
    except Exception:  # noqa: BLE001 - a model that refers to the entry elsewhere (a BPE merge): keep the original
        return tok
    enc.encode_special_tokens = True
    return enc


# -- training -----------------------------------------------------------------------------------


def train(
    kind: str, texts: Iterable[str], vocab_size: int = 8192, n_sentinels: int = 100, progress: bool = False
) -> Tokenizer:
    """Train a tokenizer of `kind` on an iterator of documents (streamed, never held at once)."""
    specials = special_tokens(n_sentinels)
    if kind == "char":
        return _char(texts, specials)
    if kind == "bpe":
        return _bpe(texts, vocab_size, specials, progress)
    if kind == "unigram":
        return _unigram(texts, vocab_size, specials, progress)
    raise TokenizerError(f"tokenizer={kind!r} is not one of {list(KINDS)} or a path to a tokenizer.json")


def _bpe(texts: Iterable[str], vocab_size: int, specials: list[str], progress: bool) -> Tokenizer:
    """Byte-level BPE as in GPT-2 (Radford et al. 2019): every byte is a symbol, so nothing is unknown."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials) + 1:
        raise TokenizerError(
            f"vocab_size={vocab_size} is too small for byte-level BPE: it needs the "
            f"{len(alphabet)} byte symbols + {len(specials)} special tokens + merges; "
            f"set vocab_size > {len(alphabet) + len(specials)} (thousands are usual)"
        )
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=progress
    )
    tok.train_from_iterator(texts, trainer)
    return Tokenizer(tok)


def _unigram(texts: Iterable[str], vocab_size: int, specials: list[str], progress: bool) -> Tokenizer:
    """Unigram LM tokenizer (Kudo 2018) with SentencePiece's metaspace pre-tokenization."""
    tok = HFTokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=specials, unk_token=SPECIAL_TOKENS["unk"], show_progress=progress
    )
    try:
        tok.train_from_iterator(texts, trainer)
    except Exception as e:  # the Rust side raises plain Exception
        if "not large enough to contain all chars" not in str(e):
            raise
        raise TokenizerError(
            f"vocab_size={vocab_size} is too small for a unigram tokenizer of this text: it needs every distinct "
            f"character of the train split + {len(specials)} special tokens; raise vocab_size (thousands are "
            f"usual), or use tokenizer=char for a vocabulary of exactly the text's characters"
        ) from None
    return Tokenizer(tok)


def char_symbols(texts: Iterable[str]) -> list[str]:
    """The distinct characters of a corpus, sorted (nanoGPT's `sorted(set(text))`)."""
    symbols: set = set()
    for text in texts:
        symbols.update(text)
    return sorted(symbols)


def _char(texts: Iterable[str], specials: list[str]) -> Tokenizer:
    """One token per character; the vocabulary is the corpus' own symbols after the specials."""
    symbols = [s for s in char_symbols(texts) if s not in specials]
    if not symbols:
        raise TokenizerError("the corpus has no characters to build a character-level vocabulary from")
    vocab = {t: i for i, t in enumerate([*specials, *symbols])}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk"]))
    # [\s\S] matches every code point, newlines included (Oniguruma has no DOTALL flag syntax).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    return Tokenizer(tok)


def iter_limited(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    """The documents of `texts` until about `max_chars` characters (a sample to train on)."""
    seen = 0
    for text in texts:
        if seen >= max_chars:
            return
        seen += len(text)
        yield text


HF_ROLES = ("bos", "eos", "pad", "unk", "mask", "sep", "cls")


def to_transformers(path: str | os.PathLike):
    """The tokenizer at `path` (roles found as Tokenizer finds them) as a transformers fast tokenizer, for lm
    export's hf/ directory (lm/model/hf_export.py writes it beside the model)."""
    from lm.extras import require

    fast = require("hf", "writing the tokenizer into lm export's hf/ directory").PreTrainedTokenizerFast
    ours = Tokenizer.load(path)
    # to_str(): the tokenizer as loaded, with any role tokens it had to add, so the ids agree
    tokens = {f"{role}_token": ours.id_to_token(getattr(ours, f"{role}_id")) for role in HF_ROLES}
    return fast(tokenizer_object=HFTokenizer.from_str(ours.to_str()), **tokens)
