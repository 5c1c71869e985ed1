"""The registry of well-known corpora, the local mirror and the download cache.

A registry file is looked up first in the local mirror (`LM_DATA_MIRROR` or data.mirror), then in
the download cache (`LM_CACHE`), then downloaded atomically (and checksum-verified where known).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from lm.core.files import new_temporary
from lm.data.errors import DataError


@dataclass(frozen=True)
class Remote:
    """One file of a registry corpus: its path under the mirror (and cache), and where to download it."""

    mirror: str
    url: str | None = None
    sha256: str | None = None
    member: str | None = None  # the file inside the zip archive at `url`


@dataclass(frozen=True)
class Corpus:
    description: str
    files: dict[str, tuple[Remote, ...]] = field(default_factory=dict)  # split ("all" = apply the split rule)
    hf: tuple[str, str | None] | None = None  # (dataset, config) read with `datasets` when no local copy
    mirror_dir: str | None = None  # for hf corpora: a local copy (jsonl/parquet/text files) under the mirror
    # For a corpus with both `files` (its mirror copy) and `hf` (the download source): our split -> the
    # dataset's split name, read when none of the files is local.
    hf_splits: dict[str, str] = field(default_factory=lambda: {"train": "train"})
    doc_split: str = "line"
    doc_separator: str | None = None
    split: str = "document"


_GH = "https://raw.githubusercontent.com"
_HF = "https://huggingface.co/datasets"
_WT = "https://wikitext.smerity.com"


def _wikitext(n: str) -> dict[str, tuple[Remote, ...]]:
    zip_url, d = f"{_WT}/wikitext-{n}-raw-v1.zip", f"wikitext-{n}-raw"
    return {
        split: (Remote(f"text/{d}/wiki.{name}.raw", zip_url, member=f"{d}/wiki.{name}.raw"),)
        for split, name in (("train", "train"), ("val", "valid"), ("test", "test"))
    }


def _gutenberg() -> dict[str, tuple[Remote, ...]]:
    d = "text/gutenberg"
    return {
        "train": tuple(Remote(f"{d}/train-{i:05d}-of-00010.jsonl.zst") for i in range(10)),
        "val": (Remote(f"{d}/validation-00000-of-00001.jsonl.zst"),),
    }


CORPORA: dict[str, Corpus] = {
    "tiny_shakespeare": Corpus(
        "Tiny Shakespeare (Karpathy's char-rnn), 1.1 MB, one document split 90/10 by characters",
        {
            "all": (
                Remote(
                    "text/tinyshakespeare/input.txt",
                    f"{_GH}/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt",
                    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
                ),
            )
        },
        doc_split="file",
        split="contiguous",
    ),
    "wikitext2": Corpus(
        "WikiText-2 raw (Merity et al. 2016), 13 MB, its own train/valid/test files", _wikitext("2"), doc_split="file"
    ),
    "wikitext2_heldout": Corpus(
        "WikiText-2 raw valid + test only (2.4 MB, in the local mirror; the 11 MB train file is not), read as "
        "plain text whose documents the split rule assigns: what lm quickstart pretrains on",
        {"all": _wikitext("2")["val"] + _wikitext("2")["test"]},
    ),
    "wikitext103": Corpus(
        "WikiText-103 raw (Merity et al. 2016), 540 MB, its own train/valid/test files",
        _wikitext("103"),
        doc_split="file",
    ),
    "tinystories": Corpus(
        "TinyStories V2 (Eldan & Li 2023), 2.2 GB, stories separated by <|endoftext|>",
        {
            "train": (
                Remote(
                    "text/tinystories/TinyStoriesV2-GPT4-train.txt",
                    f"{_HF}/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt",
                ),
            ),
            "val": (
                Remote(
                    "text/tinystories/TinyStoriesV2-GPT4-valid.txt",
                    f"{_HF}/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt",
                ),
            ),
        },
        doc_split="regex",
        doc_separator=r"<\|endoftext\|>",
    ),
    "tinystories_sample": Corpus(
        "The first ~837 TinyStories train stories, 0.9 MB, one story per line (paragraphs inside a story are "
        "separated by a blank line)",
        {
            "all": (
                Remote(
                    "text/tinystories/tiny_stories_train_slice.txt",
                    f"{_GH}/s-ajaykumar/smallGPT/21cab642054b64d330a43d79c0c73da301c293ba/data/tiny_stories.txt",
                    "c56cfd24fb1c542b141a396184b822a4db3672abdb4c49c6aa843171c5e822a5",
                ),
            )
        },
        doc_split="regex",
        doc_separator=r"(?<!\n)\n(?!\n)",
    ),
    "gutenberg": Corpus(
        "724 public-domain Project Gutenberg books, ~266 MB of English prose (~65M GPT-2 tokens), one book per "
        "JSONL line in zstd shards with their own train/validation split (the mirror's text/gutenberg/, see its "
        "MANIFEST.md); without the mirror, PG-19 (Rae et al. 2020; 28k Gutenberg books, ~11 GB) via Hugging Face",
        _gutenberg(),
        hf=("emozilla/pg19", None),
        hf_splits={"train": "train", "val": "validation"},
    ),
    "openwebtext": Corpus(
        "OpenWebText (Gokaslan & Cohen 2019), ~40 GB of web text, via Hugging Face datasets",
        hf=("Skylion007/openwebtext", None),
        mirror_dir="openwebtext",
    ),
    "fineweb_edu_sample": Corpus(
        "FineWeb-Edu sample-10BT (Penedo et al. 2024), ~10B GPT-2 tokens, via Hugging Face datasets",
        hf=("HuggingFaceFW/fineweb-edu", "sample-10BT"),
        mirror_dir="fineweb-edu/sample-10BT",
    ),
}


def mirror_dir(configured: str | None = None) -> Path | None:
    """The local mirror: data.mirror if set, else $LM_DATA_MIRROR, else none."""
    value = configured or os.environ.get("LM_DATA_MIRROR")
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    return Path(os.environ.get("LM_CACHE", "~/.cache/lm")).expanduser()


# -- downloads ----------------------------------------------------------------------------------


def local_copy(remote: Remote, mirror: Path | None) -> Path | None:
    """The registry file in the mirror, else in the download cache, else None."""
    if mirror and (mirror / remote.mirror).is_file():
        return mirror / remote.mirror
    cached = cache_dir() / "downloads" / remote.mirror
    return cached if cached.is_file() else None


def fetch(remote: Remote, mirror: Path | None) -> Path:
    """The local copy of a registry file: mirror, then cache, then a fresh (atomic) download."""
    local = local_copy(remote, mirror)
    if local is not None:
        return local
    cached = cache_dir() / "downloads" / remote.mirror
    where = f"{mirror / remote.mirror}" if mirror else f"$LM_DATA_MIRROR/{remote.mirror}"
    if not remote.url:
        raise DataError(f"{remote.mirror}: not in the mirror and no download location is known; put a copy at {where}")
    try:
        if remote.member:
            archive = cache_dir() / "downloads" / Path(remote.url).name
            if not archive.is_file():
                download(remote.url, archive)
            _extract(archive, remote.member, cached)
        else:
            download(remote.url, cached, remote.sha256)
    except (urllib.error.URLError, OSError, zipfile.BadZipFile) as e:
        reason = getattr(e, "reason", e)
        raise DataError(
            f"could not download {remote.url} ({reason}). If you are offline, put a copy of the file at "
            f"{where} (set LM_DATA_MIRROR or data.mirror to the mirror directory), or pass a local file "
            f"as the source"
        ) from None
    return cached


def download(url: str, dest: Path, sha256: str | None = None, timeout: float = 60.0) -> Path:
    """Stream `url` to `dest` under a temporary name; rename only when complete (and checksum-verified)."""
    from tqdm import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temporary(dest)  # its own name: another host sharing the cache may run a download of our pid
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=timeout) as r:
            total = int(r.headers.get("Content-Length") or 0) or None
            # the bar on a terminal only: in a redirected log (Slurm, nohup) its carriage-return frames pile up
            show = sys.stderr.isatty()
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {dest.name}", disable=not show) as bar:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if sha256 and digest.hexdigest() != sha256:
            raise DataError(
                f"{url}: downloaded file has sha256 {digest.hexdigest()}, expected {sha256}; the upstream "
                f"file changed or the download is corrupt; retry, or put a verified copy in the mirror"
            )
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dest


def _extract(archive: Path, member: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temporary(dest)
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(archive) as z, z.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
