"""The fused C++ CPU forward and backward of ev-softmax attention (sparsenorm/kernels/cpu/
evidential_attention.cpp), the CPU kernels of ``sparsenorm::ev_softmax_attention_blockwise`` and its
backward op.

Oracle: the op's pure-PyTorch reference (``kernels/reference/evidential_attention.py``, itself tested
against the dense path and SDPA in tests/attention) run in float64 on the same inputs, inside
``sparsenorm.kernels.disabled()``.

Error model (u = unit roundoff of the dtype under test, 2^-24 or 2^-53), with the probabilistic
rounding bound of Higham and Mary (2019): a sum of n rounded terms is off by at most
lambda sqrt(n) u times the sum of the terms' magnitudes, with lambda = 8 (the worst-case n u
would be met only by correlated roundings). A score's shifted value
``c_ij = qs_i . k_j + b_ij - t_i`` is then computed with an absolute error at most

    e_ij = 8 u (sqrt(E + S) sum_e |qs_ie| (|k_je| + mean_j |k_je|) + |b_ij|)

(dot product of E terms; the threshold's key mean of up to S keys; the bias addition). Entries
with ``|c_ij| <= e_ij`` in the oracle, other than the row's largest valid
score (kept in both paths either way), are *ambiguous*: rounding may put them on either side of
the threshold in either path; rows holding one are left out of the value checks
(at most 10 % of rows may be, so a check never passes vacuously). On the other rows the support is
the same, and with e_i = max_j e_ij, every weight exp(c - m) has relative error <= 2 e_i + 4u, so

    |out_i - oracle_i| <= 2 (2 e_i + 8 sqrt(S + 4) u) max|v|,
    |lse_i - oracle_i| <= 2 e_i + 8 sqrt(S + 4) u + u |lse_i|

(the sums of up to S terms and the exp; the factor 2 in the first: the ratio of two such sums).
Gradients (the C++ backward against the float64 reference backward): every term of dV, dS, dQ, dK
is a product of a weight P_ij = exp(c_ij - lse_i) (relative error at most 2 e_i + 8 sqrt(S + 4) u)
with dot products and sums of at most n = L + S + Ev terms (relative error 8 sqrt(n) u of their
magnitudes). With rho_i = 2 e_i + 8 sqrt(n + 4) u and the oracle's P,

    |dV - o| <= 2 (P rho)^T |dO|,  |dQ - o| <= 2 scale D |K|,  |dK - o| <= 2 D^T |Q scale|,
    D = P rho (|dO| |V|^T + |delta|) (a bound on |dS - o|),  delta_i = dO_i . out_i

(2: a product of two rounded factors). An entry within e_ij of the threshold gets at least the
weight of a score at the threshold, exp(-lse_i), in P (the test's own float64 scores may put it
on the other side). An ambiguous entry (which either path may keep or drop)
is given the weight of a score at the threshold, exp(-lse_i), a relative error of 1, and moves its
row's normalizer by that weight: every weight of the row, and delta_i, get that much more error.
``thr`` and the valid-key counts come from the reference's own threshold function in both paths,
so they are compared bit for bit with the reference in the dtype under test, except the threshold
of a row whose rounded mean fell above all its valid scores, which either path caps at its
largest valid score (checked against the oracle's maximum within e_i); support counts exactly
with the oracle on the non-ambiguous rows.

The extension is compiled once (module fixture, cached on disk); without a compiler every test here SKIPS.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsenorm
from sparsenorm import kernels
from sparsenorm.attention import sparse_attention
from sparsenorm.kernels.ops import evidential_attention
from sparsenorm.kernels import cpu as cpu_kernels
from sparsenorm.kernels.reference import evidential_attention as ref_attention

from knife_edge import assert_agree_by_contract, softmax_on

NEG_INF, INF = float("-inf"), float("inf")
LAMBDA = 8.0  # the constant of the probabilistic rounding bound lambda sqrt(n) u (see the module docstring)


@pytest.fixture(scope="module", autouse=True)
def kernel():
    saved = cpu_kernels._code_setting
    ext = cpu_kernels.EVIDENTIAL_ATTENTION.load()
    if ext is None:
        pytest.skip(f"C++ attention kernel could not be built: {cpu_kernels.EVIDENTIAL_ATTENTION.error}")
    sparsenorm.use_cpu_kernels(True)
    yield ext
    cpu_kernels._code_setting = saved


class Spy:
    """Stands in for the built extension and counts the calls of its forward and backward."""

    def __init__(self, ext):
        self.ext, self.calls, self.backward_calls = ext, 0, 0

    def ev_softmax_attention_forward(self, *args):
        self.calls += 1
        return self.ext.ev_softmax_attention_forward(*args)

    def ev_softmax_attention_backward(self, *args):
        self.backward_calls += 1
        return self.ext.ev_softmax_attention_backward(*args)


@pytest.fixture
def spy(kernel, monkeypatch):
    s = Spy(kernel)
    monkeypatch.setattr(cpu_kernels.EVIDENTIAL_ATTENTION, "module", s)
    return s


def op(q, k, v, keep, bias, causal, scale=0.4, block_q=16, block_k=16, count_support=True):
    return evidential_attention.ev_softmax_attention_blockwise_op(q, k, v, keep, bias, causal, scale, count_support,
                                                           block_q, block_k)


def make(batch, L, S, E, Ev, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, n, e, generator=g, dtype=dtype) for n, e in ((L, E), (S, E), (S, Ev)))


def make_masks(kind, batch, L, S, dtype):
    g = torch.Generator().manual_seed(7)
    keep = bias = None
    if kind == "key padding":  # per batch entry (B, 1, 1, S), one entry with every key
        keep = (torch.arange(S) < torch.tensor([max(S - 7, 1), S])[: batch[0]].reshape(-1, 1)).reshape(
            batch[0], 1, 1, S)
    elif kind == "1-d key padding":
        keep = (torch.arange(S) < max(S - 3, 1)).reshape(1, S)
    elif kind in ("general bool", "bias + bool"):
        keep = torch.rand(batch[0], 1, L, S, generator=g) > 0.4
        keep[0, 0, L // 2] = False  # a row whose keys are all masked
    if kind in ("bias", "bias + bool"):
        bias = torch.randn(L, S, generator=g, dtype=dtype)
    return keep, bias


def oracle_check(q, k, v, keep, bias, causal, scale, block_q, block_k):
    """Run the kernel and the reference; check them against the float64 reference by the error model."""
    dtype = q.dtype
    u = torch.finfo(dtype).eps / 2
    got = op(q, k, v, keep, bias, causal, scale, block_q, block_k)
    with kernels.disabled():
        same = op(q, k, v, keep, bias, causal, scale, block_q, block_k)
        d = lambda t: None if t is None else t.double()
        oracle = op(d(q), d(k), d(v), keep, d(bias), causal, scale, block_q, block_k)
    out, lse, thr, support, count = got
    o_out, o_lse, o_thr, o_support, o_count = oracle
    assert out.dtype == lse.dtype == thr.dtype == count.dtype == dtype and support.dtype == torch.long
    assert [t.shape for t in got] == [t.shape for t in same]
    assert torch.equal(count, same[4])  # valid-key counts: one function in both paths
    # the error model, from the oracle's scores
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    qs = (q.double() * scale).abs()
    absk = k.double().abs()
    mag = qs @ (absk + absk.mean(-2, keepdim=True)).transpose(-2, -1)  # sum_e |qs_ie| (|k_je| + mean |k_e|)
    err = LAMBDA * u * ((E + S) ** 0.5 * mag + (0 if bias is None else bias.double().abs()))
    scores = (q.double() * scale) @ k.double().transpose(-2, -1) + (0 if bias is None else bias.double())
    valid = torch.ones(scores.shape, dtype=torch.bool)
    if keep is not None:
        valid = valid & keep
    if causal:
        valid = valid & (torch.arange(S) <= torch.arange(L).unsqueeze(-1))
    # A row's largest valid score is kept in both paths either way (a row whose rounded mean is above
    # it is capped at it), so only entries clearly below the maximum can be ambiguous.
    row_max = scores.masked_fill(~valid, NEG_INF).amax(-1, keepdim=True)
    near = ((scores - o_thr).abs() <= err) & valid  # within rounding of the threshold
    ambiguous_entries = near & (row_max - scores > err)
    ambiguous = ambiguous_entries.any(-1)  # (..., L)
    assert ambiguous.float().mean() <= 0.1
    rows = ~ambiguous
    e_row = torch.where(valid, err, 0.0).amax(-1, keepdim=True)
    # thr: the reference's threshold function in both paths, bit for bit, except on rows whose rounded
    # mean fell above every valid score in either path: those are capped at their largest valid score.
    raw_thr, _ = ref_attention.threshold(q * scale, k, keep, bias, causal, 1.0, block_k)
    capped = (thr != raw_thr) | (same[2] != raw_thr)
    assert torch.equal(thr[~capped], same[2][~capped])
    assert ((thr.double() - row_max).abs() <= e_row)[capped].all()
    assert ((raw_thr.double() - row_max) >= -2 * e_row)[capped].all()  # only rows at the edge are capped
    sums = LAMBDA * (S + 4) ** 0.5 * u  # a sum of up to S terms and the exp
    tol_out = 2 * (2 * e_row + sums) * v.double().abs().amax()
    assert ((out.double() - o_out).abs() <= tol_out)[rows].all()
    lse_ok = torch.where(o_lse.isinf(), lse == o_lse,
                         (lse.double() - o_lse).abs() <= 2 * e_row + sums + u * o_lse.abs())
    assert lse_ok[rows].all()
    assert torch.equal(support[rows], o_support[rows])
    assert torch.equal(count, o_count.to(dtype))
    gradient_check(q, k, v, keep, bias, causal, scale, block_q, block_k, o_out, o_lse, o_thr, valid, near,
                   ambiguous_entries, e_row)
    return got


def gradient_check(q, k, v, keep, bias, causal, scale, block_q, block_k, o_out, o_lse, o_thr, valid, near,
                   ambiguous, e_row):
    """The backward (kernel where it applies) against the float64 reference backward, by the error model."""
    u = torch.finfo(q.dtype).eps / 2
    L, S, Ev = q.shape[-2], k.shape[-2], v.shape[-1]
    g = torch.Generator().manual_seed(9)
    dout = torch.randn(o_out.shape, generator=g, dtype=q.dtype)

    def grads(q, k, v, bias):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = evidential_attention.ev_softmax_attention_blockwise(*leaves, keep, bias, causal, scale, False, block_q,
                                                           block_k)[0]
        return torch.autograd.grad(out, leaves, dout.to(q.dtype))

    got = grads(q, k, v, bias)
    with kernels.disabled():
        d = lambda t: None if t is None else t.double()
        oracle = grads(d(q), d(k), d(v), d(bias))
    assert all(a.dtype == q.dtype and a.shape == b.shape for a, b in zip(got, oracle))
    qs, k64, v64 = q.double() * scale, k.double(), v.double()
    c = qs @ k64.transpose(-2, -1) + (0 if bias is None else bias.double()) - o_thr
    p = torch.where(valid & (c > -torch.finfo(torch.float64).smallest_normal), torch.exp(c - o_lse), 0.0)
    # An entry within rounding of the threshold has at most the weight of a score at the threshold,
    # exp(-lse_i), in either path (the test's own float64 scores may put it on the other side). The
    # ambiguous ones may be in the support in one path and not in the other (relative error 1), and
    # move their row's normalizer, hence every weight of the row and out_i, by at most `flip_i` relative.
    at_threshold = torch.exp(-o_lse)
    p_hi = torch.where(near, torch.maximum(p, at_threshold), p)
    flip = torch.where(ambiguous, at_threshold, 0.0).sum(-1, keepdim=True)
    rel = 2 * e_row + LAMBDA * (L + S + Ev + 4) ** 0.5 * u + 2 * flip + ambiguous.double()
    adout = dout.double().abs()
    delta = (dout.double() * o_out).sum(-1, keepdim=True).abs()
    delta_err = 2 * flip * adout.sum(-1, keepdim=True) * v64.abs().amax()
    ds_err = p_hi * (rel * (adout @ v64.abs().transpose(-2, -1) + delta) + delta_err)  # bounds |dS - oracle|
    tolerances = (2 * scale * ds_err @ k64.abs(), 2 * ds_err.transpose(-2, -1) @ qs.abs(),
                  2 * (p_hi * rel).transpose(-2, -1) @ adout)
    for name, got_, want, tol in zip("qkv", got, oracle, tolerances):
        assert ((got_.double() - want).abs() <= tol).all(), name


MASKS = ["none", "1-d key padding", "key padding", "general bool", "bias", "bias + bool"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", MASKS)
def test_matches_the_reference_within_the_error_model(spy, dtype, causal, mask):
    batch, L, S = (2, 3), 37, 45  # neither a multiple of the 16-wide tiles
    q, k, v = make(batch, L, S, 8, 5, dtype)
    keep, bias = make_masks(mask, batch, L, S, dtype)
    out, lse, _, support, count = oracle_check(q, k, v, keep, bias, causal, 0.4, 16, 16)
    assert spy.calls == 2 and spy.backward_calls == 1  # the op's forward, then forward + backward
    if mask in ("general bool", "bias + bool"):  # the all-masked row: 0 out, +inf lse, nothing counted
        empty = (slice(0, 1), slice(None), L // 2)
        assert (out[empty] == 0).all() and (lse[empty] == INF).all()
        assert (support[empty] == 0).all() and (count[empty] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S,block_q,block_k", [(1, 1, 16, 16), (1, 30, 16, 16), (40, 1, 16, 16), (7, 9, 3, 4),
                                                 (300, 700, 256, 512), (33, 17, 256, 512)])
def test_odd_sizes_and_tiles(spy, dtype, causal, L, S, block_q, block_k):
    q, k, v = make((2,), L, S, 6, 3, dtype, seed=L + S)
    keep = (torch.arange(S) < torch.tensor([[S], [max(S // 2, 1)]])).reshape(2, 1, S)
    oracle_check(q, k, v, keep, None, causal, 6 ** -0.5, block_q, block_k)
    assert spy.calls == 2 and spy.backward_calls == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_aten_gemm_fallback_agrees_too(kernel, spy, dtype):
    """The tile products by at::mm (what runs where torch links no MKL) instead of the BLAS symbols."""
    batch, L, S = (2, 3), 37, 45
    q, k, v = make(batch, L, S, 8, 5, dtype, seed=4)
    keep, bias = make_masks("bias + bool", batch, L, S, dtype)
    kernel.set_force_aten_gemm(True)
    try:
        assert not kernel.uses_blas()
        oracle_check(q, k, v, keep, bias, True, 0.4, 16, 16)
    finally:
        kernel.set_force_aten_gemm(False)
    assert spy.calls == 2 and spy.backward_calls == 1


@settings(max_examples=30, deadline=None)
@given(L=st.integers(1, 40), S=st.integers(1, 40), E=st.integers(1, 9), Ev=st.integers(1, 7),
       block_q=st.integers(1, 24), block_k=st.integers(1, 24), causal=st.booleans(),
       mask=st.sampled_from(MASKS), float64=st.booleans(), seed=st.integers(0, 2**16))
def test_any_sizes_tiles_and_masks_property(L, S, E, Ev, block_q, block_k, causal, mask, float64, seed):
    """Any sizes, tile sizes (1 included), masks and causal: values and gradients within the error model."""
    dtype = torch.float64 if float64 else torch.float32
    q, k, v = make((2, 2), L, S, E, Ev, dtype, seed=seed)
    keep, bias = make_masks(mask, (2, 2), L, S, dtype)
    oracle_check(q, k, v, keep, bias, causal, E ** -0.5, block_q, block_k)


def test_rows_whose_rounded_mean_is_above_every_score_are_compared_by_the_contract(spy):
    """Identical keys: every score equals the exact mean, so each one sits on the knife-edge and the
    kernel and the reference (which blocks its score products differently: 4 x 16 keys and a tail of
    6) may keep different keys. Each path is checked on its own support: at least one key kept (a
    row whose rounded mean lies above every score is capped at its maximum), and its weights equal
    the float64 softmax over the keys it kept. ``v = eye(70)`` makes the output the weights."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 50, 3, generator=g)
    k = torch.full((2, 70, 3), 0.1)
    v = torch.eye(70).expand(2, 70, 70)
    scale = 1.0
    got = op(q, k, v, None, None, False, scale, 16, 16)
    with kernels.disabled():
        ref = op(q, k, v, None, None, False, scale, 16, 16)
    assert spy.calls == 1
    scores = (q.double() @ k[0].double().T) * scale  # exact to float64: all equal in each row
    threshold = scores.mean(-1, keepdim=True)
    u = torch.finfo(torch.float32).eps / 2
    # |computed gap - exact gap|: the score's dot product and the threshold's key mean (gamma_{E+S})
    bound = 4 * u * (3 + 70) * (q.double().abs() @ k[0, :1].double().abs().T) * scale + 4 * u
    paths = {"kernel": got[0], "reference": ref[0]}
    ambiguous = assert_agree_by_contract(paths, scores, threshold, bound, softmax_on, rtol=1e-5, atol=1e-6)
    assert ambiguous.all()  # the test exercises the band: every entry is on the knife-edge
    for name, (out, lse, thr, support, count) in {"kernel": got, "reference": ref}.items():
        assert torch.isfinite(lse).all() and (support >= 1).all(), name
        assert torch.equal(support, (out > 0).sum(-1)), name  # the count is the support the weights show
        assert ((thr.double() - threshold).abs() <= bound).all(), name


