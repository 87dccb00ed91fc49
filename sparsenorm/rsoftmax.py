"""t-softmax and r-softmax (Bałazy, Struski, Śmieja, Tabor, "r-softmax: Generalized Softmax with
Controllable Sparsity Rate").

Both are a *weighted softmax* ``p_i = w_i exp(x_i) / sum_j w_j exp(x_j)`` with the weights
``w_i = relu(x_i - tau)`` for a threshold ``tau``:

* t-softmax (Eq. 1): ``tau = max(x) - t`` for a ``t > 0``, so ``w_i = relu(x_i + t - max(x))``;
* r-softmax (Eq. 3): ``t_r = max(x) - quantile(x, r)``, i.e. ``tau = quantile(x, r)``, the
  linearly interpolated quantile of the row (the paper's definition, the same as
  ``torch.quantile(..., interpolation="linear")``).

Layering: :func:`_quantile_threshold` selects the quantile with ``torch.kthvalue`` (O(n)
selection, no full sort); :func:`_weighted_softmax` evaluates the weighted softmax; the
``autograd.Function`` classes save the output ``p`` plus ``e = p / w`` (the Jacobian has
``1 / w_i`` terms, so one tensor beyond the output is unavoidable) and per-row scalars, and apply
the closed-form backward below; :func:`t_softmax` / :func:`r_softmax` validate and wrap; the
modules :class:`TSoftmax` / :class:`RSoftmax` store ``dim`` and the parameter.

Closed-form backward. With ``e_i = exp(x_i) / sum_j w_j exp(x_j)`` on the support (0 off it),
``<g, p> = sum_i g_i p_i`` and ``C = -sum_i e_i (g_i - <g, p>)``::

    dL/dx_j   = (p_j + e_j) (g_j - <g, p>) + (d tau / d x_j) C
    dL/dt     = -C                                   (t-softmax: d tau / d t = -1)
    dL/dr     = C (n - 1) (x_(hi) - x_(lo))          (r-softmax: tau = lerp(x_(lo), x_(hi), frac))

where ``d tau / d x`` is the indicator of the arg-max (t-softmax) or puts ``1 - frac`` on the
order statistic ``x_(lo)`` and ``frac`` on ``x_(hi)`` (r-softmax; ``lo = floor(r (n - 1))``).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.autograd import Function

from ._validation import check_floating, check_param, compute_dtype, normalize_dim

Param = Union[float, int, Tensor]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _row_param(value: Param, x: Tensor, name: str) -> Union[float, Tensor]:
    """A per-row parameter as a float or a tensor of shape ``x.shape[:-1] + (1,)``-broadcastable.

    ``x`` has its normalized dimension last. Accepted tensor shapes: 0-d, broadcastable to ``x``
    with size 1 on the last dim, or ``x``'s shape without its last dim (one value per row).
    """
    if not isinstance(value, Tensor):
        return float(value)
    if value.dim() == 0:
        value = value.reshape([1] * x.dim())
    elif value.dim() == x.dim() - 1 and tuple(value.shape) == tuple(x.shape[:-1]):
        value = value.unsqueeze(-1)
    row_shape = tuple(x.shape[:-1]) + (1,)
    try:
        if torch.broadcast_shapes(value.shape, row_shape) != torch.Size(row_shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(value.shape)} must be a number, a 0-d tensor, one value per row "
            f"(shape {tuple(x.shape[:-1])}) or broadcastable to {row_shape} (size 1 along dim)"
        ) from None
    return value.to(device=x.device, dtype=x.dtype)


def _move_param(value: Param, x: Tensor, dim: int) -> Param:
    """Move a per-row parameter given in ``x``'s layout so that ``dim`` becomes the last dim."""
    if isinstance(value, Tensor) and value.dim() == x.dim() and x.dim() > 0:
        return value.movedim(dim, -1)
    return value


def _weighted_softmax(x: Tensor, tau: Tensor, m: Tensor) -> Tuple[Tensor, Tensor]:
    """``p = w exp(x) / sum(w exp(x))`` with ``w = relu(x - tau)``, and ``e = p / w`` (0 where w = 0).

    ``m`` is the row max (finite; 0 for rows without a valid entry, which give ``p = e = 0``).
    """
    w = (x - tau).clamp_min_(0)
    ex = torch.exp(x - m)
    num = w * ex
    z = num.sum(-1, keepdim=True)
    z = z.masked_fill_(z == 0, 1.0)  # only rows with no valid entry: p = 0 there, not 0/0
    p = num.div_(z)
    e = ex.masked_fill_(w == 0, 0.0).div_(z)
    return p, e


