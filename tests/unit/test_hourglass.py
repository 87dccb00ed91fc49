"""Sparsehourglass (Laha et al. 2018): sparsemax(alpha(z) z), alpha(z) = (1 + qK) / (|sum z| + qK)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

from sparsenorm import SparseHourglass, sparsehourglass

NEG_INF = float("-inf")


def sort_sparsemax(z):
    """Independent sparsemax of a 1-D tensor by sorting (Martins & Astudillo, Alg. 1)."""
    z_sorted, _ = torch.sort(z, descending=True)
    cumsum = z_sorted.cumsum(0)
    ks = torch.arange(1, z.numel() + 1, dtype=z.dtype)
    support = 1 + ks * z_sorted > cumsum
    k = int(support.nonzero().max()) + 1
    tau = (cumsum[k - 1] - 1) / k
    return torch.clamp(z - tau, min=0)


def literal_hourglass(z, q):
    """README formula on the finite entries of a 1-D tensor; -inf entries get 0."""
    valid = z > NEG_INF
    zv = z[valid]
    k = zv.numel()
    alpha = (1 + q * k) / (abs(float(zv.sum())) + q * k)
    out = torch.zeros_like(z)
    out[valid] = sort_sparsemax(alpha * zv)
    return out


@pytest.mark.parametrize("q", [0.01, 0.3, 1.0, 10.0])
def test_matches_readme_formula(q):
    x = torch.randn(20, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2 + 0.5
    expected = torch.stack([literal_hourglass(row, q) for row in x])
    torch.testing.assert_close(sparsehourglass(x, q), expected)


def test_large_q_is_sparsemax_and_small_q_sparser():
    x = torch.randn(30, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    plain = torch.stack([sort_sparsemax(row) for row in x])
    torch.testing.assert_close(sparsehourglass(x, 1e9), plain)
    # alpha >= 1 exactly when |sum z| <= 1: there a smaller q gives a larger alpha, a smaller support
    near_zero_sum = x - x.mean(-1, keepdim=True)
    sizes = [(sparsehourglass(near_zero_sum, q) > 0).sum(-1) for q in (10.0, 1.0, 0.1, 0.01)]
    for dense, sparse in zip(sizes, sizes[1:]):
        assert bool((sparse <= dense).all())


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_any_dim(dim):
    x = torch.randn(3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    moved = x.movedim(dim, -1)
    expected = torch.stack([literal_hourglass(row, 0.5) for row in moved.reshape(-1, moved.shape[-1])])
    torch.testing.assert_close(sparsehourglass(x, 0.5, dim=dim), expected.reshape(moved.shape).movedim(-1, dim))


# ---------------------------------------------------------------------------- properties
rows = st.lists(st.integers(-80, 80), min_size=1, max_size=10)  # multiples of 1/8: exact shifts


@settings(max_examples=60, deadline=None)
@given(values=rows, q=st.floats(0.01, 10))
def test_simplex_permutation_monotonicity(values, q):
    x = torch.tensor(values, dtype=torch.float64) / 8
    p = sparsehourglass(x, q)
    assert bool((p >= 0).all()) and abs(float(p.sum()) - 1) < 1e-9
    perm = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(x.numel()))
    torch.testing.assert_close(sparsehourglass(x[perm], q), p[perm])
    order = x.argsort()
    assert bool((p[order].diff() >= -1e-12).all())


@settings(max_examples=60, deadline=None)
@given(values=rows, q=st.floats(0.01, 10), shift=st.integers(-40, 40))
def test_translation_changes_alpha_not_the_formula(values, q, shift):
    """Not translation invariant (alpha uses |sum z|): a shift acts only through alpha(z + c)."""
    x = torch.tensor(values, dtype=torch.float64) / 8
    shifted = x + shift
    torch.testing.assert_close(sparsehourglass(shifted, q), literal_hourglass(shifted, q))


def test_not_translation_invariant_example():
    x = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    a, b = sparsehourglass(x, 1.0), sparsehourglass(x + 10, 1.0)
    assert not torch.allclose(a, b)
    # sparsemax itself is: the difference is alpha alone
    torch.testing.assert_close(sort_sparsemax(x), sort_sparsemax(x + 10))


def test_k1_and_all_equal():
    torch.testing.assert_close(sparsehourglass(torch.tensor([[3.0], [-2.0]])), torch.ones(2, 1))
    torch.testing.assert_close(sparsehourglass(torch.full((2, 4), 0.7)), torch.full((2, 4), 0.25))


# ---------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("q", [0.2, 1.0, 5.0])
def test_gradcheck_x(q):
    x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
    assert gradcheck(lambda v: sparsehourglass(v, q), (x,))
    assert gradcheck(lambda v: sparsehourglass(v, q, dim=0), (x,))


def test_gradcheck_q_and_masks():
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).requires_grad_()
    q = torch.tensor([[0.3], [1.0], [2.0], [0.05]], dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, qq: sparsehourglass(v, qq), (x, q))
    mask = torch.tensor([[True, False, True, True, False, True], [False] * 6, [True] * 6,
                         [False, True, True, False, True, True]])
    assert gradcheck(lambda v: sparsehourglass(torch.where(mask, v, torch.full_like(v, NEG_INF)), 0.7), (x,))


# ---------------------------------------------------------------------------- masks and edge cases
def test_neg_inf_padding_excluded_from_sum_and_k():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(6, 8, dtype=torch.float64, generator=g) + 1.0
    mask = torch.rand(6, 8, generator=g) < 0.4
    mask[:, 0] = False
    p = sparsehourglass(x.masked_fill(mask, NEG_INF), 0.5)
    assert bool((p[mask] == 0).all())
    for i in range(6):
        torch.testing.assert_close(p[i, ~mask[i]], sparsehourglass(x[i, ~mask[i]], 0.5))


def test_empty_row_and_nan():
    x = torch.tensor([[NEG_INF] * 3, [0.2, -0.1, 0.4], [0.1, float("nan"), 0.0]], requires_grad=True)
    p = sparsehourglass(x)
    assert torch.equal(p[0].detach(), torch.zeros(3))
    assert abs(float(p[1].detach().sum()) - 1) < 1e-6
    assert bool(torch.isnan(p[2]).all())
    p[:2].backward(torch.randn(2, 3))
    assert torch.equal(x.grad[0], torch.zeros(3)) and torch.isfinite(x.grad[:2]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    x = torch.randn(16, 40, generator=torch.Generator().manual_seed(7)) * 3
    p = sparsehourglass(x.to(dtype), 0.5)
    assert p.dtype == dtype
    res = torch.finfo(dtype).eps * 4
    assert float((p.float().sum(-1) - 1).abs().max()) <= res
    torch.testing.assert_close(p.float(), sparsehourglass(x.to(dtype).float(), 0.5), atol=res, rtol=0)


def test_large_magnitudes():
    x = (torch.randn(8, 64, generator=torch.Generator().manual_seed(8)) * 1e4).requires_grad_()
    p = sparsehourglass(x, 1.0)
    assert torch.isfinite(p).all()
    (p * torch.randn_like(p)).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_bad_arguments():
    x = torch.randn(2, 4)
    for q in (0.0, -1.0, float("nan"), torch.tensor([1.0, -2.0])):
        with pytest.raises(ValueError, match="q"):
            sparsehourglass(x, q)
    with pytest.raises(ValueError, match="q"):
        SparseHourglass(q=0.0)
    with pytest.raises(TypeError):
        sparsehourglass(torch.arange(4), 1.0)


def test_module():
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(SparseHourglass(q=0.3, dim=1)(x), sparsehourglass(x, 0.3, dim=1))
    assert len(list(SparseHourglass().parameters())) == 0


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_zero_size_inputs(shape):
    x = torch.randn(shape, requires_grad=True)
    out = sparsehourglass(x)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == shape
