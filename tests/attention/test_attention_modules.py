"""MultiheadAttention is a drop-in for torch.nn.MultiheadAttention."""
import pytest
import torch
from torch import nn

from sparsenorm.attention import MultiheadAttention, sparse_attention

E, H = 8, 2


def pair(normalizer="softmax", **kwargs):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, **kwargs).double()
    ours = MultiheadAttention(E, H, normalizer=normalizer, **kwargs).double()
    ours.load_state_dict(ref.state_dict())
    return ref.eval(), ours.eval()


def inputs(batch_first=False, N=3, L=4, S=6, kdim=E, vdim=E):
    g = torch.Generator().manual_seed(1)
    shape = (lambda n: (N, n)) if batch_first else (lambda n: (n, N))
    return (torch.randn(*shape(L), E, generator=g, dtype=torch.float64),
            torch.randn(*shape(S), kdim, generator=g, dtype=torch.float64),
            torch.randn(*shape(S), vdim, generator=g, dtype=torch.float64))


PADDING = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 5 + [True]])


@pytest.mark.parametrize("ctor, call", [
    ({}, {}),
    ({"batch_first": True}, {}),
    ({"kdim": 5, "vdim": 3}, {}),
    ({"add_bias_kv": True}, {"key_padding_mask": PADDING}),
    ({"add_zero_attn": True}, {"key_padding_mask": PADDING}),
    ({"bias": False}, {"key_padding_mask": PADDING.double().masked_fill(PADDING, float("-inf"))}),
    ({}, {"key_padding_mask": PADDING, "average_attn_weights": False}),
    ({}, {"attn_mask": torch.rand(4, 6, generator=torch.Generator().manual_seed(2)) > 0.7}),
    ({}, {"attn_mask": torch.randn(3 * H, 4, 6, dtype=torch.float64)}),
    ({}, {"need_weights": False}),
])
def test_softmax_equals_torch_multihead_attention(ctor, call):
    ref, ours = pair(**ctor)
    q, k, v = inputs(ctor.get("batch_first", False), kdim=ctor.get("kdim", E), vdim=ctor.get("vdim", E))
    expected, expected_w = ref(q, k, v, **call)
    out, w = ours(q, k, v, **call)
    torch.testing.assert_close(out, expected)
    if expected_w is None:
        assert w is None
    else:
        torch.testing.assert_close(w, expected_w)


def test_no_normalizer_is_torch_multihead_attention():
    """The drop-in's defaults are PyTorch's: no ``normalizer`` means softmax, the same output and weights."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, batch_first=True).double().eval()
    ours = MultiheadAttention(E, H, batch_first=True).double().eval()
    ours.load_state_dict(ref.state_dict())
    q, k, v = inputs(batch_first=True)
    for call in ({}, {"key_padding_mask": PADDING}, {"need_weights": False}):
        expected, expected_w = ref(q, k, v, **call)
        out, w = ours(q, k, v, **call)
        torch.testing.assert_close(out, expected)
        if expected_w is None:
            assert w is None
        else:
            torch.testing.assert_close(w, expected_w)
    assert "normalizer=softmax" in repr(ours)


def test_unbatched_input_and_causal():
    ref, ours = pair()
    q = torch.randn(5, E, dtype=torch.float64)
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    expected, expected_w = ref(q, q, q, attn_mask=causal, is_causal=True)
    out, w = ours(q, q, q, is_causal=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w, expected_w)


def test_ev_softmax_module_matches_functional_and_ignores_padding():
    _, ours = pair("ev_softmax")
    q, k, v = inputs()
    out, w = ours(q, k, v, key_padding_mask=PADDING, average_attn_weights=False)
    assert torch.equal(w[1, :, :, 4:], torch.zeros_like(w[1, :, :, 4:]))
    # sequence 1 alone, without its padding, gives the same output
    alone, w_alone = ours(q[:, 1:2], k[:4, 1:2], v[:4, 1:2], average_attn_weights=False)
    torch.testing.assert_close(out[:, 1:2], alone)
    torch.testing.assert_close(w[1:2, :, :, :4], w_alone)


def test_posthoc_evidential_is_softmax_in_training_and_ev_softmax_in_eval():
    ref, ours = pair("posthoc_evidential")
    _, ev = pair("ev_softmax")
    q, k, v = inputs()
    ours.train(), ref.train()
    torch.testing.assert_close(ours(q, k, v)[1], ref(q, k, v)[1])
    ours.eval()
    torch.testing.assert_close(ours(q, k, v)[1], ev(q, k, v)[1])


def test_parameters_and_bad_normalizer():
    m = MultiheadAttention(E, H, normalizer="entmax_bisect", alpha=1.3)
    assert "alpha=1.3" in repr(m)
    q = torch.randn(4, 2, E)
    out, w = m(q, q, q, average_attn_weights=False)
    expected = sparse_attention(*(t.reshape(4, 2, H, E // H).permute(1, 2, 0, 3) for t in (
        nn.functional.linear(q, *(p.chunk(3)[0] for p in (m.in_proj_weight, m.in_proj_bias))),
        nn.functional.linear(q, *(p.chunk(3)[1] for p in (m.in_proj_weight, m.in_proj_bias))),
        nn.functional.linear(q, *(p.chunk(3)[2] for p in (m.in_proj_weight, m.in_proj_bias))))),
        "entmax_bisect", alpha=1.3, return_weights=True)[1]
    torch.testing.assert_close(w, expected)
    with pytest.raises(ValueError, match="unknown normalizer"):
        MultiheadAttention(E, H, normalizer="nope")
