"""What the tests of the fused linear + loss share (``test_linear_loss.py``, ``test_seam_fused_ce.py``): the
normalizers they run, their random inputs, the error model's tolerance, the comparison and the gradients
compared.

Error model. The fused path computes the same logits by the same dot products in other blocks, so a
logit differs by at most ``gamma_d * sum_i |h_i W_vi|`` (``gamma_d ~ d eps``); every loss here is
2-Lipschitz in the logits (``|dL/dz|_1 = |p - e_y|_1 <= 2``), and the normalisers add a rounding of
``~ V eps`` relative. The gradients ``G W`` and ``G^T h`` inherit ``|dG|_1 <= 2 |dz|_inf`` times the
largest ``|W|`` or ``|h|``, plus the products' own ``~ V eps`` (or ``N eps``). :func:`error_bound` is that
bound with a factor 8 of slack; in float64 it is ~1e-12.
"""
import torch

NAMES = ["softmax", "ev_softmax", "sparsemax", "entmax15", "entmax_bisect"]


def linear_inputs(seed, n, d, v, dtype=torch.float64, scale=1.0, bias=True, ignored_row=1):
    """``(generator, h, W, b, y)``: ``h`` (n x d, times ``scale``), ``W`` (v x d) and ``b`` (v, or None)
    standard normal and requiring gradients, ``y`` uniform over the v entries with row ``ignored_row`` -100
    (ignored); the generator goes on from there."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, d, generator=g, dtype=dtype) * scale).requires_grad_()
    w = torch.randn(v, d, generator=g, dtype=dtype).requires_grad_()
    b = torch.randn(v, generator=g, dtype=dtype).requires_grad_() if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    y[ignored_row] = -100
    return g, h, w, b, y


def error_bound(h, w, dtype, extra=1):
    """The error model's bound (module docstring) for these inputs, times 8 (times ``extra`` more)."""
    eps = torch.finfo(dtype).eps
    d, v, n = w.shape[1], w.shape[0], h.shape[0]
    dz = d * eps * float((h.detach().abs().max() * w.detach().abs().max()) * d + 1)
    big = float(max(h.detach().abs().max(), w.detach().abs().max(), 1))
    return 8 * extra * (2 * dz * big + (v + n + d) * eps * big * big)


def assert_close(a, b, tol, what):
    """Same shape, and no entry farther than ``tol`` (infinities of the same sign agree)."""
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    if not a.numel():
        return
    both_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    err = float(torch.where(both_inf, torch.zeros_like(a), (a - b).abs()).max())
    assert err <= tol, f"{what}: max error {err:.3g} > {tol:.3g}"


def random_grads(loss, inputs, seed=0):
    """The gradients of ``loss`` against a seeded random upstream gradient, for the ``inputs`` that are not None
    (the graph kept for another call)."""
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(loss.shape, generator=g, dtype=loss.dtype)
    return torch.autograd.grad(loss, [t for t in inputs if t is not None], grad, retain_graph=True)
