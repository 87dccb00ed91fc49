"""The r-softmax threshold: the paper's linearly interpolated ``quantile(x, r)`` of each row.

Rows along the last dim; ``-inf`` entries are "not there": the quantile is over the other entries
(``r`` is the fraction of zeros among them). Two algorithms with the same results:

* :func:`quantile_threshold_sorted`: a full sort, sync-free (the reference on every device);
* :func:`quantile_threshold`: the CPU variant, ``torch.topk`` from the nearer end of the row
  (selection, no full sort); it reads the ranks on the host to size the selection.

Both return ``(tau, lo_idx, hi_idx, frac, dtau_dr)``: the threshold (``+inf`` for a row with no
entry there), the indices of the order statistics ``x_(lo)`` and ``x_(hi)`` it interpolates, the
weight ``frac`` of ``x_(hi)``, and ``d tau / d r = (n_valid - 1)(x_(hi) - x_(lo))``.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..._validation import not_there_level


def _order_statistics(x: Tensor, rank: Union[int, Tensor]):
    """Values and indices of the order statistics ``x_(rank)`` and ``x_(rank + 1)`` of each row.

    ``rank`` is 0-based ascending (an int shared by all rows, or a ``(..., 1)`` long tensor);
    ``rank + 1`` is clamped to ``n - 1``. Uses ``torch.topk`` from whichever end of the row is
    nearer: O(n) selection per row, no full sort.
    """
    n = x.shape[-1]
    if isinstance(rank, int):
        if rank >= n - 1:
            idx = x.argmax(-1, keepdim=True)
            v = x.gather(-1, idx)
            return v, v, idx, idx
        if rank + 2 <= n - rank:  # the rank + 2 smallest; the two largest of them
            vals, ids = torch.topk(x, rank + 2, -1, largest=False, sorted=False)
            two, j = torch.topk(vals, 2, -1, largest=True, sorted=True)
            hi, lo = two.split(1, -1)
            hi_idx, lo_idx = ids.gather(-1, j).split(1, -1)
        else:  # the n - rank largest; the two smallest of them
            vals, ids = torch.topk(x, n - rank, -1, largest=True, sorted=False)
            two, j = torch.topk(vals, 2, -1, largest=False, sorted=True)
            lo, hi = two.split(1, -1)
            lo_idx, hi_idx = ids.gather(-1, j).split(1, -1)
        return lo, hi, lo_idx, hi_idx
    rank_hi = (rank + 1).clamp_(max=n - 1)
    k_small = int(rank_hi.max()) + 1
    k_large = n - int(rank.min())
    if k_small <= k_large:
        vals, ids = torch.topk(x, k_small, -1, largest=False, sorted=True)
        pos_lo, pos_hi = rank, rank_hi
    else:  # descending: rank rho sits at position n - 1 - rho
        vals, ids = torch.topk(x, k_large, -1, largest=True, sorted=True)
        pos_lo, pos_hi = n - 1 - rank, n - 1 - rank_hi
    return vals.gather(-1, pos_lo), vals.gather(-1, pos_hi), ids.gather(-1, pos_lo), ids.gather(-1, pos_hi)


def quantile_threshold(x: Tensor, r: Union[float, Tensor]):
    """The paper's linear-interpolated ``quantile(x, r)`` over the finite entries of each row.

    ``-inf`` entries are "not there": the quantile is over the ``n_valid`` other entries, so
    ``r`` is the fraction of zeros among them (they rank first, so the rank is shifted by their
    count). Returns ``(tau, lo_idx, hi_idx, frac, dtau_dr)``: the threshold (``+inf`` for a row
    without a valid entry), the indices of ``x_(lo)`` and ``x_(hi)``, the weight ``frac`` of
    ``x_(hi)`` and ``d tau / d r = (n_valid - 1)(x_(hi) - x_(lo))``.
    """
    n = x.shape[-1]
    has_masked = bool((x.amin(-1) == float("-inf")).any())
    if not has_masked and not isinstance(r, Tensor):
        pos = r * (n - 1)
        rank = min(int(pos), n - 1)
        frac: Union[float, Tensor] = pos - rank
        n_valid_m1: Union[int, Tensor] = n - 1
    else:
        n_valid = n - torch.isneginf(x).sum(-1, keepdim=True) if has_masked else torch.full_like(x[..., :1], n, dtype=torch.long)
        n_valid_m1 = (n_valid - 1).clamp_min(0).to(x.dtype)
        pos = (r * n_valid_m1).expand(x.shape[:-1] + (1,))
        lo = pos.floor()
        frac = pos - lo
        rank = (lo.long() + (n - n_valid)).clamp_(0, n - 1)
        if rank.numel() and bool((rank == rank.reshape(-1)[0]).all()):
            rank = int(rank.reshape(-1)[0])  # one shared rank: the faster unsorted path
    x_lo, x_hi, lo_idx, hi_idx = _order_statistics(x, rank)
    tau = torch.lerp(x_lo, x_hi, frac)
    dtau_dr = (x_hi - x_lo) * n_valid_m1
    if has_masked:
        empty = n_valid == 0
        tau = tau.masked_fill(empty, float("inf"))
        dtau_dr = dtau_dr.masked_fill(empty, 0.0)
    return tau, lo_idx, hi_idx, frac, dtau_dr




def quantile_threshold_sorted(x: Tensor, r: Tensor):
    """As :func:`quantile_threshold` (``r`` a tensor of shape ``x.shape[:-1] + (1,)``), by a full sort."""
    n = x.shape[-1]
    n_valid = n - torch.isneginf(x).sum(-1, keepdim=True)
    n_valid_m1 = (n_valid - 1).clamp_min(0).to(x.dtype)
    pos = r * n_valid_m1
    lo = pos.floor()
    frac = pos - lo
    rank = (lo.long() + (n - n_valid)).clamp(0, n - 1)
    rank_hi = (rank + 1).clamp(max=n - 1)
    values, order = torch.sort(x, dim=-1, stable=True)  # ties in index order, as the C++ kernel
    x_lo, x_hi = values.gather(-1, rank), values.gather(-1, rank_hi)
    lo_idx, hi_idx = order.gather(-1, rank), order.gather(-1, rank_hi)
    tau = torch.lerp(x_lo, x_hi, frac)
    dtau_dr = (x_hi - x_lo) * n_valid_m1
    empty = n_valid == 0
    return (tau.masked_fill(empty, float("inf")), lo_idx, hi_idx, frac,
            dtau_dr.masked_fill(empty, 0.0))


# ---------------------------------------------------------------------------------------------
# The weighted softmax shared by t-softmax and r-softmax, and its closed-form backward
# ---------------------------------------------------------------------------------------------
def weighted_softmax(x: Tensor, tau: Tensor, m: Tensor) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``p = w exp(x) / sum(w exp(x))`` with ``w = relu(x - tau)``, computed as ``softmax(x) * w``
    renormalized (torch's fused softmax does the exponentials), plus what the backward needs.

    Returns ``(p, w_safe, dead)``: ``w_safe = max(w, tiny)`` (so ``h / w_safe`` is 0 off the
    support, where ``h = 0``), and ``dead`` (a ``(..., 1)`` bool) marking rows whose
    gradient is 0: rows with no valid entry (``m = -inf``), which give ``p = 0``, and rows where
    every weight is 0 (``tau >= max``), which get the uniform distribution over their arg-max
    entries, the limit ``tau -> max`` from below (``r -> 1``; Theorem 1's one-hot for small ``t``).
    Sync-free: the dead rows are handled with ``torch.where`` whether there are any or not.
    """
    w = (x - tau).clamp_min_(0)
    num = _softmax_last(x, m).mul_(w)
    z = num.sum(-1, keepdim=True)
    p = num.div_(z.masked_fill_(z == 0, 1.0))
    w_safe = w.clamp_min_(torch.finfo(x.dtype).tiny)
    empty = m == float("-inf")
    no_weight = (tau >= m) & ~empty
    dead = empty | no_weight
    ties = ((x == m) & no_weight).to(p.dtype)
    p = torch.where(dead, ties / ties.sum(-1, keepdim=True).clamp_min(1), p)
    return p, w_safe, dead


