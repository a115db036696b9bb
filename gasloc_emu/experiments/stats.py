"""The statistics of the results page: sample means with their sample standard deviation and a
95 % confidence interval (Student's t), and verdicts from paired differences over seeds.

Two arms run with the same seed share the model's initialisation and the order of the data, so
the difference of their results on that seed removes what the seed alone does; the interval of
the mean paired difference is what a verdict rests on: "lower" when it lies below zero, "higher"
when above, "tie" when it contains zero. With one seed there is no interval and no verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Two-sided 95 % quantiles of Student's t by degrees of freedom (t_{0.975, df}), from the
# standard tables; above 30 degrees of freedom the normal quantile is within 2 % of them.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.960


def t975(df: int) -> float:
    """t_{0.975} with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"df = {df} is out of range; expected an int >= 1")
    return _T975[df - 1] if df <= len(_T975) else _Z975


@dataclass(frozen=True)
class Sample:
    """The finite values of one measurement over seeds: mean, sample standard deviation
    (n - 1 in the denominator), and the half width of the mean's 95 % interval; ``sd`` and
    ``half`` are None with fewer than two values, everything is None with none."""

    mean: float | None
    sd: float | None
    half: float | None
    n: int

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.half is None:
            return None
        return self.mean - self.half, self.mean + self.half


def sample(values) -> Sample:
    """``Sample`` of the finite values among ``values`` (None, NaN and inf are left out)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(vals)
    if n == 0:
        return Sample(None, None, None, 0)
    mean = sum(vals) / n
    if n == 1:
        return Sample(mean, None, None, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    return Sample(mean, sd, t975(n - 1) * sd / math.sqrt(n), n)


def paired(mine: dict, theirs: dict, *, relative: bool = False) -> Sample:
    """The differences mine[seed] - theirs[seed] over the seeds both have a finite value for;
    ``relative``: each divided by theirs[seed]."""
    seeds = sorted(s for s in mine if s in theirs)
    return sample((mine[s] - theirs[s]) / (theirs[s] if relative else 1.0) for s in seeds
                  if finite(mine[s]) and finite(theirs[s]))


def direction(diff: Sample) -> str:
    """'lower', 'higher' or 'tie' by the 95 % interval of a paired difference; 'one seed'
    when there is no interval."""
    if diff.half is None:
        return "one seed" if diff.n == 1 else "no pairs"
    lo, hi = diff.interval
    return "lower" if hi < 0 else "higher" if lo > 0 else "tie"


def finite(v) -> bool:
    """A number that is neither None, NaN nor infinite."""
    return v is not None and math.isfinite(v)
