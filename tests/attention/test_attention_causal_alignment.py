"""Bottom-right causal alignment (``causal_alignment="bottom_right"``: query ``i`` of L sees the keys
``j <= i + S - L``, as FlashAttention >= 2.1) in every CPU kernel, against the dense path with the
same mask written out: chunked prefill (L < S), cached decode (L = 1), L = S (where it is
top-left), and L > S (the first L - S queries see no key), with a left-padding key mask and GQA.

Inputs are float64: a computed gap ``score - threshold`` is off by about ``(E + S) 2^-53 max|q||k|``
(~1e-14 here), so no entry of these random scores lies within rounding of its threshold and
every path keeps the same keys (the knife-edge contract, tests/knife_edge.py, with an empty band);
the values then agree to float64 rounding. The Triton kernel's cases are in
tests/kernels/test_triton_attention.py (interpreter on CPU)."""
import pytest
import torch

from knife_edge import band
from sparsenorm.kernels.auto_plan import flex_available
from sparsenorm import kernels
from sparsenorm.attention import sparse_attention
from sparsenorm.kernels.ops.evidential_attention import ev_softmax_attention_blockwise
from sparsenorm.kernels.ops.projection_attention import projection_attention

SHAPES = [(5, 13), (1, 13), (13, 13), (9, 6)]  # (L, S): chunked prefill, decode, square, more queries than keys
SEARCHED = ["sparsemax", "entmax15", "entmax_bisect"]


def inputs(L, S, seed, B=2, Hq=4, Hk=2, E=8, Ev=5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, E, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hk, S, E, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hk, S, Ev, generator=g, dtype=torch.float64)
    pad = torch.tensor([0, min(3, S - 1)])  # the second sequence is left-padded
    key_mask = (torch.arange(S) >= pad.view(B, 1)).view(B, 1, 1, S)
    return q, k, v, key_mask


def explicit_mask(L, S, key_mask):
    """The bottom-right causal mask and the key padding, written out as a (B, 1, L, S) boolean mask."""
    causal = torch.arange(S) <= torch.arange(L).view(L, 1) + (S - L)
    return causal & key_mask


def dense(q, k, v, key_mask, normalizer):
    L, S = q.shape[-2], k.shape[-2]
    return sparse_attention(q, k, v, normalizer, attn_mask=explicit_mask(L, S, key_mask), backend="dense")


