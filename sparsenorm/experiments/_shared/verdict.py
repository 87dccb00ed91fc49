"""The one rule that turns an experiment's numbers into a verdict on a paper's claim.

Every experiment judges its claims here; none compares numbers by its own logic.

**Unit of evidence.** A claim compares normalizers trained on the same seeds, so the evidence is the
per-seed *paired* difference ``d_s = score(subject, s) - score(rival, s)``, oriented so that a
positive ``d`` is the paper's direction (for a lower-is-better metric the sign is flipped). Several
settings of one sweep may pool their (setting, seed) pairs into one sample (the report says so).

**Test.** The exact Wilcoxon signed-rank test of the paired differences (scipy), at level
:data:`LEVEL` = 0.05, two-sided for a direction, one-sided per side for a margin. Chosen over the
paired t-test because training outcomes over seeds are often skewed or bimodal (a collapsed run, a
run that never left its initialisation) and the signed-rank test assumes no normality; and because
its exact null distribution makes the smallest attainable p depend on the number of pairs alone, so
too few seeds cannot be mistaken for evidence: with n pairs the smallest two-sided p is 2 / 2**n,
so fewer than :func:`min_pairs` (6 at 0.05) can never decide a direction. This is computed from
scipy's test, not hard-coded.

**Verdicts.**

- *direction* ("A beats B"): **reproduced** when the mean of ``d`` is positive and the two-sided
  p < LEVEL; **not reproduced** when the mean is negative and p < LEVEL; **inconclusive** otherwise,
  and always when the pairs are too few for any p to reach LEVEL.
- *non-inferiority* ("A is on par with B or better", margin m > 0): **reproduced** when the one-sided
  test of ``d + m > 0`` rejects at LEVEL; **not reproduced** when the one-sided test of
  ``d + m < 0`` does (A is significantly worse than B by more than m); else inconclusive.
- *equivalence* ("A matches B", margin m): two one-sided tests (TOST): **reproduced** when both
  ``d + m > 0`` and ``d - m < 0`` reject at LEVEL; **not reproduced** when ``|d|`` significantly
  exceeds m on one side; else inconclusive. Every margin is stated with the claim, with its reason.
- *single run* (one number per system, e.g. BLEU on one test set): the experiment's own paired test
  over test items (a paired bootstrap) gives p; the direction rule above applies to it.
- *compound* claims are judged part by part: **reproduced** when every part is; **not reproduced**
  when any part is significantly against; **partly reproduced** when some parts hold significantly
  and none is significantly against; **inconclusive** when none is significant either way.

A difference of means alone never reproduces a claim. Verdicts of quick runs are labelled
*indicative* wherever they are shown.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import stats as scipy_stats

LEVEL = 0.05
"""Significance level of every test (two-sided for a direction, per side for a margin)."""

REPRODUCED = "reproduced"
PARTLY = "partly reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable in this run"
NEW = "new comparison"
"""A result the paper does not state (e.g. a normalizer the paper did not try); the evidence says what was found."""
NOT_RUN = "not run"
"""A claim of a paper that no experiment of sparsenorm runs (the index gives the reason and the cost)."""
INDICATIVE = " (indicative)"
"""Appended to a verdict from a quick run: too few steps and seeds to decide the claim."""

SeedScores = Union[Mapping[int, float], Sequence[float]]


@dataclass
class Claim:
    """One claim of a paper and what a run says about it."""

    claim: str
    verdict: str
    """One of :data:`REPRODUCED`, :data:`PARTLY`, :data:`NOT_REPRODUCED`, :data:`INCONCLUSIVE`,
    :data:`NOT_TESTABLE`, :data:`NEW`."""
    evidence: str
    """The numbers behind the verdict (paired differences, their test, the margin)."""
    source: str = ""
    """Where the paper makes the claim (e.g. "Sec. 4.1, Fig. 3")."""
    key: str = ""
    """The claim's id in :mod:`.paper_claims` (empty for a new comparison the papers do not make)."""
    seeds: Optional[int] = None
    """The largest number of paired seeds (or paired units) a part of the verdict rests on (each part's own
    count is in the evidence); None for a claim not judged from seeds."""


