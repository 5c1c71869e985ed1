"""Collators: packed token windows (B, L) -> the model's batch for each pretraining objective.

- clm:  causal LM; labels already shifted (labels[:, t] is the target of position t).
- mlm:  BERT's masking (Devlin et al. 2019): 15% of positions are predicted; of those 80% become
        <mask>, 10% a random token, 10% stay; special tokens are never chosen. ELECTRA's (the model's
        mlm_corruption): 85% <mask>, 15% stay, none random.
- span: T5's span corruption (Raffel et al. 2020, 3.1.4): 15% of the tokens, in spans of mean
        length 3, are replaced by sentinels in the input; the target lists each sentinel followed
        by the tokens it hides. Window lengths are chosen so that the corrupted input is at most
        seq_len tokens, as in T5's `random_spans_helper` (exactly seq_len at the defaults from 10 tokens
        up; a token shorter at some other densities), so nothing is ever padded.

Randomness is per sample, drawn from a generator keyed by (seed, stream, sample position), so
a sample is masked the same way whatever the micro-batch size, world size or resume point.
"""

from __future__ import annotations

import numpy as np

from lm.config_base import ConfigError
from lm.constants import BERT_MLM_CORRUPTION, IGNORE_INDEX


class Collator:
    window: int  # tokens read per sample
    overlap: int = 0  # tokens shared by consecutive windows

    def __init__(self, seed: int, stream: int):
        self.seed, self.stream = seed, stream

    def rng(self, key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.stream, int(key)])

    def __call__(self, windows: np.ndarray, keys: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError


class CausalLM(Collator):
    """Windows of seq_len + 1 tokens; consecutive windows share one token (the last label)."""

    overlap = 1

    def __init__(self, seq_len: int, seed: int = 0, stream: int = 0):
        super().__init__(seed, stream)
        self.window = seq_len + 1

    def __call__(self, windows, keys):
        return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}  # (B, T) each


class MaskedLM(Collator):
    def __init__(
        self,
        seq_len: int,
        mask_id: int,
        special_ids: list[int],
        vocab_size: int,
        probability: float = 0.15,
        seed: int = 0,
        stream: int = 0,
        corruption: tuple[float, float] = BERT_MLM_CORRUPTION,
    ):
        """corruption: of the chosen positions, the fractions given <mask> and a random token (BERT's 80/10)."""
        super().__init__(seed, stream)
        self.window, self.mask_id, self.p = seq_len, mask_id, probability
        self.masked, self.random = corruption
        self.maskable = np.ones(vocab_size, dtype=bool)
        self.maskable[special_ids] = False
        self.regular = np.flatnonzero(self.maskable)  # random replacements are ordinary tokens only

    def __call__(self, windows, keys):
        inputs, labels = windows.copy(), np.full_like(windows, IGNORE_INDEX)
        for b, key in enumerate(keys):
            self._mask_row(self.rng(key), windows[b], inputs[b], labels[b])
        return {"input_ids": inputs, "labels": labels}

    def _mask_row(self, rng, tokens, inputs, labels) -> None:
        maskable = self.maskable[tokens]
        chosen = (rng.random(tokens.size) < self.p) & maskable
        if not chosen.any() and maskable.any():  # a row without targets would give a NaN mean loss
            chosen[rng.choice(np.flatnonzero(maskable))] = True
        action = rng.random(tokens.size)
        labels[chosen] = tokens[chosen]
        inputs[chosen & (action < self.masked)] = self.mask_id
        swap = chosen & (action >= self.masked) & (action < self.masked + self.random)
        inputs[swap] = self.regular[rng.integers(self.regular.size, size=int(swap.sum()))]


def _span_counts(n: int, density: float, mean_span: float) -> tuple[int, int]:
    """(noise tokens, noise spans) for a window of n tokens, as T5's random_spans_noise_mask."""
    noise = min(max(int(round(n * density)), 1), n - 1)
    spans = max(int(round(min(noise, n - noise) / mean_span)), 1)
    return noise, spans


