"""Sparsemax and entmax: drop-in replacements for the ``entmax`` package's maps.

* ``sparsemax``: Euclidean projection onto the simplex (Martins & Astudillo 2016, Eq. 2).
* ``entmax15``: 1.5-entmax, exact (Peters, Niculae & Martins 2019).
* ``sparsemax_bisect`` / ``entmax_bisect``: the same family solved by bisection on the threshold,
  for any ``alpha >= 1`` (with a gradient w.r.t. ``alpha``, Correia et al. 2019).

Names, arguments and results match ``entmax`` 1.3, so switching is a change of import, without
its known defects: ``k`` works with a negative ``dim``; a row that is all ``-inf`` gives zeros with
a zero gradient (``entmax`` crashes); fp16/bf16 are computed in float32 (``entmax``'s bf16
``entmax15`` does not sum to one); double backward works (``entmax15``'s gives NaN there).

The exact maps find their threshold without a full sort (``sparsenorm._threshold``: Michelot's
finite iteration for sparsemax, a root-bracketing iteration for 1.5-entmax, blockwise candidate
selection for long rows), then apply the entmax package's closed-form backward. With
``sparsenorm.use_cpu_kernels(True)`` (or ``SPARSENORM_CPU_KERNELS=1``) CPU float32/float64 inputs
use an opt-in fused C++ kernel instead (``csrc/sparsemax_cpu.cpp``; same results).

Common conventions (every function here):

* ``-inf`` means "not there": such entries get exactly 0. A row with no finite entry gives all
  zeros and a zero gradient. NaN anywhere in a row makes that whole row NaN (other rows are
  unaffected). ``+inf`` entries are not supported (their row is NaN).
* fp16/bf16 inputs are computed in float32 and cast back; a non-floating input raises
  ``TypeError``; ``k < 1`` or ``alpha < 1`` raise ``ValueError`` naming the argument.
* The backward is closed-form and uses only the saved output ``p``.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn
from torch.autograd import Function

from ._threshold import kernel_backward, project, sqrt_nonneg, support_backward
from ._validation import check_floating, check_param, compute_dtype, normalize_dim

__all__ = [
    "sparsemax", "sparsemax_bisect", "entmax15", "entmax_bisect",
    "Sparsemax", "SparsemaxBisect", "Entmax15", "EntmaxBisect",
]


# ----------------------------------------------------------------------------- helpers

def _check_k(k: Optional[int]) -> None:
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be a positive int or None, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1 (or None for a full sort), got {k}")


def _check_n_iter(n_iter: int) -> None:
    if isinstance(n_iter, bool) or not isinstance(n_iter, int):
        raise TypeError(f"n_iter must be a positive int, got {type(n_iter).__name__}")
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1, got {n_iter}")


def _shift_by_max(x: Tensor, dim: int) -> Tensor:
    """``x - max(x)`` along ``dim``; rows with no finite entry are left as they are (all -inf)."""
    row_max = x.amax(dim=dim, keepdim=True)
    row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)
    return x - row_max


# ----------------------------------------------------------------------------- sparsemax

class ProjectionFunction(Function):
    """Sparsemax (``mode="sparsemax"``, ``p = [x - tau]_+``) or 1.5-entmax (``mode="entmax15"``,
    ``p = [x/2 - tau]_+^2``) with the exact threshold; the backward is
    ``w * (g - sum(w g) / sum(w))`` with ``w = 1{p > 0}`` (sparsemax) or ``w = sqrt(p)`` (entmax's
    ``gppr``), from the saved output only."""

    @staticmethod
    def forward(ctx, X: Tensor, dim: int, k: Optional[int], mode: str) -> Tensor:
        p = project(X.to(compute_dtype(X)), dim, mode, k)
        out = p.to(X.dtype)
        ctx.dim = dim
        ctx.mode = mode
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (p,) = ctx.saved_tensors
        return _projection_backward(p, grad_output, ctx.dim, ctx.mode).to(p.dtype), None, None, None


def _weighted_backward(w: Tensor, g: Tensor, dim: int) -> Tensor:
    """``w * (g - sum(w g) / sum(w))`` along ``dim``: the backward of sparsemax (``w = 1`` on the
    support), 1.5-entmax (``w = sqrt(p)``) and alpha-entmax (``w = p^(2 - alpha)``).

    ``w`` is a scratch tensor of ours. Without double backward this is softmax's fused backward
    kernel applied to ``u = w / sum(w)`` -- ``u * (g - sum(g u))`` -- times ``sum(w)``, which
    allocates only the result. Rows with ``w = 0`` everywhere give 0.
    """
    total = w.sum(dim, keepdim=True)
    total = torch.where(total > 0, total, torch.ones_like(total))
    if torch.is_grad_enabled():  # double backward: plain differentiable ops
        q = (g * w).sum(dim, keepdim=True) / total
        return (g - q) * w
    u = w.div_(total)
    g = g if g.shape == u.shape else g.expand_as(u)
    return torch._softmax_backward_data(g, u, dim, u.dtype).mul_(total)


def _projection_backward(p: Tensor, g: Tensor, dim: int, mode: str) -> Tensor:
    """The fused kernel's backward, the support-only one, or ``_weighted_backward`` with
    ``w = sign(p)`` (the support indicator as floats, ``p >= 0``) or ``w = sqrt(p)``."""
    fused = kernel_backward(p, g, dim, mode)
    if fused is not None:
        return fused
    sparse = support_backward(p, g, dim, mode)
    if sparse is not None:
        return sparse
    p = p.to(compute_dtype(p))
    weight = torch.sign(p) if mode == "sparsemax" else _safe_sqrt(p)
    return _weighted_backward(weight, g.to(p.dtype), dim)


def sparsemax(X: Tensor, dim: int = -1, k: Optional[int] = None) -> Tensor:
    """sparsemax: Euclidean projection of ``X`` onto the probability simplex along ``dim``.

    ``sparsemax(z) = argmin_{p in simplex} ||p - z||^2 = [z - tau(z)]_+`` (Martins & Astudillo
    2016, Eq. 2), with ``tau`` such that the result sums to one (their Eq. 3/Prop. 1). Jacobian
    ``diag(s) - s s^T / |S|`` with ``s`` the support indicator (their Sec. 2.5), so the backward of
    ``g`` is ``s * (g - mean_{j in S} g_j)``.

    Parameters
    ----------
    X : floating tensor of any shape; fp16/bf16 are computed in float32.
    dim : the dimension to normalize (negative values allowed, with or without ``k``).
    k : optional int >= 1, the ``entmax`` package's partial-sort hint (expected support size),
        accepted for compatibility. The threshold is found without sorting (an exact finite
        iteration, see ``sparsenorm._threshold``), so the result is exact whatever ``k`` is; ``k``
        is only used if that iteration falls back to sorting.

    Edge cases: ``-inf`` entries get 0; an all ``-inf`` row gives zeros (zero gradient); NaN in a
    row gives a NaN row; K = 1 gives 1; equal entries give the uniform distribution.
    """
    check_floating(X)
    dim = normalize_dim(X, dim)
    _check_k(k)
    return ProjectionFunction.apply(X, dim, k, "sparsemax")


# ----------------------------------------------------------------------------- 1.5-entmax

def _safe_sqrt(p: Tensor) -> Tensor:
    """``sqrt(p)`` whose derivative at ``p = 0`` is 0 rather than inf, so double backward is
    finite (``p = 0`` entries are off the support, locally constant)."""
    if not torch.is_grad_enabled() or not p.requires_grad:
        return sqrt_nonneg(p)
    on = p > 0
    return torch.where(on, torch.where(on, p, torch.ones_like(p)).sqrt(), torch.zeros_like(p))


def entmax15(X: Tensor, dim: int = -1, k: Optional[int] = None) -> Tensor:
    """1.5-entmax: ``argmax_{p in simplex} <p, x> + H_1.5(p)`` along ``dim``, exactly.

    ``H_alpha`` is the Tsallis entropy ``(1 - sum p^alpha) / (alpha (alpha - 1))``; for
    ``alpha = 1.5`` the solution is ``p = [x/2 - tau]_+^2`` with ``tau`` such that ``p`` sums to one
    (Peters et al. 2019, Eq. 9 and Alg. 2). Backward: with ``r = sqrt(p)``,
    ``dX = r * g - r * sum(r * g) / sum(r)``.

    Parameters
    ----------
    X : floating tensor; fp16/bf16 are computed in float32 (so bf16 sums to one within bf16's
        resolution).
    dim : the dimension to normalize (negative values allowed, with or without ``k``).
    k : optional int >= 1, the ``entmax`` package's partial-sort hint, accepted for compatibility;
        the result is exact whatever ``k`` (see :func:`sparsemax`).

    Edge cases as :func:`sparsemax`. Double backward works (the derivative of ``sqrt(p)`` at
    ``p = 0`` is taken as 0).
    """
    check_floating(X)
    dim = normalize_dim(X, dim)
    _check_k(k)
    return ProjectionFunction.apply(X, dim, k, "entmax15")


# ----------------------------------------------------------------------------- bisection

def _expand_alpha(alpha: Union[float, Tensor], X: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    shape = list(X.shape)
    shape[dim] = 1
    if not isinstance(alpha, Tensor):
        return torch.full(shape, float(alpha), dtype=dtype, device=X.device)
    try:
        return alpha.to(dtype).expand(*shape)
    except RuntimeError:
        raise ValueError(
            f"alpha of shape {tuple(alpha.shape)} must broadcast to {tuple(shape)} "
            f"(X's shape with dim {dim} of size 1)"
        ) from None


class EntmaxBisectFunction(Function):
    """alpha-entmax by bisection on ``tau`` for ``p = [(alpha - 1) x - tau]_+^(1/(alpha-1))``."""

    @staticmethod
    def forward(ctx, X: Tensor, alpha: Tensor, dim: int, n_iter: int, ensure_sum_one: bool) -> Tensor:
        dtype = compute_dtype(X)
        a = _expand_alpha(alpha, X, dim, dtype)
        z = _shift_by_max(X.to(dtype), dim) if X.numel() else X.to(dtype)
        p = _entmax_bisect_forward(z, a, dim, n_iter, ensure_sum_one)
        ctx.dim = dim
        ctx.alpha_shape = alpha.shape if isinstance(alpha, Tensor) else None
        ctx.save_for_backward(p, a)
        return p.to(X.dtype)

    @staticmethod
    def backward(ctx, dY: Tensor):
        p, a = ctx.saved_tensors
        dim = ctx.dim
        dY = dY.to(p.dtype)
        softmax_rows = a == 1
        on = p > 0
        p_on = torch.where(on, p, torch.ones_like(p))  # safe for pow/log (and double backward)
        # 1 / g''(p) = p^(2 - alpha) on the support (softmax, alpha = 1: p itself).
        gppr = torch.where(on, p_on ** (2 - a), torch.zeros_like(p))
        dX = dY * gppr
        total = gppr.sum(dim, keepdim=True)
        total = torch.where(total > 0, total, torch.ones_like(total))
        q = dX.sum(dim, keepdim=True) / total
        dX = dX - q * gppr

        d_alpha = None
        if ctx.needs_input_grad[1]:
            # Correia et al. (2019), Prop. 1 (as in the entmax package). Undefined at alpha = 1
            # (0/0); returned as 0 there (documented).
            a_safe = torch.where(softmax_rows, torch.full_like(a, 2.0), a)
            S = torch.where(on, p_on * torch.log(p_on), torch.zeros_like(p))
            ent = S.sum(dim, keepdim=True)
            skewed = gppr / total
            d_alpha = dY * (p - skewed) / (a_safe - 1) ** 2 - dY * (S - skewed * ent) / (a_safe - 1)
            d_alpha = d_alpha.sum(dim, keepdim=True)
            d_alpha = torch.where(softmax_rows, torch.zeros_like(d_alpha), d_alpha)
            if ctx.alpha_shape is not None:
                d_alpha = d_alpha.sum_to_size(ctx.alpha_shape)
        return dX, d_alpha, None, None, None


def _entmax_bisect_forward(z: Tensor, a: Tensor, dim: int, n_iter: int, ensure_sum_one: bool) -> Tensor:
    """``z`` is shifted so each row's maximum is 0 (or all -inf); ``a`` is alpha per row."""
    if z.numel() == 0:
        return z.clone()
    d = z.shape[dim]
    softmax_rows = a == 1
    a_b = torch.where(softmax_rows, torch.full_like(a, 2.0), a)  # placeholder on softmax rows
    zs = z * (a_b - 1)
    inv = 1 / (a_b - 1)
    # tau lies in [max - 1, max - (1/d)^(alpha-1)] (max = 0 here): p_max <= 1 and p_max >= 1/d.
    tau_lo = torch.full_like(a_b, -1.0)
    tau_hi = -((1.0 / d) ** (a_b - 1))
    dm = tau_hi - tau_lo
    p = None
    for _ in range(n_iter):
        dm = dm / 2
        tau_m = tau_lo + dm
        p = (zs - tau_m).clamp_min(0) ** inv
        f_m = p.sum(dim, keepdim=True) - 1
        tau_lo = torch.where(f_m >= 0, tau_m, tau_lo)
    if ensure_sum_one:
        total = p.sum(dim, keepdim=True)
        p = p / torch.where(total > 0, total, torch.ones_like(total))
    if bool(softmax_rows.any()):
        soft = torch.softmax(z, dim=dim)
        empty_rows = torch.isneginf(z).all(dim, keepdim=True)
        soft = torch.where(empty_rows, torch.zeros_like(soft), soft)
        p = torch.where(softmax_rows, soft, p)
    return p


