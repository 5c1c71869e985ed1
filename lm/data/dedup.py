"""Exact deduplication across the whole corpus (data.dedup, lm prepare --dedup): a document whose doc_key
(lm/data/documents.py: its text with whitespace runs made one space) was seen earlier is dropped, its tokens
and its EOS with it. Cramming (Geiping & Goldstein 2022) and Lee et al. (2022) deduplicate their corpora;
this is the document-level, exact form of it.

The workers key the documents; the keys seen so far live here, in the parent, in task order, so the result
does not depend on the number of workers. They are appended to a file in the partial directory before each
progress record, so an interrupted lm prepare resumes with exactly the keys of the tasks it had done.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lm.data.shards import CannotResume
from lm.data.workers import Result

KEYS_FILE = "dedup_keys.u64"


class Deduper:
    def __init__(self, partial: Path, n_keys: int = 0):
        """The keys of the first `n_keys` recorded (a resume); any written after that record are dropped."""
        self.path = partial / KEYS_FILE
        keys = np.fromfile(self.path, np.uint64, count=n_keys) if n_keys else np.empty(0, np.uint64)
        if len(keys) < n_keys:
            raise CannotResume(f"{self.path} holds {len(keys)} keys, its progress record {n_keys}")
        with open(self.path, "ab") as f:
            f.truncate(8 * n_keys)
        self.seen = set(keys.tolist())
        self.n_keys = n_keys

    def filter(self, result: Result) -> Result:
        """`result` without the documents seen before (in earlier tasks or earlier in this one), counting them in
        its duplicate_docs and duplicate_tokens."""
        new: list[int] = []
        for split, (lengths, keys) in result.units.items():
            keep = np.ones(len(keys), bool)
            for i, key in enumerate(keys.tolist()):
                if not key:
                    continue
                if key in self.seen:
                    keep[i] = False
                else:
                    self.seen.add(key)
                    new.append(key)
            if keep.all():
                continue
            dropped = int((~keep).sum())
            result.tokens[split] = result.tokens[split][np.repeat(keep, lengths)]
            result.docs[split] -= dropped  # a keyed document always ends in its task
            result.duplicate_docs += dropped
            result.duplicate_tokens += int(lengths[~keep].sum())
        with open(self.path, "ab") as f:
            f.write(np.array(new, np.uint64).tobytes())
        self.n_keys += len(new)
        return result
