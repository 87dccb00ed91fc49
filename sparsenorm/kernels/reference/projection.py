"""Thresholds, projection and backward of sparsemax and 1.5-entmax on rows along the last dim.

Both maps are ``p = [z - tau]_+`` (sparsemax) and ``p = [z/2 - tau]_+^2`` (1.5-entmax) with the
row threshold ``tau`` chosen so that ``p`` sums to one. Two forward algorithms:

* :func:`project_sorted`, sync-free (full sort, the entmax package's algorithm): the reference on
  every device;
* :func:`project`, the CPU variant without a kernel: an exact iteration without a full sort that
  reads row counts on the host to shrink its work (free on a CPU; a stall on an accelerator).

The sort-based solvers (``*_tau_sort``) work on rows already shifted by their maximum (largest
finite entry 0). Entries at or below ``finfo.min / 2`` are "not there"; rows with none there give
zeros.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple, TypeVar

import torch
from torch import Tensor

from ..._validation import not_there_level

S = TypeVar("S")


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
# A full sort is slow on CPU. Instead the threshold is found by an exact iteration that
# uses only elementwise ops and row reductions, on rows shifted so their maximum is 0:
#
# * sparsemax (Michelot 1986): tau <- (sum_{z > tau} z - 1) / |{z > tau}| from tau = -1 (a lower
#   bound, as p_max <= 1). Newton's method on the convex piecewise-linear f(tau) = sum (z - tau)_+ - 1,
#   so tau increases monotonically, the set {z > tau} only shrinks, and once it stops changing
#   tau is exact -- a finite number of passes (4-6 on typical logits).
# * 1.5-entmax, f(tau) = sum (z - tau)_+^2 - 1: from a lower bound tau with set S = {z > tau},
#   the smaller root of sum_S (z - t)^2 = 1 is exact if S is the support and an upper bound
#   otherwise; from an upper bound a Newton step lands below the root again. The root of the
#   current set is accepted once the set stops changing (or f vanishes to rounding).
#
# Rows converge at different speeds, so converged rows are dropped from later passes. For long
# rows (K >= 2048) only the blocks of 64-512 entries whose maximum lies within the candidate
# window of the row maximum (tau >= max - 1, i.e. entries > max - 1 for sparsemax, > max - 2 for
# entmax15 in input units) are gathered and solved, after one blockwise max; the output is then
# written block by block into zeros. Everything is exact, so ``k`` (the entmax package's
# partial-sort hint) is accepted but not needed; it is only used by the sort fallback.

_OFFSET = {"sparsemax": 1.0, "entmax15": 2.0}  # candidate window below the max, in units of x
_MAX_ITER = 64
_MIN_BLOCKED_COLS = 2048


def sqrt_nonneg(p: Tensor) -> Tensor:
    """``sqrt(p)`` for ``p >= 0``, exactly 0 at 0, without CPU sqrt's slow path for zeros.

    torch's CPU sqrt is several times slower on zeros than on positive numbers
    (``benchmarks/results/tuning_cpu.json#sqrt_zeros``), and sparse outputs are mostly zeros; so
    take ``sqrt(max(p, tiny)) - sqrt(tiny)`` (``tiny`` the smallest normal number): 0 at 0, and
    ``sqrt(p)`` to within 1e-19 (float32) elsewhere.
    """
    tiny = torch.finfo(p.dtype).tiny
    return p.clamp_min(tiny).sqrt_().sub_(tiny ** 0.5)


def _map_(z: Tensor, tau: Tensor, kind: str) -> Tensor:
    """In place: ``z <- [z - tau]_+`` (sparsemax) or ``[(z - tau) / 2]_+^2`` (1.5-entmax).

    For 1.5-entmax ``z`` and ``tau`` are in units of ``x`` (twice the usual ``x/2 - tau``);
    halving is exact, so this equals the entmax package's ``[x/2 - tau]_+^2``.
    """
    z.sub_(tau).clamp_min_(0)
    return z.mul_(0.5).square_() if kind == "entmax15" else z


def threshold_step(kind: str, tau: Tensor, s1: Tensor, s2: Optional[Tensor], n: Tensor, prev_n: Tensor,
                   was_root: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step of the exact threshold iteration described above, from a row's sums at ``tau``.

    ``s1``, ``s2`` and ``n`` are the sum, the sum of squares (1.5-entmax only) and the number of the
    positive entries of ``(z - tau)_+`` (``z``, ``tau`` in units of ``x``); ``prev_n`` is the
    previous step's ``n`` (-1 at first), ``was_root`` whether ``tau`` is the previous step's root
    (False at first). Returns ``(final, done, new_tau, was_root)``: the exact threshold on the
    current set, whether it is the answer, the next iterate and the new ``was_root``. Shared by
    the row-wise projection and the blockwise attention (which sums over key blocks).
    """
    if kind != "entmax15":
        final = tau + (s1 - 1) / n.clamp_min(1)
        return final, n == prev_n, torch.maximum(tau, final), was_root
    eps = torch.finfo(tau.dtype).eps
    # In x/2 units: f = sum (z/2 - t)_+^2 - 1 = s2/4 - 1, with s1, s2 sums of (z - 2t)_+.
    f = s2 / 4 - 1
    done = (was_root & (n == prev_n)) | (f.abs() <= 16 * eps) | (n == 0)
    below = f >= 0
    disc = (s1 * s1 - 4 * n * f).clamp_min_(0)
    # 2x the smaller root of sum_{z > tau} (z/2 - t)^2 = 1, relative to tau (well conditioned).
    root = tau + (s1 - disc.sqrt_()) / n.clamp_min(1)
    final = torch.where(n > 0, root, tau)
    newton = tau + 2 * f / s1.clamp_min(eps)
    return final, done, torch.where(below, root, newton), below


def _iterate_tau(
    src: Tensor, kind: str, k: Optional[int] = None, shift: Optional[Tensor] = None, buf: Optional[Tensor] = None
) -> Tensor:
    """Exact thresholds (R, 1) of the rows of ``z = src - shift`` (R, W) (``shift`` None: ``z = src``).

    Each row of ``z`` has maximum 0 or is all -inf. For 1.5-entmax, ``z`` and the returned
    threshold are in units of ``x`` (2x the usual ``x/2`` units). With ``shift`` given, ``z`` is
    recomputed into ``buf`` on every pass instead of being stored, so the only large allocation
    is ``buf`` (which the caller reuses for the output).
    """
    n_rows = src.shape[0]
    tau_out = src.new_zeros(n_rows, 1)
    entmax = kind == "entmax15"
    cur, cur_shift, rows = src, shift, None  # rows: indices into src still iterating (None: all)
    tau = src.new_full((n_rows, 1), -2.0 if entmax else -1.0)  # lower bound: p_max <= 1
    prev_n = src.new_full((n_rows, 1), -1.0)
    was_root = torch.zeros(n_rows, 1, dtype=torch.bool, device=src.device)
    if buf is None:
        buf = torch.empty_like(src)
    for _ in range(_MAX_ITER):
        m = cur.shape[0]
        d = buf[:m]
        if cur_shift is None:
            torch.sub(cur, tau, out=d)
        else:
            torch.sub(cur, cur_shift, out=d).sub_(tau)
        d.clamp_min_(0)
        s1 = d.sum(-1, keepdim=True)
        s2 = torch.linalg.vector_norm(d, dim=-1, keepdim=True).square_() if entmax else None
        n = d.sign_().sum(-1, keepdim=True)  # in place: d is not needed any more
        final, done, new_tau, was_root = threshold_step(kind, tau, s1, s2, n, prev_n, was_root)
        if rows is None:
            tau_out = torch.where(done, final, tau_out)
        elif bool(done.any()):
            hit = done.squeeze(1)
            tau_out.index_copy_(0, rows[hit], final[hit])
        keep = ~done.squeeze(1)
        n_keep = int(keep.sum())
        if n_keep == 0:
            return tau_out
        tau, prev_n = new_tau, n
        if n_keep < 0.75 * m:  # drop converged rows from later passes
            sel = keep.nonzero().squeeze(1)
            cur = cur.index_select(0, sel)
            cur_shift = None if cur_shift is None else cur_shift.index_select(0, sel)
            rows = sel if rows is None else rows.index_select(0, sel)
            tau, prev_n, was_root = tau[sel], prev_n[sel], was_root[sel]
    # Not converged within _MAX_ITER passes (adversarial inputs): sort those rows.
    left = torch.arange(n_rows, device=src.device) if rows is None else rows
    z = cur if cur_shift is None else cur - cur_shift
    tau_sorted = entmax15_tau_sort(z * 0.5, k) * 2 if entmax else sparsemax_tau_sort(z, k)
    tau_out.index_copy_(0, left, tau_sorted)
    return tau_out


_RECOMPUTE_BYTES = 8 << 20  # above this, recompute z per pass rather than allocate a second copy


def _block_size(n_cols: int) -> Optional[int]:
    """A divisor of ``n_cols`` in [64, 512] (closest to 128), or None."""
    if n_cols < _MIN_BLOCKED_COLS:
        return None
    best = None
    for b in range(64, 513):
        if n_cols % b == 0 and (best is None or abs(b - 128) < abs(best - 128)):
            best = b
    return best


def project(x: Tensor, dim: int, kind: str, k: Optional[int] = None) -> Tensor:
    """Exact sparsemax (``kind='sparsemax'``) or 1.5-entmax (``'entmax15'``) of ``x`` along ``dim``.

    ``x`` is float32/float64; the result has ``x``'s shape and dtype (contiguous). Rows with no
    finite entry give zeros; rows with a NaN or +inf entry give NaN.
    """
    if x.numel() == 0:
        return torch.zeros_like(x)
    if x.dim() == 0:
        return project(x.unsqueeze(0), 0, kind, k).squeeze(0)
    moved = x.movedim(dim, -1)
    n_cols = moved.shape[-1]
    x2 = moved.reshape(-1, n_cols).contiguous()
    n_rows = x2.shape[0]
    block = _block_size(n_cols)
    blocks = None
    if block is not None:
        blocks = x2.view(n_rows, n_cols // block, block)
        block_max = blocks.amax(-1)
        row_max = block_max.amax(-1, keepdim=True)
    else:
        row_max = x2.amax(-1, keepdim=True)
    bad_rows = torch.isnan(row_max) | (row_max == float("inf"))
    empty_rows = row_max <= not_there_level(x.dtype)  # no entry there: zeros
    any_bad = bool(bad_rows.any())
    any_empty = bool(empty_rows.any())
    shift = row_max.masked_fill(empty_rows | bad_rows, 0.0)
    if blocks is not None:
        # Widen the window by more than the rounding of ``shift - offset`` so no candidate is lost.
        eps = torch.finfo(x.dtype).eps
        lo = shift - (_OFFSET[kind] * (1 + 1e-3) + 8 * eps * shift.abs())
        chosen = (block_max > lo) & ~bad_rows
        per_row = chosen.sum(-1)
        heavy = 4 * per_row * block > n_cols  # rows with a wide support: iterate on whole rows
        n_heavy = int(heavy.sum())
        if 4 * n_heavy <= n_rows:
            light_per_row = per_row.masked_fill(heavy, 0)
            chosen &= ~heavy.unsqueeze(1)
            out = _project_blocks(blocks, chosen, light_per_row, int(light_per_row.max()), shift, kind, k)
            if n_heavy:
                idx = heavy.nonzero().squeeze(1)
                z = x2.index_select(0, idx).sub_(shift.index_select(0, idx))
                out.index_copy_(0, idx, _map_(z, _iterate_tau(z, kind, k), kind))
            if any_empty:
                out.masked_fill_(empty_rows, 0.0)
            if any_bad:
                out.masked_fill_(bad_rows, float("nan"))
            return _restore(out, moved, dim, x)

    if any_bad:
        x2 = x2.masked_fill(bad_rows, 0.0)
    if x2.numel() * x2.element_size() >= _RECOMPUTE_BYTES:
        buf = torch.empty_like(x2)
        tau = _iterate_tau(x2, kind, k, shift=shift, buf=buf)
        p2 = _map_(torch.sub(x2, shift, out=buf), tau, kind)
    else:
        z = x2 - shift
        p2 = _map_(z, _iterate_tau(z, kind, k), kind)
    if any_empty:
        p2.masked_fill_(empty_rows, 0.0)
    if any_bad:
        p2.masked_fill_(bad_rows, float("nan"))
    return _restore(p2, moved, dim, x)


def _restore(p2: Tensor, moved: Tensor, dim: int, x: Tensor) -> Tensor:
    out = p2.view(moved.shape).movedim(-1, dim)
    return out if dim == x.dim() - 1 else out.contiguous()


def _project_blocks(blocks, chosen, per_row, width, shift, kind, k) -> Tensor:
    """Solve on the chosen blocks only (padded per row with -inf) and write them into zeros."""
    n_rows, n_blocks, block = blocks.shape
    row_of, block_of = chosen.nonzero(as_tuple=True)
    starts = per_row.cumsum(0) - per_row
    slot = torch.arange(row_of.numel(), device=blocks.device) - starts[row_of]
    padded = blocks.new_full((n_rows, width, block), float("-inf"))
    padded[row_of, slot] = blocks[row_of, block_of]
    z = padded.view(n_rows, width * block).sub_(shift)
    tau = _iterate_tau(z, kind, k)
    p = _map_(z, tau, kind).view(n_rows, width, block)
    out = blocks.new_zeros(blocks.shape)
    out[row_of, block_of] = p[row_of, slot]
    return out.view(n_rows, n_blocks * block)


def support_backward(p: Tensor, g: Tensor, dim: int, kind: str) -> Optional[Tensor]:
    """The closed-form backward computed on the support's blocks only, or None (use the dense form).

    Both Jacobians are ``diag(w) - w w^T / sum(w)`` on the support, with ``w = 1`` (sparsemax) or
    ``w = sqrt(p)`` (1.5-entmax), so the gradient is ``w * (g - sum(w g) / sum(w))`` on the
    support and exactly 0 elsewhere. For long rows (last dim, contiguous ``p``, at most a quarter
    of the blocks touched) this reads ``p`` once and writes zeros once. NaN rows stay NaN. Not
    used under double backward (the dense form is differentiable).
    """
    if torch.is_grad_enabled() or p.dim() == 0 or dim != p.dim() - 1 or not p.is_contiguous() or p.numel() == 0:
        return None
    n_cols = p.shape[-1]
    block = _block_size(n_cols)
    if block is None:
        return None
    n_rows = p.numel() // n_cols
    p3 = p.view(n_rows, n_cols // block, block)
    touched = p3.amax(-1)
    touched = (touched != 0)  # NaN != 0: NaN rows keep their blocks
    per_row = touched.sum(-1)
    if 4 * int((4 * per_row * block > n_cols).sum()) > n_rows:
        return None  # mostly wide supports: the dense form is cheaper
    work = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
    row_of, block_of = touched.nonzero(as_tuple=True)
    p_on = p3[row_of, block_of].to(work)  # (n, block)
    g_on = g.reshape(n_rows, n_cols // block, block)[row_of, block_of].to(work)
    w = sqrt_nonneg(p_on) if kind == "entmax15" else torch.sign(p_on)
    wg = w * g_on
    w_sum = torch.zeros(n_rows, dtype=work, device=p.device).index_add_(0, row_of, w.sum(-1))
    wg_sum = torch.zeros(n_rows, dtype=work, device=p.device).index_add_(0, row_of, wg.sum(-1))
    q = wg_sum / torch.where(w_sum > 0, w_sum, torch.ones_like(w_sum))
    vals = wg.sub_(w * q.index_select(0, row_of).unsqueeze(1))
    out = torch.zeros_like(p)
    out.view(n_rows, n_cols // block, block)[row_of, block_of] = vals.to(p.dtype)
    return out


def project_sorted(x: Tensor, kind: str) -> Tensor:
    """Exact sparsemax / 1.5-entmax of the rows of ``x`` (last dim) by a full sort; sync-free.

    Rows with no entry there give zeros; rows with NaN or ``+inf`` give NaN.
    """
    x = x.masked_fill(x <= not_there_level(x.dtype), float("-inf"))
    row_max = x.amax(-1, keepdim=True)
    z = x - row_max.masked_fill(row_max == float("-inf"), 0.0)
    if kind == "entmax15":
        z = z * 0.5
        tau = entmax15_tau_sort(z)
        return (z - tau).clamp_min(0).square()
    return (z - sparsemax_tau_sort(z)).clamp_min(0)


def dense_backward(p: Tensor, g: Tensor, kind: str) -> Tensor:
    """``w * (g - sum(w g) / sum(w))`` over the last dim with ``w = 1{p > 0}`` (sparsemax) or
    ``sqrt(p)`` (1.5-entmax), in differentiable ops (double backward works; the derivative of
    ``sqrt(p)`` at ``p = 0`` is taken as 0). NaN rows stay NaN."""
    if kind == "sparsemax":
        w = torch.sign(p)
    else:
        on = p > 0
        w = torch.where(on, torch.where(on, p, torch.ones_like(p)).sqrt(), torch.where(p == p, 0.0, p))
    total = w.sum(-1, keepdim=True)
    total = torch.where(total > 0, total, torch.ones_like(total))
    q = (g * w).sum(-1, keepdim=True) / total
    return (g - q) * w


def fast_backward(p: Tensor, g: Tensor, kind: str) -> Tensor:
    """:func:`dense_backward` without double-backward support, on the support's blocks only for
    long sparse rows (CPU variant: reads block counts on the host) and with softmax's fused
    backward kernel otherwise."""
    sparse = support_backward(p, g, p.dim() - 1, kind)
    if sparse is not None:
        return sparse
    w = torch.sign(p) if kind == "sparsemax" else sqrt_nonneg(p)
    total = w.sum(-1, keepdim=True)
    total = torch.where(total > 0, total, torch.ones_like(total))
    u = w.div_(total)
    g = g if g.shape == u.shape else g.expand_as(u)
    return torch._softmax_backward_data(g.contiguous(), u, -1, u.dtype).mul_(total)


# ---------------------------------------------------------------------------------------------
# Bisection: the one loop, alpha-entmax (sparsenorm.entmax.entmax_bisect) and its backward
# ---------------------------------------------------------------------------------------------
def bisect(tau_lo: Tensor, width: Tensor, n_iter: int, mass: Callable[[Tensor], Tuple[Tensor, S]]) -> Tuple[Tensor, S]:
    """The one bisection loop of the family (as the ``entmax`` package's ``root_finding.py``): halve the
    bracket ``[tau_lo, tau_lo + width]`` (per row, shape ``(..., 1)``; a negative ``width`` walks it the
    other way) ``n_iter`` times, keeping the side where the row's mass at the midpoint is ``>= 1``.

    Variants differ only in their hook ``mass(tau) -> (row sums (..., 1), state)`` and their bracket:
    the dense rows here (:func:`bisect_rows`: ``state`` the weights) and the blockwise attention
    search (``reference/projection_attention.py``: sums over key blocks, no state). Returns the last
    midpoint and the last ``state`` (None when ``n_iter`` is 0).
    """
    tau_m, state = tau_lo, None
    for _ in range(n_iter):
        width = width / 2
        tau_m = tau_lo + width
        total, state = mass(tau_m)
        tau_lo = torch.where(total - 1 >= 0, tau_m, tau_lo)
    return tau_m, state


def bisect_rows(zs: Tensor, tau_lo: Tensor, width: Tensor, n_iter: int, ensure_sum_one: bool,
                p_of: Callable[[Tensor], Tensor]) -> Tensor:
    """The weights ``p = p_of([zs - tau]_+)`` at the last midpoint of :func:`bisect` on the rows of ``zs``.

    The hooks: alpha-entmax ``u -> u^(1/(alpha - 1))`` on ``zs = (alpha - 1) z``, sparsemax the identity
    on ``zs = z``. ``ensure_sum_one`` divides by the sum.
    """
    def mass(tau: Tensor) -> Tuple[Tensor, Tensor]:
        p = p_of((zs - tau).clamp_min(0))
        return p.sum(-1, keepdim=True), p

    _, p = bisect(tau_lo, width, n_iter, mass)
    p = zs if p is None else p
    if ensure_sum_one:
        total = p.sum(-1, keepdim=True)
        p = p / torch.where(total > 0, total, torch.ones_like(total))
    return p


def sparsemax_bisect_forward(z: Tensor, n_iter: int, ensure_sum_one: bool) -> Tensor:
    """sparsemax by bisection; ``z`` is shifted so each row's maximum is 0 (or all -inf).

    alpha = 2: ``p = [z - tau]_+`` (the identity hook), ``tau`` in ``[max - 1, max - 1/d]``.
    """
    shape = z.shape[:-1] + (1,)
    return bisect_rows(z, z.new_full(shape, -1.0), z.new_full(shape, 1.0 - 1.0 / z.shape[-1]), n_iter,
                       ensure_sum_one, lambda u: u)


def bisect_forward(z: Tensor, a: Tensor, n_iter: int, ensure_sum_one: bool, maybe_softmax: bool) -> Tensor:
    """``z`` is shifted so each row's maximum is 0 (or all -inf); ``a`` is alpha per row.

    For ``alpha < 1`` the exponent ``1 / (alpha - 1)`` is negative and the bracket is reversed
    (``tau_hi < tau_lo``, a negative step), as in the entmax package; the same loop applies.
    """
    d = z.shape[-1]
    softmax_rows = a == 1
    a_b = torch.where(softmax_rows, torch.full_like(a, 2.0), a)  # placeholder on softmax rows
    zs = z * (a_b - 1)
    inv = 1 / (a_b - 1)
    # tau lies between max - 1 and max - (1/d)^(alpha-1) (max = 0 here): p_max <= 1 and p_max >= 1/d.
    tau_lo = torch.full_like(a_b, -1.0)
    tau_hi = -((1.0 / d) ** (a_b - 1))
    p = bisect_rows(zs, tau_lo, tau_hi - tau_lo, n_iter, ensure_sum_one, lambda u: u ** inv)
    if maybe_softmax:  # a static flag (alpha given as a tensor, or the number 1), not data
        soft = torch.softmax(z, dim=-1)
        empty_rows = torch.isneginf(z).all(-1, keepdim=True)
        soft = torch.where(empty_rows, torch.zeros_like(soft), soft)
        p = torch.where(softmax_rows, soft, p)
    return p


def bisect_backward_parts(p: Tensor, g: Tensor, a: Tensor):
    """alpha-entmax's backward from ``p`` (``a`` alpha per row): ``(dX, gppr, sum gppr, on, p_on)``
    with ``gppr = p^(2 - alpha)`` on the support (1 / g''(p); softmax, alpha = 1: p itself) and
    ``dX = gppr (g - sum(g gppr) / sum(gppr))``, in differentiable ops; the other parts serve the
    gradient w.r.t. alpha."""
    on = p > 0
    p_on = torch.where(on, p, torch.ones_like(p))  # safe for pow/log (and double backward)
    gppr = torch.where(on, p_on ** (2 - a), torch.zeros_like(p))
    dX = g * gppr
    total = gppr.sum(-1, keepdim=True)
    total = torch.where(total > 0, total, torch.ones_like(total))
    q = dX.sum(-1, keepdim=True) / total
    return dX - q * gppr, gppr, total, on, p_on


def shift_by_max(x: Tensor) -> Tensor:
    """``x - max(x)`` over the last dim; rows with no finite entry are left as they are (all -inf)."""
    row_max = x.amax(dim=-1, keepdim=True)
    return x - row_max.masked_fill(row_max == float("-inf"), 0.0)