class SparsemaxBisectFunction(Function):
    """sparsemax by bisection on ``tau`` for ``p = [x - tau]_+``; backward as sparsemax."""

    @staticmethod
    def forward(ctx, X: Tensor, dim: int, n_iter: int, ensure_sum_one: bool) -> Tensor:
        dtype = compute_dtype(X)
        if X.numel() == 0:
            ctx.dim = dim
            out = X.new_zeros(X.shape)
            ctx.save_for_backward(out)
            return out
        z = _shift_by_max(X.to(dtype), dim)
        d = z.shape[dim]
        shape = list(z.shape)
        shape[dim] = 1
        tau_lo = z.new_full(shape, -1.0)
        dm = z.new_full(shape, 1.0 - 1.0 / d)
        p = None
        for _ in range(n_iter):
            dm = dm / 2
            tau_m = tau_lo + dm
            p = (z - tau_m).clamp_min(0)
            f_m = p.sum(dim, keepdim=True) - 1
            tau_lo = torch.where(f_m >= 0, tau_m, tau_lo)
        if ensure_sum_one:
            total = p.sum(dim, keepdim=True)
            p = p / torch.where(total > 0, total, torch.ones_like(total))
        ctx.dim = dim
        ctx.save_for_backward(p)
        return p.to(X.dtype)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (p,) = ctx.saved_tensors
        return _projection_backward(p, grad_output, ctx.dim, "sparsemax"), None, None, None


