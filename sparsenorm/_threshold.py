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


# ----------------------------------------------------------------------------- fast projection
#
# Both thresholds are bounded below by a constant offset from the row maximum: sparsemax's p_max =
# max - tau <= 1 gives tau >= max - 1, and 1.5-entmax's p_max = (max/2 - tau)^2 <= 1 gives
# tau >= max/2 - 1. So only entries within that offset of the maximum ("candidates") can be in the
# support, and the exact sort-based formula applied to the candidates alone (sorted, padded with
# -inf) gives exactly the same threshold as a full sort: the support is a prefix of the sorted
# candidates. For typical logits the candidates are a small fraction of the row, so this costs a
# few full passes (max, compare, nonzero, zero-fill) instead of a full sort. When most entries are
# candidates the rows are simply sorted (what the entmax package always does).

_OFFSET = {"sparsemax": 1.0, "entmax15": 2.0}  # candidate window below the max, in units of x
_SOLVER = {"sparsemax": sparsemax_tau_sort, "entmax15": entmax15_tau_sort}
_DENSE_FRACTION = 8  # sort whole rows once more than 1/8 of all entries are candidates
_BUCKET_GROWTH = 4  # rows are padded to the largest candidate count within a 4x range


def _map(z: Tensor, tau: Tensor, kind: str) -> Tensor:
    """``p`` from shifted scores ``z`` (halved for entmax15) and their row thresholds."""
    p = (z - tau).clamp_min_(0)
    return p.square_() if kind == "entmax15" else p


def _scale(kind: str) -> float:
    return 0.5 if kind == "entmax15" else 1.0


def _tau_of_candidates(vals: Tensor, rows: Tensor, counts: Tensor, kind: str) -> Tensor:
    """Exact threshold per row from its candidates only (``vals`` grouped by ``rows``, ascending).

    The candidates are laid out as rows padded with -inf and solved by the sort formula. When a
    few rows have far more candidates than the rest, rows are bucketed by count (widths growing
    4x) so that they do not pad all the others.
    """
    n_rows = counts.shape[0]
    n = vals.numel()
    if n == 0:
        return vals.new_zeros(n_rows)
    solver = _SOLVER[kind]
    starts = counts.cumsum(0) - counts
    pos = torch.arange(n, device=vals.device) - starts[rows]
    width = int(counts.max())
    if n_rows * width <= 4 * n + 64 * n_rows:  # one padded block wastes little
        padded = vals.new_full((n_rows, width), float("-inf"))
        padded.view(-1).index_copy_(0, rows * width + pos, vals)
        return solver(padded, None).squeeze(1)
    tau = vals.new_zeros(n_rows)
    lower, upper = 0, 64
    while lower < width:
        in_bucket = (counts > lower) & (counts <= upper)
        bucket_rows = in_bucket.nonzero().squeeze(1)
        if bucket_rows.numel():
            slot = torch.full((n_rows,), -1, dtype=torch.long, device=vals.device)
            slot[bucket_rows] = torch.arange(bucket_rows.numel(), device=vals.device)
            mine = in_bucket[rows].nonzero().squeeze(1)
            padded = vals.new_full((bucket_rows.numel(), int(counts[bucket_rows].max())), float("-inf"))
            padded[slot[rows[mine]], pos[mine]] = vals[mine]
            tau[bucket_rows] = solver(padded, None).squeeze(1)
        lower, upper = upper, upper * _BUCKET_GROWTH
    return tau


def project(x: Tensor, dim: int, kind: str, k: Optional[int] = None) -> Tensor:
    """Exact sparsemax (``kind='sparsemax'``) or 1.5-entmax (``'entmax15'``) of ``x`` along ``dim``.

    ``x`` is float32/float64; the result has ``x``'s shape, dtype and (contiguous) layout. Rows
    with no finite entry give zeros; rows with a NaN or +inf entry give NaN. ``k`` only matters
    on the dense fallback (the ``entmax`` package's partial-sort hint).
    """
    if x.numel() == 0:
        return torch.zeros_like(x)
    if x.dim() == 0:
        return project(x.unsqueeze(0), 0, kind, k).squeeze(0)
    moved = x.movedim(dim, -1)
    n_cols = moved.shape[-1]
    x2 = moved.reshape(-1, n_cols).contiguous()
    row_max = x2.amax(-1, keepdim=True)
    bad_rows = torch.isnan(row_max) | (row_max == float("inf"))
    shift = row_max.masked_fill(torch.isinf(row_max) | bad_rows, 0.0)
    offset = _OFFSET[kind]
    # Widen the window by more than the rounding of ``shift - offset`` so no candidate is lost.
    eps = torch.finfo(x.dtype).eps
    lo = shift - (offset * (1 + 1e-3) + 8 * eps * shift.abs())
    flat = (x2 > lo).view(-1).nonzero().squeeze(1)
    scale = _scale(kind)

    if flat.numel() * _DENSE_FRACTION > x2.numel():
        z = x2 - shift
        if scale != 1.0:
            z.mul_(scale)
        tau = _SOLVER[kind](z, k)
        p2 = _map(z, tau, kind)
        if bool(bad_rows.any()):
            p2.masked_fill_(bad_rows, float("nan"))
        return p2.reshape(moved.shape).movedim(-1, dim).contiguous()

    x_flat = x2.reshape(-1)  # a view when normalizing the last dim of a contiguous tensor
    rows = flat // n_cols
    vals = x_flat.index_select(0, flat).sub_(shift.view(-1).index_select(0, rows))
    if scale != 1.0:
        vals.mul_(scale)
    counts = torch.bincount(rows, minlength=x2.shape[0])
    tau = _tau_of_candidates(vals, rows, counts, kind)
    p_vals = _map(vals, tau.index_select(0, rows), kind)
    # Every candidate is written (zeros included), so the index list needs no filtering.
    out2 = torch.zeros_like(x2)
    out2.view(-1).index_copy_(0, flat, p_vals)
    if bool(bad_rows.any()):
        out2.masked_fill_(bad_rows, float("nan"))
    out = out2.reshape(moved.shape).movedim(-1, dim)
    return out if dim == x.dim() - 1 else out.contiguous()
