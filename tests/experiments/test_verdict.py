"""The judging rule on synthetic seed tables whose answer is known by construction."""
import numpy as np
import pytest
from scipy import stats

from sparsenorm.experiments._shared import verdict as v


def _seeds(n, shift, noise=0.01, seed=0):
    """Paired scores: the subject is ``shift`` above the rival, plus small independent noise per seed."""
    rng = np.random.default_rng(seed)
    rival = rng.normal(0.5, 0.05, n)  # seed-to-seed spread shared by both (pairing removes it)
    subject = rival + shift + rng.normal(0, noise, n)
    return dict(enumerate(subject)), dict(enumerate(rival))


def test_min_pairs_follows_from_the_exact_test():
    # Two-sided exact signed-rank: smallest p = 2 / 2**n, so 6 pairs are the fewest reaching 0.05.
    for n in range(1, 10):
        assert v.smallest_p(n) == pytest.approx(2 / 2 ** n if n > 1 else 1.0)
    assert v.min_pairs(0.05) == 6
    assert v.min_pairs(0.05, "greater") == 5
    assert v.min_pairs(0.01) == 8  # 2/2**7 = 0.0156 >= 0.01 > 2/2**8


def test_clear_effect_with_ten_seeds_is_reproduced():
    a, b = _seeds(10, shift=0.05)
    t = v.direction(v.paired_differences(a, b), "A beats B")
    assert t.verdict == v.REPRODUCED and t.p < v.LEVEL and t.n == 10


def test_reversed_effect_is_not_reproduced():
    a, b = _seeds(10, shift=-0.05)
    assert v.direction(v.paired_differences(a, b), "A beats B").verdict == v.NOT_REPRODUCED


def test_lower_is_better_flips_the_orientation():
    a, b = _seeds(10, shift=-0.05)  # A lower: better for a distance
    assert v.direction(v.paired_differences(a, b, higher_is_better=False), "A closer").verdict == v.REPRODUCED


def test_noise_is_inconclusive():
    a, b = _seeds(10, shift=0.0, noise=0.05, seed=3)
    d = v.paired_differences(a, b)
    assert stats.wilcoxon(d).pvalue >= 0.05  # the table really is noise at this level
    assert v.direction(d, "A beats B").verdict == v.INCONCLUSIVE


def test_three_seeds_are_inconclusive_even_when_consistent():
    a, b = _seeds(3, shift=1.0)
    t = v.direction(v.paired_differences(a, b), "A beats B")
    assert all(x > 0 for x in v.paired_differences(a, b))
    assert t.verdict == v.INCONCLUSIVE and t.p is None and "needs 6" in t.detail


def test_pairs_are_matched_by_seed():
    d = v.paired_differences({0: 1.0, 1: 2.0, 5: 9.0}, {1: 1.0, 0: 0.0, 7: 3.0})
    assert d.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="one score per seed"):
        v.paired_differences([1.0, 2.0], [1.0])


def test_equivalence_inside_and_outside_the_margin():
    a, b = _seeds(10, shift=0.001, noise=0.002)
    assert v.equivalence(v.paired_differences(a, b), 0.02, "A matches B").verdict == v.REPRODUCED
    a, b = _seeds(10, shift=0.05, noise=0.002)
    assert v.equivalence(v.paired_differences(a, b), 0.02, "A matches B").verdict == v.NOT_REPRODUCED
    a, b = _seeds(10, shift=0.0, noise=0.05)  # too noisy to place inside or outside +-0.02
    assert v.equivalence(v.paired_differences(a, b), 0.02, "A matches B").verdict == v.INCONCLUSIVE
    assert v.equivalence([0.0] * 3, 0.02, "A matches B").verdict == v.INCONCLUSIVE  # too few pairs
    with pytest.raises(ValueError, match="margin"):
        v.equivalence([0.0] * 10, 0.0, "A matches B")


