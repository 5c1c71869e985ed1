"""Mean ± std over seeds, and whether a difference exceeds seed noise.

The rule: Welch's two-sample t-test (unequal variances; scipy.stats.ttest_ind with
equal_var=False) of a variant's per-seed values against the baseline's, two-sided, at
alpha = 0.05. With 3 seeds a side it only flags differences several seed-stds wide, which is the
point: a smaller gap is not distinguishable from the noise of changing the seed. It needs at least
2 finished seeds on each side; with fewer the report says "n/a" rather than guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.05
RULE = (
    f"Welch's t-test (two-sided, unequal variances) against the baseline over seeds, "
    f"alpha = {ALPHA}; needs >= 2 finished seeds per side"
)


@dataclass
class Stat:
    mean: float | None
    std: float | None  # sample std (ddof=1); None with fewer than 2 values
    n: int
    values: list


def describe(values: list) -> Stat:
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        return Stat(None, None, 0, [])
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return Stat(mean, std, len(values), values)


def welch_p(a: Stat, b: Stat) -> float | None:
    """Two-sided p-value of Welch's t-test, or None when either side has < 2 values."""
    if a.n < 2 or b.n < 2:
        return None
    if a.std == 0 and b.std == 0:  # identical seeds on both sides: equal means or a certain gap
        return 1.0 if a.mean == b.mean else 0.0
    from scipy.stats import ttest_ind

    return float(ttest_ind(a.values, b.values, equal_var=False).pvalue)


def significant(p: float | None) -> bool | None:
    return None if p is None else p < ALPHA


def fmt_mean_std(s: Stat, digits: int = 3) -> str:
    if s.mean is None:
        return "–"
    if s.std is None:
        return f"{s.mean:.{digits}f}"
    return f"{s.mean:.{digits}f} ± {s.std:.{digits}f}"
