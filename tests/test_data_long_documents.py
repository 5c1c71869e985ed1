"""One overlong document (a 20 MB line) is tokenized in pieces of max_doc_chars: bounded memory, the
same tokens as whole, one document in the counts.

Tokenizing a string whole costs ~200-300 bytes of memory per character (measured: a 5 MB line peaked
at 1.4 GB RSS with the char tokenizer, 1.0 GB with BPE, before pieces); in pieces of 1 MiB a 20 MB line
peaks at ~0.55 GB (~28 bytes per input byte: the payload, its text and its pieces, token arrays).
"""

import json
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lm.data.documents import split_long
from lm.data.tokenizer import train

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def words_text(n_chars: int, seed: int = 0) -> str:
    """Random words separated by single and double spaces, newlines and tabs; ASCII."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9))) for _ in range(500)]
    parts, n = [], 0
    while n < n_chars:
        w = rng.choice(vocab) + rng.choice([" "] * 8 + ["  ", "\n", "\t", ". "])
        parts.append(w)
        n += len(w)
    return "".join(parts).strip()


@pytest.mark.parametrize("kind", ["bpe", "unigram", "char"])
def test_pieces_tokenize_like_the_whole_text(kind):
    text = words_text(60_000)
    tok = train(kind, [text], vocab_size=400 if kind == "bpe" else 200, n_sentinels=0)
    pieces = split_long(text, 1000)
    assert "".join(pieces) == text and len(pieces) > 60
    assert all(0 < len(p) <= 1000 for p in pieces)
    assert all(p[0] == " " and not p[1].isspace() for p in pieces[1:])  # cut before " word"
    joined = [i for p in pieces for i in tok.encode(p)]
    assert joined == tok.encode(text)


def test_a_giant_word_is_cut_at_the_limit():
    assert split_long("x" * 2500, 1000) == ["x" * 1000, "x" * 1000, "x" * 500]
    assert split_long("short", 1000) == ["short"]


@pytest.mark.slow  # ~25 s on 2 busy cores
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/self/status VmHWM")
def test_one_long_line_prepares_in_bounded_memory(tmp_path):
    n_chars = 20_000_000
    src = tmp_path / "one_line.txt"
    text = words_text(n_chars).replace("\n", " ")
    src.write_text(text + "\n")
    out = tmp_path / "out"
    # A fresh process, so its high-water mark is this preparation's own peak. VmHWM, not ru_maxrss: the
    # latter keeps the pytest worker's pages that the fork copied before exec (a 1 GB worker, a 1 GB floor).
    script = textwrap.dedent(f"""
        from lm.data.prepare import prepare
        prepare({{"source": {str(src)!r}, "tokenizer": "bpe", "vocab_size": 512, "n_sentinels": 0,
                  "val_fraction": 0.0, "workers": 1}}, {str(out)!r}, progress=False)
        print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    peak = int(run.stdout.split()[-1])
    assert peak / len(text) < 50, f"peak RSS {peak / 1e6:.0f} MB for a {len(text) / 1e6:.0f} MB line"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["split_documents"] == 1 and meta["config"]["max_doc_chars"] == 1 << 20
    assert meta["splits"]["train"]["documents"] == 1  # one document, one EOS, whatever the pieces
    ids = np.fromfile(out / meta["splits"]["train"]["shards"][0]["file"], dtype=meta["dtype"])
    eos = meta["tokenizer"]["specials"]["eos"]
    assert ids[-1] == eos and (ids == eos).sum() == 1
    from lm.data.tokenizer import Tokenizer

    tok = Tokenizer.load(out / "tokenizer.json")
    step = 1 << 20  # ASCII byte-level tokens: any token boundary is a character boundary
    body = ids[:-1]
    decoded = "".join(tok.decode(body[i : i + step].tolist()) for i in range(0, len(body), step))
    assert decoded == text