def test_exactly_tied_keys_are_all_kept_by_the_kernel(spy):
    """The kernel's own tie rule (``s >= mean`` keeps a tie), on inputs where every score and the
    mean are exact in float32 (dyadic values, sums below 2^24): no rounding decides, so every key is
    kept in both paths and the output is the plain mean of v."""
    g = torch.Generator().manual_seed(4)
    q = torch.randint(-8, 9, (2, 50, 3), generator=g).float()
    k = torch.full((2, 70, 3), 0.5)
    v = torch.randn(2, 70, 2, generator=g)
    for path in ("kernel", "reference"):
        if path == "kernel":
            out, lse, thr, support, count = op(q, k, v, None, None, False, 1.0, 16, 16)
        else:
            with kernels.disabled():
                out, lse, thr, support, count = op(q, k, v, None, None, False, 1.0, 16, 16)
        assert torch.equal(support, torch.full_like(support, 70)), path
        torch.testing.assert_close(out, v.mean(-2, keepdim=True).expand_as(out), rtol=1e-5, atol=1e-6)
    assert spy.calls == 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", ["none", "general bool", "bias + bool"])
def test_gradcheck_float64_through_the_kernel(spy, causal, mask):
    q, k, v = (t.requires_grad_() for t in make((2, 1), 6, 9, 3, 2, torch.float64, seed=5))
    keep, bias = make_masks(mask, (2, 1), 6, 9, torch.float64)
    fn = lambda q, k, v: evidential_attention.ev_softmax_attention_blockwise(q, k, v, keep, bias, causal,
                                                                      block_q=4, block_k=4)[0]
    assert torch.autograd.gradcheck(fn, (q, k, v))
    assert spy.calls > 0 and spy.backward_calls > 0


