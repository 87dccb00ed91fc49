"""Evidential softmax (Chen et al., NeurIPS 2021) and post-hoc evidential sparsification (Itkina et al.).

Equation numbers refer to the ev-softmax paper (``shared/papers/ev-softmax-paper-with-appendix.txt``):

* Eq. 7   ``ev_softmax(v)_k ∝ 1{v_k >= mean(v)} exp(v_k)``
* Eq. 9   its Jacobian, softmax's Jacobian restricted to the support
* Eq. 10  ``ev_softmax_train(v)_k ∝ (1{v_k >= mean(v)} + eps) exp(v_k)``, full support
* Eq. 12  the gradient of ``log ev_softmax_train`` tends to ``δ_i - ev_softmax(v)`` as eps → 0
* Appendix A (Eqs. 4, 6, 19, 21–26)  post-hoc evidential sparsification from the last linear layer

Shared conventions (every function here):

* Entries that are "not there" -- ``-inf``, ``False`` in a boolean ``mask`` (True = keep), or at or
  below ``finfo(dtype).min / 2`` (an additive mask, e.g. Hugging Face's ``finfo.min``) -- get
  exactly 0 probability (log: ``-inf``) and a zero gradient, and are left out of the mean, so
  padding does not turn ev-softmax into softmax.
* A row with no entry there returns all zeros (``log_ev_softmax_train``: all ``-inf``) with a zero
  gradient. NaN in a row gives NaN in that row only (``+inf`` too, as for ``torch.softmax``).
* float16/bfloat16 are computed in float32 and returned in the input dtype.
* Ties with the mean are kept (``>=``, Eq. 7). The threshold is ``min(mean, max)``: the exact mean
  never exceeds the maximum, but the floating-point mean of near-equal entries can, by rounding;
  capping it keeps the maximal entries, so no row is ever left without support, and all-equal
  entries give the uniform distribution.

Implementation: the registered operator ``sparsenorm::ev_softmax`` (``sparsenorm.kernels.ops.evidential``):
a fused C++ kernel on CPU where built, the Triton kernel on CUDA where triton is installed, else the
pure-PyTorch reference
(``kernels/reference/evidential.py``), which is ``softmax`` of ``x`` with the entries below the
threshold replaced by ``-inf`` (Eq. 7) or shifted by ``log(eps) - log(1 + eps)`` (Eq. 10), so its
float32 accuracy is that of a masked ``torch.softmax``. The shift is piecewise constant, so the
backward pass is exactly softmax's (resp. log-softmax's) backward on the saved output, which is
all the operator saves (a fused kernel for the log form; under ``create_graph`` differentiable ops,
so double backward works). The kernel sums the
row mean in double, so the support can differ from the reference only for an entry within
rounding of its row's mean.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ._validation import check_eps, check_floating, compute_dtype, run_on_rows
from .kernels import ops

_NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------
# Functional API
# ----------------------------------------------------------------------------------------------
def ev_softmax(x: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    r"""Evidential softmax, Eq. 7: ``p_k ∝ 1{x_k >= mean(x)} exp(x_k)``.

    The mean is over the entries of the row that are there only (``-inf``, ``mask == False`` and
    entries ``<= finfo(dtype).min / 2`` are excluded and get probability 0). Ties with the mean are
    kept (``>=``); rounding in the mean can never empty a row (see the module notes). K = 1 gives 1, all-equal
    entries the uniform distribution, K = 2 the one-hot argmax (a tie gives (1/2, 1/2)).

    Gradient (Eq. 9): ``∂p_i/∂x_j = p_i (δ_ij - p_j)``, i.e. softmax's Jacobian on the support
    and 0 off it. Rows with no valid entry give zeros and a zero gradient; NaN stays in its row.

    Args:
        x: floating tensor of scores (float16/bfloat16 computed in float32).
        dim: dimension to normalize over.
        mask: optional boolean tensor broadcastable to ``x``; True = keep.
    """
    return run_on_rows(ops.ev_softmax, x, dim, mask, None, False)


def ev_softmax_train(x: Tensor, dim: int = -1, eps: float = 1e-6, mask: Optional[Tensor] = None) -> Tensor:
    r"""Training-time evidential softmax, Eq. 10: ``p_k ∝ (1{x_k >= mean(x)} + eps) exp(x_k)``.

    eps is added to *every* valid entry, as in Eq. 10 (not only to those off the support), so
    every valid entry has positive probability for eps > 0; ``eps = 0`` gives :func:`ev_softmax`.
    Masking, the mean over valid entries, empty rows, NaN and dtypes as in :func:`ev_softmax`.

    Gradient: ``p_i (δ_ij - p_j)`` (softmax's Jacobian; the indicator is piecewise constant).

    Raises:
        ValueError: if ``eps`` is negative, NaN or infinite.
    """
    check_eps(eps)
    return run_on_rows(ops.ev_softmax, x, dim, mask, float(eps), False)


def log_ev_softmax_train(
    x: Tensor, dim: int = -1, eps: float = 1e-6, mask: Optional[Tensor] = None
) -> Tensor:
    r"""``log ev_softmax_train(x)`` (Eq. 10) computed in log space with ``log_softmax``.

    Finite for every valid entry when eps > 0 (no ``log`` of an underflowed probability), so
    the negative log-likelihood is finite even for a target outside the ev-softmax support.
    Its gradient is ``δ_ij - ev_softmax_train(x)_j``, which tends to Eq. 12,
    ``δ_ij - ev_softmax(x)_j``, as eps → 0.

    ``-inf``/masked entries give ``-inf`` (log 0) with zero gradient; a row with no valid entry
    gives all ``-inf`` and a zero gradient. ``eps = 0`` gives ``-inf`` off the support.

    Raises:
        ValueError: if ``eps`` is negative, NaN or infinite.
    """
    check_eps(eps)
    return run_on_rows(ops.ev_softmax, x, dim, mask, float(eps), True)


# ----------------------------------------------------------------------------------------------
# Post-hoc evidential sparsification (Itkina et al. 2020; ev-softmax paper Appendix A)
# ----------------------------------------------------------------------------------------------
def _check_linear(features: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    check_floating(features, "features")
    check_floating(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (K, J) as in nn.Linear, got shape {tuple(weight.shape)}")
    if features.dim() == 0 or features.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"features must have shape (..., J) with J = weight.shape[1] = {weight.shape[1]}, "
            f"got {tuple(features.shape)}"
        )
    if weight.shape[0] == 0:
        raise ValueError("weight has no output classes (K = 0)")
    if bias is not None:
        check_floating(bias, "bias")
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape (K,) = ({weight.shape[0]},), got {tuple(bias.shape)}")


def evidential_weights(features: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    r"""Evidential class weights ``w`` (Eq. 4; Definition B.1/B.2, Eq. 24), shape (..., K).

    ``β_jk = β̂_jk - mean_l β̂_jl`` and ``α_k = α̂_k - mean_l α̂_l`` (the weights and bias centered
    over classes), ``w_k = α_k + Σ_j β_jk φ_j``. ``weight`` is ``β̂ᵀ`` in nn.Linear's (K, J) layout.
    """
    _check_linear(features, weight, bias)
    dtype = torch.promote_types(compute_dtype(features), compute_dtype(weight))
    beta = weight.to(dtype)
    beta = beta - beta.mean(0, keepdim=True)  # (K, J), centered over classes
    w = features.to(dtype) @ beta.T
    if bias is not None:
        alpha = bias.to(dtype)
        w = w + (alpha - alpha.mean())
    return w


def singleton_masses(w: Tensor) -> Tensor:
    r"""Dempster–Shafer singleton masses ``m({z_k})`` of Eq. 6/19 (up to the common normalizer).

    ``m_k = e^{-w_k^-} (e^{w_k^+} - 1 + Π_{l≠k} (1 - e^{-w_l^-}))`` with ``w^± = max(0, ±w)``.
    The product over ``l ≠ k`` costs O(K) per row: the zero factors (``w_l >= 0``) are counted,
    the others multiplied through a sum of logs, and each ``k`` divides its own factor out
    (a log-difference), so no factor is ever divided by zero.
    """
    w_plus = w.clamp_min(0)
    w_minus = (-w).clamp_min(0)
    factor = -torch.expm1(-w_minus)  # 1 - e^{-w^-}, exactly 0 iff w >= 0
    is_zero = factor == 0
    n_zero = is_zero.sum(-1, keepdim=True)
    log_factor = torch.log(factor.masked_fill(is_zero, 1.0))
    log_total = log_factor.sum(-1, keepdim=True)  # log of the product of the nonzero factors
    prod_without_k = torch.where(
        is_zero,
        torch.where(n_zero == 1, torch.exp(log_total), torch.zeros_like(w)),  # k held the only zero
        torch.where(n_zero == 0, torch.exp(log_total - log_factor), torch.zeros_like(w)),
    )
    return torch.exp(-w_minus) * (torch.expm1(w_plus) + prod_without_k)


def posthoc_evidential(features: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    r"""Post-hoc evidential sparsification (Itkina et al. 2020), literally from the last layer.

    With ``features`` φ (..., J), ``weight`` (K, J) and ``bias`` (K,) in ``torch.nn.Linear``'s layout
    (so ``posthoc_evidential(h, layer.weight, layer.bias)`` filters ``softmax(layer(h))``):

    1. evidential weights ``w`` (Eq. 4 / Appendix A, Eqs. 21–26), see :func:`evidential_weights`;
    2. singleton masses ``m_k`` (Eq. 6/19) in O(K) per row, see :func:`singleton_masses`;
    3. ``p_k ∝ 1{m_k ≠ 0} e^{w_k}`` (Eqs. 5, 22), normalized like a softmax over the kept classes.

    By Theorem 3.1 this equals ``ev_softmax(features @ weight.T + bias)`` except on ties with the
    mean (a measure-zero set). When every singleton mass is zero (all ``w_k = 0`` with K >= 2,
    i.e. all scores equal) the distribution is undefined by Eq. 5; the uniform distribution is
    returned there, as Eq. 32 (Definition B.3) prescribes. ``bias=None`` means no bias. The result
    is in the promoted dtype of ``features`` and ``weight`` (float16/bfloat16 computed in float32
    and cast back). Differentiable (softmax's gradient on the kept classes).
    """
    w = evidential_weights(features, weight, bias)
    keep = singleton_masses(w) != 0
    keep = keep | ~keep.any(-1, keepdim=True)
    p = torch.softmax(w.masked_fill(~keep, _NEG_INF), -1)
    return p.to(torch.promote_types(features.dtype, weight.dtype))


# ----------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------
class EvSoftmax(nn.Module):
    """Module form of :func:`ev_softmax` (Eq. 7); ``forward(x, mask=None)``."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return ev_softmax(x, dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class _TrainFormModule(nn.Module):
    """Shared by the modules of Eq. 10 and its log: store ``dim`` and ``eps``, call ``_function``."""

    _function = staticmethod(ev_softmax_train)

    def __init__(self, dim: int = -1, eps: float = 1e-6):
        super().__init__()
        check_eps(eps)
        self.dim = dim
        self.eps = eps

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return self._function(x, dim=self.dim, eps=self.eps, mask=mask)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"


class EvSoftmaxTrain(_TrainFormModule):
    """Module form of :func:`ev_softmax_train` (Eq. 10); ``forward(x, mask=None)``."""

    _function = staticmethod(ev_softmax_train)


class LogEvSoftmaxTrain(_TrainFormModule):
    """Module form of :func:`log_ev_softmax_train`; ``forward(x, mask=None)``."""

    _function = staticmethod(log_ev_softmax_train)


class PosthocEvidential(nn.Module):
    """Post-hoc evidential sparsification of a trained ``nn.Linear`` output layer.

    ``PosthocEvidential(layer)(features)`` is ``posthoc_evidential(features, layer.weight,
    layer.bias)``: the layer is held by reference (not copied), so later training shows.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        self.linear = linear

    def forward(self, features: Tensor) -> Tensor:
        return posthoc_evidential(features, self.linear.weight, self.linear.bias)
