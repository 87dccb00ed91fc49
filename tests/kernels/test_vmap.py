"""The registered ops' vmap rule (``sparsenorm.kernels.ops._common.register_rowwise_vmap``): the vmapped dim is
more rows.

Every op works row by row, so under ``torch.vmap`` each batch entry's rows are the rows the op sees
alone: the same arithmetic on the same values. The outputs must therefore equal a loop over the
batch entries *exactly* (no tolerance), wherever the vmapped dim sits, with per-row parameters
batched or shared, and with a backward's incoming gradient broadcast.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from sparsenorm import registry
from sparsenorm.kernels import ops

S, B, K = 3, 4, 7


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(S, B, K, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


def _rows_param(value_lo: float, value_hi: float, batched: bool, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (S, B, 1) if batched else (B, 1)
    return value_lo + (value_hi - value_lo) * torch.rand(shape, generator=gen, dtype=torch.float64)


def _loop(fn, args, in_dims):
    """``fn`` on each batch entry alone, outputs stacked along dim 0."""
    outs = []
    for s in range(S):
        entry = [a if d is None else a.select(d, s) for a, d in zip(args, in_dims)]
        outs.append(fn(*entry))
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*outs))
    return torch.stack(outs)


def _assert_exact(got, want):
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


FORWARDS = {
    "ev_softmax": lambda x: ops.ev_softmax(x, None, False),
    "ev_softmax_log_eps": lambda x: ops.ev_softmax(x, 1e-6, True),
    "sparsemax": lambda x: ops.project(x, "sparsemax", None),
    "entmax15": lambda x: ops.project(x, "entmax15", None),
    "entmax_bisect": lambda x: ops.entmax_bisect(x, 1.7, 50, True),
}


@pytest.mark.parametrize("name", sorted(FORWARDS))
@pytest.mark.parametrize("bdim", [0, 1, 2])
def test_single_input_ops_equal_a_loop(name, bdim):
    x = _x().movedim(0, bdim)  # the vmapped dim anywhere, not only in front
    fn = FORWARDS[name]
    _assert_exact(torch.vmap(fn, in_dims=bdim)(x), _loop(fn, [x], [bdim]))


@pytest.mark.parametrize("op_name,param_range", [
    ("hourglass_forward", (0.5, 2.0)), ("r_softmax_threshold", (0.1, 0.9)), ("r_softmax_forward", (0.1, 0.9)),
    ("t_softmax_forward", (0.0, 0.5))])
@pytest.mark.parametrize("param_batched", [True, False])
def test_ops_with_a_per_row_parameter_equal_a_loop(op_name, param_range, param_batched):
    """The per-row parameter (q, r, t) batched like x, or shared by every batch entry (expanded by the rule)."""
    op = getattr(ops, op_name)
    x, p = _x(), _rows_param(*param_range, batched=param_batched)
    dims = (0, 0 if param_batched else None)
    _assert_exact(torch.vmap(op, in_dims=dims)(x, p), _loop(op, [x, p], dims))


@pytest.mark.parametrize("incoming", ["batched", "shared", "broadcast"])
def test_backward_ops_equal_a_loop(incoming):
    """The backward ops with the incoming gradient batched, shared by all entries, or of lower rank (broadcast)."""
    x = _x()
    gen = torch.Generator().manual_seed(2)
    grad = {"batched": torch.randn(S, B, K, generator=gen, dtype=torch.float64),
            "shared": torch.randn(B, K, generator=gen, dtype=torch.float64),
            "broadcast": torch.randn(S, K, generator=gen, dtype=torch.float64)}[incoming]
    gdim = None if incoming == "shared" else 0
    for kind in ("sparsemax", "entmax15"):
        p = ops.project(x, kind, None)
        fn = lambda p_, g_, kind=kind: ops.project_backward(p_, g_, kind)  # noqa: E731
        _assert_exact(torch.vmap(fn, in_dims=(0, gdim))(p, grad), _loop(fn, [p, grad], (0, gdim)))
    p = ops.entmax_bisect(x, 1.7, 50, True)
    fn = lambda p_, g_: ops.entmax_bisect_backward(p_, g_, 1.7)  # noqa: E731
    _assert_exact(torch.vmap(fn, in_dims=(0, gdim))(p, grad), _loop(fn, [p, grad], (0, gdim)))
    if incoming != "broadcast":  # (this op takes a gradient of the output's shape)
        out = ops.ev_softmax(x, 1e-6, True)
        _assert_exact(torch.vmap(ops.ev_softmax_log_backward, in_dims=(gdim, 0))(grad, out),
                      _loop(ops.ev_softmax_log_backward, [grad, out], (gdim, 0)))
    for log in (False, True):
        out = ops.ev_softmax(x, 1e-6, log)
        fn = lambda g_, o_, log=log: ops.ev_softmax_backward(g_, o_, log)  # noqa: E731
        _assert_exact(torch.vmap(fn, in_dims=(gdim, 0))(grad, out), _loop(fn, [grad, out], (gdim, 0)))


def test_hourglass_and_r_softmax_backward_ops_equal_a_loop():
    x, q = _x(), _rows_param(0.5, 2.0, batched=True)
    g = torch.randn(S, B, K, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    p, alpha, total = ops.hourglass_forward(x, q)
    args = [g, p, x, alpha, total, q]
    _assert_exact(torch.vmap(ops.hourglass_backward)(*args), _loop(ops.hourglass_backward, args, [0] * 6))
    r = _rows_param(0.1, 0.9, batched=True)
    p, tau, lo, hi, frac, _, dead = ops.r_softmax_forward(x, r)
    args = [g, p, x, tau, lo, hi, frac, dead]
    _assert_exact(torch.vmap(ops.r_softmax_backward)(*args), _loop(ops.r_softmax_backward, args, [0] * 8))


@pytest.mark.parametrize("name", registry.names())
def test_registry_forms_and_their_gradients_equal_a_loop(name):
    """Forward forms and the gradient through them, with autograd outside vmap as the stacked training uses it.
    Every normalizer: the registered ops through their rule, r-softmax, t-softmax and sparsehourglass
    through the vmap rule torch generates for their autograd.Functions. (``torch.func.grad`` through a
    custom op is not supported by torch 2.13's ``torch.library``: the autograd.Function it generates has
    no ``setup_context``. The backward ops' own rules are tested above.)"""
    norm = registry.get(name)
    for form in ("train_forward", "forward", "log_prob"):
        fn = getattr(norm, form)
        if fn is None:
            continue
        x = _x().requires_grad_()
        batched, looped = torch.vmap(lambda t: fn(t, dim=-1))(x), _loop(lambda t: fn(t, dim=-1), [x], [0])
        _assert_exact(batched.detach(), looped.detach())
        finite = torch.isfinite(looped)  # log forms: -inf off the support
        weights = torch.randn(looped.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        g_batched, = torch.autograd.grad((torch.where(finite, batched, 0) * weights).sum(), x)
        g_looped, = torch.autograd.grad((torch.where(finite, looped, 0) * weights).sum(), x)
        _assert_exact(g_batched, g_looped)


def test_no_fallback_loop(capfd):
    """With the rule, vmap calls the op once; the fallback would print a performance warning per op."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "sparsenorm: the C\\+\\+ CPU kernels are not built")  # a machine without them
        torch.vmap(FORWARDS["sparsemax"])(_x())
        torch.vmap(FORWARDS["ev_softmax"])(_x())
    assert "batching rule" not in capfd.readouterr().err


def test_functions_with_a_shared_tensor_parameter():
    """The autograd.Functions with a tensor parameter shared by every batch entry (one per row; a per-entry
    parameter cannot be vmapped: its value checks are data-dependent), gradients to x and to the parameter."""
    from sparsenorm import entmax_bisect, r_softmax, sparsehourglass, sparsemax_bisect, t_softmax

    gen = torch.Generator().manual_seed(6)
    rows = lambda lo, hi: (lo + (hi - lo) * torch.rand(B, 1, generator=gen, dtype=torch.float64)).requires_grad_()  # noqa: E731
    alpha, r, t, q = rows(1.2, 2.2), rows(0.2, 0.8), rows(0.5, 2.0), rows(0.5, 2.0)
    cases = {"entmax_bisect": (lambda v: entmax_bisect(v, alpha, dim=-1), alpha),
             "sparsemax_bisect": (lambda v: sparsemax_bisect(v, dim=-1), None),
             "r_softmax": (lambda v: r_softmax(v, r), r), "t_softmax": (lambda v: t_softmax(v, t), t),
             "sparsehourglass": (lambda v: sparsehourglass(v, q), q)}
    weights = torch.randn(S, B, K, generator=gen, dtype=torch.float64)
    for name, (fn, param) in cases.items():
        x = _x().requires_grad_()
        batched, looped = torch.vmap(fn)(x), _loop(fn, [x], [0])
        _assert_exact(batched.detach(), looped.detach())
        (gx_batched,) = torch.autograd.grad((batched * weights).sum(), x, retain_graph=True)
        (gx_looped,) = torch.autograd.grad((looped * weights).sum(), x, retain_graph=True)
        _assert_exact(gx_batched, gx_looped)  # computed row by row
        if param is None:
            continue
        # The shared parameter's gradient sums each batch entry's part, in another order under vmap than in
        # the loop: the two differ by at most S ulps of the sum of the parts' magnitudes (Higham, Thm. 3.1).
        parts = torch.stack([torch.autograd.grad((looped[s] * weights[s]).sum(), param, retain_graph=True)[0]
                             for s in range(S)])
        (g_batched,) = torch.autograd.grad((batched * weights).sum(), param)
        bound = S * torch.finfo(torch.float64).eps * parts.abs().sum(0)
        assert ((g_batched - parts.sum(0)).abs() <= bound).all(), name
