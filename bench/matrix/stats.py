"""Bootstrap intervals over prompts and the verdicts read from them (bench/matrix/results.py
says why prompts are the unit resampled)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES, CONFIDENCE = 2000, 0.95


@dataclass(frozen=True)
class Interval:
    """A statistic on all units and its bootstrap interval. value None: undefined (a zero
    denominator); low/high None: not estimable (fewer than 2 prompts, or value undefined)."""
    value: float | None
    low: float | None = None
    high: float | None = None


def bootstrap(statistic, prompts: int, resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
              seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile interval of `statistic` over prompts resampled with replacement.

    statistic: maps an index array [resamples, prompts] (each row one resample of the prompt
    indices) to [resamples] values; a prompt drawn twice counts twice, and every configuration
    and unit of a drawn prompt comes with it (pairing kept). NaN values (a resample where the
    statistic is undefined) are left out. (None, None) with fewer than 2 prompts: resampling
    one prompt says nothing about the spread.
    """
    if prompts < 2:
        return None, None
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, prompts, size=(resamples, prompts))
    values = np.asarray(statistic(draws), dtype=float)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None, None
    tail = (1.0 - confidence) / 2.0
    # order statistics, no interpolation: an infinite resample (zero denominator) stays infinite
    low, high = np.quantile(values, [tail, 1.0 - tail], method="inverted_cdf")
    return float(low), float(high)


def divide(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0),
                        np.where(num > 0, np.inf, np.nan))


def bootstrap_ratio(num_by_prompt: Sequence[float], den_by_prompt: Sequence[float],
                    resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                    seed: int = 0) -> Interval:
    """sum(num) / sum(den) with a paired bootstrap interval over prompts.

    num_by_prompt[p], den_by_prompt[p]: prompt p's sums over its units (for a tokens/s ratio,
    config A's and config B's request speeds over the same units, so that the ratio of the sums
    is the ratio of the mean speeds). Value None when sum(den) is 0.
    """
    num, den = np.asarray(num_by_prompt, dtype=float), np.asarray(den_by_prompt, dtype=float)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"one numerator and one denominator per prompt: {num.shape} vs {den.shape}")
    if num.size == 0 or den.sum() == 0:
        return Interval(None)
    low, high = bootstrap(lambda idx: divide(num[idx].sum(axis=1), den[idx].sum(axis=1)),
                          num.size, resamples, confidence, seed)
    return Interval(float(num.sum() / den.sum()), low, high)


def verdict(interval: Interval, threshold: float, at_most: bool = False) -> str:
    """`met` when the whole interval is on the goal's side of the threshold (>= it, or <= it
    with at_most), `not met` when it is wholly on the other side, `tie` when it contains the
    threshold or could not be estimated, `n/a` when the statistic is undefined."""
    if interval.value is None:
        return "n/a"
    if interval.low is None or interval.high is None:
        return "tie"
    if at_most:
        return "met" if interval.high <= threshold else "not met" if interval.low > threshold else "tie"
    return "met" if interval.low >= threshold else "not met" if interval.high < threshold else "tie"


def versus_one(interval: Interval) -> str:
    """How A compares with B: `faster`, `slower`, or `tie` when the interval spans 1."""
    if interval.value is None:
        return "n/a"
    if interval.low is None or interval.high is None or interval.low <= 1.0 <= interval.high:
        return "tie"
    return "faster" if interval.low > 1.0 else "slower"
