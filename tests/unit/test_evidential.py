"""ev-softmax (Eq. 7), its training form (Eq. 10, and its log), and post-hoc evidential sparsification.

Oracles: the literal formulas of the ev-softmax paper written out in numpy below, the numbers printed
in the paper's slides and Fig. 1, and Dempster's rule evaluated by brute force over all subsets.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparsenorm import (
    EvSoftmax,
    EvSoftmaxTrain,
    LogEvSoftmaxTrain,
    PosthocEvidential,
    ev_softmax,
    ev_softmax_train,
    log_ev_softmax_train,
    posthoc_evidential,
)
from sparsenorm.evidential import evidential_weights, singleton_masses

from knife_edge import band

NEG_INF = float("-inf")
ALL_FUNCS = [ev_softmax, ev_softmax_train, log_ev_softmax_train]
PROB_FUNCS = [ev_softmax, ev_softmax_train]


# ------------------------------------------------------------------------------------------------
# Literal oracles (numpy, float64, one row at a time)
# ------------------------------------------------------------------------------------------------
def ev_softmax_literal(v, eps=0.0):
    """Eq. 7 (eps = 0) / Eq. 10: (1{v_k >= mean(v)} + eps) e^{v_k}, normalized; -inf = absent."""
    v = np.asarray(v, dtype=np.float64)
    valid = v != -np.inf
    mean = v[valid].mean()
    weight = np.where(valid, (v >= mean) + eps, 0.0) * np.exp(np.where(valid, v, 0.0))
    return weight / weight.sum()


def softmax_literal(v):
    e = np.exp(np.asarray(v, dtype=np.float64))
    return e / e.sum()


def finite_rows(min_k=1, max_k=8):
    return st.integers(min_k, max_k).flatmap(
        lambda k: arrays(np.float64, (k,), elements=st.floats(-20, 20, allow_nan=False, width=64))
    )


def clear_of_mean(v, gap=1e-6):
    """True when no entry is within ``gap`` of the mean (so rounding cannot change the support)."""
    return bool(np.all(np.abs(v - v.mean()) > gap))


# ------------------------------------------------------------------------------------------------
# Worked examples (slides) and Fig. 1
# ------------------------------------------------------------------------------------------------
WORKED = [
    # v, softmax(v) and ev-softmax(v) as printed in the slides' table (Fig. 1 repeats the second row)
    ((1.3, 0.37, -0.67), (0.65, 0.26, 0.09), (0.72, 0.28, 0.0)),
    ((0.4, 1.4, -0.8), (0.25, 0.67, 0.07), (0.27, 0.73, 0.0)),
]


@pytest.mark.parametrize("v, printed_softmax, printed_ev", WORKED)
def test_worked_examples_match_literal_formula_and_printed_numbers(v, printed_softmax, printed_ev):
    x = torch.tensor(v, dtype=torch.float64)
    got = ev_softmax(x).numpy()
    np.testing.assert_allclose(got, ev_softmax_literal(v), rtol=0, atol=1e-12)
    # The printed values have two decimals (the slides print softmax's 0.676 as 0.67: truncated).
    np.testing.assert_allclose(got, printed_ev, atol=0.01)
    np.testing.assert_allclose(torch.softmax(x, -1).numpy(), printed_softmax, atol=0.01)
    assert got[2] == 0.0 and (got[:2] > 0).all()  # bimodal: exactly one zero (Fig. 1's point)


def test_fig1_values_to_three_decimals():
    got = ev_softmax(torch.tensor([0.4, 1.4, -0.8], dtype=torch.float64)).numpy()
    # e^0.4 / (e^0.4 + e^1.4) = 1 / (1 + e) = 0.2689...
    np.testing.assert_allclose(got, [1 / (1 + math.e), math.e / (1 + math.e), 0.0], atol=1e-12)


# ------------------------------------------------------------------------------------------------
# Agreement with the literal formula
# ------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(finite_rows(), st.sampled_from([0.0, 1e-6, 1e-2, 0.5]))
def test_matches_literal_eq7_and_eq10(v, eps):
    assume(clear_of_mean(v))
    x = torch.from_numpy(v)
    np.testing.assert_allclose(ev_softmax(x).numpy(), ev_softmax_literal(v), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(ev_softmax_train(x, eps=eps).numpy(), ev_softmax_literal(v, eps), rtol=1e-10, atol=1e-14)
    with np.errstate(divide="ignore"):
        expected_log = np.log(ev_softmax_literal(v, eps))
    got_log = log_ev_softmax_train(x, eps=eps).numpy()
    finite = np.isfinite(expected_log)
    np.testing.assert_allclose(got_log[finite], expected_log[finite], rtol=1e-10, atol=1e-10)
    assert np.array_equal(np.isfinite(got_log), finite)


def test_log_is_finite_where_the_probability_underflows():
    # e^{-200} * 1e-6 underflows float32 but its log is about -214.
    x = torch.tensor([[0.0, 0.0, -200.0]])
    p = ev_softmax_train(x)
    logp = log_ev_softmax_train(x)
    assert p[0, 2] == 0.0
    assert torch.isfinite(logp).all()
    expected = -200.0 + math.log(1e-6) - math.log(2 * (1 + 1e-6))
    assert logp[0, 2].item() == pytest.approx(expected, rel=1e-5)


def test_eps_is_added_to_every_entry_as_in_eq10():
    # support {0, 1}: weights (1 + eps) e^v on it, eps e^v off it
    v = torch.tensor([2.0, 1.0, -3.0], dtype=torch.float64)
    eps = 0.1
    w = torch.tensor([1 + eps, 1 + eps, eps], dtype=torch.float64) * v.exp()
    torch.testing.assert_close(ev_softmax_train(v, eps=eps), w / w.sum())


def test_eps_zero_is_ev_softmax():
    x = torch.randn(5, 9, dtype=torch.float64)
    torch.testing.assert_close(ev_softmax_train(x, eps=0.0), ev_softmax(x))
    assert torch.equal(torch.isinf(log_ev_softmax_train(x, eps=0.0)), ev_softmax(x) == 0)


def test_ties_with_the_mean_are_kept():
    # mean of (1, 0, 2) is exactly 1: the entry equal to it stays (>=, Eq. 7)
    x = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    e = math.e
    torch.testing.assert_close(ev_softmax(x),
                               torch.tensor([e / (e + e * e), 0.0, e * e / (e + e * e)], dtype=torch.float64))


@pytest.mark.parametrize("flush_denormal", [False, True])
def test_ties_kept_in_float32_and_with_flush_to_zero(flush_denormal):
    x = torch.tensor([[1.0, 0.0, 2.0], [3.0, 3.0, 0.0]])  # means 1 and 2: one tie, then none
    supported = torch.set_flush_denormal(flush_denormal)
    try:
        p = ev_softmax(x)
    finally:
        if supported:
            torch.set_flush_denormal(False)
    assert torch.equal(p > 0, torch.tensor([[True, False, True], [True, True, False]]))


@pytest.mark.parametrize("value", [0.1, 1 / 3, -7.3, 1e4, 0.0])
@pytest.mark.parametrize("k", [2, 3, 7, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_equal_entries_give_uniform_despite_rounding_of_the_mean(value, k, dtype):
    x = torch.full((k,), value, dtype=dtype)
    for f in PROB_FUNCS:
        torch.testing.assert_close(f(x), torch.full((k,), 1 / k, dtype=dtype))


def test_k1_gives_one_and_k2_gives_argmax():
    for f in PROB_FUNCS:
        assert f(torch.tensor([[-3.5]])).item() == 1.0
    assert log_ev_softmax_train(torch.tensor([[-3.5]])).item() == 0.0
    x = torch.randn(200, 2, dtype=torch.float64)
    one_hot = torch.nn.functional.one_hot(x.argmax(-1), 2).to(x.dtype)
    assert torch.equal(ev_softmax(x), one_hot)  # Sec. 3.1: in R^2 ev-softmax is argmax


def test_k0_gives_empty_output():
    x = torch.zeros(3, 0)
    for f in ALL_FUNCS:
        assert f(x).shape == (3, 0)


# ------------------------------------------------------------------------------------------------
# Table 1 (and Appendix C): monotonic, translation invariant, permutation invariant, full domain,
# Lipschitz 1 given equal supports; not idempotent, not scale invariant.
# ------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(finite_rows(min_k=2))
def test_monotonic(v):
    x = torch.from_numpy(v)
    for f in PROB_FUNCS:
        p = f(x).numpy()
        order = np.argsort(v, kind="stable")
        assert np.all(np.diff(p[order]) >= -1e-15)


@settings(max_examples=60, deadline=None)
@given(finite_rows(), st.integers(-1000, 1000))
def test_translation_invariant(v, shift):
    assume(clear_of_mean(v, gap=1e-6))
    x = torch.from_numpy(v)
    for f in ALL_FUNCS:
        torch.testing.assert_close(f(x + shift), f(x), rtol=1e-9, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(finite_rows(), st.randoms(use_true_random=False))
def test_permutation_invariant(v, rnd):
    perm = list(range(len(v)))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    x = torch.from_numpy(v)
    for f in ALL_FUNCS:
        torch.testing.assert_close(f(x[perm]), f(x)[perm], rtol=1e-9, atol=1e-14)  # summation order


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda k: arrays(np.float64, (k,), elements=st.floats(-1e300, 1e300, width=64))))
def test_full_domain(v):
    x = torch.from_numpy(v)
    for f in PROB_FUNCS:
        p = f(x)
        assert torch.isfinite(p).all() and (p >= 0).all()
        assert p.sum().item() == pytest.approx(1.0, abs=1e-12)


def _row_and_perturbation():
    return st.integers(3, 8).flatmap(
        lambda k: st.tuples(
            arrays(np.float64, (k,), elements=st.floats(-20, 20, width=64)),
            arrays(np.float64, (k,), elements=st.floats(-0.5, 0.5, width=64)),
        )
    )


@settings(max_examples=60, deadline=None)
@given(_row_and_perturbation())
def test_lipschitz_1_when_supports_agree(row_and_delta):
    v, delta = row_and_delta
    x1 = torch.from_numpy(v)
    x2 = x1 + torch.from_numpy(delta)
    p1, p2 = ev_softmax(x1), ev_softmax(x2)
    assume(torch.equal(p1 > 0, p2 > 0))
    assert (p1 - p2).norm() <= (x1 - x2).norm() + 1e-12


def test_not_idempotent_and_not_scale_invariant():
    # Table 1 claims neither; one counterexample each shows the implementation does not either.
    x = torch.tensor([1.3, 0.37, -0.67], dtype=torch.float64)
    p = ev_softmax(x)
    assert not torch.allclose(ev_softmax(p), p)
    assert not torch.allclose(ev_softmax(3 * x), p)


# ------------------------------------------------------------------------------------------------
# Gradients: Eq. 9, Eq. 12, gradcheck, double backward, memory
# ------------------------------------------------------------------------------------------------
def test_eq9_jacobian():
    torch.manual_seed(0)
    for _ in range(5):
        x = torch.randn(7, dtype=torch.float64)
        p = ev_softmax(x)
        jac = torch.autograd.functional.jacobian(ev_softmax, x)
        torch.testing.assert_close(jac, torch.diag(p) - torch.outer(p, p))
        # zero rows and columns off the support, softmax's Jacobian on it
        off = p == 0
        assert torch.all(jac[off] == 0) and torch.all(jac[:, off] == 0)
        # and the same as finite differences of the forward (no tie within 1e-6 of the mean)
        assert clear_of_mean(x.numpy(), 1e-4)
        h = 1e-7
        fd = torch.stack([(ev_softmax(x + h * e) - ev_softmax(x - h * e)) / (2 * h)
                          for e in torch.eye(7, dtype=x.dtype)], 1)
        torch.testing.assert_close(jac, fd, atol=1e-6, rtol=1e-5)


def test_eq12_gradient_of_log_train_tends_to_delta_minus_ev_softmax():
    torch.manual_seed(1)
    x = torch.randn(6, dtype=torch.float64)
    target_off_support = int(torch.nonzero(ev_softmax(x) == 0)[0])
    for i in (int(x.argmax()), target_off_support):
        errors = []
        for eps in (1e-2, 1e-5, 1e-8, 1e-11):
            xx = x.clone().requires_grad_(True)
            log_ev_softmax_train(xx, eps=eps)[i].backward()
            delta = torch.nn.functional.one_hot(torch.tensor(i), 6).to(x.dtype)
            # exactly delta - ev_softmax_train for every eps ...
            torch.testing.assert_close(xx.grad, delta - ev_softmax_train(x, eps=eps))
            errors.append((xx.grad - (delta - ev_softmax(x))).abs().max().item())
        # ... which tends to Eq. 12 as eps -> 0 (linearly in eps)
        assert all(b < a for a, b in zip(errors, errors[1:]))
        assert errors[-1] < 1e-9


@pytest.mark.parametrize("func", ALL_FUNCS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gradcheck_and_gradgradcheck(func, dim):
    torch.manual_seed(2)
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    kwargs = {} if func is ev_softmax else {"eps": 0.05}
    assert torch.autograd.gradcheck(lambda t: func(t, dim=dim, **kwargs), (x,))
    # double backward (n^2 numerical differences: a smaller input)
    assert torch.autograd.gradgradcheck(lambda t: func(t, dim=dim, **kwargs),
                                        (x[:, :, :2].detach().requires_grad_(True),))


@pytest.mark.parametrize("func", ALL_FUNCS)
def test_gradcheck_with_mask_and_default_eps(func):
    torch.manual_seed(3)
    x = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 6) > 0.3
    mask[:, 0] = True

    def masked_func(t):
        # numerical differences of the -inf log-probabilities of masked entries are NaN (inf - inf)
        return func(t, mask=mask).masked_fill(~mask, 0.0)

    assert torch.autograd.gradcheck(masked_func, (x,))
    assert torch.autograd.gradgradcheck(masked_func, (x,))


@pytest.mark.parametrize("func", ALL_FUNCS)
def test_backward_saves_only_the_output(func):
    # Seen through the saved-tensor hooks: the graph node is the Python autograd's or, once the C++
    # extension is loaded, the C++ autograd kernel's (a CppFunction, which does not list saved_tensors).
    x = torch.randn(4, 6, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = func(x)
    assert len(saved) == 1 and saved[0].data_ptr() == y.data_ptr()


# ------------------------------------------------------------------------------------------------
# Masks, -inf, empty rows, NaN
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("func", ALL_FUNCS)
def test_mask_equals_neg_inf_padding_and_truncation(func):
    torch.manual_seed(4)
    x = torch.randn(6, 9, dtype=torch.float64)
    lengths = torch.tensor([9, 1, 4, 5, 7, 2])
    mask = torch.arange(9) < lengths[:, None]
    padded = x.masked_fill(~mask, NEG_INF)
    out = func(x, mask=mask)
    torch.testing.assert_close(out, func(padded))
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(out[row, :n], func(x[row, :n]))
        expected_absent = NEG_INF if func is log_ev_softmax_train else 0.0
        assert torch.all(out[row, n:] == expected_absent)


def test_padding_is_excluded_from_the_mean():
    # With the mean over all 8 entries (-1e9 padding), every real score would be above it and
    # ev-softmax would be plain softmax over (1, 2, 3); over the valid entries the mean is 2.
    real = torch.tensor([1.0, 2.0, 3.0])
    x = torch.cat([real, torch.full((5,), -1e9)])
    mask = torch.arange(8) < 3
    p = ev_softmax(x, mask=mask)
    assert p[0] == 0 and torch.all(p[3:] == 0)
    torch.testing.assert_close(p[:3], torch.tensor([0.0, 1 / (1 + math.e), math.e / (1 + math.e)]))
    assert not torch.allclose(p[:3], torch.softmax(real, -1))
    torch.testing.assert_close(ev_softmax(x.masked_fill(~mask, NEG_INF)), p)


def test_broadcast_attention_mask():
    torch.manual_seed(5)
    scores = torch.randn(2, 4, 3, 6)  # (batch, heads, queries, keys)
    key_mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])[:, None, None, :]
    out = ev_softmax(scores, mask=key_mask)
    torch.testing.assert_close(out[1, ..., :3], ev_softmax(scores[1, ..., :3]))
    assert torch.all(out[1, ..., 3:] == 0)


@pytest.mark.parametrize("func", ALL_FUNCS)
def test_empty_rows_give_zeros_and_zero_gradient(func):
    x = torch.randn(3, 5, requires_grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out = func(x, mask=mask)
    expected_empty = NEG_INF if func is log_ev_softmax_train else 0.0
    assert torch.all(out[1] == expected_empty)
    assert torch.isfinite(out[[0, 2]]).all()
    (out[[0, 2]].sum() + out[1].clamp_min(-1.0).sum()).backward()
    assert torch.all(x.grad[1] == 0) and torch.isfinite(x.grad).all()
    # all -inf input is the same as a fully masked row
    y = torch.full((2, 4), NEG_INF, requires_grad=True)
    out = func(y)
    assert torch.all(out == expected_empty)
    out.clamp_min(-1.0).sum().backward()
    assert torch.all(y.grad == 0)


@pytest.mark.parametrize("func", ALL_FUNCS)
def test_nan_stays_in_its_row(func):
    x = torch.randn(4, 6, requires_grad=True)
    bad = x.detach().clone()
    bad[2, 3] = float("nan")
    bad = bad.requires_grad_(True)
    out = func(bad)
    assert torch.isnan(out[2]).all()
    torch.testing.assert_close(out[[0, 1, 3]], func(x)[[0, 1, 3]])
    out[[0, 1, 3]].sum().backward()
    assert torch.isfinite(bad.grad[[0, 1, 3]]).all()


def test_mask_row_without_neg_inf_elsewhere_is_unaffected():
    x = torch.randn(3, 5, dtype=torch.float64)
    x_pad = x.clone()
    x_pad[0, 4] = NEG_INF
    out = ev_softmax(x_pad)
    torch.testing.assert_close(out[1:], ev_softmax(x[1:]))  # the masked path agrees with the fast path
    torch.testing.assert_close(out[0, :4], ev_softmax(x[0, :4]))


# ------------------------------------------------------------------------------------------------
# dtypes, magnitudes, shapes, dims
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("func", ALL_FUNCS)
def test_half_precision_computes_in_float32(dtype, func):
    torch.manual_seed(6)
    x = (3 * torch.randn(8, 50)).to(dtype).requires_grad_(True)
    out = func(x)
    assert out.dtype == dtype
    reference = func(x.detach().float())
    torch.testing.assert_close(out.float(), reference.to(dtype).float())
    if func is not log_ev_softmax_train:
        resolution = torch.finfo(dtype).eps
        assert torch.allclose(out.float().sum(-1), torch.ones(8), atol=4 * resolution)
    out.float().sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("func", ALL_FUNCS)
def test_large_magnitudes_stay_finite(func):
    torch.manual_seed(7)
    x = (1e4 * torch.randn(16, 300)).requires_grad_(True)
    out = func(x)
    if func is log_ev_softmax_train:
        assert torch.isfinite(out).all()
    else:
        assert torch.isfinite(out).all() and torch.allclose(out.sum(-1), torch.ones(16))
    (out * torch.randn_like(out)).sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("func", ALL_FUNCS)
def test_any_dim_and_leading_shape(func):
    torch.manual_seed(8)
    x = torch.randn(2, 7, 3, 4, dtype=torch.float64)
    for dim in range(-4, 4):
        expected = func(x.movedim(dim, -1)).movedim(-1, dim)
        torch.testing.assert_close(func(x, dim=dim), expected)


def test_non_contiguous_input():
    x = torch.randn(6, 8, dtype=torch.float64)
    torch.testing.assert_close(ev_softmax(x.T, dim=0), ev_softmax(x.T.contiguous(), dim=0))
    torch.testing.assert_close(ev_softmax_train(x[:, ::2]), ev_softmax_train(x[:, ::2].contiguous()))


def test_input_is_not_modified():
    x = torch.randn(4, 6)
    before = x.clone()
    for f in ALL_FUNCS:
        f(x)
        f(x, mask=x > 0)
    assert torch.equal(x, before)


# ------------------------------------------------------------------------------------------------
# Bad arguments, modules
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("func", [ev_softmax_train, log_ev_softmax_train])
@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf")])
def test_bad_eps_raises_value_error_naming_eps(func, eps):
    with pytest.raises(ValueError, match="eps"):
        func(torch.randn(3), eps=eps)


@pytest.mark.parametrize("func", ALL_FUNCS)
def test_bad_input_and_mask(func):
    with pytest.raises(TypeError):
        func(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError):
        func([1.0, 2.0])
    with pytest.raises(IndexError, match="dim"):
        func(torch.randn(3, 4), dim=2)
    with pytest.raises(TypeError, match="mask"):
        func(torch.randn(3, 4), mask=torch.ones(3, 4))
    with pytest.raises(ValueError, match="mask"):
        func(torch.randn(3, 4), mask=torch.ones(2, 4, dtype=torch.bool))


def test_modules():
    x = torch.randn(3, 4, 5)
    mask = torch.rand(3, 4, 5) > 0.2
    torch.testing.assert_close(EvSoftmax(dim=1)(x, mask=mask), ev_softmax(x, dim=1, mask=mask))
    torch.testing.assert_close(EvSoftmaxTrain(dim=0, eps=0.1)(x), ev_softmax_train(x, dim=0, eps=0.1))
    torch.testing.assert_close(LogEvSoftmaxTrain(eps=0.01)(x, mask=mask), log_ev_softmax_train(x, eps=0.01, mask=mask))
    assert "eps=0.1" in repr(EvSoftmaxTrain(eps=0.1))
    with pytest.raises(ValueError, match="eps"):
        EvSoftmaxTrain(eps=-1.0)
    with pytest.raises(ValueError, match="eps"):
        LogEvSoftmaxTrain(eps=-1.0)


# ------------------------------------------------------------------------------------------------
# Post-hoc evidential sparsification (Appendix A) and Theorem 3.1
# ------------------------------------------------------------------------------------------------
def _dempster_singleton_masses(w):
    """Brute force: fuse the 2K simple mass functions of Eqs. 17-18 by Dempster's rule (Eq. 14)
    over all subsets of K classes, return the normalized singleton masses."""
    k = len(w)
    full = (1 << k) - 1
    masses = {full: 1.0}  # vacuous mass function
    simple = []
    for i, wi in enumerate(w):
        wp, wm = max(0.0, wi), max(0.0, -wi)
        simple.append({1 << i: 1 - math.exp(-wp), full: math.exp(-wp)})
        simple.append({full & ~(1 << i): 1 - math.exp(-wm), full: math.exp(-wm)})
    for m2 in simple:
        fused = {}
        for a, ma in masses.items():
            for b, mb in m2.items():
                c = a & b
                if c and ma * mb:
                    fused[c] = fused.get(c, 0.0) + ma * mb
        total = sum(fused.values())
        masses = {s: v / total for s, v in fused.items()}
    return np.array([masses.get(1 << i, 0.0) for i in range(k)])


@pytest.mark.parametrize(
    "w",
    [
        [0.7, -0.2, -0.5],
        [1.5, 0.3, -0.9, -0.9],
        [0.0, 0.0, 0.0],
        [2.0, 0.0, -1.0, -1.0],  # one zero factor (w_l >= 0 counts as zero) besides the positive one
        [0.0, 0.5, 0.5, -1.0],
        [3.0, -1.0, -1.0, -1.0],
    ],
)
def test_singleton_masses_match_dempsters_rule_by_brute_force(w):
    got = singleton_masses(torch.tensor(w, dtype=torch.float64)).numpy()
    expected = _dempster_singleton_masses(w)
    # Eq. 19 is up to the common normalizer: same zeros, and proportional where nonzero.
    assert np.array_equal(got == 0, expected < 1e-15)
    if (got > 0).any():
        ratio = expected[got > 0] / got[got > 0]
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-9)


def test_singleton_masses_match_the_quadratic_product_formula():
    torch.manual_seed(9)
    w = torch.randn(50, 6, dtype=torch.float64)
    w[:10, :3] = 0.0  # exact zero factors
    w_plus, w_minus = w.clamp_min(0), (-w).clamp_min(0)
    factor = 1 - torch.exp(-w_minus)
    prod_without = torch.stack([torch.cat([factor[:, :k], factor[:, k + 1:]], 1).prod(1) for k in range(6)], 1)
    expected = torch.exp(-w_minus) * (torch.exp(w_plus) - 1 + prod_without)
    torch.testing.assert_close(singleton_masses(w), expected)


@pytest.mark.parametrize("batch_shape", [(), (5,), (2, 3)])
@pytest.mark.parametrize("use_bias", [True, False])
def test_theorem_3_1_posthoc_equals_ev_softmax(batch_shape, use_bias):
    gen = torch.Generator().manual_seed(10)
    for k, j in [(3, 4), (10, 7), (64, 32)]:
        phi = torch.randn(*batch_shape, j, generator=gen, dtype=torch.float64)
        weight = torch.randn(k, j, generator=gen, dtype=torch.float64)
        bias = torch.randn(k, generator=gen, dtype=torch.float64) if use_bias else None
        scores = phi @ weight.T + (bias if use_bias else 0)
        torch.testing.assert_close(posthoc_evidential(phi, weight, bias), ev_softmax(scores))


def test_evidential_weights_are_centered_scores_lemma_3_2():
    torch.manual_seed(11)
    layer = torch.nn.Linear(6, 5).double()
    h = torch.randn(4, 6, dtype=torch.float64)
    v = layer(h)
    torch.testing.assert_close(evidential_weights(h, layer.weight, layer.bias), v - v.mean(-1, keepdim=True))


def test_posthoc_module_and_linear_layout():
    torch.manual_seed(12)
    layer = torch.nn.Linear(8, 6)
    h = torch.randn(10, 8)
    p = PosthocEvidential(layer)(h)
    torch.testing.assert_close(p, posthoc_evidential(h, layer.weight, layer.bias))
    # the support against the dense formula's, by the contract: the post-hoc weights round the
    # centered scores differently, so entries within float32 rounding of the mean may go either way
    scores = layer(h).double()
    bound = 8 * (8 + 6) * torch.finfo(torch.float32).eps * (h.abs().double() @ layer.weight.abs().double().T
                                                             + layer.bias.abs().double()).amax(-1, keepdim=True)
    clear_in, clear_out, _ = band(scores, scores.mean(-1, keepdim=True), bound)
    assert (p[clear_in] > 0).all() and (p[clear_out] == 0).all() and clear_in.any() and clear_out.any()
    with pytest.raises(TypeError):
        PosthocEvidential(torch.nn.Conv1d(1, 1, 1))


def test_posthoc_edge_cases():
    # all scores equal: every singleton mass is 0; the uniform distribution is returned (Eq. 32)
    torch.testing.assert_close(posthoc_evidential(torch.zeros(1, 3), torch.ones(4, 3)), torch.full((1, 4), 0.25))
    # K = 1
    assert posthoc_evidential(torch.randn(2, 3), torch.randn(1, 3)).eq(1).all()
    # large magnitudes: no NaN
    p = posthoc_evidential(1e3 * torch.randn(5, 4), torch.randn(7, 4), torch.randn(7))
    assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(5))
    # half precision in, same dtype out
    assert posthoc_evidential(torch.randn(2, 3).half(), torch.randn(4, 3).half()).dtype == torch.float16


def test_posthoc_gradcheck():
    torch.manual_seed(13)
    phi = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(posthoc_evidential, (phi, weight, bias))


def test_posthoc_bad_shapes():
    with pytest.raises(ValueError, match="features"):
        posthoc_evidential(torch.randn(3, 5), torch.randn(4, 3))
    with pytest.raises(ValueError, match="weight"):
        posthoc_evidential(torch.randn(3, 5), torch.randn(4, 5, 1))
    with pytest.raises(ValueError, match="bias"):
        posthoc_evidential(torch.randn(3, 5), torch.randn(4, 5), torch.randn(5))
    with pytest.raises(TypeError, match="features"):
        posthoc_evidential(torch.ones(3, 5, dtype=torch.long), torch.randn(4, 5))