def _finite_row_max(x: Tensor) -> Tensor:
    """Row max (keepdim) with -inf (row without a valid entry) replaced by 0.

    ``amax`` rather than ``max(dim)``: the latter also builds indices and is much slower on CPU.
    """
    m = x.amax(-1, keepdim=True)
    return m.masked_fill(m == float("-inf"), 0.0)


def _backward_common(g: Tensor, p: Tensor, e: Tensor) -> Tuple[Tensor, Tensor]:
    """``(p + e)(g - <g, p>)`` and ``C = -sum e (g - <g, p>)`` for the closed-form backward."""
    centred = g - (g * p).sum(-1, keepdim=True)
    e_part = e * centred
    c = -e_part.sum(-1, keepdim=True)
    grad = centred.mul_(p).add_(e_part)
    return grad, c


def _first_order_only(backward):
    """Raise a clear error for double backward (``create_graph=True``) instead of a silent wrong answer.

    The closed-form backward uses ``e = p / w``, which is not an output of the forward, so a
    second derivative through it would miss terms; refusing is the honest option.
    """

    def wrapped(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "t_softmax/r_softmax support first derivatives only: double backward "
                "(create_graph=True) is not implemented"
            )
        return backward(ctx, *grads)

    return wrapped


# --------------------------------------------------------------------------------------------
# t-softmax
# --------------------------------------------------------------------------------------------
class TSoftmaxFunction(Function):
    """t-softmax over the last dim; ``t`` a float or a tensor broadcastable to ``x[..., :1]``."""

    @staticmethod
    def forward(ctx, x: Tensor, t: Union[float, Tensor]) -> Tensor:
        m = _finite_row_max(x)
        argmax = x.argmax(-1, keepdim=True)
        p, e = _weighted_softmax(x, m - t, m)
        ctx.t_shape = t.shape if isinstance(t, Tensor) else None
        ctx.save_for_backward(p, e, argmax)
        return p

    @staticmethod
    @_first_order_only
    def backward(ctx, g: Tensor):
        p, e, argmax = ctx.saved_tensors
        grad, c = _backward_common(g, p, e)
        grad.scatter_add_(-1, argmax, c)  # d tau / d x = indicator of the arg-max
        grad_t = None
        if ctx.t_shape is not None and ctx.needs_input_grad[1]:
            grad_t = (-c).sum_to_size(ctx.t_shape)
        return grad, grad_t


def t_softmax(x: Tensor, t: Param, dim: int = -1) -> Tensor:
    r"""t-softmax (r-softmax paper, Eq. 1): a weighted softmax with weights ``relu(x_i + t - max(x))``.

    .. math:: \mathrm{t\text{-}softmax}(x, t)_i =
              \frac{w_i e^{x_i}}{\sum_j w_j e^{x_j}}, \quad w_i = \mathrm{ReLU}(x_i + t - \max_j x_j)

    Entries at distance ``>= t`` below the maximum get exactly 0. Theorem 1: the limit
    ``t -> inf`` is softmax; for ``t <= x_(1) - x_(2)`` (gap between the two largest entries)
    the output is one-hot. Translation invariant in ``x`` (t fixed).

    Args:
        x: floating tensor of logits (any shape).
        t: ``t > 0``; a number, a 0-d tensor, one value per row (``x``'s shape without ``dim``)
            or a tensor broadcastable to ``x`` with size 1 along ``dim``. A tensor ``t`` with
            ``requires_grad`` gets a gradient (the paper learns ``t`` by backpropagation).
        dim: dimension to normalize over.

    Edge cases: a ``-inf`` entry gets exactly 0; a row with no finite entry returns zeros with
    zero gradient; NaN in a row gives NaN in that row; float16/bfloat16 are computed in float32
    and returned in the input dtype. ``t <= 0`` (or NaN) raises ``ValueError``; a non-floating
    ``x`` raises ``TypeError``. Backward is closed-form (module docstring); double backward
    raises a clear ``RuntimeError``.
    """
    check_floating(x, "x")
    check_param(t, "t", low=0.0, low_inclusive=False)
    if x.dim() == 0:
        x_work = x.reshape(1)
        return t_softmax(x_work, t, 0).reshape(())
    dim = normalize_dim(x, dim)
    last = dim == x.dim() - 1
    xc = (x if last else x.movedim(dim, -1)).to(compute_dtype(x))
    tt = _row_param(t if last else _move_param(t, x, dim), xc, "t")
    out = TSoftmaxFunction.apply(xc, tt).to(x.dtype)
    return out if last else out.movedim(-1, dim)