def grads(out, args, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.autograd.grad(out, args, torch.randn(out.shape, generator=g, dtype=out.dtype))


def assert_no_knife_edge(q, k, key_mask, scale=None):
    """The premise of comparing by equality: no ev-softmax score lies within the float64 error bound
    of its row's mean (checked, not assumed), but in rows with a single valid key, which equals the
    mean and is kept by every path (the threshold is capped at the row's maximum)."""
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = E ** -0.5 if scale is None else scale
    keys = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q @ keys.transpose(-2, -1) * scale
    valid = explicit_mask(L, S, key_mask).expand_as(s)
    mean = (s * valid).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp_min(1)
    bound = 8 * (E + S) * 2.0 ** -53 * (q.abs() @ keys.abs().transpose(-2, -1)).amax(-1, keepdim=True) * scale
    _, _, ambiguous = band(s, mean, bound)
    assert not (ambiguous & valid & (valid.sum(-1, keepdim=True) > 1)).any()


@pytest.mark.parametrize("L,S", SHAPES)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("path", ["cpp", "reference"])
def test_ev_softmax_blockwise_bottom_right(L, S, padded, path):
    q, k, v, key_mask = inputs(L, S, seed=L * 31 + S)
    key_mask = key_mask if padded else torch.ones_like(key_mask)
    assert_no_knife_edge(q, k, key_mask)
    args = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_args = [t.clone().requires_grad_() for t in (q, k, v)]
    want = dense(*ref_args, key_mask, "ev_softmax")
    with kernels.disabled() if path == "reference" else torch.enable_grad():
        got = sparse_attention(*args, "ev_softmax", attn_mask=key_mask if padded else None, is_causal=True,
                               causal_alignment="bottom_right", backend="blockwise")
        got_grads = grads(got, args, 1)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(got_grads, grads(want, ref_args, 1)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("L,S", SHAPES)
@pytest.mark.parametrize("padded", [False, True])
def test_ev_softmax_decode_kernel(L, S, padded):
    """The few-queries kernel (GQA heads stacked against their key/value head): bottom-right,
    top-left and no causal mask, key padding or key lengths; values and gradients."""
    q, k, v, key_mask = inputs(L, S, seed=L * 5 + S)
    key_mask = key_mask if padded else torch.ones_like(key_mask)
    assert_no_knife_edge(q, k, key_mask)
    args = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_args = [t.clone().requires_grad_() for t in (q, k, v)]
    got = sparse_attention(*args, "ev_softmax", attn_mask=key_mask if padded else None, is_causal=True,
                           causal_alignment="bottom_right", backend="decode")
    want = dense(*ref_args, key_mask, "ev_softmax")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(grads(got, args, 3), grads(want, ref_args, 3)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    lengths = torch.tensor([S, max(S - 4, 0)])
    for causal in (False, True):
        got = sparse_attention(q, k, v, "ev_softmax", key_lengths=lengths, is_causal=causal, backend="decode")
        want = sparse_attention(q, k, v, "ev_softmax", key_lengths=lengths, is_causal=causal, backend="dense")
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_decode_kernel_counts_and_gradcheck():
    """Support counts equal the dense path's (sparsenorm.attention.record), and float64 gradcheck."""
    from sparsenorm.kernels.reference.evidential_attention import few_queries

    q, k, v, key_mask = inputs(3, 11, seed=4)
    out, support, valid = few_queries(q, k, v, key_mask.view(2, 11), True, 8, 0.3, count_support=True)
    dense_w = sparse_attention(q, k, v, "ev_softmax", attn_mask=explicit_mask(3, 11, key_mask), scale=0.3,
                               return_weights=True, backend="dense")[1]
    assert torch.equal(support, (dense_w > 0).sum(-1))
    assert torch.equal(valid, explicit_mask(3, 11, key_mask).expand(2, 4, 3, 11).sum(-1))
    small = (q[:1, :, :2].clone().requires_grad_(), k[:1, :, :7].clone().requires_grad_(),
             v[:1, :, :7].clone().requires_grad_())
    fn = lambda q, k, v: few_queries(q, k, v, key_mask[:1, 0, 0, :7], True, 5, 0.5)[0]
    assert torch.autograd.gradcheck(fn, small)


@pytest.mark.parametrize("L,S", SHAPES)
@pytest.mark.parametrize("normalizer", SEARCHED)
def test_searched_blockwise_bottom_right(L, S, normalizer):
    q, k, v, key_mask = inputs(L, S, seed=L * 17 + S)
    args = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_args = [t.clone().requires_grad_() for t in (q, k, v)]
    got = sparse_attention(*args, normalizer, attn_mask=key_mask, is_causal=True, causal_alignment="bottom_right",
                           backend="blockwise")
    want = dense(*ref_args, key_mask, normalizer)
    # alpha-entmax by bisection: both paths stop after the same 50 halvings of one bracket
    tol = dict(rtol=1e-7, atol=1e-9) if normalizer == "entmax_bisect" else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got, want, **tol)
    for a, b in zip(grads(got, args, 2), grads(want, ref_args, 2)):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.skipif(not flex_available(), reason="this torch has no FlexAttention")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # eager is the CPU test path
@pytest.mark.parametrize("L,S", [(5, 13), (1, 13), (13, 13)])
def test_ev_softmax_flex_bottom_right(L, S):
    q, k, v, key_mask = inputs(L, S, seed=L * 7 + S)
    assert_no_knife_edge(q, k, key_mask)
    with torch.no_grad():  # FlexAttention has no CPU backward
        got = sparse_attention(q, k, v, "ev_softmax", attn_mask=key_mask, is_causal=True,
                               causal_alignment="bottom_right", backend="flex")
        plain = sparse_attention(q, k, v, "ev_softmax", is_causal=True, causal_alignment="bottom_right",
                                 backend="flex")
    torch.testing.assert_close(got, dense(q, k, v, key_mask, "ev_softmax"), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(plain, dense(q, k, v, torch.ones_like(key_mask), "ev_softmax"),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("normalizer", ["ev_softmax", "sparsemax", "softmax", "r_softmax"])
def test_dense_path_bottom_right_and_default_top_left(normalizer):
    """The dense path builds the bottom-right mask itself; the default stays SDPA's top-left."""
    q, k, v, key_mask = inputs(5, 13, seed=3)
    got = sparse_attention(q, k, v, normalizer, attn_mask=key_mask, is_causal=True, causal_alignment="bottom_right",
                           backend="dense")
    torch.testing.assert_close(got, dense(q, k, v, key_mask, normalizer), rtol=0, atol=0)
    top_left = torch.arange(13) <= torch.arange(5).view(5, 1)
    torch.testing.assert_close(sparse_attention(q, k, v, normalizer, is_causal=True, backend="dense"),
                               sparse_attention(q, k, v, normalizer, attn_mask=top_left, backend="dense"),
                               rtol=0, atol=0)


def test_bottom_right_gradcheck_float64():
    """The changed backwards (the key tiles a query tile visits, the causal tile mask) by gradcheck."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, n, 3, generator=g, dtype=torch.float64, requires_grad=True) for n in (4, 9, 9))
    keep = (torch.arange(9) >= 2).view(1, 1, 1, 9)
    for path in ("cpp", "reference"):
        with kernels.disabled() if path == "reference" else torch.enable_grad():
            fn = lambda q, k, v: ev_softmax_attention_blockwise(q, k, v, keep, None, True, block_q=2, block_k=4,
                                                                causal_offset=5)[0]
            assert torch.autograd.gradcheck(fn, (q, k, v))
    for kind in ("sparsemax", "entmax15"):
        fn = lambda q, k, v: projection_attention(q, k, v, kind, keep=keep, is_causal=True, block_q=2, block_k=4,
                                                  causal_offset=5)
        assert torch.autograd.gradcheck(fn, (q, k, v))


def test_bad_alignment_is_named():
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="causal_alignment"):
        sparse_attention(q, q, q, is_causal=True, causal_alignment="bottom-right")
