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


SIX_FOR, SIX_AGAINST = [1.0, 2, 3, 4, 5, 6], [-1.0, -2, -3, -4, -5, -6]  # 6 of 6 one way: p = 2 / 2**6 = 0.031
TEN_FOR, TEN_AGAINST = [float(i) for i in range(1, 11)], [-float(i) for i in range(1, 11)]  # p = 2 / 2**10


def test_every_part_holding_is_reproduced_without_correction():
    # The claim of 3 parts at 6 seeds, each 6 of 6 in the paper's direction (p 0.031 each): under Holm the smallest
    # corrected p would be 3 x 0.031 = 0.094 and the claim could never be reproduced; intersection-union: it is.
    parts = [v.direction(SIX_FOR, "primary"), v.direction(SIX_FOR, "second"), v.direction(SIX_FOR, "third")]
    assert [t.p for t in parts] == pytest.approx([2 / 2 ** 6] * 3)
    c = v.claim("A beats B, C and D", parts)
    assert c.verdict == v.REPRODUCED and c.seeds == 6
    assert "Holm" not in c.evidence  # no part is against, so no correction is applied or shown


def test_a_margin_part_holds_one_sided_at_the_level():
    # 5 pairs inside a margin of 1, all on the good side of -1: one-sided p = 1 / 2**5 = 0.031 < 0.05 holds,
    # where a direction part would need 6 pairs (two-sided)
    t = v.non_inferiority([0.1, -0.2, 0.3, -0.4, 0.5], 1.0, "on par")
    assert t.verdict == v.REPRODUCED and t.p == pytest.approx(1 / 2 ** 5)
    assert v.direction([0.1, 0.2, 0.3, 0.4, 0.5], "five").verdict == v.INCONCLUSIVE
    c = v.claim("A on par with B and beats C", [t, v.direction(SIX_FOR, "beats C")])
    assert c.verdict == v.REPRODUCED


def test_a_part_against_after_holm_is_not_reproduced_first():
    # The primary holds, a secondary is against at 10 seeds (p 0.002, Holm 3 x 0.002 = 0.0059 < 0.05): the
    # against conclusion is checked first, so the claim is not reproduced (not "partly")
    parts = [v.direction(SIX_FOR, "primary"), v.direction(TEN_AGAINST, "against"), v.direction(SIX_FOR, "third")]
    c = v.claim("x", parts)
    assert c.verdict == v.NOT_REPRODUCED
    assert "Holm p 0.0059" in c.evidence and "against: not reproduced" in c.evidence


def test_a_part_against_alone_but_not_after_holm():
    # 6 of 6 against (p 0.031) in a claim of 3 parts: Holm p 0.094, not significantly against for the claim; the
    # part reads inconclusive with both p-values
    primary_holds = v.claim("x", [v.direction(SIX_FOR, "primary"), v.direction(SIX_AGAINST, "side"),
                                  v.direction(SIX_FOR, "third")])
    assert primary_holds.verdict == v.PARTLY
    assert "side: inconclusive" in primary_holds.evidence and "p 0.031, Holm p 0.094" in primary_holds.evidence
    assert "not significantly against after Holm over the claim's 3 parts" in primary_holds.evidence
    primary_against = v.claim("x", [v.direction(SIX_AGAINST, "primary"), v.direction(SIX_FOR, "second"),
                                    v.direction(SIX_FOR, "third")])
    assert primary_against.verdict == v.INCONCLUSIVE
    # alone (one part) the same 6 seeds are against: Holm over one part is no correction
    assert v.claim("x", [v.direction(SIX_AGAINST, "primary")]).verdict == v.NOT_REPRODUCED


def test_holm_family_is_every_part_of_the_claim():
    # One part against at 10 seeds (p = 2 / 1024): with 25 parts, 25 p = 0.049 < 0.05 is against; with 26 parts
    # (the other 25 holding) 26 p = 0.051 is not. Parts that hold count in the family though they are not corrected.
    p10 = 2 / 2 ** 10
    for m, expected in ((25, v.NOT_REPRODUCED), (26, v.PARTLY)):
        parts = [v.direction(TEN_FOR, "primary")] + [v.direction(TEN_FOR, f"holds {i}") for i in range(m - 2)]
        parts.append(v.direction(TEN_AGAINST, "against"))
        judged = v.holm(parts)
        assert judged[-1].p_holm == pytest.approx(m * p10)
        assert all(t.p_holm is None and t.verdict == v.REPRODUCED for t in judged[:-1])
        assert v.claim("x", parts).verdict == expected


def test_holm_steps_down_over_the_parts_against():
    # two parts against, p 0.0156 (7 pairs) and 0.031 (6 pairs), in a claim of 3: step-down gives
    # 3 x 0.0156 = 0.047 (against) then max(0.047, 2 x 0.031) = 0.062 (not)
    seven_against = [-1.0, -2, -3, -4, -5, -6, -7]
    parts = [v.direction(SIX_FOR, "holds"), v.direction(seven_against, "seven"), v.direction(SIX_AGAINST, "six")]
    judged = v.holm(parts)
    assert judged[0].p_holm is None and judged[0].verdict == v.REPRODUCED
    assert [t.p_holm for t in judged[1:]] == pytest.approx([3 * 2 / 2 ** 7, 2 * 2 / 2 ** 6])
    assert [t.verdict for t in judged[1:]] == [v.NOT_REPRODUCED, v.INCONCLUSIVE]
    c = v.claim("x", parts)
    assert c.verdict == v.NOT_REPRODUCED and "primary: holds" in c.evidence and "secondary: six" in c.evidence
    with pytest.raises(ValueError, match="primary"):
        v.claim("x", parts, primary=4)


def test_margin_against_is_corrected_like_a_direction():
    # non-inferiority against by its own one-sided test (6 of 6 worse by more than the margin: p 1 / 64) in a claim
    # of 2 parts: Holm 2 / 64 = 0.031 < 0.05, against
    worse = [-2.0, -2.1, -2.2, -2.3, -2.4, -2.5]
    t = v.non_inferiority(worse, 1.0, "on par")
    assert t.verdict == v.NOT_REPRODUCED and t.p == pytest.approx(1 / 2 ** 6)
    c = v.claim("x", [v.direction(SIX_FOR, "primary"), t])
    assert c.verdict == v.NOT_REPRODUCED and "Holm p 0.031" in c.evidence


def test_single_run_and_spread_parts_against_are_corrected_too():
    against = v.single_run(-1.0, 0.04, "BLEU", "paired bootstrap")
    assert against.verdict == v.NOT_REPRODUCED
    assert v.claim("x", [v.direction(SIX_FOR, "primary"), against]).verdict == v.PARTLY  # Holm 2 x 0.04
    assert v.claim("x", [v.single_run(1.0, 0.04, "BLEU", "paired bootstrap"),
                         v.direction(SIX_FOR, "second")]).verdict == v.REPRODUCED


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
    # the text states the code's order: a significant against-part first, then every part holding (uncorrected)
    order = [text.index(w) for w in ("*Not reproduced*", "*Reproduced*", "*Partly reproduced*", "*Inconclusive*")]
    assert order == sorted(order) and "intersection" in text and "union" in text
    assert "two-sided" in text and "one-sided" in text


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