def backward_common(g: Tensor, p: Tensor, w_safe: Tensor, dead: Tensor) -> Tuple[Tensor, Tensor]:
    """``(p + e)(g - <g, p>)`` with ``e = p / w``, and ``C = -sum_j e_j (g_j - <g, p>)``.

    ``h = p (g - <g, p>)`` is softmax's backward (torch's fused kernel); the result is
    ``h + h / w``, and ``C = -sum(h / w) = -sum(result)`` because ``sum(h) = 0``.
    """
    h = _softmax_backward(g, p)
    grad = h.addcdiv_(h, w_safe).masked_fill_(dead, 0.0)
    return grad, grad.sum(-1, keepdim=True).neg_()


# Below this many elements, plain elementwise ops (which stay single-threaded) beat torch's fused
# softmax kernels, whose parallel region has a fixed cost of milliseconds on a busy CPU.
_FUSED_MIN_NUMEL = 1 << 16


def _softmax_last(x: Tensor, m: Tensor) -> Tensor:
    if x.numel() >= _FUSED_MIN_NUMEL:
        return torch.softmax(x, -1)
    ex = (x - m.masked_fill(m == float("-inf"), 0.0)).exp_()
    return ex.div_(ex.sum(-1, keepdim=True))


def _softmax_backward(g: Tensor, p: Tensor) -> Tensor:
    if _FUSED_SOFTMAX_BACKWARD is not None and p.numel() >= _FUSED_MIN_NUMEL:
        return _FUSED_SOFTMAX_BACKWARD(g.contiguous(), p, -1, p.dtype)
    return (g - torch.linalg.vecdot(g, p).unsqueeze(-1)).mul_(p)


