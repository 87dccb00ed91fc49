"""Evidential softmax (Chen et al., NeurIPS 2021) and post-hoc evidential sparsification (Itkina et al.).

Equation numbers refer to the ev-softmax paper (``shared/papers/ev-softmax-paper-with-appendix.txt``):

* Eq. 7   ``ev_softmax(v)_k ∝ 1{v_k >= mean(v)} exp(v_k)``
* Eq. 9   its Jacobian, softmax's Jacobian restricted to the support
* Eq. 10  ``ev_softmax_train(v)_k ∝ (1{v_k >= mean(v)} + eps) exp(v_k)``, full support
* Eq. 12  the gradient of ``log ev_softmax_train`` tends to ``δ_i - ev_softmax(v)`` as eps → 0
* Appendix A (Eqs. 4, 6, 19, 21–26)  post-hoc evidential sparsification from the last linear layer

Shared conventions (every function here):

* ``-inf`` entries (and ``False`` entries of a boolean ``mask``, True = keep) are "not there": they
  get exactly 0 probability and are left out of the mean, so padding does not turn ev-softmax
  into softmax.
* A row with no valid entry returns all zeros (``log_ev_softmax_train``: all ``-inf``) with a zero
  gradient. NaN in a row gives NaN in that row only (``+inf`` too, as for ``torch.softmax``).
* float16/bfloat16 are computed in float32 and returned in the input dtype (the float32 output is
  what backward keeps for them).
* Ties with the mean are kept (``>=``, Eq. 7). The exact mean never exceeds the maximum, but the
  floating-point mean of equal entries can, by rounding; no row is ever left without support.
  Without ``-inf`` entries such a row (all entries equal up to rounding) counts as all ties, so
  all-equal entries give the uniform distribution; with ``-inf`` entries (and for
  ``log_ev_softmax_train`` with eps = 0) the threshold is capped at the row maximum.

Implementation: ev-softmax is ``softmax`` of ``x - threshold`` with the entries below the
threshold filled with ``-inf`` (or the most negative float, see :func:`_support_logits`), and
Eq. 10 is ``softmax(x + log(1{x >= threshold} + eps))``. The shift is piecewise constant, so the
backward pass is exactly softmax's (resp. log-softmax's) backward on the saved output, which is
all each ``autograd.Function`` saves; it uses differentiable ops, so double backward works. On CPU
the softmax is computed in place in the buffer that holds the shifted logits, which saves an
allocation (large fresh allocations cost page faults comparable to the kernel itself).

Opt-in C++ kernel: with ``sparsenorm.use_cpu_kernels(True)`` (or ``SPARSENORM_CPU_KERNELS=1``) the
CPU float32/float64 forward runs a fused kernel (``csrc/evidential_cpu.cpp``, 3 passes per row as
softmax) with the same rules; its row mean is summed in another order (in double), so outputs
agree with this path to rounding, and the support can differ only for an entry within rounding
of its row's mean. Backward is unchanged.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _cpu_kernels
from ._validation import apply_mask, check_floating, check_param, compute_dtype, normalize_dim

_NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------
# Support threshold
# ----------------------------------------------------------------------------------------------
def _threshold(x: Tensor, dim: int, cap: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """The support threshold of each row, and the rows with no valid entry.

    Fast path (no ``-inf``, ``+inf`` or NaN anywhere): the row mean, from one ``mean`` pass; the
    finiteness check runs on the per-row means only, never on ``x``. With ``cap`` the threshold
    is ``min(mean, max)``, so that rounding of the mean can never leave a row without support.
    A ``-inf`` entry makes its row's mean ``-inf`` (or NaN with ``+inf``), which sends the whole
    call to the masked path: ``min(mean, max)`` over the valid (non ``-inf``) entries, and
    ``empty`` (bool, keepdim) marking rows with none; ``empty`` is None on the fast path.
    """
    if x.shape[dim] == 0:  # no classes: nothing to threshold (amax refuses empty dims)
        return x.new_zeros(x.shape[:dim] + (1,) + x.shape[dim + 1:]), None
    mean = x.mean(dim, keepdim=True)
    # One scalar read instead of an elementwise isfinite: a non-finite row mean makes the sum
    # non-finite (so can an overflowing sum of finite means; the masked path is right then too).
    if x.numel() == 0 or math.isfinite(mean.sum().item()):
        return (torch.minimum(mean, x.amax(dim, keepdim=True)) if cap else mean), None
    valid = x != _NEG_INF  # NaN counts as valid, so it reaches the row's mean and output
    count = valid.sum(dim, keepdim=True)
    total = x.masked_fill(~valid, 0.0).sum(dim, keepdim=True)
    empty = count == 0
    mean = total / count.clamp_min(1).to(x.dtype)
    return torch.minimum(mean, x.amax(dim, keepdim=True)), empty


def _prepare(x: Tensor, dim: int, mask: Optional[Tensor], name: str = "x") -> Tuple[Tensor, int]:
    check_floating(x, name)
    dim = normalize_dim(x, dim)
    x = x.to(compute_dtype(x))
    x = apply_mask(x, mask, dim)
    return x, dim


def _check_eps(eps: float) -> None:
    if isinstance(eps, Tensor):
        raise TypeError("eps must be a Python number, not a tensor")
    check_param(eps, "eps", low=0.0)
    if math.isinf(eps):
        raise ValueError(f"eps must be finite, got {eps}")


def _support_logits(x: Tensor, dim: int, exact_zero_log: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """A new tensor ``x - threshold`` on the support and a fill value off it (its softmax is Eq. 7).

    Centering first lets one scalar-threshold kernel decide ``x >= threshold`` as
    ``c > -smallest_normal``: the difference of two unequal floats is at least the smallest
    normal number in magnitude unless both are below about ``2**-100`` (float32), so this is
    ``c >= 0`` everywhere else, and it does not depend on denormals (flush-to-zero mode). This
    avoids boolean temporaries, which are several times slower than float ones on CPU.

    The fill is ``-inf`` on the masked path and where ``exact_zero_log`` asks for log 0 = ``-inf``
    (both use the capped threshold, so no row loses its support). Otherwise it is the most
    negative finite number, whose softmax weight is exactly 0 next to any kept entry; should
    rounding put the mean above every entry of a row (all entries equal up to rounding), the
    whole row is filled and its softmax is uniform, i.e. all entries count as ties. This saves
    the ``amax`` pass of the capped threshold.
    """
    thr, empty = _threshold(x, dim, cap=exact_zero_log)
    fill = _NEG_INF if (exact_zero_log or empty is not None) else torch.finfo(x.dtype).min
    # A contiguous buffer of our own: the softmax is then computed in place in it (see
    # _softmax_into), which needs contiguous memory.
    c = torch.sub(x, thr).contiguous()
    F.threshold_(c, -torch.finfo(c.dtype).smallest_normal, fill)
    return c, empty


def _train_logits(x: Tensor, dim: int, eps: float) -> Tuple[Tensor, Optional[Tensor]]:
    """A new tensor of logits whose softmax is Eq. 10: ``x`` on the support, ``x + log(eps) -
    log(1 + eps)`` off it. (Eq. 10 adds eps to every entry; the constant ``log(1 + eps)`` is
    subtracted from all entries, which softmax ignores.)
    """
    if eps == 0.0:
        return _support_logits(x, dim, exact_zero_log=True)
    # Uncapped mean: if rounding puts it above every entry, every entry is shifted alike and the
    # row is uniform, i.e. all entries count as ties.
    thr, empty = _threshold(x, dim)
    off_support = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, ours
    torch.lt(x, thr, out=off_support)  # 1.0 / 0.0 as floats: fast kernels, reused as the output
    torch.add(x, off_support, alpha=math.log(eps) - math.log1p(eps), out=off_support)
    return off_support, empty


# ----------------------------------------------------------------------------------------------
# autograd Functions: forward on prepared (upcast, masked) input, backward from the output only
# ----------------------------------------------------------------------------------------------
def _softmax_backward(grad: Tensor, out: Tensor, dim: int) -> Tensor:
    return torch._softmax_backward_data(grad, out, dim, out.dtype)


def _log_softmax_backward(grad: Tensor, out: Tensor, dim: int, zero_at_neg_inf: bool) -> Tensor:
    if zero_at_neg_inf:
        # A -inf output is constant (the entry is not there): its incoming gradient is dropped
        # before the sum, and the entry itself then gets exactly 0.
        grad = grad.masked_fill(out == _NEG_INF, 0.0)
    return torch._log_softmax_backward_data(grad, out, dim, out.dtype)


class EvSoftmaxFunction(torch.autograd.Function):
    """Eq. 7 (``eps=None``) or Eq. 10 forward; the backward is softmax's on the output (Eq. 9: the
    indicator and Eq. 10's log-shift are piecewise constant, so nothing else depends on x)."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int, eps: Optional[float]) -> Tensor:
        fused = _fused_forward(x, dim, eps=eps, log=False)
        if fused is not None:
            out = fused[0]
        else:
            z, empty = _support_logits(x, dim) if eps is None else _train_logits(x, dim, eps)
            out = _finish_softmax(z, dim, empty)
        ctx.dim = dim
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        return _softmax_backward(grad, out, ctx.dim), None, None


