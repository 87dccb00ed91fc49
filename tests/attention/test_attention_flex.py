"""ev-softmax attention on FlexAttention (forward, CPU) against the exact dense path."""
import pytest
import torch

from sparsenorm.kernels.auto_plan import flex_available
from sparsenorm.attention import sparse_attention
from sparsenorm.kernels.attention import flex

pytestmark = [
    pytest.mark.skipif(not flex_available(), reason="this torch has no flex_attention"),
    # On CPU the function calls eager flex_attention on purpose (see sparsenorm.kernels.attention.flex).
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]


def qkv(B=2, Hq=4, Hk=2, L=24, S=40, E=8, Ev=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, n, e, generator=g, dtype=torch.float64).to(dtype)
                 for h, n, e in ((Hq, L, E), (Hk, S, E), (Hk, S, Ev)))


def key_lengths_mask(lengths, S):
    return (torch.arange(S) < lengths.view(-1, 1, 1, 1))


def dense(q, k, v, keep=None, key_lengths=None, is_causal=False, scale=None):
    """The exact path: sparse_attention's dense ev-softmax with the masks as one boolean mask."""
    mask = keep
    if key_lengths is not None:
        lengths = key_lengths_mask(key_lengths, k.shape[2])
        mask = lengths if mask is None else mask & lengths
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return sparse_attention(q, k, v, "ev_softmax", attn_mask=mask, is_causal=is_causal, scale=scale)


