"""Sparsemax and entmax: drop-in replacements for the ``entmax`` package's maps.

* ``sparsemax``: Euclidean projection onto the simplex (Martins & Astudillo 2016, Eq. 2).
* ``entmax15``: 1.5-entmax, exact (Peters, Niculae & Martins 2019).
* ``sparsemax_bisect`` / ``entmax_bisect``: the same family solved by bisection on the threshold,
  for any ``alpha > 0`` (with a gradient w.r.t. ``alpha``, Correia et al. 2019).

Names, arguments and results match ``entmax`` 1.3, so switching is a change of import, without
its known defects: ``k`` works with a negative ``dim``; a row that is all ``-inf`` gives zeros with
a zero gradient (``entmax`` crashes); fp16/bf16 are computed in float32 (``entmax``'s bf16
``entmax15`` does not sum to one); double backward works (``entmax15``'s gives NaN there).

The exact maps run the registered operator ``sparsenorm::project`` (``sparsenorm.kernels.ops``):
a fused C++ kernel on CPU where built (exact sort-free threshold iteration), else an exact iteration
without a full sort on CPU, and a full sort (sync-free) on other devices; then the entmax
package's closed-form backward.

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

import torch
from torch import Tensor, nn
from torch.autograd import Function

from ._validation import check_floating, check_k, check_n_iter, check_param, normalize
from .kernels import ops
from .kernels.reference.projection import bisect, bisect_backward_parts, bisect_forward, dense_backward, shift_by_max

__all__ = [
    "sparsemax", "sparsemax_bisect", "entmax15", "entmax_bisect",
    "Sparsemax", "SparsemaxBisect", "Entmax15", "EntmaxBisect",
]


# ----------------------------------------------------------------------------- helpers

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
    return normalize(ops.project, X, dim, mask, "sparsemax", k, name="X", marks_not_there=False)


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
    return normalize(ops.project, X, dim, mask, "entmax15", k, name="X", marks_not_there=False)


# ----------------------------------------------------------------------------- bisection

class EntmaxBisectFunction(Function):
    """alpha-entmax by bisection on ``tau`` for ``p = [(alpha - 1) x - tau]_+^(1/(alpha-1))`` over
    the last dim; ``a`` is alpha per row (shape ``X.shape[:-1] + (1,)``)."""

    generate_vmap_rule = True  # forward is torch ops only, and separate from setup_context: torch.vmap works

    @staticmethod
    def forward(X: Tensor, a: Tensor, n_iter: int, ensure_sum_one: bool, maybe_softmax: bool) -> Tensor:
        return bisect_forward(shift_by_max(X), a, n_iter, ensure_sum_one, maybe_softmax)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output, inputs[1])

    @staticmethod
    def backward(ctx, dY: Tensor):
        p, a = ctx.saved_tensors
        softmax_rows = a == 1
        dX, gppr, total, on, p_on = bisect_backward_parts(p, dY, a)

        d_alpha = None
        if ctx.needs_input_grad[1]:
            # Correia et al. (2019), Prop. 1 (as in the entmax package). Undefined at alpha = 1
            # (0/0); returned as 0 there (documented).
            a_safe = torch.where(softmax_rows, torch.full_like(a, 2.0), a)
            S = torch.where(on, p_on * torch.log(p_on), torch.zeros_like(p))
            ent = S.sum(-1, keepdim=True)
            skewed = gppr / total
            d_alpha = dY * (p - skewed) / (a_safe - 1) ** 2 - dY * (S - skewed * ent) / (a_safe - 1)
            d_alpha = d_alpha.sum(-1, keepdim=True)
            d_alpha = torch.where(softmax_rows, torch.zeros_like(d_alpha), d_alpha)
        return dX, d_alpha, None, None, None


class SparsemaxBisectFunction(Function):
    """sparsemax by bisection on ``tau`` for ``p = [x - tau]_+`` over the last dim; backward as sparsemax."""

    generate_vmap_rule = True  # as EntmaxBisectFunction

    @staticmethod
    def forward(X: Tensor, n_iter: int, ensure_sum_one: bool) -> Tensor:
        z = shift_by_max(X)
        shape = z.shape[:-1] + (1,)
        # alpha = 2: p = [z - tau]_+ (the identity hook); tau in [max - 1, max - 1/d]
        return bisect(z, z.new_full(shape, -1.0), z.new_full(shape, 1.0 - 1.0 / z.shape[-1]), n_iter, ensure_sum_one,
                      lambda u: u)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (p,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            return dense_backward(p, grad_output, "sparsemax"), None, None
        return ops.project_backward(p, grad_output, "sparsemax"), None, None


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
    fused_op = not isinstance(alpha, Tensor) and alpha > 1  # one alpha > 1 (static)

    def run(rows: Tensor, alpha) -> Tensor:
        if fused_op:
            return ops.entmax_bisect(rows, float(alpha), n_iter, bool(ensure_sum_one))
        a = alpha if isinstance(alpha, Tensor) else torch.full(rows.shape[:-1] + (1,), alpha, dtype=rows.dtype,
                                                               device=rows.device)
        return EntmaxBisectFunction.apply(rows, a, n_iter, bool(ensure_sum_one), maybe_softmax)

    # The op treats entries <= finfo.min / 2 as not there itself (its C++ kernel in its passes, its
    # reference by marking them): no marking pass here (issue 28: that pass, a masked_fill, and
    # its backward were about half of entmax_bisect's CPU time).
    return normalize(run, X, dim, mask, params={"alpha": alpha}, name="X", marks_not_there=not fused_op)


def sparsemax_bisect(X: Tensor, dim: int = -1, n_iter: int = 50, ensure_sum_one: bool = True,
                     mask: Optional[Tensor] = None) -> Tensor:
    """sparsemax by bisection on ``tau`` (``n_iter`` halvings of ``[max - 1, max - 1/d]``).

    Same map as :func:`sparsemax` up to the bisection's resolution. Unlike the ``entmax`` package
    (which always does 50 steps), ``n_iter`` is honoured; any ``dim`` works. Edge cases and
    ``mask`` as :func:`sparsemax`.
    """
    check_n_iter(n_iter)
    return normalize(SparsemaxBisectFunction.apply, X, dim, mask, n_iter, bool(ensure_sum_one), name="X")


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