@dataclass
class Test:
    """The outcome of one comparison under the rule."""

    label: str
    verdict: str
    n: int
    mean: float
    """Mean oriented difference (positive: the paper's direction)."""
    p: Optional[float]
    detail: str = ""

    def describe(self, digits: int = 3) -> str:
        p = "p n/a" if self.p is None else f"p {self.p:.2g}"
        text = f"{self.label}: {self.verdict}, mean paired difference {self.mean:+.{digits}f} over {self.n} pairs, {p}"
        return text + (f" ({self.detail})" if self.detail else "")


@lru_cache(maxsize=None)
def smallest_p(n: int, alternative: str = "two-sided") -> float:
    """The smallest p the exact Wilcoxon signed-rank test can give with ``n`` nonzero pairs."""
    if n < 1:
        return 1.0
    return float(scipy_stats.wilcoxon(np.arange(1.0, n + 1.0), alternative=alternative, method="exact").pvalue)


def min_pairs(level: float = LEVEL, alternative: str = "two-sided") -> int:
    """The fewest nonzero pairs with which the test can reach ``level`` (6 at 0.05 two-sided)."""
    n = 1
    while smallest_p(n, alternative) >= level:
        n += 1
    return n


def paired_differences(subject: SeedScores, rival: SeedScores, higher_is_better: bool = True) -> np.ndarray:
    """``subject - rival`` on the seeds both have, oriented so that positive favours ``subject``.

    Mappings are matched by seed; sequences must be the same length and in the same seed order.
    """
    if isinstance(subject, Mapping) != isinstance(rival, Mapping):
        raise TypeError("subject and rival must both be mappings seed -> score, or both sequences")
    if isinstance(subject, Mapping):
        common = sorted(set(subject) & set(rival))
        a = np.array([subject[s] for s in common], dtype=float)
        b = np.array([rival[s] for s in common], dtype=float)
    else:
        a, b = np.asarray(subject, dtype=float), np.asarray(rival, dtype=float)
        if a.shape != b.shape:
            raise ValueError(f"subject and rival must have one score per seed each, got {a.shape} and {b.shape}")
    d = a - b
    return d if higher_is_better else -d


def _one_sided_p(d: np.ndarray, alternative: str) -> Tuple[Optional[float], int]:
    """One-sided exact p of the signed-rank test on ``d`` (zeros dropped); None when nothing is left."""
    nonzero = d[d != 0]
    if nonzero.size == 0:
        return None, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = scipy_stats.wilcoxon(nonzero, alternative=alternative).pvalue
    return float(p), int(nonzero.size)


