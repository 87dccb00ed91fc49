"""The fused C++ CPU kernel of r-softmax and t-softmax (sparsenorm/kernels/cpu/rsoftmax.cpp).

Oracles: the reference path (``sparsenorm.kernels.disabled()``: ``torch.topk`` selection, itself
tested against ``torch.quantile`` and the paper's formula in test_rsoftmax.py) and the sync-free
sorted reference. Same support and values to rounding, incl. ties, -inf entries, empty rows,
per-row r, r = 0 and 1; gradients w.r.t. x and r (t). The bucket selection must give exactly the
sorted reference's order statistics (values and indices, ties in index order) on any row.

Tolerance (error model): p_i = w_i exp(x_i - max) / S in both paths. Each term carries a few
roundings (subtraction, exp within 1 ulp, product, quotient: <= 4 eps each side) and S a summation
error of at most (K / 4 + 2) eps relative (SIMD lanes summed sequentially, at least 4 lanes, then a
tree; torch's sum is tighter), so |p_kernel - p_ref| <= (10 + K / 2) eps p (both sides' bounds).
"""
from __future__ import annotations

import math

import pytest
import torch

from hypothesis import given, settings
from hypothesis import strategies as st

from sparsenorm import kernels, r_softmax, t_softmax
from sparsenorm.kernels import cpu
from sparsenorm.kernels.reference import rsoftmax as ref


@pytest.fixture(scope="module", autouse=True)
def kernel():
    saved = cpu._code_setting
    if cpu.RSOFTMAX.load() is None:
        pytest.skip(f"C++ kernel not buildable here: {cpu.RSOFTMAX.error}")
    cpu._code_setting = True
    yield
    cpu._code_setting = saved


def cases(dtype):
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=gen, dtype=dtype) * 3

    masked = randn(6, 40)
    masked[0, :5] = -math.inf
    masked[2] = -math.inf
    masked[4, 1:] = -math.inf  # one valid entry
    ties = torch.arange(60, dtype=dtype).remainder(5).view(4, 15)
    poisoned = randn(3, 9)
    poisoned[1, 2] = math.nan
    poisoned[2, 0] = math.inf
    return [("random", randn(7, 33)), ("long", randn(3, 3001)), ("K=1", randn(4, 1)), ("K=2", randn(5, 2)),
            ("-inf and empty rows", masked), ("ties", ties), ("all equal", torch.full((3, 8), 0.7, dtype=dtype)),
            ("NaN and +inf", poisoned)]


def both(x, r, fn=r_softmax):
    with kernels.disabled():
        pure = fn(x, r)
    return pure, fn(x, r)


def assert_close_model(fused, pure, k, label=""):
    """Within the error model of the module docstring (relative; atol only for subnormal p)."""
    finfo = torch.finfo(pure.dtype)
    torch.testing.assert_close(fused, pure, rtol=(10 + k / 2) * finfo.eps, atol=finfo.tiny, msg=label)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("r", [0.0, 0.25, 0.5, 0.9, 1.0, "per-row"])
def test_kernel_matches_reference(dtype, r):
    for label, x in cases(dtype):
        rr = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(3), dtype=dtype) if r == "per-row" else r
        pure, fused = both(x, rr)
        assert torch.equal(torch.isnan(pure), torch.isnan(fused)), label
        assert torch.equal(pure == 0, fused == 0), f"{label}: support differs"
        ok = ~torch.isnan(pure)
        assert_close_model(fused[ok], pure[ok], x.shape[-1], label)
        # the sync-free sorted reference agrees too
        rows = torch.full((x.shape[0], 1), rr, dtype=dtype) if not isinstance(rr, torch.Tensor) else rr[:, None]
        sorted_p = ref.forward(x, rows, sorted_threshold=True)[0]
        assert torch.equal(sorted_p == 0, fused == 0), f"{label}: support differs from the sorted reference"