def t5_lengths(seq_len: int, density: float, mean_span: float) -> tuple[int, int, int]:
    """(raw window, encoder input, decoder target) lengths: the longest window whose corrupted
    input (kept tokens + one sentinel per span + EOS) fits in seq_len."""

    def lengths(n):
        noise, spans = _span_counts(n, density, mean_span)
        return n - noise + spans + 1, noise + spans + 1

    if seq_len < 3:  # a 1-token window has no noise: input and target would not fit
        raise ConfigError(f"span corruption needs train.seq_len >= 3 (got {seq_len})")
    # T5 starts one short: with spans <= noise tokens, n - 1 tokens always fit in n (a window of seq_len
    # need not: 8 tokens keep 7, add a sentinel and EOS, 9)
    n = seq_len - 1
    while lengths(n + 1)[0] <= seq_len:
        n += 1
    return (n, *lengths(n))


class SpanCorruption(Collator):
    def __init__(
        self,
        seq_len: int,
        sentinel_ids: list[int],
        eos_id: int,
        decoder_start_id: int,
        density: float = 0.15,
        mean_span: float = 3.0,
        seed: int = 0,
        stream: int = 0,
    ):
        super().__init__(seed, stream)
        self.window, self.input_len, self.target_len = t5_lengths(seq_len, density, mean_span)
        self.noise, self.spans = _span_counts(self.window, density, mean_span)
        if self.spans > len(sentinel_ids):
            raise ConfigError(
                f"span corruption of {seq_len}-token inputs needs {self.spans} sentinel tokens, the "
                f"tokenizer has {len(sentinel_ids)}: prepare the data with n_sentinels >= {self.spans} (a tokenizer "
                f"lm prepare trains; an adopted tokenizer.json keeps its own <extra_id_N> tokens, whatever n_sentinels "
                f"says), or lower seq_len or data.noise_density"
            )
        self.sentinels = np.asarray(sentinel_ids[: self.spans], dtype=np.int64)
        self.eos_id, self.start_id = eos_id, decoder_start_id

    def __call__(self, windows, keys):
        B = len(windows)
        inputs = np.empty((B, self.input_len), dtype=np.int64)
        labels = np.empty((B, self.target_len), dtype=np.int64)
        for b, key in enumerate(keys):
            inputs[b], labels[b] = self._corrupt(windows[b], self._noise_mask(self.rng(key)))
        decoder_input_ids = np.concatenate([np.full((B, 1), self.start_id), labels[:, :-1]], axis=1)  # (B, S)
        return {"input_ids": inputs, "decoder_input_ids": decoder_input_ids, "labels": labels}

    def _noise_mask(self, rng) -> np.ndarray:
        """Noise spans interleaved with kept spans, kept first; span lengths are random compositions."""

        def composition(total, parts):
            cuts = np.sort(rng.choice(total - 1, parts - 1, replace=False)) + 1 if parts > 1 else np.empty(0, int)
            return np.diff(np.concatenate([[0], cuts, [total]]))

        kept = composition(self.window - self.noise, self.spans)
        noise = composition(self.noise, self.spans)
        lengths = np.stack([kept, noise], axis=1).ravel()  # (2 * spans,)
        return np.repeat(np.arange(lengths.size) % 2 == 1, lengths)

    def _corrupt(self, tokens: np.ndarray, noise: np.ndarray):
        first = noise & ~np.concatenate([[False], noise[:-1]])  # the first token of each noise span
        span = np.cumsum(first) - 1
        sentinel = self.sentinels[np.maximum(span, 0)]
        inputs = np.where(first, sentinel, tokens)[~noise | first]
        # target: each span's sentinel, then its hidden tokens
        keep_first = ~noise & np.concatenate([[True], noise[:-1]])  # the first kept token after each span
        target_sentinel = self.sentinels[np.cumsum(keep_first) - 1]
        targets = np.where(keep_first, target_sentinel, tokens)[noise | keep_first]
        return np.append(inputs, self.eos_id), np.append(targets, self.eos_id)