def entmax_bisect(
    X: Tensor,
    alpha: Union[float, Tensor] = 1.5,
    dim: int = -1,
    n_iter: int = 50,
    ensure_sum_one: bool = True,
) -> Tensor:
    """alpha-entmax by bisection: ``argmax_{p in simplex} <p, x> + H_alpha(p)`` along ``dim``.

    ``H_alpha(p) = (1 - sum p^alpha) / (alpha (alpha - 1))`` (Tsallis); the solution is
    ``p = [(alpha - 1) x - tau]_+^(1 / (alpha - 1))`` (Peters et al. 2019, Eq. 9) with ``tau`` found by
    ``n_iter`` halvings of ``[max - 1, max - (1/d)^(alpha - 1)]``. ``alpha = 2`` is sparsemax.

    Parameters
    ----------
    X : floating tensor (fp16/bf16 computed in float32).
    alpha : float or tensor >= 1, broadcastable to ``X``'s shape with ``dim`` of size 1 (one value
        per row). Differentiable (Correia et al. 2019). ``alpha == 1`` exactly gives softmax (the
        limit); the gradient w.r.t. ``alpha`` is undefined there (0/0) and is returned as 0.
        ``alpha < 1`` raises ``ValueError``.
    dim : the dimension to normalize.
    n_iter : number of bisection steps (>= 1); 24 suffice for float32, 50 for float64.
    ensure_sum_one : divide by the sum at the end.

    Backward: ``gppr = p^(2 - alpha)`` on the support, ``dX = gppr * (g - sum(g gppr) / sum(gppr))``.
    Edge cases as :func:`sparsemax`.
    """
    check_floating(X)
    dim = normalize_dim(X, dim)
    _check_n_iter(n_iter)
    if isinstance(alpha, Tensor):
        check_floating(alpha, "alpha")
    check_param(alpha, "alpha", low=1.0)
    return EntmaxBisectFunction.apply(X, alpha, dim, n_iter, bool(ensure_sum_one))


