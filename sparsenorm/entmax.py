"""Sparsemax and entmax: drop-in replacements for the ``entmax`` package's maps.

* ``sparsemax``: Euclidean projection onto the simplex (Martins & Astudillo 2016, Eq. 2).
* ``entmax15``: 1.5-entmax, exact (Peters, Niculae & Martins 2019).
* ``sparsemax_bisect`` / ``entmax_bisect``: the same family solved by bisection on the threshold,
  for any ``alpha > 0`` (with a gradient w.r.t. ``alpha``, Correia et al. 2019).

Names, arguments and results match ``entmax`` 1.3, so switching is a change of import, without
its known defects: ``k`` works with a negative ``dim``; a row that is all ``-inf`` gives zeros with
a zero gradient (``entmax`` crashes); fp16/bf16 are computed in float32 (``entmax``'s bf16
``entmax15`` does not sum to one); double backward works (``entmax15``'s gives NaN there).

The exact maps run the registered operator ``sparsenorm::project`` (``sparsenorm.kernels.ops.projection``):
a fused C++ kernel on CPU where built (exact sort-free threshold iteration), else an exact iteration
without a full sort on CPU; the Triton kernel on CUDA where triton is installed and the row fits,
else a full sort (sync-free); then the entmax package's closed-form backward. ``entmax_bisect``
with one number ``alpha > 1`` runs ``sparsenorm::entmax_bisect``; a tensor ``alpha`` (learned) or
``alpha <= 1`` the bisection's ``autograd.Function`` on the op layer.

Common conventions (every function here):

* Entries that are "not there" -- ``-inf``, ``False`` in ``mask`` (True = keep), or at or below
  ``finfo(dtype).min / 2`` -- get exactly 0 and a zero gradient. A row with no entry there gives
  all zeros and a zero gradient. NaN anywhere in a row makes that whole row NaN (other rows are
  unaffected). ``+inf`` entries are not supported (their row is NaN).
* fp16/bf16 inputs are computed in float32 and cast back; a non-floating input raises
  ``TypeError``; ``k < 1`` or ``alpha <= 0`` raise ``ValueError`` naming the argument.
* The backward is closed-form and uses only the saved output ``p``.
"""
from __future__ import annotations

from typing import Optional, Union

from torch import Tensor, nn

from ._validation import check_floating, check_k, check_n_iter, check_param, run_on_rows
from .kernels.ops import projection as ops

__all__ = [
    "sparsemax", "sparsemax_bisect", "entmax15", "entmax_bisect",
    "Sparsemax", "SparsemaxBisect", "Entmax15", "EntmaxBisect",
]


# ----------------------------------------------------------------------------- sparsemax

def sparsemax(X: Tensor, dim: int = -1, k: Optional[int] = None, mask: Optional[Tensor] = None) -> Tensor:
    """sparsemax: Euclidean projection of ``X`` onto the probability simplex along ``dim``.

    ``sparsemax(z) = argmin_{p in simplex} ||p - z||^2 = [z - tau(z)]_+`` (Martins & Astudillo
    2016, Eq. 2), with ``tau`` such that the result sums to one (their Eq. 3/Prop. 1). Jacobian
    ``diag(s) - s s^T / |S|`` with ``s`` the support indicator (their Sec. 2.5), so the backward of
    ``g`` is ``s * (g - mean_{j in S} g_j)``.

    Args:
        X: floating tensor of any shape; fp16/bf16 are computed in float32.
        dim: the dimension to normalize (negative values allowed, with or without ``k``).
        k: optional int >= 1, the ``entmax`` package's partial-sort hint (expected support size),
            accepted for compatibility. The threshold is found without sorting (an exact finite
            iteration, see ``sparsenorm.kernels.reference.projection``), so the result is exact
            whatever ``k`` is; ``k`` is only used if that iteration falls back to sorting.
        mask: optional boolean tensor broadcastable to ``X``; True = keep (False: not there).

    Edge cases: entries that are not there get 0; a row with none there gives zeros (zero
    gradient); NaN in a row gives a NaN row; K = 1 gives 1; equal entries give the uniform
    distribution.
    """
    check_k(k)
    return run_on_rows(ops.project, X, dim, mask, "sparsemax", k, name="X")


# ----------------------------------------------------------------------------- 1.5-entmax

def entmax15(X: Tensor, dim: int = -1, k: Optional[int] = None, mask: Optional[Tensor] = None) -> Tensor:
    """1.5-entmax: ``argmax_{p in simplex} <p, x> + H_1.5(p)`` along ``dim``, exactly.

    ``H_alpha`` is the Tsallis entropy ``(1 - sum p^alpha) / (alpha (alpha - 1))``; for
    ``alpha = 1.5`` the solution is ``p = [x/2 - tau]_+^2`` with ``tau`` such that ``p`` sums to one
    (Peters et al. 2019, Eq. 9 and Alg. 2). Backward: with ``r = sqrt(p)``,
    ``dX = r * g - r * sum(r * g) / sum(r)``.

    Args:
        X: floating tensor; fp16/bf16 are computed in float32 (so bf16 sums to one within bf16's
            resolution).
        dim: the dimension to normalize (negative values allowed, with or without ``k``).
        k: optional int >= 1, the ``entmax`` package's partial-sort hint, accepted for compatibility;
            the result is exact whatever ``k`` (see :func:`sparsemax`).
        mask: optional boolean tensor broadcastable to ``X``; True = keep.

    Edge cases as :func:`sparsemax`. Double backward works (the derivative of ``sqrt(p)`` at
    ``p = 0`` is taken as 0).
    """
    check_k(k)
    return run_on_rows(ops.project, X, dim, mask, "entmax15", k, name="X")


