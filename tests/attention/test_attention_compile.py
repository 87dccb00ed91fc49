"""Every attention entry point traces under ``torch.compile(fullgraph=True)`` and equals eager.

Error model: ``backend="eager"`` replays the very aten calls of eager mode, so values and
gradients must be bitwise equal. Inductor fuses and reorders reductions: in float64 that moves a
result by a few ulps of the sums involved (<= ~n * 2**-52 relative for n <= 64 terms), so 1e-12
relative / absolute is a bound with a wide margin that a wrong result (or support) cannot meet.
"""
import pytest
import torch

from sparsenorm.attention import MultiheadAttention, record, sparse_attention

EXACT = dict(rtol=0.0, atol=0.0)


def compiled(fn, backend="eager", fullgraph=True):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=fullgraph, backend=backend)


def values_and_grads(fn, inputs):
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*inputs)
    grads = torch.autograd.grad(out, [t for t in inputs if t.requires_grad],
                                torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
    return (out, *grads)


def assert_same(got, want, **tol):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **(tol or EXACT))


def test_the_issue_repro_compiles_fullgraph():
    m = MultiheadAttention(16, 2, batch_first=True, normalizer="ev_softmax")
    x = torch.randn(2, 5, 16)
    fn = lambda x: m(x, x, x, need_weights=False)[0]  # noqa: E731
    torch.testing.assert_close(compiled(fn)(x), fn(x), **EXACT)


PADDING = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 5 + [True]])


@pytest.mark.parametrize("normalizer", ["ev_softmax", "sparsemax", "posthoc_evidential"])
@pytest.mark.parametrize("masks", ["none", "bool padding", "float attn_mask", "key_lengths"])
@pytest.mark.parametrize("training", [False, True])
def test_multihead_attention(normalizer, masks, training):
    torch.manual_seed(0)
    m = MultiheadAttention(8, 2, batch_first=True, normalizer=normalizer).double().train(training)
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    kwargs = {
        "none": {},
        "bool padding": {"key_padding_mask": PADDING},
        "float attn_mask": {"attn_mask": torch.randn(6, 6, dtype=torch.float64).masked_fill(
            torch.eye(6, dtype=torch.bool).roll(1, 1), float("-inf"))},
        "key_lengths": {"key_lengths": torch.tensor([6, 4, 5])},
    }[masks]
    fn = lambda x: m(x, x, x, **kwargs)[0]  # noqa: E731
    want = values_and_grads(fn, [x])
    assert_same(values_and_grads(compiled(fn), [x]), want)


def qkv(dtype=torch.float64, B=2, H=2, L=5, S=7, E=4):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(B, H, n, E, generator=g, dtype=dtype) for n in (L, S, S)]