def sparsemax_bisect(X: Tensor, dim: int = -1, n_iter: int = 50, ensure_sum_one: bool = True) -> Tensor:
    """sparsemax by bisection on ``tau`` (``n_iter`` halvings of ``[max - 1, max - 1/d]``).

    Same map as :func:`sparsemax` up to the bisection's resolution. Unlike the ``entmax`` package
    (which always does 50 steps), ``n_iter`` is honoured; any ``dim`` works. Edge cases as
    :func:`sparsemax`.
    """
    check_floating(X)
    dim = normalize_dim(X, dim)
    _check_n_iter(n_iter)
    return SparsemaxBisectFunction.apply(X, dim, n_iter, bool(ensure_sum_one))


# ----------------------------------------------------------------------------- modules

class _SortFreeModule(nn.Module):
    """Shared by ``Sparsemax`` and ``Entmax15``: store ``dim`` and the ``k`` hint, call ``_function``."""

    _function = staticmethod(sparsemax)

    def __init__(self, dim: int = -1, k: Optional[int] = None):
        super().__init__()
        _check_k(k)
        self.dim = dim
        self.k = k

    def forward(self, X: Tensor) -> Tensor:
        return self._function(X, dim=self.dim, k=self.k)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, k={self.k}"


class Sparsemax(_SortFreeModule):
    """Module form of :func:`sparsemax` (same arguments as ``entmax.Sparsemax``)."""

    _function = staticmethod(sparsemax)


