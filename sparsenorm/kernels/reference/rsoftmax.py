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

from typing import Union

import torch
from torch import Tensor


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
    values, order = torch.sort(x, -1)
    x_lo, x_hi = values.gather(-1, rank), values.gather(-1, rank_hi)
    lo_idx, hi_idx = order.gather(-1, rank), order.gather(-1, rank_hi)
    tau = torch.lerp(x_lo, x_hi, frac)
    dtau_dr = (x_hi - x_lo) * n_valid_m1
    empty = n_valid == 0
    return (tau.masked_fill(empty, float("inf")), lo_idx, hi_idx, frac,
            dtau_dr.masked_fill(empty, 0.0))