def mask_kwargs(form, B=2, L=5, S=7, dtype=torch.float64):
    g = torch.Generator().manual_seed(4)
    keep = torch.rand(B, 1, L, S, generator=g) > 0.3
    keep[..., 0] = True
    if form == "bool":
        return {"attn_mask": keep}
    if form == "float":  # a bias with finfo.min entries (Hugging Face's eager fill) and -inf
        bias = torch.randn(B, 1, L, S, generator=g, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
        return {"attn_mask": bias.masked_fill(torch.rand(B, 1, L, S, generator=g) > 0.9, float("-inf"))}
    if form == "key_lengths":
        return {"key_lengths": torch.tensor([S, 3])}
    if form == "query_lengths":
        return {"key_lengths": torch.tensor([S, 3]), "query_lengths": torch.tensor([2, L])}
    return {}


@pytest.mark.parametrize("form", ["none", "bool", "float", "key_lengths", "query_lengths"])
@pytest.mark.parametrize("normalizer, backend", [("ev_softmax", "dense"), ("ev_softmax", "blockwise"),
                                                 ("entmax15", "auto"), ("softmax", "auto")])
def test_sparse_attention_every_mask_form(form, normalizer, backend):
    kwargs = mask_kwargs(form)
    fn = lambda q, k, v: sparse_attention(q, k, v, normalizer, is_causal=True, backend=backend,  # noqa: E731
                                          **kwargs)
    want = values_and_grads(fn, qkv())
    assert_same(values_and_grads(compiled(fn), qkv()), want)


@pytest.mark.parametrize("form", ["none", "bool", "key_lengths", "query_lengths"])
@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax15", "entmax_bisect"])
def test_searched_blockwise_attention_compiles_with_every_mask_form_it_takes(form, normalizer):
    """``sparsenorm::projection_attention`` (the O(L) sparsemax/entmax path; it takes no float mask)."""
    kwargs = mask_kwargs(form)
    fn = lambda q, k, v: sparse_attention(q, k, v, normalizer, is_causal=True, backend="blockwise",  # noqa: E731
                                          **kwargs)
    want = values_and_grads(fn, qkv())
    assert_same(values_and_grads(compiled(fn), qkv()), want)


def test_float_mask_gradient_compiles():
    q, k, v = qkv()
    bias = mask_kwargs("float")["attn_mask"]
    fn = lambda q, k, v, b: sparse_attention(q, k, v, "sparsemax", attn_mask=b)  # noqa: E731
    want = values_and_grads(fn, [q, k, v, bias])
    assert_same(values_and_grads(compiled(fn), [q, k, v, bias]), want)


@pytest.mark.slow  # ~40 s of C++ compilation on a shared 2-core machine
def test_inductor_on_cpu():
    """The default backend (inductor, C++ on CPU): a float mask on the dense path and the blockwise op."""
    kwargs = mask_kwargs("float")
    fn = lambda q, k, v: (sparse_attention(q, k, v, "ev_softmax", **kwargs)  # noqa: E731
                          + sparse_attention(q, k, v, "ev_softmax", key_lengths=torch.tensor([7, 3]),
                                             backend="blockwise"))
    want = values_and_grads(fn, qkv())
    assert_same(values_and_grads(compiled(fn, backend="inductor"), qkv()), want, rtol=1e-12, atol=1e-12)


def test_recording_statistics_under_compile():
    """Outside ``record()`` the graph is whole; inside, the counting is one graph break and counts
    what eager counts."""
    torch.manual_seed(0)
    m = MultiheadAttention(8, 2, batch_first=True, normalizer="sparsemax")
    x = torch.randn(3, 6, 8)
    fn = lambda x: m(x, x, x, key_padding_mask=PADDING, need_weights=False)[0]  # noqa: E731
    with record(m) as eager_stats:
        fn(x)
    with record(m) as compiled_stats:
        compiled(fn, fullgraph=False)(x)
    a, b = eager_stats.layers[""] if "" in eager_stats.layers else eager_stats.layers["MultiheadAttention"], None
    b = compiled_stats.layers[next(iter(compiled_stats.layers))]
    for field in ("queries", "support_sum", "valid_sum", "histogram"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    compiled(fn)(x)  # and a whole graph again once no record() is open


# ---------------------------------------------------------------------------------------------
# Hugging Face: every registered sparsenorm attention on tiny BERT / T5 / Marian models
# ---------------------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")
import sparsenorm.hf as hf  # noqa: E402

from test_attention_hf import bert, marian, padded_batch, t5  # noqa: E402


def hf_case(factory):
    ids, mask = padded_batch()
    if factory is bert:
        return lambda m: m(input_ids=ids, attention_mask=mask).last_hidden_state
    dec = torch.randint(2, 40, (3, 4), generator=torch.Generator().manual_seed(6))
    return lambda m: m(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits


FAST = {"sparsenorm_ev_softmax", "sparsenorm_sparsemax", "sparsenorm_posthoc_evidential"}


@pytest.mark.parametrize("factory", [bert, t5, marian], ids=["bert", "t5", "marian"])
@pytest.mark.parametrize("impl", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in hf.REGISTERED])
def test_every_hf_attention_compiles_fullgraph(factory, impl):
    model = factory()
    model.set_attn_implementation(impl)
    model.train(impl == "sparsenorm_posthoc_evidential")  # its training form, with dropout, too
    run = hf_case(factory)

    def loss_and_grads(fn):
        torch.manual_seed(7)  # the same dropout draws: the compiled graph makes the same RNG calls
        model.zero_grad()
        out = fn(model)
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        return [out.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want = loss_and_grads(run)
    got = loss_and_grads(compiled(run))
    assert_same(got, want)
