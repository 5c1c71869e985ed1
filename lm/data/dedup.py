"""Exact deduplication across the whole corpus (data.dedup, lm prepare --dedup): a document whose doc_key
(lm/data/documents.py: its text with whitespace runs made one space) was seen earlier is dropped, its tokens
and its EOS with it. Cramming (Geiping & Goldstein 2022) and Lee et al. (2022) deduplicate their corpora;
this is the document-level, exact form of it.

The workers key the documents; the keys seen so far live here, in the parent, in task order, so the result
does not depend on the number of workers. They are appended to a file in the partial directory before each
progress record, so an interrupted lm prepare resumes with exactly the keys of the tasks it had done.

The keys seen are one per distinct document, so their memory grows with the corpus: KeySet holds them in one
numpy array, 16-32 bytes a key (a Python set of ints: ~75), e.g. 2-4 GB for 100M distinct documents.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lm.data.shards import CannotResume
from lm.data.workers import Result

KEYS_FILE = "dedup_keys.u64"


class KeySet:
    """A set of nonzero 64-bit keys in one numpy array: open addressing with linear probing, kept at most half full
    (16-32 bytes a key), probed for a whole task's keys at once."""

    def __init__(self, bits: int = 16):
        self.bits, self.n = bits, 0
        self.table = np.zeros(1 << bits, np.uint64)  # 0 = an empty slot (doc_key is never 0)

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        # Fibonacci hashing: the high bits of key * 2**64/phi (doc_key's low bit is always 1, so not the low bits)
        return ((keys * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - self.bits)).astype(np.int64)

    def add(self, keys: np.ndarray) -> np.ndarray:
        """Add `keys` (distinct, nonzero); True where a key was not in the set before."""
        keys = np.asarray(keys, np.uint64)
        while 2 * (self.n + len(keys)) > len(self.table):
            self._grow()
        new, todo = np.zeros(len(keys), bool), np.arange(len(keys))
        slots = self._slots(keys)
        while todo.size:
            k, at = keys[todo], slots[todo]
            held = self.table[at]
            empty = held == 0
            self.table[at[empty]] = k[empty]  # keys after the same empty slot: one of them gets it
            won = empty & (self.table[at] == k)
            new[todo[won]] = True
            todo = todo[~(won | (held == k))]  # found, or placed; the others probe the next slot
            slots[todo] = (slots[todo] + 1) & ((1 << self.bits) - 1)
        self.n += int(new.sum())
        return new

    def _grow(self) -> None:
        old = self.table[self.table != 0]
        self.bits += 1
        self.table, self.n = np.zeros(1 << self.bits, np.uint64), 0
        self.add(old)


class Deduper:
    def __init__(self, partial: Path, n_keys: int = 0):
        """The keys of the first `n_keys` recorded (a resume); any written after that record are dropped."""
        self.path = partial / KEYS_FILE
        keys = np.fromfile(self.path, np.uint64, count=n_keys) if n_keys else np.empty(0, np.uint64)
        if len(keys) < n_keys:
            raise CannotResume(f"{self.path} holds {len(keys)} keys, its progress record {n_keys}")
        with open(self.path, "ab") as f:
            f.truncate(8 * n_keys)
        self.seen = KeySet()
        self.seen.add(keys)  # distinct: only keys new when seen were written
        self.n_keys = n_keys

    def filter(self, result: Result) -> Result:
        """`result` without the documents seen before (in earlier tasks or earlier in this one), counting them in
        its duplicate_docs and duplicate_tokens."""
        new: list[np.ndarray] = []
        for split, (lengths, keys) in result.units.items():
            keys = np.asarray(keys, np.uint64)
            keep = np.ones(len(keys), bool)
            keyed = np.flatnonzero(keys)  # 0: a document not deduplicated
            _, first = np.unique(keys[keyed], return_index=True)
            first = np.sort(first)  # in document order, as they come
            fresh = self.seen.add(keys[keyed[first]])
            keep[keyed] = False
            keep[keyed[first[fresh]]] = True  # a key's first document in this task, never seen before
            new.append(keys[keyed[first[fresh]]])
            if keep.all():
                continue
            dropped = int((~keep).sum())
            result.tokens[split] = result.tokens[split][np.repeat(keep, lengths)]
            result.docs[split] -= dropped  # a keyed document always ends in its task
            result.duplicate_docs += dropped
            result.duplicate_tokens += int(lengths[~keep].sum())
        added = np.concatenate(new) if new else np.empty(0, np.uint64)
        with open(self.path, "ab") as f:
            f.write(added.tobytes())
        self.n_keys += len(added)
        return result
