"""`lm prepare`: the command line of lm.data.prepare (raw text -> tokenizer.json + token shards + meta.json)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import asdict

from lm.cli.errors import entry
from lm.config import ConfigError
from lm.data import prepare as data_prepare
from lm.data.config import DataConfig, data_preset
from lm.data.corpora import CORPORA
from lm.data.manifest import META, open_prepared
from lm.data.prepare import data_config, prepare

HELP = {
    "source": "registry corpus, file, directory, glob, hf:<dataset>[:<config>] or glue:<task>,... (GLUE's unlabelled "
    "train sentences); several allowed",
    "val_source": "sources that form the val split (then the split rule is not applied)",
    "mirror": "local copy of registry files (default: $LM_DATA_MIRROR)",
    "format": "auto (by extension) | text | jsonl | parquet | csv | tsv | hf",
    "text_field": "JSONL field / Parquet, CSV, TSV or dataset column that holds the text",
    "hf_split": "split of a Hugging Face dataset to read",
    "doc_split": "what a document is in plain-text files (a record or row is one): file | line | blank_line | regex",
    "doc_separator": "the regex between documents when --doc-split regex",
    "tokenizer": "bpe | unigram | char, or the path of an existing tokenizer.json",
    "vocab_size": "vocabulary size to train (bpe, unigram)",
    "n_sentinels": "number of <extra_id_i> sentinel tokens (T5 span corruption)",
    "tokenizer_train_chars": "train the tokenizer on at most this many characters of the train split",
    "split": "document (a hash of each document decides) | contiguous (the last val_fraction of the text, as nanoGPT)",
    "val_fraction": "fraction of documents (or text) for the val split",
    "split_seed": "seed of the document split",
    "append_eos": "put EOS after every document",
    "workers": "tokenizer processes (0 = one per CPU core)",
    "shard_tokens": "tokens per shard file",
    "task_bytes": "bytes of text per worker task",
    "max_doc_chars": "tokenize longer documents in pieces of at most this many characters, cut before whitespace "
    "(bounds memory; counted in meta.json)",
    "dedup": "drop exact duplicate documents (whitespace runs count as one space; counted in meta.json)",
    "min_doc_chars": "drop documents shorter than this many characters (counted in meta.json; 0 keeps all)",
    "encoding_errors": "strict (bad UTF-8 is an error) | replace (decode as U+FFFD and count)",
    "bad_records": "error | skip (count and skip JSONL, Parquet, CSV or TSV records without text)",
    "hf_streaming": "stream a Hugging Face dataset instead of downloading it whole",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lm prepare",
        description=data_prepare.__doc__.split("\n\n")[0] + "\n\n" + data_prepare.__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.fill("Registry corpora (lm prepare --list for details): " + ", ".join(CORPORA), 110),
    )
    p.add_argument("sources", nargs="*", help=HELP["source"])
    p.add_argument("--data", metavar="PRESET", help="start from conf/data/PRESET.yaml (flags override it)")
    p.add_argument("--out", help="output directory (default: the preset's dir)")
    p.add_argument(
        "--force",
        action="store_true",
        help="rebuild a complete directory; the old one stays until the new one is complete",
    )
    p.add_argument("--restart", action="store_true", help="discard an interrupted run instead of resuming it")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (off a terminal there is none: a line a minute instead)",
    )
    p.add_argument("--list", action="store_true", help="list the registry of well-known corpora and exit")
    p.add_argument("--verify", metavar="DIR", help="check a prepared directory's shards (sizes, sha256) and exit")
    defaults = DataConfig()
    for name, help_ in HELP.items():
        if name == "source":
            continue
        flag, default = "--" + name.replace("_", "-"), getattr(defaults, name)
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            kind = type(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else str
            p.add_argument(flag, type=kind, default=None, nargs="+" if name == "val_source" else None, help=help_)
    return p


def _check_choices(given: dict) -> None:
    """A flag that takes one of a few values (--split, --format, ...) given another: one line naming the flag and
    its values (DataConfig's typing would name data.<field> and then every data field)."""
    import difflib
    from typing import get_type_hints

    hints = get_type_hints(DataConfig)
    for name, value in given.items():
        allowed = _choices(hints[name])
        if allowed and value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {value}: no such choice; pick one of {', '.join(allowed)}{hint}")


def _choices(hint) -> list[str]:
    """The values of an Enum field (`Split`, `Split | None`); [] for any other type."""
    from enum import Enum
    from typing import get_args

    kind = next((t for t in (hint, *get_args(hint)) if isinstance(t, type) and issubclass(t, Enum)), None)
    return [c.value for c in kind] if kind is not None else []


@entry("lm prepare")
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.list:
        for name, c in CORPORA.items():
            print(f"{name:20s} {c.description}")
        return
    if args.verify:
        meta = open_prepared(args.verify, checksums=True)
        n = sum(len(s["shards"]) for s in meta["splits"].values())
        print(f"{args.verify}: OK ({n} shards, sizes and sha256 match {META})")
        return
    base = asdict(data_preset(args.data)) if args.data else {}
    given = {k: v for k, v in vars(args).items() if k in HELP and v is not None}
    if args.sources:
        given["source"] = args.sources if len(args.sources) > 1 else args.sources[0]
    if not args.out and not args.data:
        raise ConfigError("say where to write: --out DIR (or --data PRESET, whose dir is used)")
    _check_choices(given)
    cfg = data_config({**base, **given})
    if "vocab_size" in given and cfg.tokenizer == "char":  # the char vocabulary is the text's characters
        raise ConfigError(
            f"--vocab-size {given['vocab_size']} does nothing with --tokenizer char, whose vocabulary is every "
            f"character of the text; drop it, or pick --tokenizer bpe or unigram"
        )
    # the bar on a terminal only: in a redirected log (Slurm, nohup) its carriage-return frames pile up on one line
    progress = not args.no_progress and sys.stderr.isatty()
    prepare(cfg, args.out, force=args.force, restart=args.restart, progress=progress)


if __name__ == "__main__":
    main()