@pytest.mark.parametrize("per_row_r", [False, True])
def test_gradients_match_reference(per_row_r):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 25, generator=gen, dtype=torch.float64) * 2
    x[1, :3] = -math.inf
    g = torch.randn(6, 25, generator=gen, dtype=torch.float64)
    r0 = torch.rand(6, generator=gen, dtype=torch.float64) if per_row_r else torch.tensor(0.4, dtype=torch.float64)
    grads = []
    for disable in (True, False):
        xi, ri = x.clone().requires_grad_(True), r0.clone().requires_grad_(True)
        if disable:
            with kernels.disabled():
                out = torch.autograd.grad(r_softmax(xi, ri), (xi, ri), g)
        else:
            out = torch.autograd.grad(r_softmax(xi, ri), (xi, ri), g)
        grads.append(out)
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-10, atol=1e-12)


def test_gradcheck_through_kernel():
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    r = torch.tensor([[0.3], [0.55], [0.8], [0.1]], dtype=torch.float64, requires_grad=True)
    assert cpu.RSOFTMAX.kernel_for(x.detach()) is not None
    assert torch.autograd.gradcheck(lambda a, b: r_softmax(a, b), (x, r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("k", [2, 20])  # inside and past one SIMD width
def test_subnormal_weights(dtype, k):
    # x = (0, ..., 0, tiny) with tau between 0 and tiny: the one weight x - tau, hence the sum, is
    # subnormal and 1 / sum overflows; normalising by that reciprocal gave NaN and inf.
    tiny = torch.finfo(dtype).tiny
    x = torch.zeros(1, k, dtype=dtype)
    x[0, -1] = tiny
    r = 1 - 0.2 / (k - 1)  # tau = 0.8 tiny
    pure, fused = both(x, r)
    expected = torch.zeros(1, k, dtype=dtype)
    expected[0, -1] = 1
    torch.testing.assert_close(pure, expected, rtol=0, atol=0)
    torch.testing.assert_close(fused, expected, rtol=0, atol=0)


@pytest.mark.parametrize("disable", [False, True], ids=["kernel", "reference"])
@pytest.mark.parametrize("size", [1e-45, 1e-40])
def test_overflowing_gradient_is_never_nan(disable, size):
    """Two equal subnormal weights: the exact gradient (about 0.85 / size) overflows float32. The kernel
    gives its two entries -inf and +inf, whose sum C was inf - inf = NaN and spread NaN to the quantile's
    entries (found by the fuzz suite in r-softmax attention); the reference saturates them near
    +-p_top / finfo.tiny. The exact C is 0: the rest of the gradient is 0 on both paths. (The quantile
    between 0 and one subnormal rounds to either, by SIMD level: at ``tau = size`` the row is dead and the
    whole gradient 0, which the same checks accept.)"""
    x = torch.tensor([[0.0, size, size, 0.0, 0.0]], requires_grad=True)
    keep = torch.tensor([[False, True, True, True, True]])
    with kernels.disabled() if disable else torch.enable_grad():
        p = r_softmax(x, 0.5, mask=keep)
        (grad,) = torch.autograd.grad(p, x, torch.tensor([[0.3, -1.2, 0.5, 0.7, 0.1]]))
    assert not torch.isnan(grad).any(), grad
    assert grad[0, 1] == -grad[0, 2] and grad[0, 1] <= 0
    assert grad[0, 0] == 0 and grad[0, 3] == 0 and grad[0, 4] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("t", [1e-30, 0.3, 1.0, 4.0, "per-row"])
def test_t_softmax_kernel_matches_reference(dtype, t):
    for label, x in cases(dtype):
        tt = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(6), dtype=dtype) * 3 + 0.1 \
            if t == "per-row" else t
        pure, fused = both(x, tt, t_softmax)
        assert torch.equal(torch.isnan(pure), torch.isnan(fused)), label
        assert torch.equal(pure == 0, fused == 0), f"{label}: support differs"
        ok = ~torch.isnan(pure)
        assert_close_model(fused[ok], pure[ok], x.shape[-1], label)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fn,param", [(r_softmax, 0.3), (t_softmax, 2.0), (t_softmax, 1e38)])
def test_not_there_values_read_by_the_kernel(dtype, fn, param):
    # The entry path leaves entries <= finfo.min / 2 to the kernel (no masking pass): they must be
    # not there, also when t is so large that max - t falls below them.
    low = torch.finfo(dtype).min
    x = torch.randn(4, 21, generator=torch.Generator().manual_seed(7), dtype=dtype)
    x[0, :4] = low
    x[1, 5] = low / 2
    x[2] = low
    x[3, ::2] = float("-inf")
    x[3, 1] = low / 1.5
    pure, fused = both(x, param, fn)
    as_neg_inf = fn(x.masked_fill(x <= low / 2, float("-inf")), param)
    for out in (pure, fused):
        assert torch.all(out[x <= low / 2] == 0)
        assert torch.equal(out == 0, as_neg_inf == 0)
    assert_close_model(fused, pure, x.shape[-1])
    assert_close_model(fused, as_neg_inf, x.shape[-1])
    xg = x.clone().requires_grad_(True)
    (fn(xg, param) * torch.randn_like(x)).sum().backward()
    assert torch.all(xg.grad[x <= low / 2] == 0) and torch.isfinite(xg.grad).all()


def selection_rows(dtype):
    """Rows that stress the bucket selection: outliers, heavy ties, narrow and huge ranges."""
    gen = torch.Generator().manual_seed(8)
    k = 700
    normal = torch.randn(k, generator=gen, dtype=dtype)
    finfo = torch.finfo(dtype)
    outlier = normal.clone()
    outlier[3] = 1e30
    outlier[400] = -1e30
    few_values = torch.randint(0, 4, (k,), generator=gen).to(dtype)
    two_values = torch.where(torch.rand(k, generator=gen) < 0.5, 0.0, 1.0).to(dtype)
    narrow = 1 + torch.randint(0, 50, (k,), generator=gen).to(dtype) * finfo.eps
    subnormal = torch.randint(0, 300, (k,), generator=gen).to(dtype) * finfo.tiny * finfo.eps
    huge = torch.linspace(-1, 1, k, dtype=dtype)[torch.randperm(k, generator=gen)] * (finfo.max * 0.49)
    huge[0], huge[1] = finfo.max * 0.49, -finfo.max * 0.49
    skewed = torch.empty(k, dtype=dtype).exponential_(generator=gen) ** 4
    clustered = torch.cat([torch.randn(k // 2, generator=gen, dtype=dtype) * 1e-6,
                           torch.randn(k - k // 2, generator=gen, dtype=dtype) * 1e3])
    return torch.stack([normal, outlier, few_values, two_values, narrow, subnormal, huge, skewed, clustered])


def kernel_and_sorted_reference(x, r_rows):
    ext = cpu.RSOFTMAX.get()
    fused = ext.forward(x.contiguous(), r_rows.contiguous())
    pure = ref.forward(x, r_rows, sorted_threshold=True)
    return fused, pure


def assert_same_order_statistics(fused, pure, x):
    """(p, tau, lo_idx, hi_idx, frac, dtau_dr, dead): the threshold's data exactly (the indices on
    rows with an entry there: an empty row has none), and p within the error model."""
    there = (x > float("-inf")).any(-1, keepdim=True)
    for i in (1, 4, 5, 6):
        assert torch.equal(fused[i], pure[i]), ("tau", None, None, "frac", "dtau_dr", "dead")[i - 1]
    for i in (2, 3):
        assert torch.equal(fused[i][there], pure[i][there]), ("lo_idx", "hi_idx")[i - 2]
    # p > 0 only where the weight x - tau is (dead rows: the arg-max entries); exp(x - max) may
    # underflow to 0 inside. p is compared on rows where the reference's own sum is 1: on a row
    # of subnormal weights its softmax(x) * w underflows to 0 everywhere (the kernel's does not).
    tau, dead = fused[1], fused[6]
    assert not ((fused[0] > 0) & ~dead & ~(x > tau)).any()
    finfo = torch.finfo(x.dtype)
    sums_to_one = ((pure[0].sum(-1) - 1).abs() < 1e3 * finfo.eps) & ~pure[0].isnan().any(-1)
    assert_close_model(fused[0][sums_to_one], pure[0][sums_to_one], x.shape[-1])
    ones = fused[0].sum(-1)[there[:, 0]]  # the kernel's rows sum to 1 (subnormal weights included)
    torch.testing.assert_close(ones, torch.ones_like(ones), rtol=0, atol=(10 + x.shape[-1] / 2) * finfo.eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("r", [0.0, 0.1, 0.5, 0.731, 0.999, 1.0])
def test_selection_matches_sorted_reference_exactly(dtype, r):
    x = selection_rows(dtype)
    fused, pure = kernel_and_sorted_reference(x, torch.full((x.shape[0], 1), r, dtype=dtype))
    assert_same_order_statistics(fused, pure, x)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), k=st.integers(1, 300), r=st.floats(0, 1), pool=st.integers(1, 400))
def test_selection_property(data, k, r, pool):
    # Values drawn from a pool of `pool` distinct numbers (so ties are frequent for small pools),
    # some not there: order statistics, indices and support equal the sorted reference's.
    seed = data.draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(pool, generator=gen, dtype=torch.float64) * data.draw(st.sampled_from([1e-3, 1.0, 1e6]))
    x = values[torch.randint(0, pool, (2, k), generator=gen)]
    x[1][torch.rand(k, generator=gen) < 0.3] = float("-inf")
    fused, pure = kernel_and_sorted_reference(x, torch.full((2, 1), r, dtype=torch.float64))
    assert_same_order_statistics(fused, pure, x)


def test_t_softmax_gradients_match_reference_and_gradcheck():
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(6, 25, generator=gen, dtype=torch.float64) * 2
    x[1, :3] = -math.inf
    g = torch.randn(6, 25, generator=gen, dtype=torch.float64)
    t0 = torch.rand(6, 1, generator=gen, dtype=torch.float64) * 3 + 0.2
    grads = []
    for disable in (True, False):
        xi, ti = x.clone().requires_grad_(True), t0.clone().requires_grad_(True)
        with kernels.disabled() if disable else torch.enable_grad():
            out = torch.autograd.grad(t_softmax(xi, ti), (xi, ti), g)
        grads.append(out)
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-10, atol=1e-12)
    xs = (torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    ts = torch.tensor([[0.3], [1.5], [0.8], [4.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: t_softmax(a, b), (xs, ts))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_t_softmax_kernel_argmax_is_the_first_maximum(dtype):
    # The kernel finds the first arg-max with a SIMD compare per vector, then a scalar tail: tied
    # maxima in the body, in the tail, at index 0, against the reference. (A NaN row's index has no
    # use, its p and gradient being NaN: the reference gives the NaN's, the kernel another.)
    from sparsenorm.kernels import ops

    gen = torch.Generator().manual_seed(11)
    x = torch.randn(5, 100, generator=gen, dtype=dtype)
    x[0, [37, 80]] = 9.0  # tied maxima in the SIMD body
    x[1, [97, 98]] = 9.0  # in the tail (100 = 6 x 16 + 4 floats)
    x[2, [0, 50]] = 9.0  # at index 0
    x[3, 20] = math.nan
    t = torch.full((5, 1), 2.0, dtype=dtype)
    fused = ops.t_softmax_forward(x, t)
    with kernels.disabled():
        pure = ops.t_softmax_forward(x, t)
    finite = [0, 1, 2, 4]
    assert fused[2].view(-1)[finite].tolist() == pure[2].view(-1)[finite].tolist()
    assert fused[2].view(-1).tolist()[:3] == [37, 97, 0] and torch.isnan(fused[0][3]).all()