def _clean(d: Iterable[float], label: str) -> np.ndarray:
    arr = np.asarray(list(d), dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{label}: the paired differences must be finite, got {arr}")
    return arr


def direction(differences: Iterable[float], label: str, level: float = LEVEL) -> Test:
    """Does the paper's direction (positive differences) hold? Two-sided exact signed-rank test."""
    d = _clean(differences, label)
    mean = float(d.mean()) if d.size else 0.0
    nonzero = int((d != 0).sum())
    if nonzero < min_pairs(level):
        return Test(label, INCONCLUSIVE, d.size, mean, None,
                    f"{nonzero} nonzero pairs; the test needs {min_pairs(level)} to reach p < {level:g}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(scipy_stats.wilcoxon(d[d != 0]).pvalue)
    wins = int((d > 0).sum())
    verdict = INCONCLUSIVE if p >= level else (REPRODUCED if mean > 0 else NOT_REPRODUCED)
    return Test(label, verdict, d.size, mean, p, f"paper's direction in {wins} of {d.size}")


def non_inferiority(differences: Iterable[float], margin: float, label: str, level: float = LEVEL) -> Test:
    """Is the subject at most ``margin`` worse than the rival (or better)? One-sided tests at ``level``."""
    if not margin > 0:
        raise ValueError(f"{label}: margin must be positive, got {margin}")
    d = _clean(differences, label)
    mean = float(d.mean()) if d.size else 0.0
    p_ok, n_ok = _one_sided_p(d + margin, "greater")
    p_bad, _ = _one_sided_p(d + margin, "less")
    need = min_pairs(level, "greater")
    detail = f"margin {margin:g}"
    if n_ok < need:
        return Test(label, INCONCLUSIVE, d.size, mean, None,
                    f"{detail}; {n_ok} pairs, the test needs {need} to reach p < {level:g}")
    if p_ok is not None and p_ok < level:
        return Test(label, REPRODUCED, d.size, mean, p_ok, f"{detail}; worse by less than the margin")
    if p_bad is not None and p_bad < level:
        return Test(label, NOT_REPRODUCED, d.size, mean, p_bad, f"{detail}; worse by more than the margin")
    return Test(label, INCONCLUSIVE, d.size, mean, p_ok, detail)


def equivalence(differences: Iterable[float], margin: float, label: str, level: float = LEVEL) -> Test:
    """Is ``|difference|`` within ``margin``? Two one-sided signed-rank tests (TOST), each at ``level``."""
    if not margin > 0:
        raise ValueError(f"{label}: margin must be positive, got {margin}")
    d = _clean(differences, label)
    mean = float(d.mean()) if d.size else 0.0
    need = min_pairs(level, "greater")
    detail = f"margin ±{margin:g}"
    if d.size < need:
        return Test(label, INCONCLUSIVE, d.size, mean, None,
                    f"{detail}; {d.size} pairs, the test needs {need} to reach p < {level:g}")
    p_low, _ = _one_sided_p(d + margin, "greater")
    p_high, _ = _one_sided_p(d - margin, "less")
    if p_low is not None and p_high is not None and max(p_low, p_high) < level:
        return Test(label, REPRODUCED, d.size, mean, max(p_low, p_high), f"{detail}; inside the margin (TOST)")
    for shifted, alternative in ((d - margin, "greater"), (d + margin, "less")):
        p_out, _ = _one_sided_p(shifted, alternative)
        if p_out is not None and p_out < level:
            return Test(label, NOT_REPRODUCED, d.size, mean, p_out, f"{detail}; outside the margin")
    return Test(label, INCONCLUSIVE, d.size, mean, None if p_low is None or p_high is None else max(p_low, p_high),
                detail)


def larger_spread(subject: Sequence[float], rival: Sequence[float], label: str, level: float = LEVEL) -> Test:
    """Does ``subject`` vary more over seeds than ``rival``? (A claim about variance, which no paired
    difference measures.) The Brown-Forsythe test (scipy's ``levene``, median-centred: robust, like the
    signed-rank test, to skewed seeds) at ``level``; the direction is that of the standard deviations.
    Below :func:`min_pairs` seeds per side it is inconclusive, as every other part of the rule."""
    a, b = _clean(subject, label), _clean(rival, label)
    ratio = float(a.std(ddof=1) / b.std(ddof=1)) if a.size > 1 and b.size > 1 and b.std() > 0 else float("nan")
    need = min_pairs(level)
    detail = f"std over seeds {a.std(ddof=1) if a.size > 1 else 0:.3g} vs {b.std(ddof=1) if b.size > 1 else 0:.3g}"
    if min(a.size, b.size) < need:
        return Test(label, INCONCLUSIVE, min(a.size, b.size), ratio, None, f"{detail}; fewer than {need} seeds")
    if a.std() == 0 and b.std() == 0:
        return Test(label, INCONCLUSIVE, min(a.size, b.size), ratio, 1.0, detail)
    p = float(scipy_stats.levene(a, b, center="median").pvalue)
    larger = a.std() > b.std()
    verdict = INCONCLUSIVE if p >= level else (REPRODUCED if larger else NOT_REPRODUCED)
    return Test(label, verdict, min(a.size, b.size), ratio, p, f"{detail}; Brown-Forsythe; 'mean' is the std ratio")


def single_run(difference: float, p: Optional[float], label: str, test: str, level: float = LEVEL) -> Test:
    """One number per system (e.g. BLEU on one test set): ``p`` from the experiment's own paired test
    over test items (named by ``test``); ``difference`` oriented as in :func:`direction`."""
    if p is None or not math.isfinite(p):
        return Test(label, INCONCLUSIVE, 1, float(difference), None, f"no {test} p-value")
    verdict = INCONCLUSIVE if p >= level else (REPRODUCED if difference > 0 else NOT_REPRODUCED)
    return Test(label, verdict, 1, float(difference), float(p), test)


def bootstrap_p(item_differences: Iterable[float], samples: int = 2000, seed: int = 0) -> float:
    """Two-sided p of a paired bootstrap over test items (sentences, images) for "the mean difference is 0":
    ``2 min(P*(mean <= 0), P*(mean >= 0))`` over ``samples`` resamples of the items (percentile bootstrap).
    For :func:`single_run`, where an experiment has no paired test of its own."""
    d = _clean(item_differences, "bootstrap")
    if d.size == 0:
        raise ValueError("bootstrap: no items")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(samples, d.size))].mean(1)
    return float(min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean())))


