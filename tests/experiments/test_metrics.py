"""The experiments' metrics against hand-computed cases."""
import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from sparsenorm.experiments._shared import metrics

EVEN = metrics.parity_target("even")
ODD = metrics.parity_target("odd")


def point_mass(digit: int) -> np.ndarray:
    p = np.zeros(10)
    p[digit] = 1.0
    return p


def test_parity_targets_are_uniform_over_five_digits():
    np.testing.assert_allclose(EVEN, [0.2, 0, 0.2, 0, 0.2, 0, 0.2, 0, 0.2, 0])
    np.testing.assert_allclose(ODD, [0, 0.2, 0, 0.2, 0, 0.2, 0, 0.2, 0, 0.2])
    with pytest.raises(ValueError, match="parity"):
        metrics.parity_target("prime")


def test_identical_distributions_are_at_distance_zero():
    assert metrics.class_wasserstein(EVEN, EVEN) == pytest.approx(0.0, abs=1e-12)


def test_point_masses_are_as_far_apart_as_their_digits():
    assert metrics.class_wasserstein(point_mass(0), point_mass(3)) == pytest.approx(3.0)
    assert metrics.class_wasserstein(point_mass(9), point_mass(2)) == pytest.approx(7.0)


def test_even_target_vs_odd_target_is_one_digit():
    # Every unit of mass moves one digit to the right: W = 5 * 0.2 * 1.
    assert metrics.class_wasserstein(EVEN, ODD) == pytest.approx(1.0)


def test_uniform_over_ten_vs_even_target_is_half():
    # |F_uniform - F_even| is 0.1 on [0,1), [2,3), ..., [8,9) and 0 elsewhere: 5 * 0.1.
    assert metrics.class_wasserstein(np.full(10, 0.1), EVEN) == pytest.approx(0.5)


def test_mass_on_the_wrong_digits_with_the_same_values_is_far():
    # Same multiset of probabilities, wrong digits: passing probabilities as *values* (the pitfall)
    # cannot tell these apart, the class-position metric can.
    right = EVEN.copy()
    wrong = ODD.copy()
    assert sorted(right) == sorted(wrong)
    assert wasserstein_distance(right, EVEN) == pytest.approx(wasserstein_distance(wrong, EVEN))
    assert metrics.class_wasserstein(right, EVEN) == pytest.approx(0.0, abs=1e-12)
    assert metrics.class_wasserstein(wrong, EVEN) == pytest.approx(1.0)


def test_concentrated_on_one_right_digit():
    # All mass on 4 vs uniform on {0,2,4,6,8}: mean |4 - d| = (4 + 2 + 0 + 2 + 4) / 5.
    assert metrics.class_wasserstein(point_mass(4), EVEN) == pytest.approx(2.4)


def test_weights_are_normalized_and_tensors_accepted():
    p = np.array([1.0, 0, 3.0, 0, 0, 0, 0, 0, 0, 0])
    expected = metrics.class_wasserstein(p / p.sum(), point_mass(0))
    assert expected == pytest.approx(1.5)  # 0.75 of the mass moves 2 digits
    assert metrics.class_wasserstein(torch.tensor(p), point_mass(0)) == pytest.approx(expected)


def test_custom_positions():
    assert metrics.class_wasserstein([1, 0], [0, 1], positions=[0.0, 10.0]) == pytest.approx(10.0)


@pytest.mark.parametrize("p, q, match", [
    (np.ones(10), np.ones(9), "same number"),
    (-EVEN, EVEN, "non-negative"),
    (np.zeros(10), EVEN, "not all zero"),
    (np.full(10, np.nan), EVEN, "finite"),
    (np.ones((2, 10)), np.ones((2, 10)), "1-D"),
])
def test_bad_inputs_raise(p, q, match):
    with pytest.raises(ValueError, match=match):
        metrics.class_wasserstein(p, q)


def test_marginal_digit_distribution():
    prior = np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = np.zeros((3, 10))
    q[0, 2] = 1.0           # latent 0 decodes to a clear 2
    q[1, [4, 6]] = 0.5      # latent 1 is ambiguous between 4 and 6
    q[2, 1] = 1.0
    marginal = metrics.marginal_digit_distribution(prior, q)
    np.testing.assert_allclose(marginal[0], [0, 0, 0.5, 0, 0.25, 0, 0.25, 0, 0, 0])
    np.testing.assert_allclose(marginal[1], point_mass(1))


def test_nonzero_count():
    probs = np.array([[0.5, 0.5, 0.0], [0.995, 0.005, 0.0]])
    np.testing.assert_array_equal(metrics.nonzero_count(probs), [2, 2])
    np.testing.assert_array_equal(metrics.nonzero_count(probs, threshold=0.01), [2, 1])