def tolerance(q, k, v, dtype):
    """Same support: each softmax weight's relative error is at most twice a score's error
    ``E * eps * scale * max sum_d |q_d k_d|``, plus the rounding of the ``P V`` sum over S keys."""
    eps = torch.finfo(dtype).eps
    E, S = q.shape[-1], k.shape[-2]
    k = k.double().abs().repeat_interleave(q.shape[1] // k.shape[1], 1)
    dot = (q.double().abs() @ k.transpose(-2, -1)).max().item() * E ** -0.5
    return (4 * E * eps * dot + S * eps) * v.double().abs().max().item()


CASES = {
    "plain": lambda B, Hq, L, S: {},
    "bool key padding": lambda B, Hq, L, S: {
        "keep": (torch.arange(S) < torch.tensor([[S], [S - 13]])).view(B, 1, 1, S)},
    "key_lengths": lambda B, Hq, L, S: {"key_lengths": torch.tensor([S - 3, 9])},
    "causal": lambda B, Hq, L, S: {"is_causal": True},
    "causal + key_lengths": lambda B, Hq, L, S: {"is_causal": True, "key_lengths": torch.tensor([S, 5])},
    "general bool per head": lambda B, Hq, L, S: {
        "keep": torch.rand(B, Hq, L, S, generator=torch.Generator().manual_seed(3)) > 0.4},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_equals_dense_ev_softmax(case, dtype):
    q, k, v = qkv(dtype=dtype)
    masks = CASES[case](2, 4, 24, 40)
    out = flex.ev_softmax_flex_attention(q, k, v, **masks)
    expected = dense(q.double(), k.double(), v.double(), **masks)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=tolerance(q, k, v, dtype))


def test_rows_with_no_valid_key_are_zero():
    q, k, v = qkv()
    keep = torch.ones(2, 4, 24, 40, dtype=torch.bool)
    keep[0, 1, 5] = False
    out = flex.ev_softmax_flex_attention(q, k, v, keep=keep, key_lengths=torch.tensor([40, 0]))
    assert torch.equal(out[0, 1, 5], torch.zeros(8, dtype=q.dtype))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isfinite(out).all()


def test_single_key_rows_and_tied_scores_keep_their_keys():
    """Rounding may put a mean above every score when all scores tie (one key; identical keys); the
    dense path caps the threshold there, and flex must not drop such rows."""
    q, k, v = qkv(B=1, Hq=2, Hk=2, L=6, S=7, dtype=torch.float32)
    k[:, :, :] = k[:, :, :1] * 0.1  # identical keys: all scores of a row tie
    for masks in ({"is_causal": True}, {"key_lengths": torch.tensor([1])}, {}):
        out = flex.ev_softmax_flex_attention(q, k, v, **masks)
        torch.testing.assert_close(out.double(), dense(q.double(), k.double(), v.double(), **masks),
                                   rtol=0, atol=tolerance(q, k, v, torch.float32))


def test_scale_is_used():
    q, k, v = qkv()
    torch.testing.assert_close(flex.ev_softmax_flex_attention(q, k, v, scale=0.9), dense(q, k, v, scale=0.9),
                               rtol=0, atol=tolerance(q, k, v, torch.float64) * 4)


def test_cpu_backward_raises_a_clear_error_and_no_grad_works():
    q, k, v = (t.requires_grad_() for t in qkv(L=5, S=6, dtype=torch.float32))
    with pytest.raises(NotImplementedError, match="backend='flex'.*no backward on CPU"):
        flex.ev_softmax_flex_attention(q, k, v)
    with torch.no_grad():
        out = flex.ev_softmax_flex_attention(q, k, v)
    torch.testing.assert_close(out, dense(q, k, v).detach(), rtol=0, atol=tolerance(q, k, v, torch.float32))


def test_missing_flex_attention_names_the_backend(monkeypatch):
    monkeypatch.setattr(flex, "flex_attention", None)
    q, k, v = qkv(L=5, S=6)
    with pytest.raises(RuntimeError, match="backend='flex'"):
        flex.ev_softmax_flex_attention(q, k, v)


def test_bad_arguments_raise_naming_them():
    q, k, v = qkv(L=5, S=6)
    with pytest.raises(ValueError, match="key_lengths"):
        flex.ev_softmax_flex_attention(q, k, v, key_lengths=torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="keep"):
        flex.ev_softmax_flex_attention(q, k, v, keep=torch.ones(5, 6))
    with pytest.raises(ValueError, match="scale"):
        flex.ev_softmax_flex_attention(q, k, v, scale=float("nan"))


def test_off_support_drop_underflows_exp():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        drop = flex.off_support_drop(dtype)
        assert torch.exp(torch.tensor(-drop, dtype=torch.float64)).to(dtype) == 0


@pytest.mark.parametrize("causal_offset", [0, 5, -3, 30])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_threshold_equals_the_reference_threshold(causal, padding, causal_offset):
    """The Flex path's threshold (key sums per key/value head, prefix sums by the
    ``sparsenorm::key_prefix_sums`` op) against the reference's (mean over the valid keys each
    query sees, GQA heads repeated), in float64: the same sums in another order, so within
    ``S * eps`` of the row's score magnitude."""
    from sparsenorm.kernels.reference.evidential_attention import threshold

    q, k, _ = qkv(L=24, S=40)
    B, Hq, L, E = q.shape
    S = k.shape[2]
    valid = (torch.arange(S) < torch.tensor([[S], [S - 13]])) if padding else None
    if not causal and causal_offset:
        pytest.skip("the offset matters under a causal mask only")
    got = flex.key_padding_threshold(q, k, valid, causal, E ** -0.5, causal_offset)
    keep = None if valid is None else valid.view(B, 1, 1, S)
    want, count = threshold(q, k.repeat_interleave(Hq // k.shape[1], 1), keep, None, causal, E ** -0.5,
                            causal_offset=causal_offset)
    seen = (count.squeeze(-1) > 0).expand(B, Hq, L)
    magnitude = (q.abs() @ k.abs().repeat_interleave(Hq // k.shape[1], 1).transpose(-2, -1)).max() * E ** -0.5
    assert got.dtype == torch.float32
    # float32 sums (the op's contract) of float64 inputs: S + E roundings of float32 on the magnitude.
    bound = (S + E + 2) * torch.finfo(torch.float32).eps * magnitude
    assert ((got.double() - want.squeeze(-1)).abs()[seen] <= bound).all()


def test_key_prefix_sums_op_is_a_float32_cumsum():
    """``sparsenorm::key_prefix_sums`` on CPU: float32 prefix sums along the sequence, any float dtype."""
    from sparsenorm.kernels.ops.evidential_attention import key_prefix_sums

    g = torch.Generator().manual_seed(3)
    k = torch.randn(2, 3, 50, 7, generator=g).to(torch.bfloat16)
    out = key_prefix_sums(k)
    assert out.dtype == torch.float32 and out.shape == k.shape
    assert torch.equal(out, torch.cumsum(k.float(), -2))
    torch.library.opcheck(key_prefix_sums, (k,))


@pytest.mark.parametrize("causal", [False, True])
def test_float_mask_equals_dense_ev_softmax(causal):
    """A float (additive) mask on the Flex path: added to the scores, its mean part of the threshold."""
    q, k, v = qkv(dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    bias = torch.randn(2, 1, 24, 40, generator=g, dtype=torch.float64)
    out = flex.ev_softmax_flex_attention(q, k, v, bias=bias, is_causal=causal)
    rep = q.shape[1] // k.shape[1]
    expected = sparse_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), "ev_softmax",
                                attn_mask=bias, is_causal=causal)
    torch.testing.assert_close(out, expected, rtol=0, atol=tolerance(q, k, v, torch.float64))


def test_float_mask_through_sparse_attention_backend_flex():
    """``sparse_attention(..., attn_mask=<float>, backend="flex")``: the float mask reaches the Flex
    path in its broadcast form (GQA heads, a mask shared by the batch), equal to the dense path."""
    q, k, v = qkv(dtype=torch.float64)
    g = torch.Generator().manual_seed(9)
    bias = torch.randn(24, 40, generator=g, dtype=torch.float64)
    with torch.no_grad():
        out = sparse_attention(q, k, v, "ev_softmax", attn_mask=bias, backend="flex")
        expected = sparse_attention(q, k, v, "ev_softmax", attn_mask=bias, backend="dense")
    torch.testing.assert_close(out, expected, rtol=0, atol=tolerance(q, k, v, torch.float64))
