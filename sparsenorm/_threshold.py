"""Thresholds of sparsemax and 1.5-entmax along the last dimension.

Both maps are ``p = [z - tau]_+`` (sparsemax) and ``p = [z/2 - tau]_+^2`` (1.5-entmax) with the
row threshold ``tau`` chosen so that ``p`` sums to one. Every helper here works on the LAST
dimension of a tensor whose rows have already been shifted by their maximum (so the largest
finite entry is 0); ``-inf`` entries are "not there". Rows with no finite entry get ``tau = 0``
(the caller turns them into zeros). Callers move the normalized dimension last first, which is
also what makes ``k`` work with a negative ``dim`` (it does not in the ``entmax`` package).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def _ranks(n: int, like: Tensor) -> Tensor:
    return torch.arange(1, n + 1, device=like.device, dtype=like.dtype)


def _sorted_top(z: Tensor, k: Optional[int]) -> Tensor:
    """The row's entries in descending order: all of them, or the ``k`` largest."""
    if k is None or k >= z.shape[-1]:
        return torch.sort(z, dim=-1, descending=True).values
    return torch.topk(z, k, dim=-1).values


def sparsemax_tau_sort(z: Tensor, k: Optional[int] = None) -> Tensor:
    """Exact sparsemax threshold by (partial) sorting (Martins & Astudillo 2016, Alg. 1).

    With ``z_(1) >= z_(2) >= ...``, the support size is the largest ``r`` with
    ``1 + r z_(r) > sum_{j<=r} z_(j)`` and ``tau = (sum_{j<=r} z_(j) - 1) / r``. With ``k`` only the
    ``k`` largest entries are sorted; rows whose support may exceed ``k`` are redone with ``2k``.
    """
    top = _sorted_top(z, k)
    csum = top.cumsum(-1) - 1
    support = (_ranks(top.shape[-1], top) * top > csum).sum(-1, keepdim=True)
    tau = csum.gather(-1, (support - 1).clamp_min(0)) / support.clamp_min(1).to(z.dtype)
    tau = torch.where(support > 0, tau, torch.zeros_like(tau))
    if k is not None and k < z.shape[-1]:
        unsolved = (support == k).squeeze(-1)
        if bool(unsolved.any()):
            tau[unsolved] = sparsemax_tau_sort(z[unsolved], 2 * k)
    return tau


def entmax15_tau_sort(z: Tensor, k: Optional[int] = None) -> Tensor:
    """Exact 1.5-entmax threshold for ``p = [z - tau]_+^2`` by (partial) sorting.

    Peters et al. (2019), Alg. 2: for each candidate support size ``r`` of the sorted row,
    ``tau_r = mean_r - sqrt(max(0, (1 - r * var_r) / r))``; the support is the set of ``r`` with
    ``tau_r <= z_(r)``. ``z`` here is already halved (``z = x / 2``).
    """
    top = _sorted_top(z, k)
    rho = _ranks(top.shape[-1], top)
    # -inf entries would make the running moments NaN; they are never in the support, so give
    # them a value below every finite candidate (rows are shifted so the maximum is 0).
    finite = torch.isfinite(top) | torch.isnan(top)
    safe = torch.where(finite, top, torch.zeros_like(top))
    mean = safe.cumsum(-1) / rho
    mean_sq = (safe * safe).cumsum(-1) / rho
    delta = (1 - rho * (mean_sq - mean * mean)) / rho
    tau = mean - torch.sqrt(delta.clamp_min(0))
    support = ((tau <= top) & finite).sum(-1, keepdim=True)
    tau_star = tau.gather(-1, (support - 1).clamp_min(0))
    tau_star = torch.where(support > 0, tau_star, torch.zeros_like(tau_star))
    if k is not None and k < z.shape[-1]:
        unsolved = (support == k).squeeze(-1)
        if bool(unsolved.any()):
            tau_star[unsolved] = entmax15_tau_sort(z[unsolved], 2 * k)
    return tau_star
