"""sparsemax, entmax15, sparsemax_bisect, entmax_bisect: exactness, gradients, edge cases.

Oracles: the ``entmax`` package (same API, sort-based), the optimality (KKT) conditions of each
map, and the worked examples of the ev-softmax paper's slides / Fig. 1.
"""
from __future__ import annotations

import contextlib
import math

import entmax
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

import sparsenorm
from sparsenorm import (
    Entmax15,
    EntmaxBisect,
    Sparsemax,
    SparsemaxBisect,
    entmax15,
    entmax_bisect,
    sparsemax,
    sparsemax_bisect,
)

EXACT = {"sparsemax": sparsemax, "entmax15": entmax15}
REFERENCE = {"sparsemax": entmax.sparsemax, "entmax15": entmax.entmax15}
ALL_MAPS = [sparsemax, entmax15, sparsemax_bisect, entmax_bisect]
TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def _kkt_threshold(x: torch.Tensor, p: torch.Tensor, name: str, dim: int = -1) -> torch.Tensor:
    """Check the optimality conditions of ``p`` for input ``x``; return the implied threshold.

    sparsemax: p = [x - tau]_+ ; 1.5-entmax: p = [x/2 - tau]_+^2 -- one scalar tau per row, the
    support strictly above it, every other entry at or below it. Independent of any algorithm.
    """
    z, r = (x, p) if name == "sparsemax" else (x / 2, p.sqrt())
    on = p > 0
    tau_each = torch.where(on, z - r, torch.nan)
    tau = tau_each.nanmean(dim, keepdim=True)
    spread = torch.where(on, (tau_each - tau).abs(), torch.zeros_like(z)).amax(dim)
    assert float(spread.max()) < 1e-9 * max(1.0, float(x.abs().max()))
    off_excess = torch.where(on, torch.full_like(z, -math.inf), z - tau).amax(dim)
    assert float(off_excess.max()) <= 1e-9 * max(1.0, float(x.abs().max()))
    return tau


# ----------------------------------------------------------------------------- worked examples

