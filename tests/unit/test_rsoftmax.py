"""t-softmax (Eq. 1) and r-softmax (Eq. 3) of the r-softmax paper."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

from sparsenorm import RSoftmax, TSoftmax, r_softmax, t_softmax
from sparsenorm.kernels.ops.rsoftmax import RSoftmaxFunction, TSoftmaxFunction

NEG_INF = float("-inf")


# ---------------------------------------------------------------------------- literal oracles
def literal_weighted_softmax(x, tau):
    """Eq. 1's weighted softmax with weights relu(x - tau), computed directly (1-D or rows)."""
    w = torch.relu(x - tau)
    num = w * torch.exp(x - x.max(-1, keepdim=True).values)
    return num / num.sum(-1, keepdim=True)


def literal_t_softmax(x, t):
    return literal_weighted_softmax(x, x.max(-1, keepdim=True).values - t)


def literal_r_softmax(x, r):
    """Eq. 3 with torch.quantile (the paper's linear interpolation) as the oracle, row by row."""
    rows = x.reshape(-1, x.shape[-1])
    rs = torch.as_tensor(r, dtype=x.dtype).expand(rows.shape[0]) if not torch.is_tensor(r) or r.numel() == 1 \
        else r.reshape(-1)
    out = []
    for row, rr in zip(rows, rs):
        valid = row[row > NEG_INF]
        tau = torch.quantile(valid, rr.to(x.dtype))
        full = torch.zeros_like(row)
        full[row > NEG_INF] = literal_weighted_softmax(valid, tau)
        out.append(full)
    return torch.stack(out).reshape(x.shape)


def distinct_rows(n_rows, n, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g) for _ in range(n_rows)]).to(dtype) * 0.37 + \
        torch.rand(n_rows, 1, generator=g, dtype=dtype)