# ----------------------------------------------------------------------------- bisection

def entmax_bisect(
    X: Tensor,
    alpha: Union[float, Tensor] = 1.5,
    dim: int = -1,
    n_iter: int = 50,
    ensure_sum_one: bool = True,
    mask: Optional[Tensor] = None,
) -> Tensor:
    """alpha-entmax by bisection: ``argmax_{p in simplex} <p, x> + H_alpha(p)`` along ``dim``.

    ``H_alpha(p) = (1 - sum p^alpha) / (alpha (alpha - 1))`` (Tsallis); the solution is
    ``p = [(alpha - 1) x - tau]_+^(1 / (alpha - 1))`` (Peters et al. 2019, Eq. 9) with ``tau`` found by
    ``n_iter`` halvings of ``[max - 1, max - (1/d)^(alpha - 1)]``. ``alpha = 2`` is sparsemax;
    ``0 < alpha < 1`` gives a dense map (as in the entmax package, whose tests use such alphas).

    Args:
        X: floating tensor (fp16/bf16 computed in float32).
        alpha: float or tensor ``> 0``, broadcastable to ``X``'s shape with ``dim`` of size 1 (one
            value per row), or one value per row (``X``'s shape without ``dim``). Differentiable
            (Correia et al. 2019). ``alpha == 1`` exactly gives softmax (the limit); the gradient
            w.r.t. ``alpha`` is undefined there (0/0) and is returned as 0. ``alpha <= 0`` raises
            ``ValueError``.
        dim: the dimension to normalize.
        n_iter: number of bisection steps (>= 1); 24 suffice for float32, 50 for float64. With a
            number ``alpha > 1`` and at least those counts, the registered op ``sparsenorm::entmax_bisect``
            runs the fused C++ kernel on CPU where built: ``tau`` solved to rounding by Newton's method
            safeguarded by the bracket (the same map: the bisection is within ``2^-n_iter`` of it).
        ensure_sum_one: divide by the sum at the end.
        mask: optional boolean tensor broadcastable to ``X``; True = keep.

    Backward: ``gppr = p^(2 - alpha)`` on the support, ``dX = gppr * (g - sum(g gppr) / sum(gppr))``.
    Edge cases as :func:`sparsemax`.
    """
    check_n_iter(n_iter)
    if isinstance(alpha, Tensor):
        check_floating(alpha, "alpha")
    check_param(alpha, "alpha", low=0.0, low_inclusive=False)
    maybe_softmax = isinstance(alpha, Tensor) or float(alpha) == 1.0
    return run_on_rows(ops.entmax_bisect_rows, X, dim, mask, n_iter, bool(ensure_sum_one), maybe_softmax,
                       params={"alpha": alpha}, name="X")


def sparsemax_bisect(X: Tensor, dim: int = -1, n_iter: int = 50, ensure_sum_one: bool = True,
                     mask: Optional[Tensor] = None) -> Tensor:
    """sparsemax by bisection on ``tau`` (``n_iter`` halvings of ``[max - 1, max - 1/d]``).

    Same map as :func:`sparsemax` up to the bisection's resolution. Unlike the ``entmax`` package
    (which always does 50 steps), ``n_iter`` is honoured; any ``dim`` works. Edge cases and
    ``mask`` as :func:`sparsemax`.
    """
    check_n_iter(n_iter)
    return run_on_rows(ops.sparsemax_bisect_rows, X, dim, mask, n_iter, bool(ensure_sum_one), name="X")


# ----------------------------------------------------------------------------- modules

class _SortFreeModule(nn.Module):
    """Shared by ``Sparsemax`` and ``Entmax15``: store ``dim`` and the ``k`` hint, call ``_function``."""

    _function = staticmethod(sparsemax)

    def __init__(self, dim: int = -1, k: Optional[int] = None):
        super().__init__()
        check_k(k)
        self.dim = dim
        self.k = k

    def forward(self, X: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return self._function(X, dim=self.dim, k=self.k, mask=mask)

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

    def forward(self, X: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return sparsemax_bisect(X, dim=self.dim, n_iter=50 if self.n_iter is None else self.n_iter, mask=mask)

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

    def forward(self, X: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return entmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter, mask=mask)

    def extra_repr(self) -> str:
        alpha = self.alpha if not isinstance(self.alpha, Tensor) else f"tensor{tuple(self.alpha.shape)}"
        return f"alpha={alpha}, dim={self.dim}, n_iter={self.n_iter}"
