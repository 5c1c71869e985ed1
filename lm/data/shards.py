"""Token shards: one split's token ids appended to files of `shard_tokens` each, resumable after a kill."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from lm.core.files import naming


class CannotResume(Exception):
    pass


class ShardWriter:
    """Appends one split's tokens to shards of `shard_tokens`; the open shard has a .tmp name."""

    def __init__(self, root: Path, split: str, dtype, shard_tokens: int, state: dict | None = None):
        self.root, self.split, self.dtype, self.limit = root, split, np.dtype(dtype), shard_tokens
        self.shards: list[dict] = list(state["shards"]) if state else []
        for s in self.shards:
            if (
                not (root / s["file"]).is_file()
                or (root / s["file"]).stat().st_size != s["tokens"] * self.dtype.itemsize
            ):
                raise CannotResume(f"{s['file']} is missing or has the wrong size")
        self._open(state["current"] if state else 0)

    @property
    def _tmp(self) -> Path:
        return self.root / f"{self.split}_{len(self.shards):05d}.bin.tmp"

    def _open(self, keep: int) -> None:
        self.hash, self.tokens = hashlib.sha256(), keep
        if keep:
            size = keep * self.dtype.itemsize
            if not self._tmp.is_file() or self._tmp.stat().st_size < size:
                raise CannotResume(f"{self._tmp.name} is shorter than the progress record")
            with open(self._tmp, "r+b") as f:
                f.truncate(size)  # drop what was written after the last progress record
                while chunk := f.read(1 << 22):
                    self.hash.update(chunk)
        self.f = open(self._tmp, "ab" if keep else "wb")  # noqa: SIM115 - the writer owns it until close()

    def write(self, tokens: np.ndarray) -> None:
        while tokens.size:
            part, tokens = tokens[: self.limit - self.tokens], tokens[self.limit - self.tokens :]
            data = part.tobytes()
            with naming(self._tmp):  # a full disk names the shard (a write reports no file)
                self.f.write(data)
            self.hash.update(data)
            self.tokens += part.size
            if self.tokens >= self.limit:
                self._finish_shard()
                self._open(0)

    def _finish_shard(self) -> None:
        with naming(self._tmp):
            self.f.close()
        final = self._tmp.with_suffix("")
        os.replace(self._tmp, final)
        self.shards.append({"file": final.name, "tokens": self.tokens, "sha256": self.hash.hexdigest()})

    def state(self) -> dict:
        with naming(self._tmp):
            self.f.flush()
        return {"shards": self.shards, "current": self.tokens}

    def release(self) -> None:
        """Close the open shard's file handle, finished or not (the progress record says what is valid)."""
        with naming(self._tmp):  # on a full disk this close is the error shown, so it names the shard too
            self.f.close()

    def close(self) -> dict:
        if self.tokens:
            self._finish_shard()
        else:
            self.f.close()
            self._tmp.unlink()
        return {"tokens": sum(s["tokens"] for s in self.shards), "shards": self.shards}
