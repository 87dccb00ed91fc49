"""The attention op layer: registered ops (opcheck, float64 gradcheck), ``backend=``, the kernel
table keyed by registry capability, ``key_lengths=``, and masks split without reading values."""
import pytest
import torch

from sparsenorm.kernels.auto_plan import flex_available
import sparsenorm
from sparsenorm import registry
from sparsenorm.attention import MultiheadAttention, sparse_attention
from sparsenorm.attention.masks import merge, split_mask
from sparsenorm.kernels.attention import dispatch
from sparsenorm.kernels.ops import evidential_attention

NORMALIZERS = registry.names()


def qkv(B=2, H=2, L=5, S=7, E=4, Ev=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, e, generator=g, dtype=dtype).requires_grad_()
                 for n, e in ((L, E), (S, E), (S, Ev)))


# ---------------------------------------------------------------------------------------------- ops
def test_blockwise_op_passes_opcheck():
    """Schema, fake (meta) implementation, autograd registration and dispatch agree."""
    q, k, v = qkv()
    keep = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    bias = torch.randn(5, 7, dtype=torch.float64)
    for args in ((q, k, v, None, None, False, 0.5, False, 4, 4), (q, k, v, keep, bias, True, 0.5, True, 2, 3)):
        torch.library.opcheck(evidential_attention.ev_softmax_attention_blockwise_op, args)


@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_op_gradcheck_with_key_lengths(causal):
    q, k, v = qkv()
    lengths = torch.tensor([7, 2])
    fn = lambda q, k, v: sparse_attention(q, k, v, key_lengths=lengths, is_causal=causal,  # noqa: E731
                                          backend="blockwise")
    assert "ev_softmax_attention_blockwise" in type(fn(q, k, v).grad_fn).__name__
    assert torch.autograd.gradcheck(fn, (q, k, v))


# ---------------------------------------------------------------------------------------------- backend
def test_backend_values_are_checked_and_named():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'dense', 'blockwise', 'triton', 'flex'"):
        sparse_attention(q, k, v, backend="fast")
    with pytest.raises(ValueError, match="backend='flex' has no kernel"):
        sparse_attention(q, k, v, "sparsemax", backend="flex")
    with pytest.raises(ValueError, match="backend='blockwise' has no kernel"):
        sparse_attention(q, k, v, "r_softmax", backend="blockwise")
    with pytest.raises(ValueError, match="returns no weights"):
        sparse_attention(q, k, v, backend="blockwise", return_weights=True)
    with pytest.raises(ValueError, match="returns no weights"):
        sparse_attention(q, k, v, backend="blockwise", attn_mask=torch.zeros(5, 7, requires_grad=True))


@pytest.mark.parametrize("name", NORMALIZERS)
def test_every_backend_that_exists_equals_dense(name):
    q, k, v = qkv(L=6, S=9)
    keep = torch.arange(9) < torch.tensor([9, 4]).view(2, 1, 1, 1)
    dense = sparse_attention(q, k, v, name, attn_mask=keep, is_causal=True, backend="dense")
    threshold = registry.get(name).for_mode(False).attention_threshold
    for backend in dispatch.KERNELS.get(threshold, {}):
        try:
            out = sparse_attention(q, k, v, name, attn_mask=keep, is_causal=True, backend=backend)
        except ValueError as err:  # a kernel that does not apply on this machine (triton: no GPU)
            assert "does not apply" in str(err)
            continue
        torch.testing.assert_close(out, dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NORMALIZERS)
@pytest.mark.parametrize("L, S", [(4, 0), (0, 5), (0, 0)])
def test_every_backend_gives_sdpas_answer_without_keys_or_queries(name, L, S):
    """No key: every query attends to nothing, so its output row is 0 with zero gradient (SDPA's
    answer too); no query: an empty output. The tiled kernels once crashed deep inside on S = 0."""
    q, k, v = qkv(L=L, S=S)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    threshold = registry.get(name).for_mode(False).attention_threshold
    for backend in ("auto", "dense", *dispatch.KERNELS.get(threshold, {})):
        out = sparse_attention(q, k, v, name, backend=backend)
        assert out.shape == expected.shape and torch.equal(out, expected), backend
        grads = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
        assert all(g is None or not g.any() for g in grads), backend


def test_a_kernel_is_one_table_entry(monkeypatch):
    """What the sparsemax/entmax blockwise op will do: register a kernel for ``"searched"``; then
    ``backend="blockwise"`` and ``"auto"`` (past BLOCKWISE_MIN_SCORES) run it for sparsemax."""
    calls = []

    def kernel(call):
        calls.append(call.alpha)
        out, _, support, valid = dispatch.dense_attention(sparsenorm.sparsemax, call)
        return out, support, valid

    monkeypatch.setitem(dispatch.KERNELS, "searched", {})
    dispatch.register_attention_kernel("searched", "blockwise", kernel)
    q, k, v = qkv()
    sparse_attention(q, k, v, "sparsemax", backend="blockwise")
    sparse_attention(q, k, v, "entmax_bisect", alpha=1.7, backend="blockwise")
    sparse_attention(q, k, v, "sparsemax")  # auto, below the size threshold: dense
    monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 1)
    sparse_attention(q, k, v, "entmax15")
    assert calls == [2.0, 1.7, 1.5]
    with pytest.raises(ValueError, match="backend must be one of"):
        dispatch.register_attention_kernel("searched", "auto", kernel)