class Entmax15(_SortFreeModule):
    """Module form of :func:`entmax15` (same arguments as ``entmax.Entmax15``)."""

    _function = staticmethod(entmax15)


class SparsemaxBisect(nn.Module):
    """Module form of :func:`sparsemax_bisect`; ``n_iter=None`` means 50 (``entmax``'s default)."""

    def __init__(self, dim: int = -1, n_iter: Optional[int] = None):
        super().__init__()
        self.dim = dim
        self.n_iter = n_iter

    def forward(self, X: Tensor) -> Tensor:
        return sparsemax_bisect(X, dim=self.dim, n_iter=50 if self.n_iter is None else self.n_iter)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, n_iter={self.n_iter}"


class EntmaxBisect(nn.Module):
    """Module form of :func:`entmax_bisect`; ``alpha`` may be a float or a tensor (e.g. an
    ``nn.Parameter`` to learn it)."""

    def __init__(self, alpha: Union[float, Tensor] = 1.5, dim: int = -1, n_iter: int = 50):
        super().__init__()
        self.alpha = alpha
        self.dim = dim
        self.n_iter = n_iter

    def forward(self, X: Tensor) -> Tensor:
        return entmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)

    def extra_repr(self) -> str:
        alpha = self.alpha if not isinstance(self.alpha, Tensor) else f"tensor{tuple(self.alpha.shape)}"
        return f"alpha={alpha}, dim={self.dim}, n_iter={self.n_iter}"
