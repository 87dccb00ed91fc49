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

    The indices are those of the stable ascending sort (ties in index order), as in the C++
    kernel and :func:`quantile_threshold_sorted`: ``topk`` orders ties arbitrarily, so they are
    found by :func:`_stable_rank_index`. (With ties at the quantile, ``d tau / d x`` goes to that
    one entry; this path used to pick another tied entry than the kernel, so the two paths gave
    different gradients.)
    """
    n = x.shape[-1]
    if isinstance(rank, int):
        if rank >= n - 1:
            v = x.amax(-1, keepdim=True)
            idx = _stable_rank_index(x, v, n - 1)
            return v, v, idx, idx
        if rank + 2 <= n - rank:  # the rank + 2 smallest; the two largest of them
            vals, _ = torch.topk(x, rank + 2, -1, largest=False, sorted=False)
            two, _ = torch.topk(vals, 2, -1, largest=True, sorted=True)
            hi, lo = two.split(1, -1)
        else:  # the n - rank largest; the two smallest of them
            vals, _ = torch.topk(x, n - rank, -1, largest=True, sorted=False)
            two, _ = torch.topk(vals, 2, -1, largest=False, sorted=True)
            lo, hi = two.split(1, -1)
        return lo, hi, _stable_rank_index(x, lo, rank), _stable_rank_index(x, hi, rank + 1)
    rank_hi = (rank + 1).clamp_(max=n - 1)
    k_small = int(rank_hi.max()) + 1
    k_large = n - int(rank.min())
    if k_small <= k_large:
        vals, _ = torch.topk(x, k_small, -1, largest=False, sorted=True)
        pos_lo, pos_hi = rank, rank_hi
    else:  # descending: rank rho sits at position n - 1 - rho
        vals, _ = torch.topk(x, k_large, -1, largest=True, sorted=True)
        pos_lo, pos_hi = n - 1 - rank, n - 1 - rank_hi
    lo, hi = vals.gather(-1, pos_lo), vals.gather(-1, pos_hi)
    return lo, hi, _stable_rank_index(x, lo, rank), _stable_rank_index(x, hi, rank_hi)


def _stable_rank_index(x: Tensor, value: Tensor, rank: Union[int, Tensor]) -> Tensor:
    """The index of ``x_(rank)`` (whose value is ``value``, shape ``(..., 1)``) in the stable
    ascending sort of each row: among the entries equal to it, the ``(rank - #{x < value})``-th
    in index order. Sync-free, O(n)."""
    equal = x == value
    wanted = rank - (x < value).sum(-1, keepdim=True)
    occurrence = equal.cumsum(-1) - 1
    return (equal & (occurrence == wanted)).to(torch.uint8).argmax(-1, keepdim=True)


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
        n_valid = (n - torch.isneginf(x).sum(-1, keepdim=True) if has_masked
                   else torch.full_like(x[..., :1], n, dtype=torch.long))
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
    """``p = w exp(x) / sum(w exp(x))`` with ``w = relu(x - tau)``, computed as ``w exp(x - m)``
    normalized (as the C++ kernel), plus what the backward needs. The arg-max's term is ``w_top``
    itself (``exp(0) = 1``), so the sum is never below it; ``softmax(x) * w`` instead, as before,
    rounded a subnormal ``w_top`` times ``softmax < 1`` to 0 and gave an all-zero row (found by
    the fuzz suite: logits ``(0, 1.4e-45)``, ``r = 0.5``).

    Returns ``(p, e, dead)``: ``e`` the Jacobian's ``p / w`` term (:func:`jacobian_weight`), and
    ``dead`` (a ``(..., 1)`` bool) marking rows whose
    gradient is 0: rows with no valid entry (``m = -inf``), which give ``p = 0``, and rows where
    every weight is 0 (``tau >= max``), which get the uniform distribution over their arg-max
    entries, the limit ``tau -> max`` from below (``r -> 1``; Theorem 1's one-hot for small ``t``).
    Sync-free: the dead rows are handled with ``torch.where`` whether there are any or not.
    """
    w = (x - tau).clamp_min_(0)
    # Weights near finfo.max (t-softmax with a huge t) would overflow the sum: scale them by a power
    # of two (exact; p does not change) so that the largest, m - tau, is about 1, as the C++ kernel.
    top = m - tau
    huge = top > torch.finfo(x.dtype).max / (4 * max(x.shape[-1], 1))
    exponent = torch.frexp(torch.where(huge, top, torch.ones_like(top))).exponent
    w = torch.ldexp(w, torch.where(huge, 1 - exponent, torch.zeros_like(exponent)))
    num = (x - m.masked_fill(m == float("-inf"), 0.0)).exp_().mul_(w)
    z = num.sum(-1, keepdim=True)
    p = num.div_(z.masked_fill_(z == 0, 1.0))
    empty = m == float("-inf")
    no_weight = (tau >= m) & ~empty
    dead = empty | no_weight
    ties = ((x == m) & no_weight).to(p.dtype)
    p = torch.where(dead, ties / ties.sum(-1, keepdim=True).clamp_min(1), p)
    return p, jacobian_weight(x, tau, p, m), dead


def jacobian_weight(x: Tensor, tau: Tensor, p: Tensor, m: Tensor) -> Tensor:
    """``e_i = p_i / w_i = exp(x_i - m) / sum_j w_j exp(x_j - m)`` on the support, 0 off it.

    Computed as ``exp(x_i - m) * (p_top / w_top)`` with ``top`` the arg-max entry (``exp(0) = 1``,
    so ``p_top / w_top`` is ``1 / sum``; ``p_top >= 1 / n`` is a normal number). Dividing ``p_i``
    by ``w_i`` instead, as before, lost every digit where ``p_i`` is subnormal: with ``w_i`` tiny,
    ``e_i`` is O(1) but ``p_i`` is a multiple of the smallest subnormal (found by the fuzz suite:
    ``x = (0, 0.5, 1.4e-45)``, ``r = 0`` gave gradients of 1 or 0 where the exact one is 0.38).
    Dead rows (``tau >= m``) get garbage here; the backward zeroes them.
    """
    if x.shape[-1] == 0:
        return torch.zeros_like(x)
    w = x - tau
    w_top = (m - tau).clamp_min(torch.finfo(x.dtype).tiny)  # > 0 on every live row
    inv_sum = p.amax(-1, keepdim=True) / w_top  # the largest p is the arg-max's (w and exp both grow with x)
    return torch.where(w > 0, torch.exp(x - m) * inv_sum, torch.zeros((), dtype=x.dtype, device=x.device))


def backward_common(g: Tensor, p: Tensor, e: Tensor, dead: Tensor) -> Tuple[Tensor, Tensor]:
    """``(p + e)(g - <g, p>)`` with ``e = p / w`` (:func:`jacobian_weight`), and
    ``C = -sum_j e_j (g_j - <g, p>) = -sum(result)`` (because ``sum_j p_j (g_j - <g, p>) = 0``).
    """
    centered = g - torch.linalg.vecdot(g, p).unsqueeze(-1)
    # A zero cotangent gives a zero gradient even where e overflows (w below 1 / finfo.max: the
    # exact Jacobian is finite but not representable); inf * 0 gave NaN on an ignored loss row.
    grad = (p + e).mul_(centered).masked_fill_(dead | (centered == 0), 0.0)
    return grad, grad.sum(-1, keepdim=True).neg_()


def overflowed_c(g: Tensor, p: Tensor, x: Tensor, tau: Tensor, m: Tensor) -> Tensor:
    """``C = -sum_j (p_j + e_j)(g_j - <g, p>)`` for rows whose ``e = p / w`` overflowed (``w`` below
    ``1 / finfo.max``): the sum of the ``+inf`` and ``-inf`` terms is NaN there, though the exact ``C``
    may be anything, zero included (two equal tiny weights). With ``e_j = exp(x_j - m) * inv_sum``
    (:func:`jacobian_weight`), ``C = -inv_sum * S - sum_j p_j (g_j - <g, p>)``, ``S`` the finite sum of
    ``exp(x_j - m)(g_j - <g, p>)`` over the support: an exact zero ``S`` gives a finite ``C``, any
    other ``S`` an infinite one of the right sign (the exact value overflows), never NaN (fuzz suite:
    scores of +-1.4e-45 in r-softmax attention)."""
    centered = g - torch.linalg.vecdot(g, p).unsqueeze(-1)
    on = (x - tau) > 0
    inv_sum = p.amax(-1, keepdim=True) / (m - tau).clamp_min(torch.finfo(x.dtype).tiny)
    scaled = torch.where(on, torch.exp(x - m) * centered, torch.zeros((), dtype=x.dtype, device=x.device))
    s = scaled.sum(-1, keepdim=True)
    e_part = torch.where(s == 0, torch.zeros_like(s), -inv_sum * s)
    return e_part - (p * centered).sum(-1, keepdim=True)


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
    m = x.amax(-1, keepdim=True) if x.shape[-1] else tau
    e = jacobian_weight(x, tau, p, m)
    grad, c = backward_common(g, p, e, dead)
    c = torch.where(torch.isnan(c) & ~dead, overflowed_c(g, p, x, tau, m), c)
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