def combine(parts: Sequence[Test]) -> str:
    """The verdict of a compound claim from its parts' (see the module docstring)."""
    verdicts = [t.verdict for t in parts]
    if not verdicts:
        return NOT_TESTABLE
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    if NOT_REPRODUCED in verdicts:
        return NOT_REPRODUCED
    return PARTLY if REPRODUCED in verdicts else INCONCLUSIVE


def claim(text: str, parts: Sequence[Test], source: str = "", key: str = "", note: str = "",
          digits: int = 3) -> Claim:
    """A :class:`Claim` judged from its parts, with each part's test as the evidence."""
    evidence = "; ".join(t.describe(digits) for t in parts) + (f". {note}" if note else "")
    seeds = max((t.n for t in parts), default=None)  # the largest paired sample a part rests on
    return Claim(text, combine(parts), evidence, source, key, seeds)


def label_mode(verdict: str, quick: bool) -> str:
    """A verdict as shown: quick-run verdicts of the rule are labelled indicative."""
    judged = verdict in (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE)
    return verdict + INDICATIVE if quick and judged else verdict


def rule_paragraph(level: float = LEVEL) -> str:
    """The one paragraph every report and the index print to state the rule, its level and its margins."""
    return (
        f"**How claims are judged** (one rule for every experiment, `sparsenorm.experiments._shared.verdict`): "
        f"per-seed paired differences between the normalizers a claim compares (same seeds, same data), tested "
        f"with the exact Wilcoxon signed-rank test at level {level:g}. A direction claim is *reproduced* when "
        f"the paper's direction holds and the two-sided p < {level:g}, *not reproduced* when the opposite "
        f"direction is significant, *inconclusive* otherwise — always with fewer than {min_pairs(level)} paired "
        f"seeds, since no signed-rank p can then reach {level:g}. Claims of equality or of being \"on par\" "
        f"need their interval inside a margin stated with the claim (two one-sided tests at {level:g}; "
        f"{min_pairs(level, 'greater')} pairs at least). A single-run number (one test set) uses the "
        f"experiment's paired bootstrap over test items. Compound claims are judged part by part: *partly* only "
        f"when some parts hold significantly and none is significantly against. A difference of means alone "
        f"never reproduces a claim; quick-mode verdicts are *indicative*.")


def counts(verdicts: Iterable[str]) -> Dict[str, int]:
    """How many claims got each verdict (for the index's summary line)."""
    out: Dict[str, int] = {}
    for v in verdicts:
        out[v] = out.get(v, 0) + 1
    return out


__all__ = [
    "LEVEL", "REPRODUCED", "PARTLY", "NOT_REPRODUCED", "INCONCLUSIVE", "NOT_TESTABLE", "NEW", "NOT_RUN", "INDICATIVE",
    "Claim", "Test", "smallest_p", "min_pairs", "paired_differences", "direction", "non_inferiority", "equivalence",
    "larger_spread", "single_run", "bootstrap_p", "combine", "claim", "label_mode", "rule_paragraph", "counts",
]
