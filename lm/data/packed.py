"""Packed loader: memory-mapped token shards -> fixed-length batches, seeded, rank-sharded, resumable.

    loader = PackedLoader("data/shakespeare", "train", seq_len=256, micro_batch_size=8, objective="clm",
                          rank=rank, world_size=world, seed=0)
    for step, batch in zip(range(max_steps), loader): ...    # train: infinite, reshuffled every epoch
    state = loader.state_dict(); ...; loader.load_state_dict(state)      # continue at the next sample
    for batch in PackedLoader(..., "val", ...): ...          # val: finite, one fixed order, the same every time

The split's shards form one token stream. Sample i is the window stream[i*stride : i*stride + window]
(stride = window - overlap, so the windows tile the stream; train_stride sets another stride for
the train split, e.g. 1 = every offset a sample, nanoGPT's random offsets drawn without
replacement): windows cross document boundaries (documents are separated by EOS) and are never
padded; no attention mask is made at the boundaries, so a token attends across them (GPT-2's
packing). The train order is a seeded pseudo-random permutation of the samples per epoch,
evaluated pointwise (a Feistel network with cycle walking, Black & Rogaway 2002), so it costs
no memory however many samples there are.

Sample positions are global: micro-step k of a data-parallel group of W ranks covers positions
[k*W*B, (k+1)*W*B), rank r taking [k*W*B + r*B, k*W*B + (r+1)*B). The state is the number of
samples the group has consumed, so a run resumed with another micro-batch size or world size
continues at exactly the next sample; masking noise is keyed by position, so it matches too.

Batches are dicts of torch LongTensors in the model contract: clm -> input_ids, labels (shifted);
mlm -> input_ids, labels (-100
where not predicted); span -> input_ids, decoder_input_ids, labels.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lm.config_base import ConfigError
from lm.constants import BERT_MLM_CORRUPTION
from lm.data.collate import CausalLM, Collator, MaskedLM, SpanCorruption
from lm.data.errors import DataError
from lm.data.manifest import open_prepared

OBJECTIVES = ("clm", "mlm", "span")
# The val windows' order: fixed whatever the run's seed, so every run of a corpus validates on the same windows.
VAL_ORDER = [0x76616C]
# The val batches' masks and spans (mlm, span): fixed too, so two seeds of an ablation differ by their training only.
VAL_SEED = 0


class TokenStream:
    """The shards of one split as one virtual array; every shard is mapped when the stream opens, read when sliced.
    Mapped at once, not on first use: `lm prepare --force` (another job, another user) replaces the directory's files
    while a run reads it, and a shard first mapped after that was the new data's (other documents, another
    tokenizer: read without a word) or gone (FileNotFoundError hours in). A mapping reads the file it opened until
    the run ends, whatever is renamed or removed meanwhile."""

    def __init__(self, root: Path, meta: dict, split: str):
        if split not in meta["splits"]:
            fix = (
                f"; it was prepared without one (val_fraction={meta.get('config', {}).get('val_fraction')}), and "
                f"training validates on it: prepare it again with --val-fraction 0.01 or --val-source FILE "
                f"(lm prepare ... --force --out {root}; lm train data.source=...: data.val_fraction=0.01)"
                if split == "val"
                else ""
            )
            raise DataError(f"{root}: no {split!r} split (has {sorted(meta['splits'])}){fix}")
        self.root, self.dtype = root, np.dtype(meta["dtype"])
        self.files = [s["file"] for s in meta["splits"][split]["shards"]]
        self.starts = np.cumsum([0] + [s["tokens"] for s in meta["splits"][split]["shards"]])  # (n_shards + 1,)
        self.n = int(self.starts[-1])
        self._maps = [_map_shard(root / s["file"], s["tokens"], self.dtype) for s in meta["splits"][split]["shards"]]

    def shard(self, i: int) -> np.ndarray:
        return self._maps[i]

    def read_windows(self, starts: np.ndarray, out: np.ndarray) -> None:
        """out[b] = stream[starts[b] : starts[b] + L] for out of shape (B, L); one gather per shard."""
        L = out.shape[1]
        first = np.searchsorted(self.starts, starts, side="right") - 1  # (B,) shard of each window's start
        inside = starts + L <= self.starts[first + 1]  # (B,) the window ends in the same shard
        for i in np.unique(first[inside]):
            rows = np.flatnonzero(inside & (first == i))
            offsets = (starts[rows] - self.starts[i])[:, None] + np.arange(L)  # (b, L)
            out[rows] = self.shard(int(i))[offsets]
        for b in np.flatnonzero(~inside):  # the few windows that cross into the next shard
            self.read(int(starts[b]), out[b])

    def read(self, start: int, out: np.ndarray) -> None:
        """Copy stream[start : start + len(out)] into out (crossing shard boundaries if needed)."""
        pos, filled = start, 0
        while filled < out.size:
            i = int(np.searchsorted(self.starts, pos, side="right")) - 1
            lo = pos - int(self.starts[i])
            take = min(out.size - filled, int(self.starts[i + 1]) - pos)
            out[filled : filled + take] = self.shard(i)[lo : lo + take]
            pos, filled = pos + take, filled + take

    def locate(self, pos: int) -> str:
        i = int(np.searchsorted(self.starts, pos, side="right")) - 1
        return f"{self.root / self.files[i]} at token {pos - int(self.starts[i])}"


def _map_shard(path: Path, tokens: int, dtype: np.dtype) -> np.ndarray:
    """The shard's tokens as a plain ndarray view of its map (the base keeps the file mapped): slicing an np.memmap
    builds a memmap subclass each time, which cost as much as copying a window."""
    if tokens == 0:
        return np.empty(0, dtype)  # mmap refuses an empty file
    shard = np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)
    if shard.size != tokens:  # checked by open_prepared an instant ago: the directory was replaced since
        raise DataError(
            f"{path}: {shard.size} tokens where its meta.json says {tokens}: the directory changed while this run "
            f"opened it (another lm prepare --force of it?); run again once that has finished"
        )
    return shard


# -- a seeded permutation evaluated pointwise ---------------------------------------------------


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-mixing function of 64-bit integers (wraps mod 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def permute(i: np.ndarray, n: int, key: list[int]) -> np.ndarray:
    """perm(i) for a pseudo-random permutation of range(n) chosen by `key`, without an O(n) table."""
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    rounds = np.random.SeedSequence(key).generate_state(4, np.uint64)

    def feistel(x):  # a bijection of [0, 4**half), which holds range(n)
        left, right = x >> np.uint64(half), x & mask
        for k in rounds:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << np.uint64(half)) | right

    out = feistel(np.asarray(i, dtype=np.uint64))
    while (outside := out >= np.uint64(n)).any():  # cycle walking: re-apply until back inside range(n)
        out[outside] = feistel(out[outside])
    return out.astype(np.int64)


# -- the loader ---------------------------------------------------------------------------------


def make_collator(
    objective: str,
    seq_len: int,
    meta: dict,
    seed: int,
    stream: int,
    mlm_probability: float = 0.15,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    decoder_start_id: int | None = None,
    mlm_corruption: tuple[float, float] = BERT_MLM_CORRUPTION,
) -> Collator:
    sp, vocab = meta["tokenizer"]["specials"], meta["tokenizer"]["vocab_size"]
    if objective == "clm":
        return CausalLM(seq_len, seed, stream)
    if objective == "mlm":
        specials = [v for k, v in sp.items() if k != "sentinels"] + sp["sentinels"]
        return MaskedLM(seq_len, sp["mask"], specials, vocab, mlm_probability, seed, stream, mlm_corruption)
    if objective == "span":
        start = sp["pad"] if decoder_start_id is None else decoder_start_id
        return SpanCorruption(seq_len, sp["sentinels"], sp["eos"], start, noise_density, mean_span_length, seed, stream)
    raise ConfigError(f"objective={objective!r} is not one of {list(OBJECTIVES)}")


class PackedLoader:
    """Fixed-length batches over a prepared directory; see the module docstring."""

    def __init__(
        self,
        data_dir,
        split: str,
        seq_len: int,
        micro_batch_size: int,
        objective: str = "clm",
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        mlm_probability: float = 0.15,
        noise_density: float = 0.15,
        mean_span_length: float = 3.0,
        vocab_size: int | None = None,
        decoder_start_id: int | None = None,
        verify: bool = False,
        train_stride: int | None = None,
        mlm_corruption: tuple[float, float] = BERT_MLM_CORRUPTION,
    ):
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank={rank} must be in [0, world_size={world_size})")
        if seq_len < 1 or micro_batch_size < 1:
            raise ConfigError(f"seq_len={seq_len} and micro_batch_size={micro_batch_size} must be >= 1")
        self.root = Path(data_dir).expanduser()
        self.meta = open_prepared(self.root, checksums=verify)
        self.vocab_size = self.meta["tokenizer"]["vocab_size"]
        self.tokenizer_sha256 = self.meta["tokenizer"]["sha256"]
        if vocab_size is not None and vocab_size < self.vocab_size:
            raise ConfigError(
                f"model.vocab_size={vocab_size} is smaller than the tokenizer of {self.root} "
                f"({self.vocab_size} tokens); set model.vocab_size={self.vocab_size} or more"
            )
        self.split, self.seq_len, self.micro_batch_size = split, seq_len, micro_batch_size
        self.objective, self.rank, self.world_size, self.seed = objective, rank, world_size, seed
        self.training = split == "train"
        self.stream = TokenStream(self.root, self.meta, split)
        self.collate = make_collator(
            objective,
            seq_len,
            self.meta,
            seed if self.training else VAL_SEED,  # val: the same masks and spans for every run of a corpus
            0 if self.training else 1,
            mlm_probability,
            noise_density,
            mean_span_length,
            decoder_start_id,
            mlm_corruption,
        )
        self.window, self.stride = self.collate.window, self.collate.window - self.collate.overlap
        if train_stride is not None and self.training:  # val always tiles: each token scored once
            if train_stride < 1:
                raise ConfigError(
                    f"data.train_stride={train_stride} must be >= 1 (or null: the window "
                    f"length minus the overlap, {self.stride} here)"
                )
            self.stride = train_stride
        self.n_samples = max(0, (self.stream.n - self.window) // self.stride + 1)  # last start <= n - window
        if self.n_samples < (1 if self.training else world_size):
            raise DataError(
                f"{self.root}: the {split!r} split has {self.stream.n} tokens, too few for "
                f"{1 if self.training else world_size} window(s) of {self.window} tokens; use a "
                f"shorter seq_len, or prepare more data for it (val_fraction)"
            )
        self.consumed = 0  # samples consumed by the whole data-parallel group (train)

    @property
    def dense_labels(self) -> bool:
        """Every label is a target (no IGNORE_INDEX: clm's shifted windows, span corruption's targets) and
        every train micro-batch has the same shape on every rank; mlm labels only the masked positions."""
        return self.objective in ("clm", "span")

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict]:
        return self._train() if self.training else self._eval()

    def __len__(self) -> int:
        if self.training:
            raise TypeError("the train loader is infinite; use loader.n_samples for the samples per epoch")
        return math.ceil(self._eval_per_rank / self.micro_batch_size)

    def _train(self) -> Iterator[dict]:
        B = self.micro_batch_size
        while True:
            positions = self.consumed + self.rank * B + np.arange(B)  # (B,)
            self.consumed += B * self.world_size  # before yielding: state_dict() then points past this batch
            yield self._batch(self.sample_ids(positions), positions)

    @property
    def _eval_per_rank(self) -> int:
        return self.n_samples // self.world_size  # equal on every rank, so collective eval never waits

    @property
    def val_windows(self) -> int:
        """The windows a whole validation pass scores: the split's, cut to a multiple of the world size."""
        return self._eval_per_rank * self.world_size

    def first_windows(self, windows: int) -> Iterator[dict]:
        """A validation pass over the first `windows` windows of the val order (a multiple of the world size, at
        most val_windows): the same windows on any world size, ceil(windows / (W x B)) micro-batches on every
        rank, the last shorter where W x B does not divide `windows` (lm/core/pretrain_task.py fixes the count)."""
        if windows % self.world_size or not 0 < windows <= self.val_windows:
            raise ValueError(
                f"{windows} val windows: not a positive multiple of {self.world_size} up to {self.val_windows}"
            )
        return self._eval(windows)

    def _eval(self, windows: int | None = None) -> Iterator[dict]:
        # Interleaved like training: micro-batch k of rank r holds windows [k*W*B + r*B, ... + B), so the
        # first k micro-batches of all ranks are the first k*W*B windows whatever W is; a validation pass
        # cut at eval_batches then measures the same windows on 1 rank as on W (with the same W*B). Positions map
        # to windows by a fixed permutation: a cut pass is a uniform sample of the split, not its first documents
        # (a corpus of several sources validated on the first sources only, or on one book).
        B, W = self.micro_batch_size, self.world_size
        n = self.val_windows if windows is None else windows
        for start in range(0, n, B * W):
            per_rank = min(B * W, n - start) // W  # the last chunk is split evenly too
            ids = permute(start + self.rank * per_rank + np.arange(per_rank), self.n_samples, VAL_ORDER)
            yield self._batch(ids, ids)

    def sample_ids(self, positions: np.ndarray) -> np.ndarray:
        """Train positions -> sample indices: a fresh permutation of the samples every epoch."""
        epoch, j = np.divmod(positions, self.n_samples)
        out = np.empty_like(positions)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = permute(j[sel], self.n_samples, [self.seed, int(e)])
        return out

    def _batch(self, sample_ids: np.ndarray, keys: np.ndarray) -> dict:
        import torch

        windows = np.empty((len(sample_ids), self.window), dtype=np.int64)  # (B, L)
        self.stream.read_windows(np.asarray(sample_ids, dtype=np.int64) * self.stride, windows)
        if windows.max() >= self.vocab_size:
            b, t = np.unravel_index(int(windows.argmax()), windows.shape)
            where = self.stream.locate(int(sample_ids[b]) * self.stride + int(t))
            raise DataError(
                f"{where}: token id {windows[b, t]} >= vocabulary size {self.vocab_size}: the shard is "
                f"corrupt or from another tokenizer; run lm prepare --verify {self.root}, then "
                f"lm prepare --force"
            )
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self.collate(windows, keys).items()}

    # -- resume -------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "samples_consumed": int(self.consumed),
            "seed": self.seed,
            "split": self.split,
            "n_samples": self.n_samples,
            "window": self.window,
            "stride": self.stride,
            "objective": self.objective,
            "tokenizer_sha256": self.tokenizer_sha256,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue after `samples_consumed` samples; refuses a state from another data order."""
        for key in ("seed", "split", "n_samples", "window", "stride", "objective", "tokenizer_sha256"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(
                    f"loader state has {key}={state[key]!r} but this loader has {getattr(self, key)!r}: "
                    f"the resumed run would not see the same data order; resume with the same data, "
                    f"seq_len, train_stride, objective and seed"
                )
        self.consumed = int(state["samples_consumed"])
