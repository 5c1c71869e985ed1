"""Examples -> token ids for a classifier, and padded batches.

Layout by family (`arch`, as in ModelConfig.arch); a single-sentence task drops b and its separator:

    encoder (BERT):              [CLS] a [SEP] b [SEP]    token_type 0 on [CLS] a [SEP], 1 on b [SEP]
    decoder (GPT):               [BOS] a [SEP] b [EOS]    token_type 0 on [BOS] a [SEP], 1 on b [EOS]
    encoder_decoder (T5, BART):  same as decoder

Encoders pool the first position ([CLS]); decoders and encoder-decoders pool the last real token
(lm.model.SequenceClassifier), so [EOS] closes the input: it is the one position that has
attended to all of a and b, and it is the same token in every example.

A pair task's GlueTaskConfig.pair_input other than "joint" reads each pair twice, and an example holds
its "second" reading: with "both_orders" the example is (a, b) and "second" the same layout of (b, a);
with "siamese" the example is a alone and "second" b alone, each in the single-sentence layout. collate
stacks the second rows under the first ones, and the classifier combines the two pooled vectors
(lm.model.SequenceClassifier: GPT-1's sum, Sentence-BERT's [u; v; |u - v|] or cosine).

Truncation is longest-first (BERT's run_classifier, Devlin et al. 2019): while a and b together
exceed max_len minus the special tokens, drop the last token of the longer one (of b on a tie).
token_type_ids are always returned; a model without segment embeddings ignores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from lm.model.config import Arch

if TYPE_CHECKING:
    import torch  # imported where used: encoding examples needs no torch

Features = dict[str, list]


def truncate_longest_first(a: Sequence[int], b: Sequence[int], budget: int) -> tuple[list, list]:
    la, lb = len(a), len(b)
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return list(a[:la]), list(b[:lb])


def encode_pair(tokenizer, text_a: str, text_b: str | None, max_len: int, arch: str) -> Features:
    """input_ids, attention_mask and token_type_ids (lists) of one example, at most max_len long."""
    a = tokenizer.encode(text_a)
    b = tokenizer.encode(text_b) if text_b is not None else None
    return build_inputs(tokenizer, a, b, max_len, arch)


def build_inputs(tokenizer, a: Sequence[int], b: Sequence[int] | None, max_len: int, arch: str) -> Features:
    """The special-token layout of the module docstring around already tokenized a (and b)."""
    if arch not in list(Arch):
        raise ValueError(f"arch={arch!r} is not one of {[a.value for a in Arch]}")
    n_special = 2 if b is None else 3
    if max_len < n_special + 1:
        raise ValueError(
            f"max_len={max_len} leaves no room for text after {n_special} special tokens; "
            f"use max_len >= {n_special + 1}"
        )
    a, b = truncate_longest_first(a, b or [], max_len - n_special)
    if arch == "encoder":
        first, mid, last = tokenizer.cls_id, tokenizer.sep_id, tokenizer.sep_id
    else:
        first, mid, last = tokenizer.bos_id, tokenizer.sep_id, tokenizer.eos_id
    if n_special == 2:
        ids, types = [first, *a, last], [0] * (len(a) + 2)
    else:
        ids = [first, *a, mid, *b, last]
        types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "token_type_ids": types}


def encode_examples(tokenizer, examples, max_len: int, arch: str, pair_input: str = "joint") -> list[Features]:
    """encode_pair over readers.Example rows (batched through tokenizer.encode_batch when it has one),
    with "labels" when the example has a label, and a pair's "second" reading unless pair_input is "joint"."""
    encode_batch = getattr(tokenizer, "encode_batch", None) or (lambda texts: [tokenizer.encode(t) for t in texts])
    a_ids = encode_batch([e.text_a for e in examples])
    pairs = [i for i, e in enumerate(examples) if e.text_b is not None]
    b_ids = dict(zip(pairs, encode_batch([examples[i].text_b for i in pairs])))
    out = []
    for i, e in enumerate(examples):
        if i in b_ids and pair_input == "siamese":
            f = build_inputs(tokenizer, a_ids[i], None, max_len, arch)
            f["second"] = build_inputs(tokenizer, b_ids[i], None, max_len, arch)
        else:
            f = build_inputs(tokenizer, a_ids[i], b_ids.get(i), max_len, arch)
            if i in b_ids and pair_input == "both_orders":
                f["second"] = build_inputs(tokenizer, b_ids[i], a_ids[i], max_len, arch)
        if e.label is not None:
            f["labels"] = e.label
        out.append(f)
    return out


def padded_length(longest: int, multiple: int, cap: int | None) -> int:
    """`longest` rounded up to a multiple of `multiple`, at most max(cap, longest)."""
    rounded = -(-longest // multiple) * multiple
    return max(longest, min(rounded, cap)) if cap is not None else rounded


def collate(
    features: Sequence[Features], pad_id: int, multiple: int = 1, cap: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad a list of encoded examples into (B, T) long tensors; attention_mask and token_type_ids
    are 0 on pads. "labels" (B,) is long for class ids and float for STS-B scores. Examples with a
    "second" reading give (2B, T): rows 0..B-1 the first readings, rows B..2B-1 the second ones.

    T is the longest example rounded up to a multiple of `multiple`, but not beyond `cap` (the task's max_len)
    where the longest fits under it: fewer distinct shapes for torch.compile and CUDA graphs to record."""
    import torch

    if not features:
        raise ValueError("collate got an empty batch")
    twice = ["second" in f for f in features]
    if any(twice):
        if not all(twice):
            raise ValueError("collate: some examples are read twice and some once; encode a task one way")
        label_of = [{"labels": f["labels"]} if "labels" in f else {} for f in features]
        rows = [{k: v for k, v in f.items() if k != "second"} for f in features]
        rows += [{**f["second"], **y} for f, y in zip(features, label_of)]  # padded to one length with the first
        batch = collate(rows, pad_id, multiple, cap)
        if "labels" in batch:
            batch["labels"] = batch["labels"][: len(features)]  # (B,): one label per pair
        return batch
    lengths = np.array([len(f["input_ids"]) for f in features])
    width = padded_length(int(lengths.max()), multiple, cap)
    real = np.arange(width)[None, :] < lengths[:, None]  # (B, T): row-major order = concatenation order
    batch = {}
    for key, fill in (("input_ids", pad_id), ("attention_mask", 0), ("token_type_ids", 0)):
        x = np.full(real.shape, fill, dtype=np.int64)  # (B, T)
        x[real] = np.fromiter(chain.from_iterable(f[key] for f in features), dtype=np.int64, count=lengths.sum())
        batch[key] = torch.from_numpy(x)
    labelled = ["labels" in f for f in features]
    if any(labelled):
        if not all(labelled):
            raise ValueError("collate: some examples have labels and some do not; batch test and dev data apart")
        labels = [f["labels"] for f in features]
        regression = any(isinstance(y, float) for y in labels)
        batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)  # (B,)
    return batch