def test_fig1_worked_examples():
    """ev-softmax slides / Fig. 1: sparsemax(1.3, 0.37, -0.67) = (0.97, 0.03, 0), (0.4, 1.4, -0.8) -> (0, 1, 0)."""
    x = torch.tensor([[1.3, 0.37, -0.67], [0.4, 1.4, -0.8]], dtype=torch.float64)
    p = sparsemax(x)
    # The slides round to two decimals; the exact values: tau = (1.3 + 0.37 - 1) / 2 = 0.335.
    assert torch.allclose(p, torch.tensor([[0.965, 0.035, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(p, torch.tensor([[0.97, 0.03, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64), atol=0.006)
    # Softmax on the same inputs keeps every entry (the slides' point of comparison).
    assert (torch.softmax(x, -1) > 0).all()


def test_two_class_closed_form():
    """Martins & Astudillo (2016), Sec. 2.2: sparsemax([t, 0])_1 = clip((t + 1) / 2, 0, 1)."""
    t = torch.linspace(-3, 3, 61, dtype=torch.float64)
    x = torch.stack([t, torch.zeros_like(t)], -1)
    assert torch.allclose(sparsemax(x)[:, 0], ((t + 1) / 2).clamp(0, 1), atol=1e-12)
    # 1.5-entmax in 2-D is the same with [t/2 - tau]_+^2: p1 solves sqrt(p1) - sqrt(1-p1) = t/2.
    p1 = entmax15(x)[:, 0]
    inside = (p1 > 0) & (p1 < 1)
    assert torch.allclose((p1.sqrt() - (1 - p1).sqrt())[inside], t[inside] / 2, atol=1e-10)


# ----------------------------------------------------------------------------- agreement with entmax

@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [None, 1, 2, 5, 64])
def test_matches_entmax_package_all_dims(name, dtype, k):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 9, dtype=dtype) * 3
    for dim in (-3, -2, -1, 0, 1, 2):
        ours = EXACT[name](x, dim=dim, k=k)
        ref = REFERENCE[name](x, dim=dim % 3, k=k)  # entmax's k path breaks with dim < 0
        assert ours.dtype == dtype and ours.shape == x.shape
        assert torch.allclose(ours, ref, atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-3, 0.3, 3.0, 100.0])
def test_matches_entmax_package_wide_rows(name, dtype, scale):
    """Rows of 2000: small scales exercise the dense (sorting) path, large ones the candidate path."""
    torch.manual_seed(1)
    x = torch.randn(16, 2000, dtype=dtype) * scale
    for dim in (-1, 0):
        xd = x if dim == -1 else x.T.contiguous().T  # same values, normalized along dim 0 of x.T
        ours = EXACT[name](xd.T if dim == 0 else xd, dim=dim)
        ref = REFERENCE[name](xd.T if dim == 0 else xd, dim=dim % 2)
        assert torch.allclose(ours, ref, atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("n_cols", [4096, 4099])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_long_rows_values_and_gradients(name, n_cols, dtype):
    """Long rows: 4096 columns use the blockwise candidate path (forward and backward); 4099 (prime)
    cannot be split into blocks and iterates on whole rows. Masks and a flat row included."""
    torch.manual_seed(15)
    x = torch.randn(6, n_cols, dtype=dtype) * 3
    x[1, ::3] = -math.inf
    x[2] = torch.randn(n_cols, dtype=dtype) * 1e-3  # almost flat: dense support
    x[4, 100:] = -math.inf
    xr = x.clone().requires_grad_(True)
    ours = EXACT[name](xr)
    assert torch.allclose(ours, REFERENCE[name](x), atol=TOL[dtype], rtol=0)
    g = torch.randn_like(x)
    (grad,) = torch.autograd.grad(ours, xr, g)
    xe = x.clone().requires_grad_(True)
    (grad_ref,) = torch.autograd.grad(REFERENCE[name](xe), xe, g)
    assert torch.allclose(grad, grad_ref, atol=1e3 * TOL[dtype], rtol=0)
    # The stride-0 gradient of a sum, and half precision, through the same paths.
    (grad_sum,) = torch.autograd.grad(EXACT[name](xr).sum(), xr)
    assert grad_sum.abs().max() < 1e-4
    xh = x.to(torch.bfloat16).requires_grad_(True)
    ph = EXACT[name](xh)
    assert (ph.float().sum(-1) - 1).abs().max() <= 2 ** -8
    (gh,) = torch.autograd.grad(ph, xh, g.to(torch.bfloat16))
    assert torch.isfinite(gh).all()


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("n_cols", [50, 4096])
def test_sort_fallback_when_iterations_run_out(name, n_cols, monkeypatch):
    """Rows not converged after the iteration cap are solved by sorting; force that with a cap of 1."""
    from sparsenorm.kernels.reference import projection as _threshold

    monkeypatch.setattr(_threshold, "_MAX_ITER", 1)
    torch.manual_seed(16)
    x = torch.randn(5, n_cols, dtype=torch.float64) * 3
    with sparsenorm.kernels.disabled():  # the iteration is the CPU path without the C++ kernel
        assert torch.allclose(EXACT[name](x), REFERENCE[name](x), atol=1e-12, rtol=0)
        assert torch.allclose(EXACT[name](x, k=2), REFERENCE[name](x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_recompute_mode_for_large_inputs(name, monkeypatch):
    """Large inputs recompute the shifted rows on every pass instead of storing them; force it."""
    from sparsenorm.kernels.reference import projection as _threshold

    monkeypatch.setattr(_threshold, "_RECOMPUTE_BYTES", 0)
    torch.manual_seed(17)
    x = torch.randn(7, 300, dtype=torch.float64) * 3
    x[1, :200] = -math.inf
    x[3] = -math.inf
    x[5] *= 1e-3
    with sparsenorm.kernels.disabled():
        p = EXACT[name](x)
    rows = [0, 1, 2, 4, 5, 6]  # entmax 1.3 crashes on the all -inf row 3
    assert torch.allclose(p[rows], REFERENCE[name](x[rows]), atol=1e-12, rtol=0)
    assert torch.equal(p[3], torch.zeros(300, dtype=torch.float64))
    x[2, 7] = math.nan
    p = EXACT[name](x)
    assert torch.isnan(p[2]).all() and torch.isfinite(p[[0, 1, 3, 4, 5, 6]]).all()


def test_slowly_converging_row():
    """A row on which Michelot's iteration drops one entry per pass (support shrinks slowly)."""
    z = -torch.cumsum(torch.full((200,), 0.011, dtype=torch.float64), 0)
    x = torch.stack([z, z.flip(0), z * 0.1])
    for name in EXACT:
        assert torch.allclose(EXACT[name](x), REFERENCE[name](x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_nan_and_empty_rows_in_long_rows(name):
    x = torch.randn(3, 4096) * 3
    x[0, 5] = math.nan
    x[1] = -math.inf
    xr = x.clone().requires_grad_(True)
    p = EXACT[name](xr)
    assert torch.isnan(p[0]).all() and torch.equal(p[1], torch.zeros(4096))
    assert torch.isclose(p[2].sum(), torch.tensor(1.0))
    (g,) = torch.autograd.grad(p, xr, torch.randn_like(x))
    assert torch.equal(g[1], torch.zeros(4096)) and torch.isfinite(g[2]).all()


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
def test_rows_with_very_different_support_sizes(name):
    """One nearly flat row (thousands of candidates) among sharp rows: the bucketed path."""
    torch.manual_seed(2)
    x = torch.randn(40, 3000, dtype=torch.float64) * 10
    x[3] = torch.randn(3000, dtype=torch.float64) * 1e-3
    x[7] = torch.randn(3000, dtype=torch.float64) * 0.05
    ours = EXACT[name](x)
    assert torch.allclose(ours, REFERENCE[name](x), atol=1e-12, rtol=0)
    assert (ours[3] > 0).sum() > 1000


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("dim", [-2, 0, 1, -1])
def test_gradients_match_entmax_package(name, dim):
    torch.manual_seed(3)
    x = (torch.randn(5, 7, dtype=torch.float64) * 2).requires_grad_(True)
    g = torch.randn(5, 7, dtype=torch.float64)
    (ours,) = torch.autograd.grad(EXACT[name](x, dim=dim), x, g)
    (ref,) = torch.autograd.grad(REFERENCE[name](x, dim=dim % 2), x, g)
    assert torch.allclose(ours, ref, atol=1e-12)


def test_bisect_matches_entmax_package():
    torch.manual_seed(4)
    x = torch.randn(6, 11, dtype=torch.float64) * 2
    for dim in (-1, 0):
        for alpha in (1.2, 1.5, 2.0, 3.0):
            assert torch.allclose(entmax_bisect(x, alpha, dim=dim), entmax.entmax_bisect(x, alpha, dim=dim), atol=1e-12)
        assert torch.allclose(sparsemax_bisect(x, dim=dim), entmax.sparsemax_bisect(x, dim=dim), atol=1e-12)
    alpha = torch.tensor([[1.1], [1.3], [1.5], [1.9], [2.5], [4.0]], dtype=torch.float64, requires_grad=True)
    xr = x.clone().requires_grad_(True)
    g = torch.randn_like(x)
    ours = torch.autograd.grad(entmax_bisect(xr, alpha), (xr, alpha), g)
    ref = torch.autograd.grad(entmax.entmax_bisect(xr, alpha), (xr, alpha), g)
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=1e-10)


def test_bisect_agrees_with_exact_maps():
    torch.manual_seed(5)
    x = torch.randn(8, 30, dtype=torch.float64) * 2
    assert torch.allclose(sparsemax_bisect(x), sparsemax(x), atol=1e-12)
    assert torch.allclose(entmax_bisect(x, 2.0), sparsemax(x), atol=1e-12)
    assert torch.allclose(entmax_bisect(x, 1.5), entmax15(x), atol=1e-12)
    assert torch.allclose(entmax_bisect(x, 1.0), torch.softmax(x, -1), atol=1e-15)
    # Per-row alpha, including the softmax limit in one row.
    alpha = torch.tensor([1.0, 1.5, 2.0, 1.5, 1.0, 2.0, 1.5, 1.5], dtype=torch.float64).unsqueeze(1)
    out = entmax_bisect(x, alpha)
    for i, a in enumerate(alpha.squeeze(1).tolist()):
        expect = {1.0: torch.softmax(x[i], -1), 1.5: entmax15(x[i]), 2.0: sparsemax(x[i])}[a]
        assert torch.allclose(out[i], expect, atol=1e-12)


def test_sparsemax_bisect_honours_n_iter():
    """The entmax package ignores n_iter in sparsemax_bisect (always 50); here it is used."""
    x = torch.randn(4, 20, dtype=torch.float64)
    coarse = sparsemax_bisect(x, n_iter=3, ensure_sum_one=False)
    fine = sparsemax_bisect(x, n_iter=60, ensure_sum_one=False)
    assert (coarse - fine).abs().max() > 1e-4
    assert torch.allclose(fine, sparsemax(x), atol=1e-12)
    assert torch.allclose(SparsemaxBisect()(x), sparsemax(x), atol=1e-12)  # n_iter=None -> 50


# ----------------------------------------------------------------------------- the entmax package's defects, fixed

def test_negative_dim_with_k():
    torch.manual_seed(6)
    x = torch.randn(3, 4, 5)
    with pytest.raises(RuntimeError):  # the defect is real in entmax 1.3
        entmax.sparsemax(x, dim=-2, k=2)
    for name in ("sparsemax", "entmax15"):
        assert torch.allclose(EXACT[name](x, dim=-2, k=2), REFERENCE[name](x, dim=1), atol=1e-6)


@pytest.mark.parametrize("fn", ALL_MAPS, ids=lambda f: f.__name__)
def test_all_neg_inf_row_gives_zeros_and_zero_gradient(fn):
    x = torch.tensor([[-math.inf] * 4, [1.0, 2.0, -math.inf, 0.5]], dtype=torch.float64, requires_grad=True)
    p = fn(x)
    assert torch.equal(p[0], torch.zeros(4, dtype=torch.float64))
    assert p[1, 2] == 0 and torch.isclose(p[1].sum(), torch.tensor(1.0, dtype=torch.float64))
    (g,) = torch.autograd.grad(p, x, torch.randn(2, 4, dtype=torch.float64))
    assert torch.equal(g[0], torch.zeros(4, dtype=torch.float64))
    assert torch.isfinite(g).all()


def test_entmax_package_crashes_on_all_neg_inf_row():
    with pytest.raises(RuntimeError):
        entmax.sparsemax(torch.full((1, 3), -math.inf))


def test_bf16_entmax15_sums_to_one():
    torch.manual_seed(7)
    x = (torch.randn(200, 50) * 2).bfloat16()
    # entmax 1.3 computes in bf16 and misses by far more than bf16's resolution.
    assert (entmax.entmax15(x).float().sum(-1) - 1).abs().max() > 2 ** -8
    for fn in ALL_MAPS:
        p = fn(x)
        assert p.dtype == torch.bfloat16
        assert (p.float().sum(-1) - 1).abs().max() <= 2 ** -8


@pytest.mark.parametrize("fn", [sparsemax, entmax15, lambda x: entmax_bisect(x, 1.5), lambda x: entmax_bisect(x, 1.3)])
def test_double_backward(fn):
    torch.manual_seed(8)
    x = (torch.randn(3, 6, dtype=torch.float64) * 2).requires_grad_(True)
    assert gradgradcheck(fn, (x,))
    (g,) = torch.autograd.grad(fn(x), x, torch.randn_like(x), create_graph=True)
    (gg,) = torch.autograd.grad(g.pow(2).sum(), x)
    assert torch.isfinite(gg).all()


def test_entmax_package_double_backward_is_nan():
    torch.manual_seed(8)
    x = (torch.randn(3, 6, dtype=torch.float64) * 2).requires_grad_(True)
    (g,) = torch.autograd.grad(entmax.entmax15(x), x, torch.randn_like(x), create_graph=True)
    (gg,) = torch.autograd.grad(g.pow(2).sum(), x)
    assert torch.isnan(gg).any()


# ----------------------------------------------------------------------------- gradcheck

@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("k", [None, 2])
def test_gradcheck_exact(name, dim, k):
    torch.manual_seed(9)
    x = (torch.randn(3, 4, 5, dtype=torch.float64) * 2).requires_grad_(True)
    assert gradcheck(lambda t: EXACT[name](t, dim=dim, k=k), (x,))


@pytest.mark.parametrize("dim", [0, -1])
def test_gradcheck_bisect(dim):
    torch.manual_seed(10)
    x = (torch.randn(3, 5, dtype=torch.float64) * 2).requires_grad_(True)
    assert gradcheck(lambda t: sparsemax_bisect(t, dim=dim, n_iter=80), (x,))
    assert gradcheck(lambda t: entmax_bisect(t, 1.7, dim=dim, n_iter=80), (x,))


def test_gradcheck_alpha():
    torch.manual_seed(11)
    x = (torch.randn(4, 6, dtype=torch.float64) * 2).requires_grad_(True)
    per_row = torch.tensor([[1.2], [1.5], [2.0], [2.7]], dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda t, a: entmax_bisect(t, a, n_iter=80), (x, per_row))
    shared = torch.tensor(1.4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda t, a: entmax_bisect(t, a, n_iter=80), (x, shared))
    # alpha as a learnable module parameter gets a gradient.
    module = EntmaxBisect(alpha=torch.nn.Parameter(torch.tensor(1.5, dtype=torch.float64)))
    (module(x) * torch.randn_like(x)).sum().backward()
    assert module.alpha.grad is not None and torch.isfinite(module.alpha.grad)


# ----------------------------------------------------------------------------- properties (Table 1)

def _rows(max_k=24):
    return st.integers(1, max_k).flatmap(
        lambda k: st.lists(
            st.lists(st.floats(-30, 30, allow_nan=False, width=64), min_size=k, max_size=k), min_size=1, max_size=4
        )
    )


@settings(max_examples=60, deadline=None)
@given(_rows(), st.sampled_from(["sparsemax", "entmax15"]))
def test_property_simplex_and_kkt(rows, name):
    x = torch.tensor(rows, dtype=torch.float64)
    p = EXACT[name](x)
    assert (p >= 0).all()
    assert torch.allclose(p.sum(-1), torch.ones(len(rows), dtype=torch.float64), atol=1e-12)
    _kkt_threshold(x, p, name)


@settings(max_examples=60, deadline=None)
@given(_rows(), st.floats(-1e3, 1e3), st.sampled_from(["sparsemax", "entmax15"]))
def test_property_translation_invariance(rows, shift, name):
    x = torch.tensor(rows, dtype=torch.float64)
    assert torch.allclose(EXACT[name](x + shift), EXACT[name](x), atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(_rows(), st.randoms(use_true_random=False), st.sampled_from(["sparsemax", "entmax15"]))
def test_property_permutation_equivariance_and_monotonicity(rows, rnd, name):
    x = torch.tensor(rows, dtype=torch.float64)
    perm = list(range(x.shape[-1]))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    p = EXACT[name](x)
    assert torch.allclose(EXACT[name](x[:, perm]), p[:, perm], atol=1e-12)
    # Monotonic (ev-softmax paper, Table 1 / App. C): x_i >= x_j  =>  p_i >= p_j.
    bigger = x.unsqueeze(-1) >= x.unsqueeze(-2)
    assert (p.unsqueeze(-1) >= p.unsqueeze(-2) - 1e-12)[bigger].all()


@settings(max_examples=40, deadline=None)
@given(_rows())
def test_property_sparsemax_idempotent_and_support_rule(rows):
    """Table 1: sparsemax is idempotent. Support rule (Martins & Astudillo, Prop. 1): with
    z_(1) >= z_(2) >= ..., the support size is max{r : 1 + r z_(r) > sum_{j <= r} z_(j)}."""
    x = torch.tensor(rows, dtype=torch.float64)
    p = sparsemax(x)
    assert torch.allclose(sparsemax(p), p, atol=1e-12)
    srt, order = x.sort(-1, descending=True)
    r = torch.arange(1, x.shape[-1] + 1, dtype=torch.float64)
    margin = 1 + r * srt - srt.cumsum(-1)
    p_sorted = p.gather(-1, order)
    # Entries whose condition is decided only by rounding (margin ~ 1e-15) may go either way.
    clear = 1e-9 * max(1.0, float(x.abs().max()))
    assert (p_sorted[margin > clear] > 0).all()
    assert (p_sorted[margin < -clear] == 0).all()


@settings(max_examples=40, deadline=None)
@given(_rows(), st.sampled_from([1.0, 1.25, 1.5, 2.0, 3.0]))
def test_property_entmax_bisect_simplex(rows, alpha):
    x = torch.tensor(rows, dtype=torch.float64)
    p = entmax_bisect(x, alpha)
    assert (p >= 0).all() and torch.allclose(p.sum(-1), torch.ones(len(rows), dtype=torch.float64), atol=1e-12)
    if alpha > 1:  # p = [(alpha - 1) x - tau]_+^(1/(alpha-1)) with one tau per row
        on = p > 0
        tau = torch.where(on, (alpha - 1) * x - p ** (alpha - 1), torch.nan)
        spread = (tau - tau.nanmean(-1, keepdim=True)).abs().nan_to_num(0)
        assert float(spread.max()) < 1e-6 * max(1.0, float(x.abs().max()))


# ----------------------------------------------------------------------------- edge cases

@pytest.mark.parametrize("fn", ALL_MAPS, ids=lambda f: f.__name__)
def test_k1_equal_entries_masks(fn):
    assert torch.equal(fn(torch.tensor([[3.7]])), torch.tensor([[1.0]]))
    assert torch.allclose(fn(torch.full((2, 5), 0.3)), torch.full((2, 5), 0.2))
    x = torch.tensor([[0.1, -math.inf, 0.3, -math.inf, 0.2]], dtype=torch.float64)
    p = fn(x)
    assert p[0, 1] == 0 and p[0, 3] == 0
    assert torch.allclose(p[:, [0, 2, 4]], fn(x[:, [0, 2, 4]]), atol=1e-12)


@pytest.mark.parametrize("fn", ALL_MAPS, ids=lambda f: f.__name__)
def test_nan_stays_in_its_row(fn):
    x = torch.tensor([[0.1, math.nan, 0.3], [0.5, 1.0, 2.0]], requires_grad=True)
    p = fn(x)
    assert torch.isnan(p[0]).all()
    assert torch.isfinite(p[1]).all() and torch.isclose(p[1].sum(), torch.tensor(1.0))
    (g,) = torch.autograd.grad(p, x, torch.ones_like(p))
    assert torch.isfinite(g[1]).all()


@pytest.mark.parametrize("fn", ALL_MAPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(fn, dtype):
    torch.manual_seed(12)
    x32 = torch.randn(30, 40) * 2
    x = x32.to(dtype).requires_grad_(True)
    p = fn(x)
    assert p.dtype == dtype
    resolution = torch.finfo(dtype).eps
    assert (p.float().sum(-1) - 1).abs().max() <= resolution
    assert torch.allclose(p.float(), fn(x.detach().float()), atol=2 * resolution)
    (g,) = torch.autograd.grad(p, x, torch.randn(30, 40).to(dtype))
    assert g.dtype == dtype and torch.isfinite(g).all()


@pytest.mark.parametrize("fn", ALL_MAPS, ids=lambda f: f.__name__)
def test_large_magnitudes(fn):
    torch.manual_seed(13)
    x = (torch.randn(20, 64) * 1e4).requires_grad_(True)
    p = fn(x)
    assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(20), atol=1e-5)
    (g,) = torch.autograd.grad(p, x, torch.randn(20, 64))
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("fn", ALL_MAPS, ids=lambda f: f.__name__)
def test_empty_and_zero_dim_inputs(fn):
    assert fn(torch.zeros(0, 5)).shape == (0, 5)
    assert fn(torch.zeros(3, 0, 4), dim=1).shape == (3, 0, 4)
    assert torch.allclose(fn(torch.tensor([2.0, 1.0, -5.0])).sum(), torch.tensor(1.0))


def test_bad_arguments():
    x = torch.randn(2, 3)
    for fn in ALL_MAPS:
        with pytest.raises(TypeError):
            fn(torch.tensor([[1, 2, 3]]))
        with pytest.raises(IndexError):
            fn(x, dim=2)
    for fn in (sparsemax, entmax15):
        for k in (0, -1):
            with pytest.raises(ValueError, match="k"):
                fn(x, k=k)
        with pytest.raises(TypeError, match="k"):
            fn(x, k=2.5)
    with pytest.raises(ValueError, match="alpha"):  # 0 < alpha < 1 is accepted, as by entmax
        entmax_bisect(x, alpha=0.0)
    with pytest.raises(ValueError, match="alpha"):
        entmax_bisect(x, alpha=torch.tensor([[1.5], [-0.1]]))
    with pytest.raises(ValueError, match="alpha"):
        entmax_bisect(x, alpha=torch.ones(3, 3) * 1.5)
    with pytest.raises(ValueError, match="n_iter"):
        entmax_bisect(x, n_iter=0)
    with pytest.raises(ValueError, match="n_iter"):
        sparsemax_bisect(x, n_iter=0)
    with pytest.raises(ValueError, match="k"):
        Sparsemax(k=0)


def test_modules_match_functions_and_top_level_names():
    torch.manual_seed(14)
    x = torch.randn(3, 4, 5)
    assert torch.equal(Sparsemax(dim=1, k=2)(x), sparsemax(x, dim=1))
    assert torch.equal(Entmax15(dim=0)(x), entmax15(x, dim=0))
    assert torch.equal(SparsemaxBisect(dim=-1, n_iter=30)(x), sparsemax_bisect(x, n_iter=30))
    assert torch.equal(EntmaxBisect(alpha=1.3, dim=2, n_iter=40)(x), entmax_bisect(x, 1.3, dim=2, n_iter=40))
    assert sparsenorm.sparsemax is sparsemax and sparsenorm.EntmaxBisect is EntmaxBisect
    assert "k=2" in repr(Sparsemax(dim=1, k=2))


def test_backward_saves_only_the_output():
    # Seen through the saved-tensor hooks: the graph node is the Python autograd's or, once the C++
    # extension is loaded, the C++ autograd kernel's (a CppFunction, which does not list saved_tensors).
    x = torch.randn(4, 8, requires_grad=True)
    for fn in (sparsemax, entmax15):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            p = fn(x)
        assert len(saved) == 1 and saved[0].data_ptr() == p.data_ptr()


# ----------------------------------------------------------------------------- opt-in C++ kernel

@pytest.fixture
def cpu_kernel(monkeypatch):
    """Turn the opt-in fused CPU kernel on for one test (skipped where it cannot be built)."""
    from sparsenorm.kernels import cpu

    monkeypatch.setattr(cpu, "_code_setting", True)
    if cpu.PROJECTION.load() is None:
        pytest.skip(f"C++ kernel not buildable here: {cpu.PROJECTION.error}")
    return cpu.PROJECTION


@pytest.mark.parametrize("name", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_kernel_matches_entmax_and_pure_path(name, dtype, cpu_kernel):
    torch.manual_seed(18)
    x = torch.randn(5, 7, 300, dtype=dtype) * 3
    x[0, 1, ::2] = -math.inf
    x[1, 2] *= 1e-3
    for dim in (-1, 1, 0):
        xr = x.clone().requires_grad_(True)
        ours = EXACT[name](xr, dim=dim, k=3)
        assert torch.allclose(ours, REFERENCE[name](x, dim=dim % 3), atol=TOL[dtype], rtol=0)
        g = torch.randn_like(x)
        (grad,) = torch.autograd.grad(ours, xr, g)
        xe = x.clone().requires_grad_(True)
        (grad_ref,) = torch.autograd.grad(REFERENCE[name](xe, dim=dim % 3), xe, g)
        assert torch.allclose(grad, grad_ref, atol=1e3 * TOL[dtype], rtol=0)


@pytest.mark.parametrize("fn", [sparsemax, entmax15], ids=lambda f: f.__name__)
def test_cpu_kernel_edge_cases(fn, cpu_kernel):
    x = torch.tensor([[-math.inf] * 3, [0.1, math.nan, 0.3], [1.0, 2.0, -math.inf], [5.0, 5.0, 5.0]],
                     dtype=torch.float64, requires_grad=True)
    p = fn(x)
    assert torch.equal(p[0], torch.zeros(3, dtype=torch.float64)) and torch.isnan(p[1]).all()
    assert p[2, 2] == 0 and torch.allclose(p[3], torch.full((3,), 1 / 3, dtype=torch.float64))
    (g,) = torch.autograd.grad(p, x, torch.randn(4, 3, dtype=torch.float64))
    assert torch.equal(g[0], torch.zeros(3, dtype=torch.float64)) and torch.isfinite(g[2:]).all()
    big = (torch.randn(20, 64) * 1e4).requires_grad_(True)
    pb = fn(big)
    assert torch.isfinite(pb).all() and torch.allclose(pb.sum(-1), torch.ones(20), atol=1e-5)
    xb = (torch.randn(30, 40) * 2).bfloat16()
    assert (fn(xb).float().sum(-1) - 1).abs().max() <= 2 ** -8
    xd = (torch.randn(3, 6, dtype=torch.float64) * 2).requires_grad_(True)
    assert gradcheck(fn, (xd,)) and gradgradcheck(fn, (xd,))


@pytest.mark.parametrize("fn", [sparsemax, entmax15], ids=lambda f: f.__name__)
@pytest.mark.parametrize("k", [21, 300])  # SIMD body and tail of the backward (float64: 4 or 8 lanes)
def test_cpu_kernel_backward_simd_body_and_tail(fn, k, cpu_kernel):
    from sparsenorm.kernels.reference.projection import dense_backward

    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(4, k, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    assert gradcheck(fn, (x,))
    # the kernel's backward against the reference formula on the same p, NaN rows included
    kind = fn.__name__
    p = fn(x.detach())
    p[1] = math.nan  # a NaN row, as the forward gives for a NaN input
    g = torch.randn(4, k, generator=gen, dtype=torch.float64)
    fused = cpu_kernel.load().backward(p, g, kind == "entmax15")
    pure = dense_backward(p, g, kind)
    # NaN rows stay NaN (the reference's sparsemax branch uses torch.sign, and sign(NaN) is 0 in
    # torch 2.13, so only the kernel is checked there)
    assert torch.isnan(fused[1]).all() and (kind == "sparsemax" or torch.isnan(pure[1]).all())
    # the same sums in another order: a few ulps of the largest term
    torch.testing.assert_close(fused[[0, 2, 3]], pure[[0, 2, 3]], rtol=0, atol=64 * k * 2.2e-16)


@pytest.mark.parametrize("kind", ["sparsemax", "entmax15", "bisect"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_kernel_nan_and_inf_in_simd_body_and_tail(kind, dtype, cpu_kernel):
    # The row max is taken in unrolled SIMD chains (NaN propagates through at::vec::maximum) and a
    # scalar tail: a NaN or +inf in either makes the row NaN, and only that row.
    k = 200  # 3 unrolled steps of 4 x 16 floats (AVX512), then a tail of 8
    x = torch.randn(5, k, dtype=dtype, generator=torch.Generator().manual_seed(5))
    x[0, 5] = math.nan  # body
    x[1, 70] = math.inf  # body
    x[2, 198] = math.nan  # tail
    x[3, 199] = math.inf  # tail
    ext = cpu_kernel.load()
    p = ext.bisect_forward(x, 1.5, True) if kind == "bisect" else ext.forward(x, kind == "entmax15")
    assert torch.isnan(p[:4]).all()
    assert torch.isfinite(p[4]).all() and abs(p[4].sum().item() - 1) <= 1e-5


def _stress_rows(dtype, k):
    """Rows for the kernel's sort-free threshold: ties, near-ties at the support's edge, one
    dominant entry, many entries within the window, wide and tiny scales."""
    gen = torch.Generator().manual_seed(31)
    rows = [torch.randn(k, generator=gen, dtype=dtype) * s for s in (1e-6, 0.1, 1.0, 3.0, 1e3)]
    rows.append(torch.randint(0, 3, (k,), generator=gen).to(dtype))  # heavy ties
    rows.append(torch.linspace(0, 2, k, dtype=dtype))  # every entry in the window
    one = torch.full((k,), -5.0, dtype=dtype)
    one[7] = 0.0
    rows.append(one)  # support of one
    edge = torch.zeros(k, dtype=dtype)
    edge[:3] = torch.tensor([1.0, 0.5, 0.0], dtype=dtype)  # entries exactly at the threshold
    rows.append(edge)
    return torch.stack(rows)


@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [500, 3000])  # a short row iterated on whole; a long one on its candidates
def test_cpu_kernel_sort_free_threshold_matches_sorted_reference(kind, dtype, k, cpu_kernel):
    # Error model: p = [u - tau]_+ (squared): tau from sums over at most K terms on both sides
    # ((K + 8) eps relative to the largest |u| on the support, <= 1 after the shift), so |dp| <=
    # 2 (K + 8) eps (entmax15: p <= 1, d(p)/d(tau) = 2 sqrt(p) <= 2).
    from sparsenorm.kernels.reference.projection import project_sorted

    x = _stress_rows(dtype, k)
    fused = cpu_kernel.load().forward(x, kind == "entmax15")
    pure = project_sorted(x, kind)
    atol = 2 * (x.shape[-1] + 8) * torch.finfo(dtype).eps
    torch.testing.assert_close(fused, pure, rtol=0, atol=atol)
    torch.testing.assert_close(fused.sum(-1), torch.ones(x.shape[0], dtype=dtype), rtol=0, atol=atol)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), k=st.sampled_from([1, 2, 7, 64, 200, 1500]), pool=st.integers(1, 50),
       scale=st.sampled_from([1e-3, 0.5, 2.0, 50.0]))
def test_cpu_kernel_sort_free_threshold_property(data, k, pool, scale):
    from sparsenorm.kernels import cpu
    from sparsenorm.kernels.reference.projection import project_sorted

    ext = cpu.PROJECTION.load()
    if ext is None:
        pytest.skip("C++ kernel not buildable here")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    values = torch.randn(pool, generator=gen, dtype=torch.float64) * scale
    x = values[torch.randint(0, pool, (3, k), generator=gen)]
    atol = 2 * (k + 8) * torch.finfo(torch.float64).eps
    for kind in ("sparsemax", "entmax15"):
        torch.testing.assert_close(ext.forward(x, kind == "entmax15"), project_sorted(x, kind), rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.05, 1.2, 1.5, 2.0, 3.0])
def test_cpu_kernel_entmax_bisect_matches_reference(dtype, alpha, cpu_kernel):
    # The reference's tau is within 2^-n_iter of the root (n_iter = 50: <= 4 eps in float64; the
    # float32 bisection stalls at rounding, a few eps), the kernel's within a few eps (Newton to
    # rounding), and d = p^(alpha - 1) is affine in tau; both sum to one after normalising, which
    # scales d by (1 + O(K eps)). So |d_kernel - d_ref| <= (K + 32) eps.
    gen = torch.Generator().manual_seed(41)
    x = torch.randn(7, 300, generator=gen, dtype=dtype) * 2
    x[0, :40] = -math.inf
    x[1] = -math.inf  # nothing there: zeros
    x[2, 5] = math.nan  # NaN row
    x[3, ::2] = torch.finfo(dtype).min  # additive mask value: not there
    x[4] = 0.5  # all equal: uniform
    with sparsenorm.kernels.disabled():
        pure = entmax_bisect(x, alpha)
    fused = entmax_bisect(x, alpha)
    assert fused[2].isnan().all() and pure[2].isnan().all()
    assert torch.equal(fused[1], torch.zeros_like(fused[1]))
    ok = torch.ones(7, dtype=torch.bool)
    ok[2] = False
    atol = (x.shape[-1] + 32) * torch.finfo(dtype).eps
    torch.testing.assert_close(fused[ok] ** (alpha - 1), pure[ok] ** (alpha - 1), rtol=0, atol=atol)
    assert torch.all(fused[3, ::2] == 0) and torch.all(fused[0, :40] == 0)
    # not there (finfo.min, -inf): exactly zero gradient on both paths (the op, not a marking pass
    # in front of it, handles such entries)
    g = torch.randn(x.shape, generator=gen, dtype=dtype)
    for disabled in (True, False):
        xr = x[[0, 3]].clone().requires_grad_(True)
        with sparsenorm.kernels.disabled() if disabled else contextlib.nullcontext():
            (grad,) = torch.autograd.grad(entmax_bisect(xr, alpha), xr, g[[0, 3]])
        assert torch.all(grad[1, ::2] == 0) and torch.all(grad[0, :40] == 0) and torch.isfinite(grad).all()


def test_cpu_kernel_entmax_bisect_gradients_and_coarse_n_iter(cpu_kernel):
    gen = torch.Generator().manual_seed(42)
    x = (torch.randn(4, 29, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    for alpha in (1.3, 1.5, 2.5):
        assert gradcheck(lambda t: entmax_bisect(t, alpha), (x,))
        g = torch.randn(4, 29, generator=gen, dtype=torch.float64)
        (fused,) = torch.autograd.grad(entmax_bisect(x, alpha), x, g)
        with sparsenorm.kernels.disabled():
            (pure,) = torch.autograd.grad(entmax_bisect(x, alpha), x, g)
        torch.testing.assert_close(fused, pure, rtol=1e-9, atol=1e-11)
    assert gradgradcheck(lambda t: entmax_bisect(t, 1.5), (x,))
    # fewer steps than convergence: the reference's coarse bisection, as documented
    with sparsenorm.kernels.disabled():
        coarse_ref = entmax_bisect(x.detach(), 1.5, n_iter=5)
    assert torch.equal(entmax_bisect(x.detach(), 1.5, n_iter=5), coarse_ref)
