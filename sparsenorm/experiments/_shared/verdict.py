"""The one rule that turns an experiment's numbers into a verdict on a paper's claim.

Every experiment judges its claims here; none compares numbers by its own logic.

**Unit of evidence.** A claim compares normalizers trained on the same seeds, so the evidence is the
per-seed *paired* difference ``d_s = score(subject, s) - score(rival, s)``, oriented so that a
positive ``d`` is the paper's direction (for a lower-is-better metric the sign is flipped). A sweep
of several settings is judged with the *setting* as the unit (its mean over seeds): the seeds of one
setting share its data and are not independent replicates of the sweep, so pooling (setting, seed)
pairs would count one setting's seeds as separate evidence (the report says "15 settings x 6 seeds").

**Test.** The Wilcoxon signed-rank test of the paired differences (zeros dropped), at level
:data:`LEVEL` = 0.05, two-sided for a direction, one-sided per side for a margin. Chosen over the
paired t-test because training outcomes over seeds are often skewed or bimodal (a collapsed run, a
run that never left its initialisation) and the signed-rank test assumes no normality. Its p is
*exact* whenever there are at most :data:`EXACT_MAX` nonzero pairs: scipy's exact null distribution
without ties, and with tied absolute differences the exact distribution of the tied (average) ranks
under random signs, enumerated by :func:`signed_rank_p` (scipy's default would switch to the normal
approximation). Above :data:`EXACT_MAX` pairs the normal approximation is used and each part names
its method. With n pairs the smallest two-sided p is 2 / 2**n, so fewer than :func:`min_pairs` (6 at
0.05) can never decide a direction; this is computed from scipy's test, not hard-coded.

**Parts.** A claim is judged in parts: its **primary** comparison, the one the paper's own sentence states
as its result (quoted in the catalogue row, e.g. ev-softmax vs softmax), and any **secondary** parts (other
rivals, other metrics). Each part is first judged by its own test at :data:`LEVEL` (below). A part that
holds by construction (e.g. post-hoc accuracy vs softmax accuracy, the same model and the same argmax) is
not a part: it is left out and the claim's note says so.

- *direction* ("A beats B"): **holds** when the mean of ``d`` is positive and the two-sided
  p < LEVEL; **significantly against** when the mean is negative and p < LEVEL; **inconclusive**
  otherwise, and always when the pairs are too few for any p to reach LEVEL.
- *non-inferiority* ("A is on par with B or better", margin m > 0): **holds** when the one-sided
  test of ``d + m > 0`` rejects at LEVEL; **against** when the one-sided test of ``d + m < 0`` does
  (A is significantly worse than B by more than m); else inconclusive.
- *equivalence* ("A matches B", margin m): two one-sided tests (TOST): **holds** when both
  ``d + m > 0`` and ``d - m < 0`` reject at LEVEL; **against** when ``|d|`` significantly
  exceeds m on one side; else inconclusive. Every margin is stated with the claim, with its source.
- *single run* (one number per system, e.g. BLEU on one test set): the experiment's own paired test
  over test items (a paired bootstrap) gives p; the direction rule above applies to it.

**Verdict of a claim**, in this order (the first that applies):

1. **not reproduced** when Holm's step-down correction over *all* the claim's parts (each part's p of being
   against the paper) still finds a part significantly against: "some part is against" is a union of the
   parts' hypotheses, so without the correction a claim of many parts would be refuted by the luck of one;
2. **reproduced** when every part holds by its own test, uncorrected: "every part holds" is an
   intersection of the parts (intersection-union test), which is wrong only if some part's own test is
   wrong, so each part at LEVEL keeps the claim's error at LEVEL and a correction would only make the
   conclusion unreachable (with 6 seeds no claim of two or more parts could ever be reproduced);
3. **partly reproduced** when the primary comparison holds and a secondary part does not;
4. **inconclusive** otherwise: in particular whenever the primary comparison is undecided, whatever the
   secondary parts say (they are shown), so that "partly" is never earned by a side result.

A part that is against by its own test but not after Holm is shown as inconclusive, with both p-values.

A difference of means alone never reproduces a claim. Verdicts of quick runs are labelled
*indicative* wherever they are shown.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import stats as scipy_stats

LEVEL = 0.05
"""Significance level of every test (two-sided for a direction, per side for a margin)."""
EXACT_MAX = 50
"""Up to this many nonzero pairs the signed-rank p is exact (with or without ties); above, the normal approximation."""
PRIMARY, SECONDARY = "primary", "secondary"
EXACT, EXACT_TIES, NORMAL = "exact", "exact, tied ranks", "normal approximation"

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
    """The claim's id in the catalogue (:mod:`sparsenorm.experiments.catalogue`; empty for a new comparison the
    papers do not make)."""
    seeds: Optional[int] = None
    """The largest number of paired seeds (or paired units) a part of the verdict rests on (each part's own
    count is in the evidence); None for a claim not judged from seeds."""
    units: str = ""
    """The paired units the parts rest on, in words (e.g. "6 seeds; 15 settings × 6 seeds")."""


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
    method: str = ""
    """How ``p`` was computed (:data:`EXACT`, :data:`EXACT_TIES`, :data:`NORMAL`, or the experiment's test)."""
    role: str = ""
    """:data:`PRIMARY` or :data:`SECONDARY` once :func:`claim` has judged it (empty: a lone test)."""
    p_holm: Optional[float] = None
    """For a part against the paper by its own test: ``p`` after Holm's correction over all the claim's parts
    (set by :func:`claim`; None for any other part, whose own test needs no correction)."""
    unit: str = "pairs"
    """What a paired unit is, in words after its count ("pairs", "settings × 6 seeds", ...)."""

    def describe(self, digits: int = 3) -> str:
        p = "p n/a" if self.p is None else f"p {self.p:.2g}"
        if self.p is not None and self.method and self.method != EXACT:
            p += f" ({self.method})"
        if self.p_holm is not None and self.p is not None and self.p_holm != self.p:
            p += f", Holm p {self.p_holm:.2g}"
        role = f"{self.role}: " if self.role else ""
        text = (f"{role}{self.label}: {self.verdict}, mean paired difference {self.mean:+.{digits}f} over "
                f"{self.n} {self.unit}, {p}")
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


def _tied_rank_p(nonzero: np.ndarray, alternative: str) -> float:
    """Exact p of the signed-rank statistic with tied |d|: the distribution of the sum of the positive
    (average) ranks under independent random signs, by convolution over the doubled (integer) ranks."""
    ranks2 = np.rint(2 * scipy_stats.rankdata(np.abs(nonzero))).astype(np.int64)  # average ranks are k/2
    dist = np.zeros(int(ranks2.sum()) + 1)
    dist[0] = 1.0
    for r in ranks2:
        dist[r:] = dist[r:] + dist[:-r] if r else dist[r:]
        dist *= 0.5
    observed = int(ranks2[nonzero > 0].sum())
    support = np.arange(dist.size)
    if alternative == "greater":
        return float(min(1.0, dist[support >= observed].sum()))
    if alternative == "less":
        return float(min(1.0, dist[support <= observed].sum()))
    centre = ranks2.sum() / 2
    return float(min(1.0, dist[np.abs(support - centre) >= abs(observed - centre) - 1e-9].sum()))


def signed_rank_p(differences: Iterable[float], alternative: str = "two-sided") -> Tuple[Optional[float], int, str]:
    """The Wilcoxon signed-rank p of the nonzero differences, their count and the method: exact up to
    :data:`EXACT_MAX` pairs (scipy's exact distribution, or :func:`_tied_rank_p` with tied |d|), else the normal
    approximation (tie-corrected). ``(None, 0, "")`` when every difference is zero."""
    d = np.asarray(list(differences), dtype=float)
    nonzero = d[d != 0]
    n = int(nonzero.size)
    if n == 0:
        return None, 0, ""
    ties = np.unique(np.abs(nonzero)).size < n
    if n <= EXACT_MAX and ties:
        return _tied_rank_p(nonzero, alternative), n, EXACT_TIES
    method = "exact" if n <= EXACT_MAX else "approx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(scipy_stats.wilcoxon(nonzero, alternative=alternative, method=method).pvalue)
    return p, n, EXACT if n <= EXACT_MAX else NORMAL


def _one_sided_p(d: np.ndarray, alternative: str) -> Tuple[Optional[float], int, str]:
    """One-sided p of the signed-rank test on ``d`` (zeros dropped); None when nothing is left."""
    return signed_rank_p(d, alternative)


def _clean(d: Iterable[float], label: str) -> np.ndarray:
    arr = np.asarray(list(d), dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{label}: the paired differences must be finite, got {arr}")
    return arr


def direction(differences: Iterable[float], label: str, level: float = LEVEL) -> Test:
    """Does the paper's direction (positive differences) hold? Two-sided signed-rank test (:func:`signed_rank_p`)."""
    d = _clean(differences, label)
    mean = float(d.mean()) if d.size else 0.0
    nonzero = int((d != 0).sum())
    if nonzero < min_pairs(level):
        return Test(label, INCONCLUSIVE, d.size, mean, None,
                    f"{nonzero} nonzero pairs; the test needs {min_pairs(level)} to reach p < {level:g}")
    p, _, method = signed_rank_p(d)
    wins = int((d > 0).sum())
    verdict = INCONCLUSIVE if p >= level else (REPRODUCED if mean > 0 else NOT_REPRODUCED)
    return Test(label, verdict, d.size, mean, p, f"paper's direction in {wins} of {d.size}", method)


def non_inferiority(differences: Iterable[float], margin: float, label: str, level: float = LEVEL,
                    margin_source: str = "") -> Test:
    """Is the subject at most ``margin`` worse than the rival (or better)? One-sided tests at ``level``;
    ``margin_source`` says where the margin comes from (shown with it)."""
    if not margin > 0:
        raise ValueError(f"{label}: margin must be positive, got {margin}")
    d = _clean(differences, label)
    mean = float(d.mean()) if d.size else 0.0
    p_ok, n_ok, method = _one_sided_p(d + margin, "greater")
    p_bad, _, _ = _one_sided_p(d + margin, "less")
    need = min_pairs(level, "greater")
    detail = f"margin {margin:g}" + (f" ({margin_source})" if margin_source else "")
    if n_ok < need:
        return Test(label, INCONCLUSIVE, d.size, mean, None,
                    f"{detail}; {n_ok} pairs, the test needs {need} to reach p < {level:g}")
    if p_ok is not None and p_ok < level:
        return Test(label, REPRODUCED, d.size, mean, p_ok, f"{detail}; worse by less than the margin", method)
    if p_bad is not None and p_bad < level:
        return Test(label, NOT_REPRODUCED, d.size, mean, p_bad, f"{detail}; worse by more than the margin", method)
    return Test(label, INCONCLUSIVE, d.size, mean, p_ok, detail, method)


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
    p_low, _, m_low = _one_sided_p(d + margin, "greater")
    p_high, _, m_high = _one_sided_p(d - margin, "less")
    method = m_low if m_low == m_high else f"{m_low} / {m_high}"
    if p_low is not None and p_high is not None and max(p_low, p_high) < level:
        return Test(label, REPRODUCED, d.size, mean, max(p_low, p_high), f"{detail}; inside the margin (TOST)", method)
    for shifted, alternative in ((d - margin, "greater"), (d + margin, "less")):
        p_out, _, m_out = _one_sided_p(shifted, alternative)
        if p_out is not None and p_out < level:
            return Test(label, NOT_REPRODUCED, d.size, mean, p_out, f"{detail}; outside the margin", m_out)
    return Test(label, INCONCLUSIVE, d.size, mean, None if p_low is None or p_high is None else max(p_low, p_high),
                detail, method)


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
    return Test(label, verdict, min(a.size, b.size), ratio, p, f"{detail}; 'mean' is the std ratio", "Brown-Forsythe",
                unit="seeds per side")


def single_run(difference: float, p: Optional[float], label: str, test: str, level: float = LEVEL) -> Test:
    """One number per system (e.g. BLEU on one test set): ``p`` from the experiment's own paired test
    over test items (named by ``test``); ``difference`` oriented as in :func:`direction`."""
    if p is None or not math.isfinite(p):
        return Test(label, INCONCLUSIVE, 1, float(difference), None, f"no {test} p-value")
    verdict = INCONCLUSIVE if p >= level else (REPRODUCED if difference > 0 else NOT_REPRODUCED)
    return Test(label, verdict, 1, float(difference), float(p), "", test, unit="run")


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


def holm(parts: Sequence[Test], level: float = LEVEL) -> List[Test]:
    """The parts with Holm's step-down correction over the claim for the one conclusion that needs it, "a part is
    significantly against" (a union over the parts): ``p_holm`` is set on each part that is against by its own
    test, and such a part whose corrected p no longer reaches ``level`` becomes inconclusive. The family is every
    part of the claim (``m = len(parts)``); a part that is not against has, by its own test, a p of being against
    of at least ``level`` and so never comes before an against part in the step-down order (it counts as p = 1).
    Parts that hold keep their verdict and their own p: "every part holds" is an intersection-union conclusion
    and needs no correction (see the module docstring)."""
    m = len(parts)
    against = sorted((i for i, t in enumerate(parts) if t.verdict == NOT_REPRODUCED and t.p is not None),
                     key=lambda j: parts[j].p)
    adjusted: Dict[int, float] = {}
    running = 0.0
    for rank, i in enumerate(against):
        running = max(running, min(1.0, (m - rank) * parts[i].p))
        adjusted[i] = running
    out = []
    for i, t in enumerate(parts):
        if i in adjusted:
            verdict = NOT_REPRODUCED if adjusted[i] < level else INCONCLUSIVE
            out.append(replace(t, verdict=verdict, p_holm=adjusted[i]))
        else:
            out.append(replace(t, p_holm=None))
    return out


def combine(parts: Sequence[Test], primary: int = 1) -> str:
    """The verdict of a claim from its parts as :func:`holm` leaves them (the first ``primary`` are the primary
    comparison; see the module docstring), in this order: a part against (after Holm) -> not reproduced; every part
    holds -> reproduced; the primary holds -> partly; else inconclusive."""
    verdicts = [t.verdict for t in parts]
    if not verdicts:
        return NOT_TESTABLE
    if NOT_REPRODUCED in verdicts:
        return NOT_REPRODUCED
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    if all(v == REPRODUCED for v in verdicts[:max(primary, 1)]):
        return PARTLY
    return INCONCLUSIVE


def claim(text: str, parts: Sequence[Test], source: str = "", key: str = "", note: str = "",
          digits: int = 3, primary: int = 1) -> Claim:
    """A :class:`Claim` judged from its parts: the first ``primary`` parts are the paper's central comparison,
    the rest secondary; each part by its own test, Holm over all parts for the parts against (:func:`holm`); each
    part's test (its role, p, and Holm p where it is against) is the evidence."""
    if not 1 <= primary <= max(len(parts), 1):
        raise ValueError(f"primary must be between 1 and the number of parts ({len(parts)}), got {primary}")
    judged = [replace(t, role=PRIMARY if i < primary else SECONDARY) for i, t in enumerate(holm(parts))]
    evidence = "; ".join(t.describe(digits) for t in judged) + (f". {note}" if note else "")
    lost = [t for t, raw in zip(judged, parts) if raw.verdict != t.verdict]
    if lost:
        evidence += (f". {len(lost)} part(s) against the paper by their own test (p < {LEVEL:g}) are not "
                     f"significantly against after Holm over the claim's {len(parts)} parts (Holm p "
                     + ", ".join(f"{t.p_holm:.2g}" for t in lost) + ")")
    seeds = max((t.n for t in judged), default=None)  # the largest paired sample a part rests on
    units = "; ".join(dict.fromkeys(f"{t.n} {t.unit}" for t in judged))
    return Claim(text, combine(judged, primary), evidence, source, key, seeds, units)


def label_mode(verdict: str, quick: bool) -> str:
    """A verdict as shown: quick-run verdicts of the rule are labelled indicative."""
    judged = verdict in (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE)
    return verdict + INDICATIVE if quick and judged else verdict


def rule_paragraph(level: float = LEVEL) -> str:
    """The one paragraph every report and the index print to state the rule, its level and its margins."""
    return (
        f"**How claims are judged** (one rule for every experiment, `sparsenorm.experiments._shared.verdict`): "
        f"paired differences between the normalizers a claim compares (same seeds, same data; in a sweep of settings "
        f"the unit is the setting, its mean over seeds), tested with the Wilcoxon signed-rank test, its p exact up "
        f"to {EXACT_MAX} pairs (with tied differences, the exact distribution of the tied ranks; any other method is "
        f"named beside its p). Each claim is judged in parts: its **primary** comparison, the one the paper's own "
        f"sentence states (quoted in the catalogue), and **secondary** parts (other rivals, other metrics). A part "
        f"*holds* by its own test: for a direction (\"A beats B\"), the paper's direction significant at {level:g} "
        f"two-sided; for \"on par\" and \"matches\", the difference inside a margin stated with its source, by "
        f"one-sided tests at {level:g} ({min_pairs(level, 'greater')} pairs at least). A part is *against* when its "
        f"test is significant the other way (outside the margin, for a margin). The verdict is the first that "
        f"applies: *Not reproduced*: a part is still significantly against after Holm's correction over all the "
        f"claim's parts; \"some part is against\" is a union of the parts, so uncorrected it would let one lucky "
        f"part out of many refute a claim. *Reproduced*: every part holds by its own test, uncorrected; \"every part "
        f"holds\" is an intersection (an intersection-union test), wrong only if a part's own test is wrong, so "
        f"each part at {level:g} keeps the claim at {level:g}, and correcting would only make it unreachable (with 6 "
        f"seeds no claim of two parts could be reproduced). *Partly reproduced*: the primary comparison holds and a "
        f"secondary part does not. *Inconclusive*: otherwise, in particular whenever the primary comparison is "
        f"undecided, whatever the secondary parts say (they are shown), so that a side result cannot earn *partly*. "
        f"Parts that hold by construction (e.g. post-hoc accuracy equals softmax's: the same model and argmax) are "
        f"left out. Fewer than {min_pairs(level)} nonzero pairs can never decide a direction (no two-sided "
        f"signed-rank p reaches {level:g}). A single-run number (one test set) uses the experiment's paired "
        f"bootstrap over test items. A difference of means alone never reproduces a claim; quick-mode verdicts are "
        f"*indicative*.")


def counts(verdicts: Iterable[str]) -> Dict[str, int]:
    """How many claims got each verdict (for the index's summary line)."""
    out: Dict[str, int] = {}
    for v in verdicts:
        out[v] = out.get(v, 0) + 1
    return out


__all__ = [
    "LEVEL", "EXACT_MAX", "PRIMARY", "SECONDARY", "EXACT", "EXACT_TIES", "NORMAL", "REPRODUCED", "PARTLY",
    "NOT_REPRODUCED", "INCONCLUSIVE", "NOT_TESTABLE", "NEW", "NOT_RUN", "INDICATIVE",
    "Claim", "Test", "smallest_p", "min_pairs", "paired_differences", "direction", "non_inferiority", "equivalence",
    "larger_spread", "single_run", "bootstrap_p", "signed_rank_p", "holm", "combine", "claim", "label_mode",
    "rule_paragraph", "counts",
]