class LogEvSoftmaxTrainFunction(torch.autograd.Function):
    """log of Eq. 10 via log_softmax; backward is log_softmax's on the output."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int, eps: float) -> Tensor:
        fused = _fused_forward(x, dim, eps=eps, log=True)
        if fused is not None:
            out, masked = fused
        else:
            z, empty = _train_logits(x, dim, eps)
            masked = empty is not None
            if masked:
                z = z.masked_fill(empty, 0.0)
            out = _softmax_into(z, dim, log=True)
            if masked:
                out = out.masked_fill(empty, _NEG_INF)
        ctx.dim = dim
        # -inf outputs exist only on the masked path or with eps == 0.
        ctx.zero_at_neg_inf = masked or eps == 0.0
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        return _log_softmax_backward(grad, out, ctx.dim, ctx.zero_at_neg_inf), None, None


def _fused_forward(x: Tensor, dim: int, eps: Optional[float], log: bool) -> Optional[Tuple[Tensor, bool]]:
    """The forward by the opt-in C++ CPU kernel (see ``sparsenorm._cpu_kernels``), or None where it
    is off or does not apply. ``eps=None`` is Eq. 7; else Eq. 10 (``eps = 0``: capped support).

    Returns the output and whether the call took the masked path (a row with -inf, +inf or NaN).
    The kernel follows the rules above row by row; the one rule that spans rows (a non-finite
    row anywhere caps every row's threshold) is applied here by re-running capped, which only
    changes rows whose mean rounded above their max (reported by the kernel).
    """
    ext = _cpu_kernels.EVIDENTIAL.kernel_for(x)
    if ext is None or x.dim() == 0:
        return None
    if eps is None:
        kind, shift, cap = 0, 0.0, False
    elif eps == 0.0:
        kind, shift, cap = 0, 0.0, True
    else:
        kind, shift, cap = 1, math.log(eps) - math.log1p(eps), False
    rows = x.movedim(dim, -1)
    flat = rows.reshape(-1, rows.shape[-1]).contiguous()
    out, nonfinite_rows, rounded_rows = ext.ev_softmax_forward(flat, kind, shift, cap, log)
    if nonfinite_rows and rounded_rows and not cap:
        out, _, _ = ext.ev_softmax_forward(flat, kind, shift, True, log)
    return out.view(rows.shape).movedim(-1, dim), nonfinite_rows > 0


def _finish_softmax(z: Tensor, dim: int, empty: Optional[Tensor]) -> Tensor:
    """``softmax(z)`` written into ``z`` (a fresh tensor: saves softmax's allocation, which on CPU
    costs more than the kernel); rows with no valid entry become zeros instead of NaN."""
    if empty is not None:
        z = z.masked_fill_(empty, 0.0)
    out = _softmax_into(z, dim, log=False)
    return out if empty is None else out.masked_fill_(empty, 0.0)


def _softmax_into(z: Tensor, dim: int, log: bool) -> Tensor:
    """(log-)softmax of a contiguous tensor of ours, in place on CPU (where softmax's kernels read
    each entry before writing it); a fresh output elsewhere."""
    if z.device.type == "cpu":
        op = torch.ops.aten._log_softmax.out if log else torch.ops.aten._softmax.out
        return op(z, dim, False, out=z)
    return torch.log_softmax(z, dim) if log else torch.softmax(z, dim)


# ----------------------------------------------------------------------------------------------
# Functional API
# ----------------------------------------------------------------------------------------------
def ev_softmax(x: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    r"""Evidential softmax, Eq. 7: ``p_k ∝ 1{x_k >= mean(x)} exp(x_k)``.

    The mean is over the valid entries of the row only (``-inf`` and ``mask == False`` entries
    are excluded and get probability 0). Ties with the mean are kept (``>=``); rounding in the
    mean can never empty a row (see the module notes). K = 1 gives 1, all-equal
    entries the uniform distribution, K = 2 the one-hot argmax (a tie gives (1/2, 1/2)).

    Gradient (Eq. 9): ``∂p_i/∂x_j = p_i (δ_ij - p_j)``, i.e. softmax's Jacobian on the support
    and 0 off it. Rows with no valid entry give zeros and a zero gradient; NaN stays in its row.

    Args:
        x: floating tensor of scores (float16/bfloat16 computed in float32).
        dim: dimension to normalize over.
        mask: optional boolean tensor broadcastable to ``x``; True = keep.
    """
    dtype = x.dtype if isinstance(x, Tensor) else None
    z, dim = _prepare(x, dim, mask)
    return EvSoftmaxFunction.apply(z, dim, None).to(dtype)


def ev_softmax_train(x: Tensor, dim: int = -1, eps: float = 1e-6, mask: Optional[Tensor] = None) -> Tensor:
    r"""Training-time evidential softmax, Eq. 10: ``p_k ∝ (1{x_k >= mean(x)} + eps) exp(x_k)``.

    eps is added to *every* valid entry, as in Eq. 10 (not only to those off the support), so
    every valid entry has positive probability for eps > 0; ``eps = 0`` gives :func:`ev_softmax`.
    Masking, the mean over valid entries, empty rows, NaN and dtypes as in :func:`ev_softmax`.

    Gradient: ``p_i (δ_ij - p_j)`` (softmax's Jacobian; the indicator is piecewise constant).

    Raises:
        ValueError: if ``eps`` is negative, NaN or infinite.
    """
    _check_eps(eps)
    dtype = x.dtype if isinstance(x, Tensor) else None
    z, dim = _prepare(x, dim, mask)
    return EvSoftmaxFunction.apply(z, dim, float(eps)).to(dtype)


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
    _check_eps(eps)
    dtype = x.dtype if isinstance(x, Tensor) else None
    z, dim = _prepare(x, dim, mask)
    return LogEvSoftmaxTrainFunction.apply(z, dim, float(eps)).to(dtype)


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
        _check_eps(eps)
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