# --------------------------------------------------------------------------------------------
# r-softmax
# --------------------------------------------------------------------------------------------
def _quantile_threshold(x: Tensor, r: Union[float, Tensor], need_hi: bool):
    """The paper's linear-interpolated ``quantile(x, r)`` over the finite entries of each row.

    ``-inf`` entries are "not there": the quantile is over the ``n_valid`` other entries, so
    ``r`` is the fraction of zeros among them. Uses ``torch.kthvalue`` (selection, no sort).

    Returns ``(tau, lo_idx, hi_idx, frac, gap)`` (all with a trailing dim of 1): the threshold,
    the indices of the order statistics ``x_(lo)`` and ``x_(hi)`` it interpolates, the weight
    ``frac`` of ``x_(hi)``, and ``(n_valid - 1)(x_(hi) - x_(lo))`` = ``d tau / d r`` (or None).
    """
    n = x.shape[-1]
    neg_inf = x == float("-inf")
    has_masked = bool(neg_inf.any())
    if has_masked:
        n_valid = n - neg_inf.sum(-1, keepdim=True)
        n_invalid = n - n_valid
    else:
        n_valid = n_invalid = None

    if n_valid is None and not isinstance(r, Tensor):
        pos = r * (n - 1)
        lo = min(int(pos), n - 1)
        frac = pos - lo
        k_lo = torch.full(x.shape[:-1] + (1,), lo, dtype=torch.long, device=x.device)
        frac_t: Union[float, Tensor] = frac
        scalar_k = lo
    else:
        nv = n_valid.to(x.dtype) if n_valid is not None else torch.full_like(x[..., :1], n)
        pos = r * (nv - 1).clamp_min(0)
        if isinstance(pos, Tensor):
            pos = pos.expand(x.shape[:-1] + (1,))
        lo_f = pos.floor()
        frac_t = pos - lo_f
        k_lo = lo_f.long()
        if n_invalid is not None:
            k_lo = k_lo + n_invalid
        k_lo = k_lo.clamp_(0, n - 1)
        uniq = torch.unique(k_lo)
        scalar_k = int(uniq[0]) if uniq.numel() == 1 else None

    # x_(lo): the (k_lo + 1)-th smallest entry of the row (-inf entries rank first).
    if scalar_k is not None:
        x_lo, lo_idx = torch.kthvalue(x, scalar_k + 1, -1, keepdim=True)
    else:
        x_lo, lo_idx = _kthvalue_per_row(x, k_lo)

    need_hi = need_hi or not (isinstance(frac_t, float) and frac_t == 0.0)
    if need_hi:
        # x_(lo+1): equal to x_(lo) if x_(lo) is tied past rank lo, else the smallest entry above it.
        above = x > x_lo
        n_le = n - above.sum(-1, keepdim=True)
        tied = n_le >= k_lo + 2
        hi_idx = x.masked_fill(~above, float("inf")).argmin(-1, keepdim=True)
        x_hi = x.gather(-1, hi_idx)
        last = k_lo >= n - 1  # lo is the last rank: hi = lo
        keep_lo = tied | last
        x_hi = torch.where(keep_lo, x_lo, x_hi)
        hi_idx = torch.where(keep_lo, lo_idx, hi_idx)
        tau = torch.lerp(x_lo, x_hi, frac_t)
    else:
        x_hi, hi_idx = x_lo, lo_idx
        tau = x_lo
    if n_valid is None:
        gap = (x_hi - x_lo) * (n - 1)
    else:
        gap = (x_hi - x_lo) * (n_valid - 1).clamp_min(0).to(x.dtype)
        empty = n_valid == 0
        # No valid entry: tau = +inf makes every weight 0 (the row returns zeros), no -inf - -inf.
        tau = tau.masked_fill(empty, float("inf"))
        gap = gap.masked_fill(empty, 0.0)
    return tau, lo_idx, hi_idx, frac_t, gap


