"""The data config schema (conf/data/*.yaml): DataConfig, its choices and validate_data."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm.config_base import Choice, ConfigError


class Format(Choice):
    auto = "auto"  # by file extension
    text = "text"
    jsonl = "jsonl"
    parquet = "parquet"
    csv = "csv"  # the text_field column of each row (lm/data/tables.py)
    tsv = "tsv"
    hf = "hf"


class DocSplit(Choice):
    file = "file"
    line = "line"
    blank_line = "blank_line"
    regex = "regex"


class Split(Choice):
    document = "document"  # a hash of each document decides
    contiguous = "contiguous"  # the last val_fraction of the text


class EncodingErrors(Choice):
    strict = "strict"
    replace = "replace"  # bad UTF-8 bytes -> U+FFFD, counted


class BadRecords(Choice):
    error = "error"
    skip = "skip"  # JSONL/Parquet/CSV/TSV records without text, counted in meta.json


@dataclass
class DataConfig:
    """One prepared dataset: where its text comes from, how it is tokenized, where it is written.

    `lm train data=<name>` selects conf/data/<name>.yaml; `lm.data.prepare.ensure_prepared(cfg)`
    builds `dir` on first use. Fields left None take the registry corpus' own choice (tiny
    Shakespeare is one document split 90/10 by characters, TinyStories splits on its separator).
    """

    name: str = "custom"
    dir: str = "${oc.env:LM_CACHE,'~/.cache/lm'}/data/${.name}"  # the prepared directory (meta.json marks it done)
    source: Any = None  # registry corpus, file, directory, glob or hf:<dataset>[:<config>]; or a list of these
    val_source: Any = None  # optional sources that form the val split (then `split` applies to none of them)
    mirror: str | None = None  # local copy of registry files; None = $LM_DATA_MIRROR
    format: Format = Format.auto
    text_field: str = "text"  # the field (JSONL) or column (Parquet, CSV, TSV, hf) that holds the text
    hf_split: str = "train"
    hf_streaming: bool = True
    doc_split: DocSplit | None = None  # None = corpus default or line
    doc_separator: str | None = None  # the regex when doc_split=regex
    tokenizer: str = "bpe"  # bpe | unigram | char | path to an existing tokenizer.json
    vocab_size: int = 8192  # bpe/unigram; char uses the corpus' own symbols
    n_sentinels: int = 100  # <extra_id_i> tokens for span corruption
    tokenizer_train_chars: int = 200_000_000  # train the tokenizer on at most this much text of the train split
    split: Split | None = None  # None = the corpus default
    val_fraction: float = 0.01
    split_seed: int = 0
    append_eos: bool = True  # EOS after every document
    workers: int = 0  # tokenizer processes; 0 = one per CPU core
    shard_tokens: int = 100_000_000
    task_bytes: int = 1 << 20  # text per worker task
    # Tokenizing one string costs ~200-300 bytes of memory per character (a 50 MB line: 15 GB), so longer
    # documents are tokenized in pieces of at most this many characters, cut before a space in front of a word.
    max_doc_chars: int = 1 << 20
    dedup: bool = False  # drop exact duplicate documents (whitespace runs count as one space; lm/data/dedup.py)
    min_doc_chars: int = 0  # drop documents shorter than this many characters (stripped); 0 keeps all
    encoding_errors: EncodingErrors = EncodingErrors.strict
    bad_records: BadRecords = BadRecords.error
    # packed loader (lm.data.packed)
    mlm_probability: float = 0.15  # BERT (Devlin et al. 2019)
    noise_density: float = 0.15  # T5 span corruption (Raffel et al. 2020)
    mean_span_length: float = 3.0
    train_stride: int | None = None  # train windows start every this many tokens; None = tile (window - overlap)


def register_data_configs() -> None:
    """data/schema: every conf/data/*.yaml lists it first."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(group="data", name="schema", node=DataConfig)
    if not OmegaConf.has_resolver("lm.text_name"):
        OmegaConf.register_new_resolver("lm.text_name", text_name)


def text_name(source: Any) -> str:
    """conf/data/text.yaml's name: the source's file name and a digest of its absolute path, so two texts
    never share a prepared directory (`text-notes-1a2b3c4d`)."""
    import hashlib
    import os

    sources = [source] if isinstance(source, str) else [str(s) for s in source]
    where = "|".join(s if ":" in s.split("/", 1)[0] else os.path.abspath(os.path.expanduser(s)) for s in sources)
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(sources[0].rstrip("/")).stem)[:40] or "text"
    return f"text-{stem}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"


def data_preset(name: str, overrides: list[str] | None = None) -> DataConfig:
    """conf/data/<name>.yaml plus overrides (`data.vocab_size=512`), composed as `lm train data=<name>` does."""
    from lm.config_base import compose_group, conf_dir

    if not (conf_dir() / "data" / f"{name}.yaml").is_file():
        known = sorted(p.stem for p in (conf_dir() / "data").glob("*.yaml"))
        raise ConfigError(f"data preset {name!r} not found in {conf_dir() / 'data'}; known presets: {known}")
    cfg = compose_group("data", name, overrides, register_data_configs)
    validate_data(cfg)
    return cfg


def validate_data(cfg: DataConfig) -> None:
    """Fail before reading any data when the values cannot work (types and choices are checked by the
    schema already); the message names the field."""
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={cfg.val_fraction} must be in [0, 1)")
    if cfg.doc_split == DocSplit.regex:
        if not cfg.doc_separator:
            raise ConfigError("data.doc_split=regex needs data.doc_separator=<regex>")
        try:
            pattern = re.compile(cfg.doc_separator)
        except re.error as e:
            raise ConfigError(f"data.doc_separator={cfg.doc_separator!r} is not a regex: {e}") from None
        if pattern.groups or pattern.fullmatch(""):
            raise ConfigError(
                f"data.doc_separator={cfg.doc_separator!r} must not match the empty string or use "
                f"capturing groups; write (?:...) for a group"
            )
    for name in ("vocab_size", "shard_tokens", "task_bytes", "max_doc_chars", "tokenizer_train_chars"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
            raise ConfigError(f"data.{name}={getattr(cfg, name)!r} must be a positive integer")
    if cfg.workers < 0 or cfg.n_sentinels < 0 or cfg.min_doc_chars < 0:
        raise ConfigError("data.workers, data.n_sentinels and data.min_doc_chars must be >= 0")
    if cfg.train_stride is not None and cfg.train_stride < 1:
        raise ConfigError(f"data.train_stride={cfg.train_stride} must be >= 1, or null for windows that tile the text")
    if not 0.0 < cfg.mlm_probability < 1.0 or not 0.0 < cfg.noise_density < 1.0 or cfg.mean_span_length < 1.0:
        raise ConfigError("data.mlm_probability and data.noise_density must be in (0, 1), data.mean_span_length >= 1")