_FUSED_SOFTMAX_BACKWARD = getattr(torch, "_softmax_backward_data", None)




def _mark_not_there(x: Tensor) -> Tensor:
    """``x`` with the entries at or below ``finfo.min / 2`` set to ``-inf`` (the C++ kernels read
    such entries as not there themselves, so the entry path leaves them as they are)."""
    return x.masked_fill(x <= not_there_level(x.dtype), float("-inf"))


def forward(x: Tensor, r: Tensor, sorted_threshold: bool = True):
    """r-softmax of the rows of ``x``: ``(p, tau, lo_idx, hi_idx, frac, dtau_dr, dead)``."""
    x = _mark_not_there(x)
    threshold = quantile_threshold_sorted if sorted_threshold else quantile_threshold
    tau, lo_idx, hi_idx, frac, dtau_dr = threshold(x, r)
    p, _, dead = weighted_softmax(x, tau, x.amax(-1, keepdim=True))
    frac = frac if isinstance(frac, Tensor) else torch.full_like(tau, frac)
    dtau_dr = dtau_dr if isinstance(dtau_dr, Tensor) else torch.full_like(tau, dtau_dr)
    return p, tau, lo_idx, hi_idx, frac.expand_as(tau), dtau_dr.expand_as(tau), dead


def backward(g: Tensor, p: Tensor, x: Tensor, tau: Tensor, lo_idx: Tensor, hi_idx: Tensor, frac: Tensor,
             dead: Tensor) -> Tuple[Tensor, Tensor]:
    """``(dL/dx, C)`` of r-softmax (see ``sparsenorm/rsoftmax.py``); ``dL/dr = C dtau_dr``."""
    w_safe = (x - tau).clamp_min_(torch.finfo(x.dtype).tiny)
    grad, c = backward_common(g, p, w_safe, dead)
    grad.scatter_add_(-1, lo_idx, c * (1 - frac))
    grad.scatter_add_(-1, hi_idx, c * frac)
    return grad, c


def row_max_and_argmax(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Row max and its index. One ``max(dim)`` pass for large inputs; ``amax`` + ``argmax`` for
    small ones, where ``max(dim)``'s parallel path has a large fixed cost on a busy CPU."""
    if x.numel() >= 1 << 16:
        return x.max(-1, keepdim=True)
    return x.amax(-1, keepdim=True), x.argmax(-1, keepdim=True)


def t_forward(x: Tensor, t: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """t-softmax of the rows of ``x`` (``t`` of shape ``x.shape[:-1] + (1,)``): ``(p, tau, argmax,
    dead)`` with ``tau = max - t``; its backward is :func:`backward` with ``lo_idx = hi_idx =
    argmax`` and ``frac = 0`` (``d tau / d x`` is the indicator of the arg-max)."""
    x = _mark_not_there(x)
    m, argmax = row_max_and_argmax(x)
    tau = m - t  # t below max(x)'s resolution: the one-hot limit (a dead row)
    p, _, dead = weighted_softmax(x, tau, m)
    return p, tau, argmax, dead