# ---------------------------------------------------------------------------- definitions
@pytest.mark.parametrize("r", [0.0, 0.05, 0.25, 0.5, 0.6, 0.77, 0.99])
@pytest.mark.parametrize("n", [2, 3, 7, 64])
def test_r_softmax_matches_quantile_formula(r, n):
    x = torch.randn(9, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    torch.testing.assert_close(r_softmax(x, r), literal_r_softmax(x, r))


def test_r_softmax_per_row_r_matches_formula():
    x = torch.randn(12, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    r = torch.rand(12, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 0.95
    expected = literal_r_softmax(x, r)
    torch.testing.assert_close(r_softmax(x, r), expected)  # one value per row
    torch.testing.assert_close(r_softmax(x, r.unsqueeze(1)), expected)  # (N, 1), the entmax layout


def test_r_softmax_authors_worked_examples():
    """Cases from the authors' repository tests (gmum/rsoftmax), each checked by hand from Eq. 3."""
    x = torch.tensor([[3.0, 2, 1], [4, 5, 6]])
    torch.testing.assert_close(r_softmax(x, 0.5), torch.tensor([[1.0, 0, 0], [0, 0, 1]]))
    x = torch.tensor([[3.0, 2, 1, 1], [4, 6, 6, 5]])
    # row 1: quantile 1.5, w = (1.5, .5, 0, 0): p1 = 1.5e^3 / (1.5e^3 + .5e^2)
    p1 = 1.5 * math.e ** 3 / (1.5 * math.e ** 3 + 0.5 * math.e ** 2)
    torch.testing.assert_close(r_softmax(x, 0.5), torch.tensor([[p1, 1 - p1, 0, 0], [0, 0.5, 0.5, 0]]))
    x = torch.tensor([[3.0, 2, 1, 1], [4, 6, 5, 5]])
    out = r_softmax(x, torch.tensor([[0.75], [0.25]]))
    torch.testing.assert_close(out, torch.tensor([[1.0, 0, 0, 0], [0, 0.8717, 0.0641, 0.0641]]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("t", [0.1, 0.5, 1.0, 3.0])
def test_t_softmax_matches_eq1(t):
    x = torch.randn(7, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(t_softmax(x, t), literal_t_softmax(x, t))
    t_rows = torch.linspace(0.2, 2.0, 7, dtype=torch.float64)
    torch.testing.assert_close(t_softmax(x, t_rows), literal_t_softmax(x, t_rows.unsqueeze(1)))


def test_t_softmax_theorem_1():
    x = torch.tensor([[2.0, 1.2, 0.5, -1.0]], dtype=torch.float64)
    # t -> inf: softmax
    torch.testing.assert_close(t_softmax(x, 1e7), torch.softmax(x, -1), atol=1e-6, rtol=0)
    # t <= gap between the two largest (0.8): one-hot of the arg-max
    for t in (0.1, 0.8):
        torch.testing.assert_close(t_softmax(x, t), torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64))
    # just above the gap: the second entry appears
    assert t_softmax(x, 0.81)[0, 1] > 0
    # entries at distance >= t from the max are exactly zero
    p = t_softmax(x, 1.5)
    assert p[0, 1] > 0 and p[0, 2] == 0 and p[0, 3] == 0  # x_2 is exactly t below the max
    assert t_softmax(x, 1.6)[0, 2] > 0


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(-1000, 1000), min_size=2, max_size=40, unique=True), data=st.data())
def test_r_softmax_exactly_k_zeros(values, data):
    n = len(values)
    k = data.draw(st.integers(1, n - 1))
    x = torch.tensor(values, dtype=torch.float64) / 7
    p = r_softmax(x, k / n)
    assert int((p == 0).sum()) == k
    # the zeros are the k smallest entries
    assert bool((p[x.argsort()[:k]] == 0).all())
    # float32 too, where exp(x - max) cannot underflow to an extra zero (as softmax's would)
    if float(x.max() - x.min()) < 60:
        assert int((r_softmax(x.float(), k / n) == 0).sum()) == k


def test_r_softmax_at_zero_still_zeroes_the_minimum():
    """Eq. 3 at r = 0 gives quantile = min, so the minimum gets weight 0 (documented; not softmax)."""
    x = distinct_rows(5, 8)
    p = r_softmax(x, 0.0)
    assert bool(((p == 0).sum(-1) == 1).all())
    assert bool((p.gather(-1, x.argmin(-1, keepdim=True)) == 0).all())


def test_r_softmax_r_one_is_argmax_limit():
    x = torch.tensor([[0.3, 2.0, -1.0, 1.9], [1.0, 3.0, 3.0, 0.0]], requires_grad=True)
    p = r_softmax(x, 1.0)
    torch.testing.assert_close(p, torch.tensor([[0.0, 1, 0, 0], [0, 0.5, 0.5, 0]]))
    # the limit r -> 1 from below agrees (unique max)
    torch.testing.assert_close(r_softmax(x[:1].detach().double(), 1 - 1e-9), p[:1].detach().double())
    p.backward(torch.randn(2, 4))
    assert torch.equal(x.grad, torch.zeros(2, 4))


@pytest.mark.parametrize("fn", [lambda x: r_softmax(x, 0.3), lambda x: t_softmax(x, 0.5)])
def test_k1_and_all_equal(fn):
    torch.testing.assert_close(fn(torch.tensor([[0.7], [-3.0]])), torch.ones(2, 1))
    torch.testing.assert_close(fn(torch.full((2, 5), 1.5)), torch.full((2, 5), 0.2))


# ---------------------------------------------------------------------------- Table-1 style properties
# multiples of 1/8 and integer shifts: x + shift is exact, so ties and orders survive the shift
finite_rows = st.lists(st.integers(-160, 160), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(values=finite_rows, r=st.floats(0, 1), t=st.floats(0.01, 10), shift=st.integers(-100, 100))
def test_properties(values, r, t, shift):
    x = torch.tensor(values, dtype=torch.float64) / 8
    perm = torch.randperm(len(values), generator=torch.Generator().manual_seed(len(values)))
    for fn in (lambda v: r_softmax(v, r), lambda v: t_softmax(v, t)):
        p = fn(x)
        assert bool((p >= 0).all())
        assert abs(float(p.sum()) - 1) < 1e-9
        torch.testing.assert_close(fn(x + shift), p, atol=1e-9, rtol=0)  # translation invariance
        torch.testing.assert_close(fn(x[perm]), p[perm])  # permutation equivariance
        order = x.argsort()  # monotonicity: x_i <= x_j implies p_i <= p_j
        assert bool((p[order].diff() >= -1e-12).all())


def test_t_softmax_sparsity_monotone_in_t():
    x = torch.randn(50, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    supports = [(t_softmax(x, t) > 0).sum(-1) for t in (0.1, 0.5, 1.0, 2.0, 5.0)]
    for small, large in zip(supports, supports[1:]):
        assert bool((small <= large).all())


# ---------------------------------------------------------------------------- dims, batching
def test_any_dim_and_leading_shape():
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    for dim in (0, 1, 2, -1, -3):
        moved = x.movedim(dim, -1)
        torch.testing.assert_close(r_softmax(x, 0.4, dim=dim), literal_r_softmax(moved, 0.4).movedim(-1, dim))
        torch.testing.assert_close(t_softmax(x, 0.7, dim=dim), literal_t_softmax(moved, 0.7).movedim(-1, dim))
    # a per-row r in x's layout (size 1 along dim)
    r = torch.rand(2, 1, 3, 4, dtype=torch.float64)
    expected = literal_r_softmax(x.movedim(1, -1), r.movedim(1, -1)).movedim(-1, 1)
    torch.testing.assert_close(r_softmax(x, r, dim=1), expected)


def test_per_row_ranks_grouped_and_sorted_paths():
    """Rows whose quantile rank differs (per-row r, masks) take the grouped-kthvalue or sort path."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 30, dtype=torch.float64, generator=g)
    few = torch.tensor([0.2, 0.7], dtype=torch.float64).repeat(20)  # 2 distinct ranks
    many = torch.rand(40, dtype=torch.float64, generator=g)  # many distinct ranks
    for r in (few, many):
        torch.testing.assert_close(r_softmax(x, r), literal_r_softmax(x, r))


# ---------------------------------------------------------------------------- gradients
def _dd(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_()


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_gradcheck_x(dim):
    x = _dd(4, 6, 5, seed=dim + 10)
    assert gradcheck(lambda v: r_softmax(v, 0.37, dim=dim), (x,))
    assert gradcheck(lambda v: r_softmax(v, 0.0, dim=dim), (x,))
    assert gradcheck(lambda v: t_softmax(v, 0.9, dim=dim), (x,))


def test_gradcheck_r_and_t():
    x = _dd(6, 7, seed=1)
    # r away from the kinks r (n - 1) in Z
    r = (torch.tensor([0.05, 0.2, 0.41, 0.55, 0.7, 0.9], dtype=torch.float64)).unsqueeze(1).requires_grad_()
    assert gradcheck(lambda v, rr: r_softmax(v, rr), (x, r))
    t = torch.tensor([[0.3], [0.8], [1.5], [2.0], [0.6], [4.0]], dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, tt: t_softmax(v, tt), (x, t))
    t0 = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)  # a shared scalar t
    assert gradcheck(lambda v, tt: t_softmax(v, tt), (x, t0))


def test_gradcheck_with_masks():
    mask = torch.tensor([[True, False, True, True, False, True],
                         [False, False, False, False, False, False],
                         [True] * 6,
                         [False, True, True, False, True, True]])
    x = _dd(4, 6, seed=2)

    def masked(fn):
        return lambda v: fn(torch.where(mask, v, torch.full_like(v, NEG_INF)))

    assert gradcheck(masked(lambda v: r_softmax(v, 0.45)), (x,))
    assert gradcheck(masked(lambda v: t_softmax(v, 0.8)), (x,))


def test_double_backward_raises_clearly():
    x = _dd(3, 5)
    for fn in (lambda v: r_softmax(v, 0.4), lambda v: t_softmax(v, 1.0)):
        with pytest.raises(RuntimeError, match="double backward"):
            torch.autograd.grad(fn(x)[:, 0].sum(), x, create_graph=True)
        (g,) = torch.autograd.grad(fn(x)[:, 0].sum(), x)  # first order still fine
        assert torch.isfinite(g).all()


def test_saves_output_plus_one_tensor():
    """Memory kept for backward: the output, e = p / w (unavoidable 1/w terms) and per-row scalars."""
    x = torch.randn(8, 50, requires_grad=True)
    for fn, cls in ((lambda v: r_softmax(v, 0.5), RSoftmaxFunction), (lambda v: t_softmax(v, 1.0), TSoftmaxFunction)):
        out = fn(x)
        assert type(out.grad_fn).__name__ == cls.__name__ + "Backward"
        saved = [t for t in out.grad_fn.saved_tensors if t is not None]
        full = [t for t in saved if t.numel() == x.numel()]
        assert len(full) == 2
        assert any(t.data_ptr() == out.data_ptr() for t in full)  # one of them is the output itself
        assert all(t.numel() <= x.shape[0] for t in saved if t.numel() != x.numel())


# ---------------------------------------------------------------------------- masks and edge cases
@pytest.mark.parametrize("r", [0.0, 0.3, 0.5, 0.8])
def test_neg_inf_entries_are_not_there(r):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5, 9, dtype=torch.float64, generator=g)
    mask = torch.rand(5, 9, generator=g) < 0.4
    mask[:, 0] = False  # at least one valid entry per row
    xm = x.masked_fill(mask, NEG_INF)
    p = r_softmax(xm, r)
    pt = t_softmax(xm, 0.7)
    assert bool((p[mask] == 0).all()) and bool((pt[mask] == 0).all())
    for i in range(5):  # the same as the row without the masked entries
        torch.testing.assert_close(p[i, ~mask[i]], r_softmax(x[i, ~mask[i]], r))
        torch.testing.assert_close(pt[i, ~mask[i]], t_softmax(x[i, ~mask[i]], 0.7))


@pytest.mark.parametrize("fn", [lambda x: r_softmax(x, 0.5), lambda x: t_softmax(x, 1.0)])
def test_empty_rows_zero_output_and_gradient(fn):
    x = torch.tensor([[NEG_INF] * 4, [0.5, 1.0, NEG_INF, 2.0]], requires_grad=True)
    p = fn(x)
    assert torch.equal(p[0], torch.zeros(4))
    assert abs(float(p[1].detach().sum()) - 1) < 1e-6
    p.backward(torch.randn(2, 4))
    assert torch.isfinite(x.grad).all() and torch.equal(x.grad[0], torch.zeros(4))


@pytest.mark.parametrize("fn", [lambda x: r_softmax(x, 0.5), lambda x: t_softmax(x, 1.0)])
def test_nan_stays_in_its_row(fn):
    x = torch.tensor([[0.5, float("nan"), 1.0], [0.1, 0.2, 0.3]])
    p = fn(x)
    assert bool(torch.isnan(p[0]).all())
    assert bool(torch.isfinite(p[1]).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    x = torch.randn(16, 33, generator=torch.Generator().manual_seed(9)) * 3
    res = torch.finfo(dtype).eps * 4
    for fn in (lambda v: r_softmax(v, 0.5), lambda v: t_softmax(v, 1.0)):
        p = fn(x.to(dtype))
        assert p.dtype == dtype
        assert float((p.float().sum(-1) - 1).abs().max()) <= res
        torch.testing.assert_close(p.float(), fn(x.to(dtype).float()), atol=res, rtol=0)
    xr = x.to(dtype).requires_grad_()
    r_softmax(xr, 0.5).sum().backward()
    assert xr.grad.dtype == dtype


def test_t_below_the_max_resolution_is_the_one_hot_limit():
    """t smaller than max(x)'s float32 spacing makes m - t == m; Theorem 1's limit is one-hot."""
    x = torch.tensor([[1e4, 1e4 - 1.0, 0.0]], requires_grad=True)
    p = t_softmax(x, 1e-5)
    torch.testing.assert_close(p, torch.tensor([[1.0, 0.0, 0.0]]))
    p.backward(torch.randn(1, 3))
    assert torch.equal(x.grad, torch.zeros(1, 3))


def test_large_magnitudes():
    x = (torch.randn(8, 64, generator=torch.Generator().manual_seed(10)) * 1e4).requires_grad_()
    for fn in (lambda v: r_softmax(v, 0.5), lambda v: t_softmax(v, 1e3)):
        p = fn(x)
        assert torch.isfinite(p).all()
        (p * torch.randn_like(p)).sum().backward()
        assert torch.isfinite(x.grad).all()
        x.grad = None


# ---------------------------------------------------------------------------- arguments
def test_bad_arguments():
    x = torch.randn(2, 5)
    for r in (-0.1, 1.01, float("nan"), torch.tensor([0.5, 1.5])):
        with pytest.raises(ValueError, match="r"):
            r_softmax(x, r)
    for t in (0.0, -1.0, torch.tensor([1.0, -0.5])):
        with pytest.raises(ValueError, match="t"):
            t_softmax(x, t)
    with pytest.raises(TypeError):
        r_softmax(torch.arange(5), 0.5)
    with pytest.raises(TypeError):
        t_softmax(torch.arange(5), 1.0)
    with pytest.raises(ValueError, match="r of shape"):
        r_softmax(x, torch.full((3,), 0.5))
    with pytest.raises(ValueError, match="r"):
        RSoftmax(r=2.0)
    with pytest.raises(ValueError, match="t"):
        TSoftmax(t=0.0)


# ---------------------------------------------------------------------------- modules
def test_modules():
    x = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(RSoftmax(r=0.3, dim=1)(x), r_softmax(x, 0.3, dim=1))
    per_row = torch.tensor([0.1, 0.5, 0.9]).reshape(3, 1, 1)
    torch.testing.assert_close(RSoftmax(dim=-1)(x, r=per_row), r_softmax(x, per_row))
    torch.testing.assert_close(TSoftmax(t=0.7, dim=0)(x), t_softmax(x, 0.7, dim=0))
    fixed = TSoftmax(t=0.7)
    assert len(list(fixed.parameters())) == 0


def test_learnable_t_trains_and_stays_positive():
    torch.manual_seed(0)
    module = TSoftmax(t=0.05, learnable=True)
    assert [name for name, _ in module.named_parameters()] == ["log_t"]
    x = torch.randn(64, 8)
    target = torch.softmax(x, -1)  # reachable only with a large t (Theorem 1)
    opt = torch.optim.Adam(module.parameters(), lr=0.1)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = (module(x) - target).pow(2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert float(module.t.detach()) > 0.05


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_zero_size_inputs(shape):
    for fn in (lambda v: r_softmax(v, 0.5), lambda v: t_softmax(v, 1.0)):
        x = torch.randn(shape, requires_grad=True)
        out = fn(x)
        assert out.shape == shape
        out.sum().backward()
        assert x.grad.shape == shape
