"""The blockwise ev-softmax path agrees with the dense path (values and gradients) and is chosen automatically."""
import pytest
import torch

from sparsenorm.attention import ev_softmax_attention_blockwise, sparse_attention
from sparsenorm.kernels.attention import dispatch
from sparsenorm.attention.masks import split_mask

from knife_edge import assert_agree_by_contract, softmax_on


def qkv(*batch, L, S, E=8, Ev=5, dtype=torch.float32, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, n, e, generator=g, dtype=dtype).requires_grad_(requires_grad)
                 for n, e in ((L, E), (S, E), (S, Ev)))


def masks(L, S):
    g = torch.Generator().manual_seed(11)
    general = torch.rand(2, 1, L, S, generator=g) > 0.4
    general[0, 0, 3] = False  # a row with no valid key
    bias = torch.randn(L, S, generator=g)
    return {
        "none": None,
        "1-d key padding": torch.arange(S) < S - 5,
        "key padding": (torch.arange(S) < torch.tensor([[S - 7], [S]])).reshape(2, 1, 1, S),
        "general bool": general,
        "additive finfo.min": torch.zeros(2, 1, L, S).masked_fill(~general, torch.finfo(torch.float32).min),
        "float bias + -inf": bias.masked_fill(torch.rand(L, S, generator=g) > 0.8, float("-inf")),
    }


@pytest.fixture
def always_blockwise(monkeypatch):
    monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 0)
    monkeypatch.setattr("sparsenorm.kernels.reference.evidential_attention.BLOCK_Q", 16)
    monkeypatch.setattr("sparsenorm.kernels.reference.evidential_attention.BLOCK_K", 16)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_name", list(masks(8, 8)))
def test_agrees_with_dense_path_in_float32(always_blockwise, mask_name, causal):
    L, S = 40, 53
    q, k, v = qkv(2, 3, L=L, S=S)
    mask = masks(L, S)[mask_name]
    dense, _ = sparse_attention(q, k, v, attn_mask=mask, is_causal=causal, return_weights=True)
    grad = torch.randn_like(dense)
    expected = torch.autograd.grad(dense, (q, k, v), grad)
    out = sparse_attention(q, k, v, attn_mask=mask, is_causal=causal)
    assert "ev_softmax_attention_blockwise" in type(out.grad_fn).__name__  # the blockwise path ran
    got = torch.autograd.grad(out, (q, k, v), grad)
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-6)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gqa_and_broadcast_batch_dims(always_blockwise):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 20, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 30, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 30, 6, generator=g, dtype=torch.float64, requires_grad=True)
    dense, _ = sparse_attention(q, k, v, is_causal=True, return_weights=True)
    out = sparse_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, dense)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    for a, b in zip(got, torch.autograd.grad(dense.sum(), (q, k, v))):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("mask_name", ["none", "general bool", "float bias + -inf"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_float64(mask_name, causal):
    q, k, v = qkv(2, 1, L=6, S=9, E=3, Ev=2, dtype=torch.float64, seed=5)
    keep, bias = split_mask(masks(6, 9)[mask_name])
    fn = lambda q, k, v: ev_softmax_attention_blockwise(q, k, v, keep, bias, causal, block_q=4, block_k=4)[0]
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_rows_whose_mean_rounds_above_every_score_are_compared_by_the_contract():
    """Identical keys: every score equals the exact mean, so each one is on the knife-edge and the
    blockwise and dense paths (which round the mean differently: q . mean(k) against mean(q . k))
    may keep different keys. Each path is checked on its own support (``v = eye(S)`` makes the
    output the weights): no NaN, at least the maximum kept, weights = float64 softmax on the support."""
    g = torch.Generator().manual_seed(12)
    q = torch.randn(1, 7, 3, generator=g, dtype=torch.float32)
    k = torch.full((1, 9, 3), 0.1)
    v = torch.eye(9).unsqueeze(0)
    scale = 3 ** -0.5
    blockwise, _, _ = ev_softmax_attention_blockwise(q, k, v, block_q=4, block_k=4)
    dense = sparse_attention(q, k, v, return_weights=True)[0]
    scores = q.double() @ k.double().transpose(-2, -1) * scale
    u = torch.finfo(torch.float32).eps / 2
    bound = 4 * u * (3 + 9) * (q.double().abs() @ k[:, :1].double().abs().transpose(-2, -1)) * scale + 4 * u
    ambiguous = assert_agree_by_contract({"blockwise": blockwise, "dense": dense}, scores,
                                         scores.mean(-1, keepdim=True), bound, softmax_on, rtol=1e-5, atol=1e-6)
    assert ambiguous.all()


def test_a_single_valid_key_gets_weight_one():
    """The first causal row has one valid key: whatever the rounded mean, that key is its maximum and is kept."""
    g = torch.Generator().manual_seed(13)
    q = torch.randn(1, 7, 3, generator=g, dtype=torch.float32)
    k = torch.full((1, 9, 3), 0.1)
    v = torch.randn(1, 9, 2, generator=g)
    out, support, count = ev_softmax_attention_blockwise(q, k, v, is_causal=True, count_support=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 0], v[:, 0])
    assert (support >= 1).all() and torch.equal(count[0, :3], torch.tensor([1.0, 2.0, 3.0]))


def test_empty_rows_give_zero_and_zero_gradient():
    q, k, v = qkv(1, L=3, S=4, dtype=torch.float64)
    keep = torch.tensor([[True, False, True, True], [False] * 4, [True, False, False, True]])
    out, _, _ = ev_softmax_attention_blockwise(q, k, v, keep, block_q=2, block_k=2)
    assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1]))
    out.sum().backward()
    assert torch.equal(q.grad[:, 1], torch.zeros_like(q.grad[:, 1])) and torch.equal(v.grad[:, 1],
                                                                                     torch.zeros_like(v.grad[:, 1]))