# ---------------------------------------------------------------------------------------------- key_lengths
@pytest.mark.parametrize("name", NORMALIZERS)
@pytest.mark.parametrize("causal", [False, True])
def test_key_lengths_equal_a_padding_mask(name, causal):
    q, k, v = qkv(L=6, S=9)
    lengths = torch.tensor([9, 0])  # the second sequence has no key: zero output, zero gradient
    keep = torch.arange(9) < lengths.view(2, 1, 1, 1)
    out, w = sparse_attention(q, k, v, name, key_lengths=lengths, is_causal=causal, return_weights=True)
    ref, ref_w = sparse_attention(q, k, v, name, attn_mask=keep, is_causal=causal, return_weights=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=0)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    out.sum().backward()
    assert torch.equal(q.grad[1], torch.zeros_like(q.grad[1]))


def test_key_lengths_combine_with_masks_in_modules():
    torch.manual_seed(0)
    m = MultiheadAttention(8, 2, batch_first=True, normalizer="entmax15").double().eval()
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    lengths = torch.tensor([6, 4, 1])
    pad = torch.arange(6) >= lengths.view(3, 1)  # True = not allowed (PyTorch's MHA convention)
    out, w = m(x, x, x, key_lengths=lengths)
    ref, ref_w = m(x, x, x, key_padding_mask=pad)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=0)
    m = MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True, add_zero_attn=True,
                           normalizer="ev_softmax").double().eval()
    torch.testing.assert_close(m(x, x, x, key_lengths=lengths)[0], m(x, x, x, key_padding_mask=pad)[0])


@pytest.mark.parametrize("lengths, error, match", [
    ([7, 2], TypeError, "key_lengths must be an integer tensor"),  # a list
    (torch.tensor([7.0, 2.0]), TypeError, "integer tensor, got dtype torch.float32"),
    (torch.tensor([7]), ValueError, r"shape \(2,\)"),
    (torch.tensor([[7, 2]]), ValueError, r"shape \(2,\)"),
    (torch.tensor([8, 2]), ValueError, r"key_lengths must lie in \[0, 7\]"),
    (torch.tensor([-1, 2]), ValueError, r"key_lengths must lie in \[0, 7\]"),
])
def test_bad_key_lengths_are_named(lengths, error, match):
    q, k, v = qkv()
    with pytest.raises(error, match=match):
        sparse_attention(q, k, v, key_lengths=lengths)


# ---------------------------------------------------------------------------------------------- masks
def test_masks_split_and_merge_without_reading_values():
    """On meta tensors (which have no values) every conversion still runs: nothing is read on the host."""
    for mask in (torch.empty(2, 1, 5, 7, device="meta"), torch.empty(5, 7, device="meta", dtype=torch.bool)):
        keep, bias = merge(split_mask(mask), split_mask(torch.empty(2, 1, 1, 7, device="meta")))
        assert keep.shape == (2, 1, 5, 7) and keep.dtype == torch.bool
        assert bias.shape == (2, 1, 5 if mask.is_floating_point() else 1, 7)
    q, k, v = (torch.empty(2, 2, n, 4, device="meta") for n in (5, 7, 7))
    out = sparse_attention(q, k, v, "sparsemax", attn_mask=torch.empty(2, 1, 5, 7, device="meta"),
                           key_lengths=torch.empty(2, dtype=torch.long, device="meta"))
    assert out.shape == (2, 2, 5, 4)


def test_float_mask_rule():
    m = torch.tensor([0.0, -1.0, float("-inf"), torch.finfo(torch.float32).min, torch.finfo(torch.float32).min / 2,
                      torch.finfo(torch.float32).min / 2.1])
    keep, bias = split_mask(m)
    assert keep.tolist() == [True, True, False, False, False, True]
    assert bias.tolist() == [0.0, -1.0, 0.0, 0.0, 0.0, torch.finfo(torch.float32).min / 2.1]
    with pytest.raises(ValueError, match="attn_mask contains NaN"):
        split_mask(torch.tensor([0.0, float("nan")]))


@pytest.mark.parametrize("name, backend", [("ev_softmax", "blockwise"), ("ev_softmax", "dense"), ("entmax15", "auto")])
def test_query_lengths_zero_the_padded_rows(name, backend):
    """Padded query rows are exactly zero (output and gradient); the others equal unpadded attention."""
    q, k, v = qkv(L=6, S=6)
    lengths = torch.tensor([6, 4])
    out = sparse_attention(q, k, v, name, key_lengths=lengths, query_lengths=lengths, backend=backend)
    ref = sparse_attention(q, k, v, name, key_lengths=lengths, backend=backend)
    assert torch.equal(out[1, :, 4:], torch.zeros_like(out[1, :, 4:]))
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=0)
    torch.testing.assert_close(out[1, :, :4], ref[1, :, :4], rtol=0, atol=0)
    out.sum().backward()
    assert torch.equal(q.grad[1, :, 4:], torch.zeros_like(q.grad[1, :, 4:]))
    with pytest.raises(ValueError, match=r"query_lengths must lie in \[0, 6\]"):
        sparse_attention(q, k, v, query_lengths=torch.tensor([7, 1]))