def test_sparse_attention_uses_the_kernel_by_default_with_key_lengths_and_gqa(spy, monkeypatch):
    monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 0)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 21, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 30, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 30, 6, generator=g, dtype=torch.float64)
    lengths = torch.tensor([30, 11])
    for causal in (False, True):
        out = sparse_attention(q, k, v, "ev_softmax", is_causal=causal, key_lengths=lengths)
        dense, _ = sparse_attention(q, k, v, "ev_softmax", is_causal=causal, key_lengths=lengths,
                                    return_weights=True)
        torch.testing.assert_close(out, dense, rtol=0, atol=1e-12)
    assert spy.calls == 2


def test_reference_runs_where_the_kernel_does_not_apply(spy):
    q, k, v = make((2,), 9, 11, 4, 3, torch.float32)
    with kernels.disabled():
        ref = op(q, k, v, None, None, True)
        assert spy.calls == 0
    bias64 = torch.randn(9, 11, dtype=torch.float64)  # a float64 bias on float32 inputs: the reference's case
    op(q, k, v, None, bias64, False)
    assert spy.calls == 0
    sparsenorm.use_cpu_kernels(False)
    try:
        assert torch.equal(op(q, k, v, None, None, True)[0], ref[0]) and spy.calls == 0
    finally:
        sparsenorm.use_cpu_kernels(True)
    op(q, k, v, None, None, True)
    assert spy.calls == 1


def test_bad_input_errors_are_unchanged(spy):
    q, k, v = make((2,), 9, 11, 4, 3, torch.float32)
    with pytest.raises(ValueError, match="attn_mask"):
        sparse_attention(q, k, v, "ev_softmax", attn_mask=torch.ones(3, 3, dtype=torch.bool), backend="blockwise")
    assert spy.calls == 0
