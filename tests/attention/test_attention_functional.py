"""sparse_attention: SDPA's conventions, the not-there rule for every normalizer, edge cases, errors."""
import pytest
import torch
import torch.nn.functional as F

import sparsenorm
from sparsenorm import registry
from sparsenorm.attention import sparse_attention
from sparsenorm.attention.masks import split_mask

# posthoc_evidential is ev-softmax of the scores in functional attention; tested separately.
NORMALIZERS = [n for n in registry.names() if n != "posthoc_evidential"]


def qkv(*batch, L=5, S=7, E=4, Ev=3, hk=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    kb = batch if hk is None else batch[:-1] + (hk,)
    return (torch.randn(*batch, L, E, generator=g, dtype=dtype),
            torch.randn(*kb, S, E, generator=g, dtype=dtype),
            torch.randn(*kb, S, Ev, generator=g, dtype=dtype))


@pytest.mark.parametrize("case", ["plain", "bool", "float", "causal", "scale", "broadcast"])
def test_softmax_equals_sdpa(case):
    q, k, v = qkv(2, 3)
    kwargs = {}
    if case == "bool":
        kwargs["attn_mask"] = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
        kwargs["attn_mask"][..., 0] = True  # SDPA gives NaN for rows with no key
    elif case == "float":
        kwargs["attn_mask"] = torch.randn(5, 7, dtype=torch.float64)
    elif case == "causal":
        kwargs["is_causal"] = True
    elif case == "scale":
        kwargs["scale"] = 0.3
    elif case == "broadcast":
        k, v = k[:1], v[:1]
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(sparse_attention(q, k, v, "softmax", **kwargs), expected)


def test_grouped_query_attention_equals_sdpa_enable_gqa():
    q, k, v = qkv(2, 6, hk=2)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(sparse_attention(q, k, v, "softmax"), expected)
    with pytest.raises(ValueError, match="key has 4 heads"):
        sparse_attention(q, torch.randn(2, 4, 7, 4, dtype=torch.float64), torch.randn(2, 4, 7, 3, dtype=torch.float64))


@pytest.mark.parametrize("name", NORMALIZERS)
def test_padding_does_not_change_the_output(name):
    """The same sequence padded to several lengths gives identical outputs and weights."""
    q, k, v = qkv(1, 2, L=4, S=6, seed=3)
    base_out, base_w = sparse_attention(q, k, v, name, return_weights=True)
    for pad in (1, 3, 10):
        kp = torch.cat([k, 100 * torch.randn(1, 2, pad, 4, dtype=k.dtype)], dim=-2)  # large junk keys
        vp = torch.cat([v, torch.randn(1, 2, pad, 3, dtype=v.dtype)], dim=-2)
        keep = torch.arange(6 + pad) < 6
        for mask in (keep, torch.zeros(6 + pad, dtype=k.dtype).masked_fill(~keep, torch.finfo(k.dtype).min)):
            out, w = sparse_attention(q, kp, vp, name, attn_mask=mask, return_weights=True)
            torch.testing.assert_close(out, base_out, rtol=0, atol=1e-12)
            assert torch.equal(w[..., 6:], torch.zeros_like(w[..., 6:]))
            torch.testing.assert_close(w[..., :6], base_w, rtol=0, atol=1e-12)


def test_ev_softmax_weights_are_ev_softmax_of_the_valid_scores():
    q, k, v = qkv(2, 2, L=6, S=9, seed=4)
    keep = torch.rand(2, 1, 6, 9, generator=torch.Generator().manual_seed(5)) > 0.3
    _, w = sparse_attention(q, k, v, "ev_softmax", attn_mask=keep, return_weights=True)
    scores = (q @ k.transpose(-2, -1)) / 2.0  # scale 1/sqrt(4)
    for idx in torch.cartesian_prod(*(torch.arange(n) for n in (2, 2, 6))):
        b, h, i = idx.tolist()
        valid = keep[b, 0, i]
        if not valid.any():
            assert torch.equal(w[b, h, i], torch.zeros(9, dtype=w.dtype))
            continue
        s = scores[b, h, i][valid]
        expected = torch.where(s >= s.mean(), torch.exp(s), torch.zeros_like(s))  # Eq. 7, mean over valid keys
        torch.testing.assert_close(w[b, h, i][valid], expected / expected.sum())
        assert torch.equal(w[b, h, i][~valid], torch.zeros(int((~valid).sum()), dtype=w.dtype))


def test_finfo_min_additive_mask_is_not_there_even_after_adding_a_bias():
    """HF-style masks: finfo.min (possibly plus a finite bias) counts as masked, not as a score."""
    q, k, v = qkv(1, 1, L=3, S=5)
    keep = torch.tensor([True, True, True, False, False])
    bias = torch.randn(3, 5, dtype=torch.float64)
    additive = bias + torch.zeros(5, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float64).min)
    expected = sparse_attention(q, k, v, attn_mask=bias.masked_fill(~keep, float("-inf")))
    torch.testing.assert_close(sparse_attention(q, k, v, attn_mask=additive), expected)
    ref_keep, ref_bias = split_mask(additive)
    assert torch.equal(ref_keep, keep.expand(3, 5)) and torch.equal(ref_bias, bias.masked_fill(~keep, 0.0))