def test_query_lengths_leave_padded_rows_out_of_the_statistics():
    q, k, v = qkv(L=6, S=6)
    lengths = torch.tensor([6, 4])
    with sparsenorm.attention.record() as stats:
        sparse_attention(q, k, v, key_lengths=lengths, query_lengths=lengths)
    assert torch.equal(stats.layers["sparse_attention"].queries, torch.tensor([10, 10]))


# ------------------------------------------------------------------ searched threshold and FlexAttention
SEARCHED = [n for n in NORMALIZERS if registry.get(n).attention_threshold == "searched"]


def ran(out, op_name: str) -> bool:
    """Whether ``op_name``'s autograd node is in ``out``'s graph (the route that computed it)."""
    todo, seen = [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if op_name in type(node).__name__:
            return True
        todo.extend(next_node for next_node, _ in node.next_functions)
    return False


@pytest.mark.parametrize("name", SEARCHED)
@pytest.mark.parametrize("layout", ["4-D GQA", "3-D", "5-D broadcast"])
def test_searched_blockwise_route_equals_dense_in_every_layout(name, layout):
    """``backend='blockwise'`` for a normalizer whose threshold is searched runs
    ``sparsenorm::projection_attention`` (O(L) memory) in any broadcastable layout: GQA and
    ``key_lengths`` go to the op as they are, other layouts as one batch of rows."""
    g = torch.Generator().manual_seed(4)
    shapes = {"4-D GQA": ((2, 4, 6, 4), (2, 2, 9, 4), (2, 2, 9, 3)),
              "3-D": ((3, 6, 4), (3, 9, 4), (3, 9, 3)),
              "5-D broadcast": ((2, 1, 2, 6, 4), (1, 3, 1, 9, 4), (1, 3, 1, 9, 3))}[layout]
    q, k, v = (torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes)
    kwargs = {"is_causal": True}
    if layout == "4-D GQA":
        kwargs["key_lengths"] = torch.tensor([9, 3])
        k_dense, v_dense = (t.repeat_interleave(2, 1) for t in (k, v))
    else:
        kwargs["attn_mask"] = torch.rand(6, 9, generator=g) > 0.3
        k_dense, v_dense = k, v
    out = sparse_attention(q, k, v, name, backend="blockwise", **kwargs)
    assert ran(out, "projection_attention")
    dense = sparse_attention(q, k_dense, v_dense, name, backend="dense", **kwargs)
    torch.testing.assert_close(out, dense, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    grads_dense = torch.autograd.grad(dense.square().sum(), (q, k, v))
    for got, want in zip(grads, grads_dense):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_auto_takes_the_searched_blockwise_kernel_for_long_sequences_and_dense_when_it_cannot():
    q, k, v = qkv(B=1, H=1, L=1024, S=1024, E=4, Ev=2, dtype=torch.float32)
    assert ran(sparse_attention(q, k, v, "sparsemax"), "projection_attention")
    # a differentiable float mask or weights need the dense path
    bias = torch.zeros(1024, 1024, requires_grad=True)
    assert not ran(sparse_attention(q, k, v, "sparsemax", attn_mask=bias), "projection_attention")
    with pytest.raises(ValueError, match="does not apply"):
        sparse_attention(q, k, v, "entmax15", attn_mask=torch.zeros(1024, 1024), backend="blockwise")


@pytest.mark.skipif(not flex_available(), reason="this torch has no flex_attention")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_route_equals_dense_without_grad_on_cpu_and_refuses_grad():
    q, k, v = (t.detach() for t in qkv(B=2, H=2, L=6, S=9))
    lengths = torch.tensor([9, 4])
    with torch.no_grad():
        out = sparse_attention(q, k, v, backend="flex", key_lengths=lengths, is_causal=True)
        dense = sparse_attention(q, k, v, backend="dense", key_lengths=lengths, is_causal=True)
    torch.testing.assert_close(out, dense, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="does not apply"):  # FlexAttention has no CPU backward
        sparse_attention(*(t.requires_grad_() for t in (q, k, v)), backend="flex")


def test_searched_query_block_shrinks_for_long_key_sequences_and_results_still_equal_dense():
    """The searched kernel's query block keeps block_q x S within SEARCHED_SCORES_PER_BLOCK (down to
    64 queries); with S = 8192 keys (block 128) the route still equals the dense path."""
    block = dispatch.searched_block_q
    assert [block(s) for s in (512, 4096, 8192, 16384, 10**6)] == [256, 256, 128, 64, 64]
    q, k, v = qkv(B=1, H=1, L=130, S=8192, E=4, Ev=3)
    for name in ("sparsemax", "entmax15"):
        out = sparse_attention(q, k, v, name, backend="blockwise")
        torch.testing.assert_close(out, sparse_attention(q, k, v, name, backend="dense"), rtol=1e-12, atol=1e-12)
