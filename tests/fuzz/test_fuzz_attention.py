"""Fuzzing ``sparse_attention`` with every attention normalizer of the registry (issue 25, item 3).

Inputs: batch, heads (grouped-query heads included), query and key lengths (0 included), head
sizes, every dtype, magnitudes up to 1e4 and subnormals (float16 q and k are clipped to 100: larger
scores overflow float16 in ``q k^T`` itself, as in SDPA), boolean key masks (all-masked queries
included), ``is_causal``. Invariants: the weights of a query with a valid key are those of the
normalizer (rows sum to 1 within its error model, :mod:`fuzz_oracles`), masked keys get exactly 0,
a query with no valid key gives a zero output row and zero gradients, the output is the weights
times ``v`` within rounding, and gradients are finite wherever the bound on the exact gradients
(dL/dscores included) stays within the compute dtype (the normalizers' rule,
``fuzz_oracles.Expected.grad_scale``).
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz_inputs import DTYPES, FUZZ, values
from fuzz_oracles import C_OPS, ORACLES, value_tolerance
from sparsenorm import registry
from sparsenorm._validation import compute_dtype
from sparsenorm.attention import sparse_attention

NAMES = [n for n in registry.names() if registry.get(n).attention]


@st.composite
def attention_inputs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    b, hk, group = draw(st.integers(0, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    length, keys, e = draw(st.integers(0, 4)), draw(st.integers(0, 5)), draw(st.integers(1, 4))
    q = draw(values((b, hk * group, length, e), dtype))
    k = draw(values((b, hk, keys, e), dtype))
    v = draw(values((b, hk, keys, e), dtype))
    q, k, v = (torch.nan_to_num(t.double(), nan=0.0, posinf=1.0, neginf=-1.0).clamp(-1e4, 1e4) for t in (q, k, v))
    if dtype == torch.float16:
        q, k = q.clamp(-100, 100), k.clamp(-100, 100)
    keep = torch.tensor(draw(st.lists(st.booleans(), min_size=length * keys, max_size=length * keys)),
                        dtype=torch.bool).reshape(length, keys) | draw(st.booleans())
    causal = draw(st.booleans())
    return tuple(t.to(dtype).requires_grad_(True) for t in (q, k, v)) + (keep, causal)


def _subnormal_gap_example():
    """A case hypothesis found (make test-rounding, 2026-11-27): bfloat16, one query entry subnormal, so two
    keys' scores differ from the rest by 9e-41 only; r-softmax's weights w = 9e-41 then make its Jacobian's 1 / w
    overflow float32: the exact dL/dscores (about 5e39) is not representable there, and dL/dq came out inf - inf
    (its exact value cancels to 0, which float32 cannot reach through those intermediates)."""
    q = torch.zeros(1, 4, 4, 1, dtype=torch.float64)
    q[0, 1, 3, 0] = -9.1835e-41
    k = torch.tensor([[[[0.0], [-1.0], [-1.0], [0.0], [0.0]], [[0.0], [0.0], [0.0], [-1.0], [-1.0]]]],
                     dtype=torch.float64)
    v = torch.zeros(1, 2, 5, 1, dtype=torch.float64)
    v[0, 0, 2, 0] = 8.0
    tensors = tuple(t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v))
    return tensors + (torch.ones(4, 5, dtype=torch.bool), False)


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(inputs=attention_inputs())
@example(inputs=_subnormal_gap_example())
def test_sparse_attention_on_fuzzed_input(name, inputs):
    q, k, v, keep, causal = inputs
    out, weights = sparse_attention(q, k, v, name, attn_mask=keep, is_causal=causal, return_weights=True)
    assert out.shape == q.shape[:-1] + v.shape[-1:] and out.dtype == q.dtype
    length, keys = q.shape[-2], k.shape[-2]
    valid = keep & (torch.ones(length, keys, dtype=torch.bool).tril() if causal else True)
    assert (weights[..., ~valid] == 0).all(), "a masked key must get exactly 0"
    assert not torch.isnan(out).any() and not torch.isnan(weights).any()

    cdt, eps_out = compute_dtype(q), torch.finfo(q.dtype).eps
    kv = k.detach().double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    scores = q.detach().double() @ kv.transpose(-1, -2) / math.sqrt(q.shape[-1])
    w = weights.double()
    grad_scale = 1.0  # the largest Jacobian bound of the rows (fuzz_oracles.Expected.grad_scale)
    for index in torch.cartesian_prod(*(torch.arange(s) for s in w.shape[:-1])).reshape(-1, w.dim() - 1).tolist():
        row, there = w[tuple(index)], valid[index[-1]]
        if not there.any():
            assert (row == 0).all() and (out[tuple(index)] == 0).all(), "a query with no valid key gives zeros"
            continue
        # the weights' scale: the oracle's, on the float64 scores (the library's rounded scores
        # are within eps_c |q||k| of them, which the tolerance's max(1, |z|) factor covers)
        expected_row = ORACLES[name](scores[tuple(index)][there], registry.get(name).params, "forward", cdt)
        scale, grad_scale = expected_row.scale, max(grad_scale, expected_row.grad_scale)
        tol = value_tolerance(keys, cdt, q.dtype, scale)
        assert abs(row.sum().item() - 1) <= keys * tol, f"weights sum to {row.sum().item()}, not 1"
    # out = weights @ v, each entry a keys-term sum rounded in the compute dtype, then the output
    # dtype; the weights returned are rounded to the output dtype too (relative eps_out / 2 each,
    # and they sum to 1, so at most eps_out / 2 * max|v| in the product)
    expected = w @ v.detach().double().repeat_interleave(q.shape[1] // v.shape[1], 1)
    v_max = v.detach().double().abs().max().item() if v.numel() else 0.0
    subnormal_step = torch.finfo(q.dtype).smallest_normal * eps_out  # rounding below smallest_normal is absolute
    bound = (keys + 2) * torch.finfo(cdt).eps * v_max + eps_out * (expected.abs() + v_max) + subnormal_step
    assert ((out.double() - expected).abs() <= bound).all(), "output is not weights @ v"

    if out.numel():
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.dtype)
        grads = torch.autograd.grad(out, (q, k, v), g, allow_unused=True)
        size = max([1.0] + [t.detach().double().abs().max().item() for t in (q, k, v) if t.numel()])
        bound = C_OPS * (keys + 1) ** 2 * g.double().abs().max().item() * size ** 2 * grad_scale
        representable = bound < torch.finfo(cdt).max
        for label, grad in zip("qkv", grads):
            # Finite only where the exact gradient surely is in the compute dtype (as for the normalizers):
            # dL/dscores is the Jacobian (entries up to grad_scale; r-/t-softmax's 1 / w, which a subnormal
            # gap w makes overflow) times dL/dweights (keys-term sums of |g| |v|), and dL/dq and dL/dk are
            # keys-term sums of dL/dscores times |k| or |q|. float16: |k| |v| / w overflows float16 itself.
            if grad is not None and grad.numel() and q.dtype != torch.float16 and representable:
                assert not torch.isnan(grad).any(), f"NaN in dL/d{label}"
