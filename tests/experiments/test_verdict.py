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


@pytest.mark.parametrize("parts, expected", [  # the first part is the primary comparison
    ([v.REPRODUCED, v.REPRODUCED], v.REPRODUCED),
    ([v.REPRODUCED, v.INCONCLUSIVE], v.PARTLY),
    ([v.INCONCLUSIVE, v.REPRODUCED], v.INCONCLUSIVE),  # a secondary part alone never earns "partly"
    ([v.REPRODUCED, v.NOT_REPRODUCED], v.NOT_REPRODUCED),  # one part significantly against: never "partly"
    ([v.INCONCLUSIVE, v.INCONCLUSIVE], v.INCONCLUSIVE),
    ([v.INCONCLUSIVE, v.NOT_REPRODUCED], v.NOT_REPRODUCED),
    ([], v.NOT_TESTABLE),
])
def test_compound_claims(parts, expected):
    assert v.combine([_test(p) for p in parts]) == expected


def test_several_primary_parts_must_all_hold_for_partly():
    parts = [_test(v.REPRODUCED), _test(v.INCONCLUSIVE), _test(v.INCONCLUSIVE)]
    assert v.combine(parts, primary=2) == v.INCONCLUSIVE
    assert v.combine(parts, primary=1) == v.PARTLY


def test_holm_corrects_the_parts_of_a_claim():
    # two parts, each significant alone at p = 0.0156 (7 pairs, all one way) and 0.03 (6 pairs): Holm gives
    # 2 x 0.0156 = 0.031 < 0.05 for the first, and max(0.031, 0.031) for the second
    seven, six = [1.0, 2, 3, 4, 5, 6, 7], [1.0, 2, 3, 4, 5, 6]
    parts = [v.direction(seven, "seven"), v.direction(six, "six")]
    assert parts[0].p == pytest.approx(2 / 2 ** 7) and parts[1].p == pytest.approx(2 / 2 ** 6)
    judged = v.holm(parts)
    assert [t.p_holm for t in judged] == pytest.approx([2 * 2 / 2 ** 7, 2 / 2 ** 6])
    assert [t.verdict for t in judged] == [v.REPRODUCED, v.REPRODUCED]
    # three parts: 3 x 0.0156 = 0.047 holds, then max(0.047, 2 x 0.031) = 0.0625 does not
    judged = v.holm(parts + [v.direction(six, "six again")])
    assert [t.verdict for t in judged] == [v.REPRODUCED, v.INCONCLUSIVE, v.INCONCLUSIVE]
    c = v.claim("x", parts + [v.direction(six, "six again")])
    assert c.verdict == v.PARTLY and "Holm p 0.062" in c.evidence and "primary: seven" in c.evidence
    assert "secondary: six" in c.evidence and "left 2 part(s)" in c.evidence
    with pytest.raises(ValueError, match="primary"):
        v.claim("x", parts, primary=3)


def test_signed_rank_p_is_exact_with_and_without_ties():
    import itertools

    rng = np.random.default_rng(1)
    for alternative in ("two-sided", "greater", "less"):
        d = rng.normal(size=11)
        p, n, method = v.signed_rank_p(d, alternative)
        assert method == v.EXACT and n == 11
        assert p == pytest.approx(stats.wilcoxon(d, alternative=alternative, method="exact").pvalue, rel=1e-12)
    tied = np.array([1.0, 1.0, 2.0, -2.0, 3.0, 3.0, 3.0, -1.0, 4.0, 5.0, 0.0])  # a zero is dropped
    ranks = stats.rankdata(np.abs(tied[tied != 0]))
    observed = ranks[tied[tied != 0] > 0].sum()
    sums = np.array([ranks[list(signs)].sum() for signs in itertools.product([False, True], repeat=ranks.size)])
    centre = ranks.sum() / 2
    for alternative, brute in (("two-sided", np.mean(np.abs(sums - centre) >= abs(observed - centre))),
                               ("greater", np.mean(sums >= observed)), ("less", np.mean(sums <= observed))):
        p, n, method = v.signed_rank_p(tied, alternative)
        assert method == v.EXACT_TIES and n == 10 and p == pytest.approx(brute, rel=1e-12)
    p, n, method = v.signed_rank_p(rng.normal(0.3, 1, 80))
    assert method == v.NORMAL and n == 80 and 0 < p < 1
    assert v.signed_rank_p([0.0, 0.0]) == (None, 0, "")
    t = v.direction(tied, "tied")
    assert t.method == v.EXACT_TIES and "exact, tied ranks" in t.describe()


def test_compound_claim_from_seed_tables():
    a, b = _seeds(10, shift=0.05)
    c, d = _seeds(10, shift=0.0, noise=0.05, seed=3)
    judged = v.claim("A beats B on both metrics",
                     [v.direction(v.paired_differences(a, b), "metric 1"),
                      v.direction(v.paired_differences(c, d), "metric 2")], key="x")
    assert judged.verdict == v.PARTLY and judged.seeds == 10 and "metric 2: inconclusive" in judged.evidence
    assert judged.units == "10 pairs" and "primary: metric 1" in judged.evidence


def test_quick_verdicts_are_indicative_and_the_rule_is_stated():
    assert v.label_mode(v.REPRODUCED, quick=True) == "reproduced (indicative)"
    assert v.label_mode(v.NEW, quick=True) == v.NEW
    assert v.label_mode(v.REPRODUCED, quick=False) == v.REPRODUCED
    text = v.rule_paragraph()
    assert "Wilcoxon" in text and "0.05" in text and "Fewer than 6" in text
    assert "primary" in text and "Holm" in text and "by construction" in text and "setting" in text


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
