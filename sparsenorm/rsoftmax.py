"""t-softmax and r-softmax (Bałazy, Struski, Śmieja, Tabor, "r-softmax: Generalized Softmax with
Controllable Sparsity Rate").

Both are a *weighted softmax* ``p_i = w_i exp(x_i) / sum_j w_j exp(x_j)`` with the weights
``w_i = relu(x_i - tau)`` for a threshold ``tau``:

* t-softmax (Eq. 1): ``tau = max(x) - t`` for a ``t > 0``, so ``w_i = relu(x_i + t - max(x))``;
* r-softmax (Eq. 3): ``t_r = max(x) - quantile(x, r)``, i.e. ``tau = quantile(x, r)``, the
  linearly interpolated quantile of the row (the paper's definition, the same as
  ``torch.quantile(..., interpolation="linear")``).

Layering: :func:`t_softmax` / :func:`r_softmax` validate and go through the entry path
(``sparsenorm._validation.run_on_rows``), which leaves entries at or below ``finfo.min / 2`` to the
operators (they read them as not there), and call the op layer (``sparsenorm.kernels.ops.rsoftmax``):
the registered operators ``sparsenorm::r_softmax_forward`` / ``t_softmax_forward`` and their shared
``r_softmax_backward`` run a fused C++ kernel on CPU where built (order statistics by bucket
selection, no sort) and else the reference (``kernels/reference/rsoftmax.py``: ``torch.topk``
selection on CPU, a sync-free sort elsewhere; the weighted softmax as ``w exp(x - max)``
normalized); their ``autograd.Function`` classes save the output ``p``, the input ``x`` (the
Jacobian has ``1 / w_i`` terms, ``w = x - tau``) and per-row threshold data, and apply the
closed-form backward below. The modules :class:`TSoftmax` / :class:`RSoftmax` store ``dim`` and
the parameter.

Closed-form backward. With ``e_i = exp(x_i) / sum_j w_j exp(x_j)`` on the support (0 off it),
``<g, p> = sum_i g_i p_i`` and ``C = -sum_i e_i (g_i - <g, p>)``::

    dL/dx_j   = (p_j + e_j) (g_j - <g, p>) + (d tau / d x_j) C
    dL/dt     = -C                                   (t-softmax: d tau / d t = -1)
    dL/dr     = C (n - 1) (x_(hi) - x_(lo))          (r-softmax: tau = lerp(x_(lo), x_(hi), frac))

where ``d tau / d x`` is the indicator of the arg-max (t-softmax) or puts ``1 - frac`` on the
order statistic ``x_(lo)`` and ``frac`` on ``x_(hi)`` (r-softmax; ``lo = floor(r (n - 1))``).
With ``h = p (g - <g, p>)`` (softmax's own backward, torch's fused kernel), ``e_j (g_j - <g, p>) =
h_j / w_j``, so ``dL/dx = h + h / w`` plus the ``C`` term, and ``C = -sum(h + h / w)`` because
``sum(h) = 0``: softmax's backward, one ``addcdiv`` and one sum.

"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from ._validation import check_param, run_on_rows
from .kernels.ops import rsoftmax as ops

Param = Union[float, int, Tensor]


def t_softmax(x: Tensor, t: Param, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
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

        mask: optional boolean tensor broadcastable to ``x``; True = keep.

    Edge cases: an entry that is not there (``-inf``, ``mask == False``, or ``<= finfo(dtype).min / 2``)
    gets exactly 0; a row with none there returns zeros with zero gradient; NaN in a row gives NaN in
    that row; float16/bfloat16 are computed in float32 and returned in the input dtype. ``t <= 0`` (or
    NaN) raises ``ValueError``; a non-floating ``x`` raises ``TypeError``. Backward is closed-form
    (module docstring); double backward raises a clear ``RuntimeError``.
    """
    check_param(t, "t", low=0.0, low_inclusive=False)
    return run_on_rows(ops.t_softmax_rows, x, dim, mask, params={"t": t})


def r_softmax(x: Tensor, r: Param, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    r"""r-softmax (r-softmax paper, Eq. 3): t-softmax with ``t_r = max(x) - quantile(x, r)``.

    .. math:: \mathrm{r\text{-}softmax}(x, r)_i =
              \frac{w_i e^{x_i}}{\sum_j w_j e^{x_j}}, \quad w_i = \mathrm{ReLU}(x_i - \mathrm{quantile}(x, r))

    ``quantile`` is the paper's linearly interpolated quantile (``torch.quantile``'s default):
    with ``pos = r (n - 1)``, ``lo = floor(pos)``, it is ``x_(lo) + (pos - lo)(x_(lo+1) - x_(lo))``
    over the sorted row. It is computed by selection (bucket selection in the C++ kernel, else
    ``torch.topk`` from the nearer end), not a full sort.

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

        mask: optional boolean tensor broadcastable to ``x``; True = keep.

    Masks: an entry that is "not there" (``-inf``, ``mask == False``, or ``<= finfo(dtype).min / 2``)
    gets exactly 0 and the quantile is taken over the entries that are there only (``r`` is the fraction
    of zeros among them). (The authors' code instead counts underflowed entries as zeros already present
    and adds ``eps = 1e-8`` to ``t``, so entries tied with the quantile keep a ~1e-8 weight; it also
    detaches ``t``. Here the formula is exact and the gradient flows through the quantile.) A row with
    no finite entry returns zeros with zero gradient; NaN in a row gives NaN in that row;
    float16/bfloat16 are computed in float32 and returned in the input dtype. ``r`` outside ``[0, 1]``
    raises ``ValueError``; a non-floating ``x`` raises ``TypeError``. Double backward
    (``create_graph=True``) raises a clear ``RuntimeError``.
    """
    check_param(r, "r", low=0.0, high=1.0)
    return run_on_rows(ops.r_softmax_rows, x, dim, mask, params={"r": r})


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

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return t_softmax(x, self.t.to(x.dtype if x.is_floating_point() else self.log_t.dtype), dim=self.dim,
                         mask=mask)

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

    def forward(self, x: Tensor, r: Optional[Param] = None, mask: Optional[Tensor] = None) -> Tensor:
        return r_softmax(x, self.r if r is None else r, dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"r={self.r}, dim={self.dim}"