def test_automatic_choice(monkeypatch):
    # more queries than the few-queries ("decode") kernel takes, which "auto" tries first
    q, k, v = qkv(1, 2, L=20, S=20)
    monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 400)
    assert "ev_softmax_attention_blockwise" in type(sparse_attention(q, k, v).grad_fn).__name__
    # weights requested, another normalizer, dropout, or a float mask with a gradient: dense
    for kwargs in ({"normalizer": "sparsemax"}, {"dropout_p": 0.1},
                   {"attn_mask": torch.zeros(20, 20, requires_grad=True)}):
        assert "ev_softmax_attention_blockwise" not in type(sparse_attention(q, k, v, **kwargs).grad_fn).__name__
    monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 401)
    assert "ev_softmax_attention_blockwise" not in type(sparse_attention(q, k, v).grad_fn).__name__
    monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 1)
    few = qkv(1, 2, L=dispatch.DECODE_MAX_QUERIES, S=20)  # a few queries: the "decode" kernel, any size
    assert "ev_softmax_attention_blockwise" not in type(sparse_attention(*few).grad_fn).__name__


@pytest.mark.parametrize("causal", [False, True])
def test_padding_does_not_change_the_blockwise_output(causal):
    """Junk keys behind a key-padding mask are left out of the mean: same output to rounding."""
    q, k, v = qkv(1, 2, L=20, S=20, dtype=torch.float64, requires_grad=False)
    base, _, _ = ev_softmax_attention_blockwise(q, k, v, is_causal=causal, block_q=8, block_k=8)
    for pad in (1, 9, 30):
        kp = torch.cat([k, 1e3 * torch.randn(1, 2, pad, 8, dtype=k.dtype)], dim=-2)
        vp = torch.cat([v, torch.randn(1, 2, pad, 5, dtype=v.dtype)], dim=-2)
        keep = (torch.arange(20 + pad) < 20).view(1, 1, 1, -1)
        out, _, _ = ev_softmax_attention_blockwise(q, kp, vp, keep, is_causal=causal, block_q=8, block_k=8)
        torch.testing.assert_close(out, base, rtol=0, atol=1e-12)