def test_non_inferiority():
    a, b = _seeds(10, shift=-0.005, noise=0.002)  # slightly worse, well within 0.02
    assert v.non_inferiority(v.paired_differences(a, b), 0.02, "A on par").verdict == v.REPRODUCED
    a, b = _seeds(10, shift=-0.1, noise=0.002)
    assert v.non_inferiority(v.paired_differences(a, b), 0.02, "A on par").verdict == v.NOT_REPRODUCED


def test_single_run_uses_the_given_paired_test():
    assert v.single_run(+1.2, 0.01, "BLEU", "paired bootstrap").verdict == v.REPRODUCED
    assert v.single_run(-1.2, 0.01, "BLEU", "paired bootstrap").verdict == v.NOT_REPRODUCED
    assert v.single_run(+1.2, 0.30, "BLEU", "paired bootstrap").verdict == v.INCONCLUSIVE
    assert v.single_run(+1.2, None, "BLEU", "paired bootstrap").verdict == v.INCONCLUSIVE


def _test(verdict):
    return v.Test("part", verdict, 10, 0.0, None)


@pytest.mark.parametrize("parts, expected", [
    ([v.REPRODUCED, v.REPRODUCED], v.REPRODUCED),
    ([v.REPRODUCED, v.INCONCLUSIVE], v.PARTLY),
    ([v.REPRODUCED, v.NOT_REPRODUCED], v.NOT_REPRODUCED),  # one part significantly against: never "partly"
    ([v.INCONCLUSIVE, v.INCONCLUSIVE], v.INCONCLUSIVE),
    ([v.INCONCLUSIVE, v.NOT_REPRODUCED], v.NOT_REPRODUCED),
    ([], v.NOT_TESTABLE),
])
def test_compound_claims(parts, expected):
    assert v.combine([_test(p) for p in parts]) == expected


def test_compound_claim_from_seed_tables():
    a, b = _seeds(10, shift=0.05)
    c, d = _seeds(10, shift=0.0, noise=0.05, seed=3)
    judged = v.claim("A beats B on both metrics",
                     [v.direction(v.paired_differences(a, b), "metric 1"),
                      v.direction(v.paired_differences(c, d), "metric 2")], key="x")
    assert judged.verdict == v.PARTLY and judged.seeds == 10 and "metric 2: inconclusive" in judged.evidence


def test_quick_verdicts_are_indicative_and_the_rule_is_stated():
    assert v.label_mode(v.REPRODUCED, quick=True) == "reproduced (indicative)"
    assert v.label_mode(v.NEW, quick=True) == v.NEW
    assert v.label_mode(v.REPRODUCED, quick=False) == v.REPRODUCED
    text = v.rule_paragraph()
    assert "Wilcoxon" in text and "0.05" in text and "fewer than 6" in text


def test_non_finite_differences_are_refused():
    with pytest.raises(ValueError, match="finite"):
        v.direction([1.0, float("nan")], "A beats B")


def test_larger_spread():
    rng = np.random.default_rng(0)
    wide, narrow = rng.normal(0, 1.0, 10), rng.normal(0, 0.05, 10)
    assert v.larger_spread(wide, narrow, "A varies more").verdict == v.REPRODUCED
    assert v.larger_spread(narrow, wide, "A varies more").verdict == v.NOT_REPRODUCED
    assert v.larger_spread(wide[:3], narrow[:3], "A varies more").verdict == v.INCONCLUSIVE


def test_bootstrap_p_over_items():
    rng = np.random.default_rng(0)
    assert v.bootstrap_p(rng.normal(0.5, 1.0, 400)) < 0.01  # a clear mean shift over 400 items
    noise = [v.bootstrap_p(rng.normal(0.0, 1.0, 200), samples=500, seed=s) for s in range(40)]
    assert np.mean(np.array(noise) < 0.05) < 0.2  # about 5 % false positives at the 0.05 level, not many more
    with pytest.raises(ValueError, match="no items"):
        v.bootstrap_p([])
