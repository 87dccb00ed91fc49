"""Same seed, same numbers (issue 25, item 5): every public function gives bitwise-identical values
and gradients on two calls, with and without ``torch.use_deterministic_algorithms(True)`` (the
``deterministic_mode`` fixture, ``tests/conftest.py``).

The functions come from the registry (every normalizer's forms and losses) plus the public
functions outside it (``sparsemax_bisect``, ``posthoc_evidential``, attention, ``marginalize``).
Both the kernel path and the reference path (``sparsenorm.kernels.disabled()``) are run. Inputs
are large enough (rows of 300) that the kernels' parallel and vectorized paths are taken.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import sparsenorm as sn
from sparsenorm import kernels, registry
from sparsenorm.attention import MultiheadAttention, sparse_attention
from sparsenorm.marginalize import marginalize

ROWS, CLASSES = 32, 300


def scores(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, CLASSES, generator=gen, dtype=torch.float64) * 3
    x[::7, ::5] = float("-inf")  # entries that are not there
    return x.to(dtype)


def functions():
    """``(label, f(x) -> output)`` for every public function of the scores."""
    for name in registry.names():
        entry = registry.get(name)
        forms = {"forward": entry.forward, "train": entry.train_forward, "log": entry.log_prob}
        for form, fn in forms.items():
            if fn is not None:
                yield f"{name}.{form}", fn
        target = torch.arange(ROWS) % CLASSES * 5 % CLASSES + 1  # never a -inf class (column 5j)
        multi = torch.zeros(ROWS, CLASSES).scatter_(1, target.unsqueeze(1), 1.0)
        yield f"{name}.single_label_loss", lambda x, loss=entry.single_label_loss, t=target: loss(x, t)
        yield f"{name}.multi_label_loss", lambda x, loss=entry.multi_label_loss, t=multi: loss(x, t.to(x.dtype))
    yield "sparsemax_bisect", sn.sparsemax_bisect
    weight = torch.randn(CLASSES, 16, generator=torch.Generator().manual_seed(3))
    yield "posthoc_evidential", lambda x: sn.posthoc_evidential(x[:, :16].clamp_min(-10), weight.to(x.dtype))
    table = torch.randn(ROWS, CLASSES, generator=torch.Generator().manual_seed(4))
    yield "marginalize", lambda x: marginalize(sn.sparsemax(x), lambda e, c: table.to(x.dtype)[e, c])


def attention_functions():
    for name in registry.names():
        if registry.get(name).attention:
            yield f"sparse_attention({name})", lambda q, k, v, name=name: sparse_attention(
                q, k, v, name, attn_mask=torch.arange(40) < 33, dropout_p=0.1)
    yield "MultiheadAttention", lambda q, k, v: _mha(q, k, v)


with torch.random.fork_rng():
    torch.manual_seed(5)
    MHA = MultiheadAttention(16, 4, dropout=0.1, batch_first=True, normalizer="entmax15")


def _mha(q, k, v):
    """(2, 4, 40, 4) inputs as (2, 40, 16) sequences."""
    return MHA(*(t.transpose(1, 2).flatten(2) for t in (q, k, v)))[0]


def value_and_grad(fn, *inputs, seed=0):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    torch.manual_seed(seed)  # dropout
    out = fn(*inputs)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    grads = torch.autograd.grad(out, inputs, torch.where(torch.isfinite(out), cotangent, 0.0), allow_unused=True)
    return [out.detach()] + [g for g in grads if g is not None]


def bits(t):
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_bitwise_equal(first, second, label):
    assert len(first) == len(second), label
    for a, b in zip(first, second):
        assert a.dtype == b.dtype and a.shape == b.shape, label
        assert torch.equal(bits(a), bits(b)), f"{label}: two calls differ"


PATHS = ["kernel", "reference"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("label,fn", list(functions()), ids=[label for label, _ in functions()])
def test_function_gives_the_same_bits_twice(label, fn, deterministic_mode, path):
    x = scores()
    with kernels.disabled() if path == "reference" else contextlib.nullcontext():
        first, second = value_and_grad(fn, x), value_and_grad(fn, x)
    assert_bitwise_equal(first, second, label)


@pytest.mark.parametrize("label,fn", list(attention_functions()), ids=[label for label, _ in attention_functions()])
def test_attention_gives_the_same_bits_twice_with_the_same_seed(label, fn, deterministic_mode):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 40, 4, generator=gen) for _ in range(3))
    first, second = value_and_grad(fn, q, k, v, seed=0), value_and_grad(fn, q, k, v, seed=0)
    other_seed = value_and_grad(fn, q, k, v, seed=1)
    assert_bitwise_equal(first, second, label)
    assert not torch.equal(first[0], other_seed[0]), "dropout must follow the seed"