@pytest.mark.parametrize("name", NORMALIZERS)
def test_rows_without_a_valid_key_give_zero_output_and_zero_gradient(name):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, L=3, S=4))
    keep = torch.tensor([[True, False, True, True], [False] * 4, [True, False, False, True]])
    out, w = sparse_attention(q, k, v, name, attn_mask=keep, return_weights=True)
    assert torch.equal(out[..., 1, :], torch.zeros_like(out[..., 1, :]))
    assert torch.equal(w[..., 1, :], torch.zeros_like(w[..., 1, :]))
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[..., 1, :], torch.zeros_like(q.grad[..., 1, :]))
    assert torch.equal(v.grad[..., 1, :], torch.zeros_like(v.grad[..., 1, :]))  # key 1 is masked for every query


@pytest.mark.parametrize("name", ["ev_softmax", "sparsemax", "entmax15", "softmax"])
def test_gradcheck_dense_path(name):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, L=3, S=5, seed=7))
    keep = torch.tensor([True, True, True, True, False])
    assert torch.autograd.gradcheck(lambda q, k, v: sparse_attention(q, k, v, name, attn_mask=keep), (q, k, v))


def test_posthoc_evidential_is_ev_softmax_and_callables_take_params():
    q, k, v = qkv(2, 2)
    torch.testing.assert_close(sparse_attention(q, k, v, "posthoc_evidential"), sparse_attention(q, k, v, "ev_softmax"))
    torch.testing.assert_close(sparse_attention(q, k, v, sparsenorm.entmax_bisect, alpha=1.3),
                               sparse_attention(q, k, v, "entmax_bisect", alpha=1.3))


def test_dropout_drops_and_rescales_weights():
    q, k, v = qkv(2, 2, L=20, S=30)
    torch.manual_seed(0)
    _, w = sparse_attention(q, k, v, "softmax", dropout_p=0.5, return_weights=True)
    _, w0 = sparse_attention(q, k, v, "softmax", return_weights=True)
    dropped = w == 0
    assert 0.3 < dropped.double().mean() < 0.7
    torch.testing.assert_close(w[~dropped], 2 * w0[~dropped])


def test_low_precision_is_computed_in_float32_and_returned_in_the_input_dtype():
    q, k, v = qkv(1, 2, dtype=torch.bfloat16)
    out, w = sparse_attention(q, k, v, return_weights=True)
    assert out.dtype == w.dtype == torch.bfloat16
    expected = sparse_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"normalizer": "softmaxx"}, ValueError, "unknown normalizer"),
    ({"normalizer": 3}, TypeError, "normalizer"),
    ({"normalizer": "sparsemax", "alpha": 1.2}, ValueError, "alpha"),
    ({"attn_mask": torch.ones(5, 7, dtype=torch.long)}, TypeError, "attn_mask"),
    ({"attn_mask": torch.ones(4, 7, dtype=torch.bool)}, ValueError, "attn_mask of shape"),
    ({"dropout_p": 1.0}, ValueError, "dropout_p"),
])
def test_bad_arguments_fail_with_a_clear_error(kwargs, error, match):
    q, k, v = qkv(2)
    with pytest.raises(error, match=match):
        sparse_attention(q, k, v, **kwargs)


def test_mismatched_shapes_and_dtypes_fail_clearly():
    q, k, v = qkv(2)
    with pytest.raises(ValueError, match="last dimension"):
        sparse_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="same length"):
        sparse_attention(q, k, v[..., :6, :])
    with pytest.raises(TypeError, match="one dtype"):
        sparse_attention(q, k.float(), v)
    with pytest.raises(TypeError, match="floating-point"):
        sparse_attention(q.long(), k, v)