def _kthvalue_per_row(x: Tensor, k_lo: Tensor) -> Tuple[Tensor, Tensor]:
    """``kthvalue`` with a different (0-based) rank per row: grouped by rank, or one sort if many."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    k2 = k_lo.reshape(-1)
    uniq = torch.unique(k2)
    if uniq.numel() > 8:
        values, indices = torch.sort(x2, -1)
        v = values.gather(-1, k2.unsqueeze(-1))
        i = indices.gather(-1, k2.unsqueeze(-1))
    else:
        v = x2.new_empty(x2.shape[0], 1)
        i = torch.empty(x2.shape[0], 1, dtype=torch.long, device=x.device)
        for k in uniq.tolist():
            rows = (k2 == k).nonzero().squeeze(-1)
            vk, ik = torch.kthvalue(x2[rows], k + 1, -1, keepdim=True)
            v[rows] = vk
            i[rows] = ik
    shape = x.shape[:-1] + (1,)
    return v.reshape(shape), i.reshape(shape)


class RSoftmaxFunction(Function):
    """r-softmax over the last dim; ``r`` a float or a tensor broadcastable to ``x[..., :1]``."""

    @staticmethod
    def forward(ctx, x: Tensor, r: Union[float, Tensor]) -> Tensor:
        r_grad = bool(ctx.needs_input_grad[1])
        tau, lo_idx, hi_idx, frac, gap = _quantile_threshold(x, r, need_hi=r_grad)
        m = _finite_row_max(x)
        p, e = _weighted_softmax(x, tau, m)
        # tau >= max: every weight is 0 (r = 1, n = 1, or the quantile tied with the max).
        # Defined as the r -> 1 limit: uniform over the arg-max entries (one-hot if unique),
        # with zero gradient (the output is locally constant there).
        degenerate = (tau >= m) & torch.isfinite(tau)
        if bool(degenerate.any()):
            ties = ((x == m) & degenerate).to(x.dtype)
            p = torch.where(degenerate, ties / ties.sum(-1, keepdim=True).clamp_min(1), p)
        else:
            degenerate = None
        ctx.r_shape = r.shape if isinstance(r, Tensor) else None
        frac_t = frac if isinstance(frac, Tensor) else torch.full_like(tau, frac)
        ctx.save_for_backward(p, e, lo_idx, hi_idx, frac_t, gap, degenerate)
        return p

    @staticmethod
    @_first_order_only
    def backward(ctx, g: Tensor):
        p, e, lo_idx, hi_idx, frac, gap, degenerate = ctx.saved_tensors
        grad, c = _backward_common(g, p, e)
        if degenerate is not None:
            grad = grad.masked_fill_(degenerate, 0.0)  # e = 0 there, so c = 0 already
        grad.scatter_add_(-1, lo_idx, c * (1 - frac))
        grad.scatter_add_(-1, hi_idx, c * frac)
        grad_r = None
        if ctx.r_shape is not None and ctx.needs_input_grad[1]:
            grad_r = (c * gap).sum_to_size(ctx.r_shape)
        return grad, grad_r


def r_softmax(x: Tensor, r: Param, dim: int = -1) -> Tensor:
    r"""r-softmax (r-softmax paper, Eq. 3): t-softmax with ``t_r = max(x) - quantile(x, r)``.

    .. math:: \mathrm{r\text{-}softmax}(x, r)_i =
              \frac{w_i e^{x_i}}{\sum_j w_j e^{x_j}}, \quad w_i = \mathrm{ReLU}(x_i - \mathrm{quantile}(x, r))

    ``quantile`` is the paper's linearly interpolated quantile (``torch.quantile``'s default):
    with ``pos = r (n - 1)``, ``lo = floor(pos)``, it is ``x_(lo) + (pos - lo)(x_(lo+1) - x_(lo))``
    over the sorted row. It is computed by selection (``torch.kthvalue``), not a full sort.

    ``r`` is the sparsity rate: for ``r = k / n`` (``1 <= k < n``) and distinct entries exactly
    ``k`` entries are 0. Note that the formula always zeroes the row minimum, even at ``r = 0``
    (``quantile(x, 0) = min(x)``): r-softmax at ``r = 0`` is *not* softmax (softmax is only the
    ``t -> inf`` limit of t-softmax, Theorem 1). When every weight would be 0 (``r = 1``,
    ``n = 1``, or the quantile equal to the row max because of ties) the output is defined as
    the limit ``r -> 1``: uniform over the arg-max entries (one-hot when the max is unique), with
    zero gradient. All-equal entries therefore give the uniform distribution for every ``r``.

    Args:
        x: floating tensor of logits (any shape).
        r: sparsity rate in ``[0, 1]``: a number, a 0-d tensor, one value per row (``x``'s shape
            without ``dim``) or a tensor broadcastable to ``x`` with size 1 along ``dim``. A tensor
            ``r`` with ``requires_grad`` gets the (piecewise) gradient ``d tau / d r``.
        dim: dimension to normalize over.

    Masks: a ``-inf`` entry is "not there": it gets exactly 0 and the quantile is taken over the
    finite entries only (``r`` is the fraction of zeros among them). (The authors' code instead
    counts underflowed entries as zeros already present and adds ``eps = 1e-8`` to ``t``, so
    entries tied with the quantile keep a ~1e-8 weight; it also detaches ``t``. Here the formula
    is exact and the gradient flows through the quantile.) A row with no finite entry returns
    zeros with zero gradient; NaN in a row gives NaN in that row; float16/bfloat16 are computed
    in float32 and returned in the input dtype. ``r`` outside ``[0, 1]`` raises ``ValueError``;
    a non-floating ``x`` raises ``TypeError``. Double backward (``create_graph=True``) raises a clear ``RuntimeError``.
    """
    check_floating(x, "x")
    check_param(r, "r", low=0.0, high=1.0)
    if x.dim() == 0:
        return r_softmax(x.reshape(1), r, 0).reshape(())
    dim = normalize_dim(x, dim)
    last = dim == x.dim() - 1
    xc = (x if last else x.movedim(dim, -1)).to(compute_dtype(x))
    rr = _row_param(r if last else _move_param(r, x, dim), xc, "r")
    out = RSoftmaxFunction.apply(xc, rr).to(x.dtype)
    return out if last else out.movedim(-1, dim)


# --------------------------------------------------------------------------------------------
# modules
# --------------------------------------------------------------------------------------------
class TSoftmax(nn.Module):
    """t-softmax (Eq. 1) as a module.

    Args:
        t: initial ``t > 0``.
        dim: dimension to normalize over.
        learnable: if True, ``t`` is learned: stored as the parameter ``log_t`` (``t = exp(log_t)``)
            so that gradient steps can never make it leave ``t > 0``. If False, ``t`` is a buffer.
    """

    def __init__(self, t: float = 1.0, dim: int = -1, learnable: bool = False):
        super().__init__()
        check_param(t, "t", low=0.0, low_inclusive=False)
        self.dim = dim
        self.learnable = learnable
        log_t = torch.log(torch.as_tensor(float(t), dtype=torch.get_default_dtype()))
        if learnable:
            self.log_t = nn.Parameter(log_t)
        else:
            self.register_buffer("log_t", log_t)

    @property
    def t(self) -> Tensor:
        return self.log_t.exp()

    def forward(self, x: Tensor) -> Tensor:
        return t_softmax(x, self.t.to(x.dtype if x.is_floating_point() else self.log_t.dtype), dim=self.dim)

    def extra_repr(self) -> str:
        return f"t={float(self.t):.4g}, dim={self.dim}, learnable={self.learnable}"


class RSoftmax(nn.Module):
    """r-softmax (Eq. 3) as a module.

    Args:
        r: default sparsity rate in ``[0, 1]``.
        dim: dimension to normalize over.

    ``forward(x, r=None)`` uses the stored ``r`` unless a per-call ``r`` (e.g. one per example,
    predicted by :class:`sparsenorm.losses.SparsityRatePredictor`) is given.
    """

    def __init__(self, r: float = 0.5, dim: int = -1):
        super().__init__()
        check_param(r, "r", low=0.0, high=1.0)
        self.r = float(r)
        self.dim = dim

    def forward(self, x: Tensor, r: Optional[Param] = None) -> Tensor:
        return r_softmax(x, self.r if r is None else r, dim=self.dim)

    def extra_repr(self) -> str:
        return f"r={self.r}, dim={self.dim}"
