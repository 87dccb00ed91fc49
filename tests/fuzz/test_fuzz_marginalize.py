"""Fuzzing :func:`sparsenorm.marginalize` (issue 25, item 3) against the dense float64 sum.

Inputs: probability tensors of 1-3 dims (0-size and 1-wide ones included), the classes on any
``dim``, contiguous / transposed / expanded layouts, float16/bfloat16/float32/float64, entries that
are exactly 0 (often: the point of the function), normal, subnormal, NaN, or negative; ``fn`` a
lookup table ``f[example, class]`` with or without a trailing dim; ``max_batch`` none or small.
Invariants:

* ``fn`` sees exactly the nonzero entries (``stats.rows``), each (example, class) pair once;
* an example with NaN among its probabilities gives NaN, every other example is finite and within
  the error model of the dense float64 sum ``sum_z p f``: each product and each of at most ``K``
  additions rounds once in the result dtype, ``|err| <= (K + 1) eps sum_z |p f|`` (plus the
  rounding of the result itself);
* chunking (``max_batch``) changes nothing beyond that bound;
* the gradient to ``probs`` is ``f`` at its nonzero entries and exactly 0 at its zeros.
"""
from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzz_inputs import FUZZ
from sparsenorm.marginalize import marginalize

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@st.composite
def probabilities(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    n = 1
    for s in shape:
        n *= s
    kinds = draw(st.lists(st.sampled_from(["zero", "zero", "normal", "tiny", "nan", "negative"]),
                          min_size=n, max_size=n))
    finfo = torch.finfo(dtype)
    value = {"zero": 0.0, "normal": 0.37, "tiny": finfo.smallest_normal * 0.5, "nan": float("nan"),
             "negative": -0.25}
    scale = draw(st.lists(st.floats(0.5, 2.0), min_size=n, max_size=n))
    flat = torch.tensor([value[k] * (s if k in ("normal", "negative") else 1.0) for k, s in zip(kinds, scale)],
                        dtype=torch.float64)
    probs = flat.reshape(shape).to(dtype)
    layout = draw(st.sampled_from(["contiguous", "transposed", "expanded"]))
    return probs, dim, layout


def with_layout(base, dim, layout):
    """``(probs, dim)``: ``base`` as given, with other strides (same values), or expanded (stride 0)
    over a new leading dim of 2."""
    if layout == "transposed" and base.dim() >= 2:
        return base.transpose(0, -1).contiguous().transpose(0, -1), dim
    if layout == "expanded":
        return base.unsqueeze(0).expand(2, *base.shape), (dim if dim < 0 else dim + 1)
    return base, dim


@FUZZ
@given(drawn=probabilities(), trailing=st.sampled_from([(), (3,)]), max_batch=st.sampled_from([None, 1, 2, 7]),
       seed=st.integers(0, 2**16))
def test_marginalize_equals_the_dense_sum_and_calls_fn_on_the_support_only(drawn, trailing, max_batch, seed):
    base, dim, layout = drawn
    leaf = base.clone().requires_grad_(base.dtype in (torch.float32, torch.float64))
    probs, dim = with_layout(leaf, dim, layout)
    moved = probs.movedim(dim, -1)
    batch_shape, K = moved.shape[:-1], moved.shape[-1]
    rows = moved.reshape(math.prod(batch_shape), K)
    table = torch.randn(rows.shape[0], K, *trailing, generator=torch.Generator().manual_seed(seed),
                        dtype=torch.float64).to(probs.dtype)
    seen = []

    def fn(example_index, class_index):
        seen.append(torch.stack([example_index, class_index], -1))
        return table[example_index, class_index]

    out, stats = marginalize(probs, fn, dim=dim, return_stats=True, max_batch=max_batch)

    pairs = torch.cat(seen) if seen else torch.zeros(0, 2, dtype=torch.long)
    nonzero = (rows != 0).nonzero()
    assert stats.rows == nonzero.shape[0] == pairs.shape[0]
    assert sorted(map(tuple, pairs.tolist())) == sorted(map(tuple, nonzero.tolist()))

    rows = rows.detach()
    exact_terms = rows.double().reshape(*rows.shape, *([1] * len(trailing))) * table.double()
    exact = exact_terms.sum(1)
    nan_rows = torch.isnan(rows).any(-1)
    got = out.reshape(rows.shape[0], *trailing).double()
    assert out.shape == (*batch_shape, *trailing)
    assert torch.isnan(got[nan_rows]).all()
    ok = ~nan_rows
    eps = torch.finfo(out.dtype).eps
    bound = (K + 2) * eps * exact_terms[ok].abs().sum(1) + torch.finfo(out.dtype).tiny
    assert torch.isfinite(got[ok]).all()
    assert ((got[ok] - exact[ok]).abs() <= bound).all(), (got[ok], exact[ok], bound)

    if leaf.requires_grad and out.numel():
        cotangent = torch.ones_like(out)
        (grad,) = torch.autograd.grad(out, leaf, cotangent)
        # each used entry's gradient is its cotangent (1) times f summed over the trailing dim; an
        # expanded input's stored entry collects both copies' (its two rows of the table)
        per_row = table.double().reshape(rows.shape[0], K, math.prod(trailing)).sum(-1) * (rows != 0)
        per_row = per_row.reshape(*batch_shape, K).movedim(-1, dim)
        expected = per_row.sum(0) if layout == "expanded" else per_row
        grad = grad.double()
        zero = (base == 0)
        assert (grad[zero] == 0).all()
        grad_rows, expected = grad, expected
        tol = 4 * eps * expected.abs().clamp_min(1)
        assert ((grad_rows - expected).abs() <= tol).all()
