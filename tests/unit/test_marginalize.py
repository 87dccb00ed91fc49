"""sparsenorm.marginalize: the exact expectation over the support equals the dense sum, value and gradient,
and evaluates fn on exactly the nonzero (example, class) pairs, in one packed call."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from sparsenorm import registry
from sparsenorm.marginalize import MarginalStats, marginalize

N, K, FEATURES, OUT = 7, 6, 5, 3


class Counting:
    """f(x, z) = tanh(x W_z) (OUT values per pair, or their sum): records every call and its rows."""

    def __init__(self, x, weight, scalar=False):
        self.x, self.weight, self.scalar = x, weight, scalar
        self.calls = []

    def __call__(self, example_index, class_index):
        self.calls.append((example_index.clone(), class_index.clone()))
        value = torch.tanh(torch.einsum("rf,rfo->ro", self.x[example_index], self.weight[class_index]))
        return value.sum(-1) if self.scalar else value

    def dense(self):
        """f on every (example, class) pair: (N, K, OUT) or (N, K)."""
        n, k = self.x.shape[0], self.weight.shape[0]
        ex, cls = torch.arange(n).repeat_interleave(k), torch.arange(k).repeat(n)
        value = torch.tanh(torch.einsum("rf,rfo->ro", self.x[ex], self.weight[cls]))
        value = value.sum(-1) if self.scalar else value
        return value.reshape(n, k, *value.shape[1:])


def make_f(dtype=torch.float64, scalar=False, requires_grad=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, FEATURES, generator=gen, dtype=dtype)
    weight = torch.randn(K, FEATURES, OUT, generator=gen, dtype=dtype).requires_grad_(requires_grad)
    return Counting(x, weight, scalar)


def dense_sum(probs, f):
    values = f.dense()
    return (probs.reshape(probs.shape + (1,) * (values.dim() - 2)) * values).sum(1)


def sparse_probs(seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return registry.get("sparsemax").forward(2 * torch.randn(N, K, generator=gen, dtype=dtype), dim=-1)


def probs_of(name, logits, gen):
    norm = registry.get(name)
    if norm.posthoc:  # post-hoc evidential needs the last layer's weights
        layer = nn.Linear(4, K).to(logits.dtype)
        return norm.probs_from_linear(torch.randn(logits.shape[0], 4, generator=gen, dtype=logits.dtype), layer)
    return norm.forward(logits, dim=-1)


@pytest.mark.parametrize("scalar", [False, True], ids=["vector_f", "scalar_f"])
@pytest.mark.parametrize("name", registry.names())
def test_equals_the_dense_sum_for_every_registry_normalizer(name, scalar):
    gen = torch.Generator().manual_seed(1)
    probs = probs_of(name, 3 * torch.randn(N, K, generator=gen, dtype=torch.float64), gen)
    f = make_f(scalar=scalar)
    out, stats = marginalize(probs, f, return_stats=True)
    expected = dense_sum(probs, f)
    assert out.shape == expected.shape == ((N,) if scalar else (N, OUT))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    # One call, on exactly the nonzero pairs.
    assert len(f.calls) == 1 and stats.calls == 1
    nnz = int((probs != 0).sum())
    assert stats.rows == nnz == f.calls[0][0].numel()
    torch.testing.assert_close(stats.support_size, (probs != 0).sum(-1))
    assert stats.rows_per_example == pytest.approx(nnz / N)
    evaluated = torch.zeros(N, K, dtype=torch.bool)
    evaluated[f.calls[0]] = True
    assert torch.equal(evaluated, probs != 0)  # each nonzero pair once, nothing else


def test_dense_softmax_evaluates_every_pair():
    probs = torch.softmax(torch.randn(N, K, dtype=torch.float64), -1)
    f = make_f()
    _, stats = marginalize(probs, f, return_stats=True)
    assert stats.rows == N * K


def test_sparse_normalizers_skip_rows():
    probs = sparse_probs()
    assert (probs == 0).any()  # the fixture must be sparse for this test to mean anything
    _, stats = marginalize(probs, make_f(), return_stats=True)
    assert stats.rows < N * K


@pytest.mark.parametrize("max_batch", [1, 3, 4, 1000])
def test_chunked_calls_give_the_same_result(max_batch):
    probs, f = sparse_probs(), make_f()
    out, stats = marginalize(probs, f, return_stats=True, max_batch=max_batch)
    torch.testing.assert_close(out, dense_sum(probs, f), rtol=1e-12, atol=1e-12)
    nnz = int((probs != 0).sum())
    assert stats.calls == len(f.calls) == math.ceil(nnz / max_batch)
    assert all(ex.numel() <= max_batch for ex, _ in f.calls)
    assert sum(ex.numel() for ex, _ in f.calls) == stats.rows == nnz


def test_empty_support_rows_give_zero():
    probs = sparse_probs()
    probs[2] = 0.0
    probs[5] = 0.0
    f = make_f()
    out = marginalize(probs, f)
    assert torch.equal(out[2], torch.zeros(OUT, dtype=out.dtype)) and torch.equal(out[5], out[2])
    assert not (f.calls[0][0] == 2).any()
    torch.testing.assert_close(out, dense_sum(probs, f), rtol=1e-12, atol=1e-12)


def test_all_zero_batch_calls_fn_once_with_no_rows():
    f = make_f()
    out, stats = marginalize(torch.zeros(N, K, dtype=torch.float64), f, return_stats=True)
    assert torch.equal(out, torch.zeros(N, OUT, dtype=torch.float64))
    assert stats.rows == 0 and len(f.calls) == 1 and f.calls[0][0].numel() == 0


def test_masked_rows_from_a_normalizer_give_zero():
    logits = torch.randn(N, K, dtype=torch.float64)
    logits[3] = float("-inf")  # a fully masked row: "not there" everywhere -> all-zero probabilities
    probs = registry.get("ev_softmax").forward(logits, dim=-1)
    out = marginalize(probs, make_f(scalar=True))
    assert out[3] == 0 and torch.isfinite(out).all()


def test_other_dim_and_several_batch_dims():
    gen = torch.Generator().manual_seed(3)
    probs = registry.get("entmax15").forward(2 * torch.randn(2, K, 4, generator=gen, dtype=torch.float64), dim=1)
    table = torch.randn(2, 4, K, dtype=torch.float64)  # f(x, z) for batch position (b, t)

    def fn(example_index, class_index):
        b, t = torch.unravel_index(example_index, (2, 4))
        return table[b, t, class_index]

    out = marginalize(probs, fn, dim=1)
    assert out.shape == (2, 4)
    torch.testing.assert_close(out, (probs.movedim(1, -1) * table).sum(-1), rtol=1e-12, atol=1e-12)


def test_result_dtype_is_promoted():
    probs = sparse_probs(dtype=torch.float32)
    out = marginalize(probs, lambda ex, cls: torch.ones(ex.numel(), dtype=torch.float64))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.ones(N, dtype=torch.float64))


def test_nan_probability_propagates_like_the_dense_sum():
    probs = sparse_probs()
    probs[1, 0] = float("nan")
    out = marginalize(probs, make_f(scalar=True))
    assert torch.isnan(out[1]) and torch.isfinite(out[torch.arange(N) != 1]).all()


# ------------------------------------------------------------------------------------------ gradients
def test_gradcheck_wrt_probs_and_fn_parameters():
    gen = torch.Generator().manual_seed(4)
    probs = torch.rand(N, K, generator=gen, dtype=torch.float64) + 0.1  # interior: the support is fixed
    probs[0, :3] = 0.0  # zeros are skipped; they stay zero under gradcheck's perturbation of other entries
    f = make_f(requires_grad=True)
    nonzero = probs != 0

    def run(p_nonzero, weight):
        p = torch.zeros(N, K, dtype=torch.float64).masked_scatter(nonzero, p_nonzero)
        f.weight = weight
        return marginalize(p, f)

    assert torch.autograd.gradcheck(run, (probs[nonzero].clone().requires_grad_(), f.weight))


@pytest.mark.parametrize("name", registry.names())
def test_gradient_to_logits_and_fn_equals_the_dense_sums(name):
    gen = torch.Generator().manual_seed(5)
    logits = (3 * torch.randn(N, K, generator=gen, dtype=torch.float64)).requires_grad_()
    f = make_f(requires_grad=True)
    upstream = torch.randn(N, OUT, generator=gen, dtype=torch.float64)

    def grads(combine):
        norm = registry.get(name)
        if norm.posthoc:
            features = logits[:, :4]
            torch.manual_seed(0)  # the same layer for both sums
            layer = nn.Linear(4, K).to(torch.float64)
            nn.init.normal_(layer.weight)
            probs = norm.probs_from_linear(features, layer)
        else:
            probs = norm.forward(logits, dim=-1)
        return torch.autograd.grad((combine(probs) * upstream).sum(), (logits, f.weight))

    sparse = grads(lambda p: marginalize(p, f))
    dense = grads(lambda p: dense_sum(p, f))
    for got, want in zip(sparse, dense):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "ev_softmax", "softmax"])
def test_gradcheck_through_a_normalizer(name):
    # Well-separated logits: gradcheck's perturbations do not move the support.
    logits = torch.tensor([[3.0, 1.0, -2.0, 0.5, -1.0, 2.2], [0.1, -3.0, 1.7, 1.0, -0.4, 0.0]], dtype=torch.float64)
    f = make_f(requires_grad=True)
    f.x = f.x[:2]
    norm = registry.get(name)
    assert torch.autograd.gradcheck(lambda z, w: marginalize(norm.forward(z, dim=-1), Counting(f.x, w)),
                                    (logits.requires_grad_(), f.weight))


# ------------------------------------------------------------------------------------------ properties
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), k=st.integers(1, 7), density=st.floats(0.0, 1.0), seed=st.integers(0, 2**16),
       max_batch=st.one_of(st.none(), st.integers(1, 9)))
def test_property_equals_dense_sum_and_counts_rows(n, k, density, seed, max_batch):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.rand(n, k, generator=gen, dtype=torch.float64)
    probs = probs * (torch.rand(n, k, generator=gen, dtype=torch.float64) < density)
    table = torch.randn(n, k, 2, generator=gen, dtype=torch.float64)
    rows = []

    def fn(ex, cls):
        rows.append(ex.numel())
        return table[ex, cls]

    out, stats = marginalize(probs, fn, return_stats=True, max_batch=max_batch)
    torch.testing.assert_close(out, (probs.unsqueeze(-1) * table).sum(1), rtol=1e-12, atol=1e-12)
    assert stats.rows == sum(rows) == int((probs != 0).sum())
    assert all(r <= max_batch for r in rows) if max_batch else len(rows) == 1


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("probs, fn, kwargs, error, match", [
    (torch.ones(2, 3, dtype=torch.long), lambda e, c: e.double(), {}, TypeError, "probs"),
    ([[0.5, 0.5]], lambda e, c: e.double(), {}, TypeError, "probs"),
    (torch.ones(()), lambda e, c: e.double(), {}, ValueError, "at least one dimension"),
    (torch.ones(2, 3), "not callable", {}, TypeError, "fn must be callable"),
    (torch.ones(2, 3), lambda e, c: e.double(), {"dim": 2}, IndexError, "dim"),
    (torch.ones(2, 3), lambda e, c: e.double(), {"max_batch": 0}, ValueError, "max_batch"),
    (torch.ones(2, 3), lambda e, c: e.double(), {"max_batch": 2.5}, ValueError, "max_batch"),
    (torch.ones(2, 3), lambda e, c: torch.ones(4), {}, ValueError, "one row per"),
    (torch.ones(2, 3), lambda e, c: torch.ones(()), {}, ValueError, "one row per"),
    (torch.ones(2, 3), lambda e, c: [1.0] * e.numel(), {}, TypeError, "fn must return a torch.Tensor"),
    (torch.ones(2, 3), lambda e, c: e, {}, TypeError, "floating-point"),
])
def test_bad_input_raises_a_clear_error(probs, fn, kwargs, error, match):
    with pytest.raises(error, match=match):
        marginalize(probs, fn, **kwargs)


def test_stats_type():
    _, stats = marginalize(sparse_probs(), make_f(), return_stats=True)
    assert isinstance(stats, MarginalStats) and stats.examples == N


def test_public_api():
    import sparsenorm

    assert sparsenorm.marginalize.marginalize is marginalize
