"""Row-wise sparsemax and 1.5-entmax: exact threshold forward, closed-form backward.

Both maps are ``p = [z - tau]_+`` (sparsemax) and ``p = [(z - tau) / 2]_+^2`` (1.5-entmax, ``z``
and ``tau`` in units of the input, i.e. the entmax package's ``[x/2 - tau']_+^2``), on rows
shifted so their maximum is 0, with ``tau`` such that ``p`` sums to one. One program holds a tile
of whole rows in registers and finds ``tau`` without sorting, by the exact iteration of the
reference (``kernels/reference/projection.py``), every pass a register-only reduction:

* sparsemax: Newton's method on the convex piecewise-linear ``f(tau) = sum (z - tau)_+ - 1``
  from the lower bound ``tau = -1`` (Michelot): ``tau`` increases, the set ``{z > tau}`` shrinks,
  and once it stops changing ``tau = (sum_S z - 1) / |S|`` is exact;
* 1.5-entmax: from a lower bound with set ``S = {z > tau}``, the smaller root of
  ``sum_S ((z - t)/2)^2 = 1`` (exact if ``S`` is the support, an upper bound otherwise), and from
  an upper bound a Newton step, which lands below the root again; the root of the current set is
  accepted once the set stops changing (or ``f`` vanishes to rounding).

Rows that have not converged after ``MAX_ITER`` passes (adversarial inputs) are finished by
bisection on the bracket ``[lower bound, 0]`` and the exact fix-up on the set above the final
lower bound (the same closed forms). Rules as the reference: entries at or below
``finfo(input dtype).min / 2`` (``-inf`` included) or masked out are not there; a row with none
there gives zeros; a row holding NaN or ``+inf`` gives NaN in that row only.

Backward (both): ``w * (g - sum(w g) / sum(w))`` with ``w = 1{p > 0}`` (sparsemax) or ``sqrt(p)``
(1.5-entmax); NaN rows stay NaN.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import check_tensor, not_there_level
from ._rows import as_rows, row_launch, row_tile

MAX_COLS = 1 << 14
"""The longest row a program holds in registers; longer rows (a vocabulary) are streamed in chunks
of ``CHUNK`` entries by one program per row, every pass of the threshold iteration a read of the row."""
CHUNK = 4096
MAX_ITER = 64
BISECT_STEPS = 40
_KINDS = {"sparsemax": 0, "entmax15": 1}


@triton.jit
def _f_and_sums(z, tau, ENTMAX: tl.constexpr):
    """``(s1, s2, n)``: sums of ``d = (z - tau)_+``, of ``d^2`` (1.5-entmax) and the count of ``d > 0``."""
    d = tl.maximum(z - tau[:, None], 0.0)
    s1 = tl.sum(d, axis=1)
    if ENTMAX:
        s2 = tl.sum(d * d, axis=1)
    else:
        s2 = s1
    n = tl.sum((d > 0).to(tl.float32), axis=1)
    return s1, s2, n


@triton.jit
def _closed_form(tau, s1, s2, n, ENTMAX: tl.constexpr):
    """The exact threshold if ``{z > tau}`` is the support: sparsemax ``(sum_S z - 1)/|S|``,
    1.5-entmax the smaller root of ``sum_S ((z - t)/2)^2 = 1`` (relative to ``tau``)."""
    if ENTMAX:
        f = s2 / 4 - 1
        disc = tl.maximum(s1 * s1 - 4 * n * f, 0.0)
        final = tl.where(n > 0, tau + (s1 - tl.sqrt(disc)) / tl.maximum(n, 1.0), tau)
    else:
        final = tau + (s1 - 1) / tl.maximum(n, 1.0)
    return final


@triton.jit
def _project_fwd_kernel(
    x_ptr, mask_ptr, out_ptr, n_rows, n_cols, level, eps,
    HAS_MASK: tl.constexpr, ENTMAX: tl.constexpr, MAX_ITER: tl.constexpr, BISECT_STEPS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, inb = row_tile(n_rows, n_cols, ROWS, BLOCK)
    x = tl.load(x_ptr + offs, mask=inb, other=float("-inf")).to(tl.float32)
    there = inb & ~(x <= level)
    if HAS_MASK:
        there = there & (tl.load(mask_ptr + offs, mask=inb, other=0) != 0)
    bad = tl.sum((there & ((x != x) | (x == float("inf")))).to(tl.int32), axis=1) > 0
    empty = tl.sum(there.to(tl.int32), axis=1) == 0
    xt = tl.where(there & ~bad[:, None], x, float("-inf"))
    row_max = tl.max(xt, axis=1)
    z = xt - tl.where(empty | bad, 0.0, row_max)[:, None]  # row max 0; not there: -inf

    if ENTMAX:
        lower = -2.0
    else:
        lower = -1.0
    tau = tl.full((ROWS,), lower, tl.float32)  # lower bound: p_max <= 1
    tau_out = tl.zeros((ROWS,), tl.float32)
    prev_n = tl.full((ROWS,), -1.0, tl.float32)
    was_root = tl.zeros((ROWS,), tl.int1)
    done = empty | bad
    it = 0
    while (tl.sum((~done).to(tl.int32), axis=0) > 0) & (it < MAX_ITER):
        s1, s2, n = _f_and_sums(z, tau, ENTMAX)
        final = _closed_form(tau, s1, s2, n, ENTMAX)
        if ENTMAX:
            f = s2 / 4 - 1
            now = (was_root & (n == prev_n)) | (tl.abs(f) <= 16 * eps) | (n == 0)
            below = f >= 0
            newton = tau + 2 * f / tl.maximum(s1, eps)
            new_tau = tl.where(below, final, newton)
            was_root = below
        else:
            now = n == prev_n
            new_tau = tl.maximum(tau, final)
        now = now & ~done
        tau_out = tl.where(now, final, tau_out)
        done = done | now
        tau = new_tau
        prev_n = n
        it += 1

    if tl.sum((~done).to(tl.int32), axis=0) > 0:
        # Bisection on [lo, hi] (f(lo) >= 0 >= f(hi)), then the closed form on {z > lo}.
        lo = tl.full((ROWS,), lower, tl.float32)
        hi = tl.zeros((ROWS,), tl.float32)
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) * 0.5
            s1, s2, n = _f_and_sums(z, mid, ENTMAX)
            if ENTMAX:
                f = s2 / 4 - 1
            else:
                f = s1 - 1
            lo = tl.where(f >= 0, mid, lo)
            hi = tl.where(f >= 0, hi, mid)
        s1, s2, n = _f_and_sums(z, lo, ENTMAX)
        tau_out = tl.where(done, tau_out, _closed_form(lo, s1, s2, n, ENTMAX))

    p = tl.maximum(z - tau_out[:, None], 0.0)
    if ENTMAX:
        p = p * 0.5
        p = p * p
    p = tl.where(bad[:, None], float("nan"), p)
    tl.store(out_ptr + offs, p.to(out_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _project_bwd_kernel(
    p_ptr, grad_ptr, dx_ptr, n_rows, n_cols,
    ENTMAX: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, inb = row_tile(n_rows, n_cols, ROWS, BLOCK)
    p = tl.load(p_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    g = tl.load(grad_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    w = _backward_weight(p, ENTMAX)  # NaN rows stay NaN
    total = tl.sum(w, axis=1)
    total = tl.where(total > 0, total, 1.0)
    q = tl.sum(w * g, axis=1) / total
    dx = (g - q[:, None]) * w
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _long_z(x_ptr, mask_ptr, base, cols, n_cols, level, shift, HAS_MASK: tl.constexpr):
    """A chunk of a long row shifted by ``shift`` (its max): not there ``-inf``."""
    inb = cols < n_cols
    x = tl.load(x_ptr + base + cols, mask=inb, other=float("-inf")).to(tl.float32)
    there = inb & ~(x <= level)
    if HAS_MASK:
        there = there & (tl.load(mask_ptr + base + cols, mask=inb, other=0) != 0)
    return tl.where(there, x - shift, float("-inf"))


@triton.jit
def _long_sums(x_ptr, mask_ptr, base, n_cols, level, shift, tau, HAS_MASK: tl.constexpr, ENTMAX: tl.constexpr,
               BLOCK: tl.constexpr):
    """``(s1, s2, n)`` of :func:`_f_and_sums` over a long row, chunk by chunk; each of shape (1,)."""
    a1 = tl.zeros((BLOCK,), tl.float32)
    a2 = tl.zeros((BLOCK,), tl.float32)
    an = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        z = _long_z(x_ptr, mask_ptr, base, start + tl.arange(0, BLOCK), n_cols, level, shift, HAS_MASK)
        d = tl.maximum(z - tau, 0.0)
        a1 += d
        if ENTMAX:
            a2 += d * d
        an += (d > 0).to(tl.float32)
    one = tl.zeros((1,), tl.float32)
    s1 = one + tl.sum(a1, axis=0)
    if ENTMAX:
        s2 = one + tl.sum(a2, axis=0)
    else:
        s2 = s1
    return s1, s2, one + tl.sum(an, axis=0)


@triton.jit
def _project_fwd_long_kernel(
    x_ptr, mask_ptr, out_ptr, n_cols, level, eps,
    HAS_MASK: tl.constexpr, ENTMAX: tl.constexpr, MAX_ITER: tl.constexpr, BISECT_STEPS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One long row per program: the iteration of :func:`_project_fwd_kernel`, every pass streamed."""
    base = tl.program_id(0).to(tl.int64) * n_cols
    top = tl.full((BLOCK,), float("-inf"), tl.float32)
    count = tl.zeros((BLOCK,), tl.int32)
    n_bad = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, n_cols, BLOCK):  # the max, the count of entries there, NaN/+inf
        cols = start + tl.arange(0, BLOCK)
        inb = cols < n_cols
        x = tl.load(x_ptr + base + cols, mask=inb, other=float("-inf")).to(tl.float32)
        there = inb & ~(x <= level)
        if HAS_MASK:
            there = there & (tl.load(mask_ptr + base + cols, mask=inb, other=0) != 0)
        top = tl.maximum(top, tl.where(there, x, float("-inf")))
        count += there.to(tl.int32)
        n_bad += (there & ((x != x) | (x == float("inf")))).to(tl.int32)
    zero = tl.zeros((1,), tl.float32)
    bad = (zero + tl.sum(n_bad, axis=0)) > 0
    empty = (zero + tl.sum(count, axis=0)) == 0
    shift = tl.where(empty | bad, 0.0, zero + tl.max(top, axis=0))

    if ENTMAX:
        lower = -2.0
    else:
        lower = -1.0
    tau = zero + lower
    tau_out = zero
    prev_n = zero - 1.0
    was_root = zero > 1.0
    done = empty | bad
    it = 0
    while (tl.sum((~done).to(tl.int32), axis=0) > 0) & (it < MAX_ITER):
        s1, s2, n = _long_sums(x_ptr, mask_ptr, base, n_cols, level, shift, tau, HAS_MASK, ENTMAX, BLOCK)
        final = _closed_form(tau, s1, s2, n, ENTMAX)
        if ENTMAX:
            f = s2 / 4 - 1
            now = (was_root & (n == prev_n)) | (tl.abs(f) <= 16 * eps) | (n == 0)
            below = f >= 0
            new_tau = tl.where(below, final, tau + 2 * f / tl.maximum(s1, eps))
            was_root = below
        else:
            now = n == prev_n
            new_tau = tl.maximum(tau, final)
        now = now & ~done
        tau_out = tl.where(now, final, tau_out)
        done = done | now
        tau = new_tau
        prev_n = n
        it += 1

    if tl.sum((~done).to(tl.int32), axis=0) > 0:  # bisection, then the closed form on {z > lo}
        lo = zero + lower
        hi = zero
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) * 0.5
            s1, s2, n = _long_sums(x_ptr, mask_ptr, base, n_cols, level, shift, mid, HAS_MASK, ENTMAX, BLOCK)
            if ENTMAX:
                f = s2 / 4 - 1
            else:
                f = s1 - 1
            lo = tl.where(f >= 0, mid, lo)
            hi = tl.where(f >= 0, hi, mid)
        s1, s2, n = _long_sums(x_ptr, mask_ptr, base, n_cols, level, shift, lo, HAS_MASK, ENTMAX, BLOCK)
        tau_out = tl.where(done, tau_out, _closed_form(lo, s1, s2, n, ENTMAX))

    for start in range(0, n_cols, BLOCK):  # the output
        cols = start + tl.arange(0, BLOCK)
        z = _long_z(x_ptr, mask_ptr, base, cols, n_cols, level, shift, HAS_MASK)
        p = tl.maximum(z - tau_out, 0.0)
        if ENTMAX:
            p = p * 0.5
            p = p * p
        p = tl.where(bad, float("nan"), p)
        tl.store(out_ptr + base + cols, p.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _project_bwd_long_kernel(p_ptr, grad_ptr, dx_ptr, n_cols, ENTMAX: tl.constexpr, BLOCK: tl.constexpr):
    """One long row per program: the sums of ``w`` and ``w g``, then ``(g - q) w``."""
    base = tl.program_id(0).to(tl.int64) * n_cols
    acc_w = tl.zeros((BLOCK,), tl.float32)
    acc_wg = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inb = cols < n_cols
        p = tl.load(p_ptr + base + cols, mask=inb, other=0.0).to(tl.float32)
        g = tl.load(grad_ptr + base + cols, mask=inb, other=0.0).to(tl.float32)
        w = _backward_weight(p, ENTMAX)
        acc_w += w
        acc_wg += w * g
    total = tl.sum(acc_w, axis=0)
    total = tl.where(total > 0, total, 1.0)
    q = tl.sum(acc_wg, axis=0) / total
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inb = cols < n_cols
        p = tl.load(p_ptr + base + cols, mask=inb, other=0.0).to(tl.float32)
        g = tl.load(grad_ptr + base + cols, mask=inb, other=0.0).to(tl.float32)
        dx = (g - q) * _backward_weight(p, ENTMAX)
        tl.store(dx_ptr + base + cols, dx.to(dx_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _backward_weight(p, ENTMAX: tl.constexpr):
    """``w = 1{p > 0}`` (sparsemax) or ``sqrt(p)`` (1.5-entmax); NaN stays NaN."""
    if ENTMAX:
        w = tl.sqrt(tl.maximum(p, 0.0))
    else:
        w = (p > 0).to(tl.float32)
    return tl.where(p != p, p, w)


def _kind(kind: str) -> int:
    if kind not in _KINDS:
        raise ValueError(f"kind must be 'sparsemax' or 'entmax15', got {kind!r}")
    return _KINDS[kind]


def supports(x: Tensor) -> bool:
    """Whether :func:`project` runs a kernel on ``x`` (device, dtype, row length)."""
    from ._common import _DTYPES, runnable_on

    return x.dtype in _DTYPES and runnable_on(x) and x.dim() > 0 and x.shape[-1] > 0


def project(x: Tensor, kind: str, mask: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """sparsemax (``kind='sparsemax'``) or 1.5-entmax (``'entmax15'``) of the rows of ``x`` (last
    dim): the reference's ``project_sorted(x, kind)``. ``mask`` (bool, broadcastable, True = keep)
    is optional. Returns a contiguous tensor of ``x``'s shape in ``out_dtype`` (default ``x.dtype``),
    computed in float32."""
    entmax = _kind(kind)
    check_tensor(x, "x")
    out_dtype = out_dtype or x.dtype
    x2, m2 = as_rows(x, mask)
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if x2.numel():
        flags = dict(HAS_MASK=m2 is not None, ENTMAX=entmax, MAX_ITER=MAX_ITER, BISECT_STEPS=BISECT_STEPS)
        m2 = m2 if m2 is not None else x2  # an unused pointer without a mask
        eps = torch.finfo(torch.float32).eps
        if x2.shape[1] <= MAX_COLS:
            row_launch(_project_fwd_kernel, x2, (x2, m2, out, x2.shape[0], x2.shape[1], not_there_level(x.dtype), eps),
                       **flags)
        else:
            _project_fwd_long_kernel[(x2.shape[0],)](x2, m2, out, x2.shape[1], not_there_level(x.dtype), eps,
                                                     BLOCK=CHUNK, num_warps=8, **flags)
    return out.view(x.shape)


def project_backward(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    """The closed-form backward of :func:`project` from its output ``p`` (the reference's
    ``dense_backward(p, grad, kind)``); ``p``'s dtype and shape."""
    entmax = _kind(kind)
    check_tensor(p, "p")
    check_tensor(grad, "grad")
    grad = grad.expand_as(p)
    p2, _ = as_rows(p, None)
    g2, _ = as_rows(grad, None)
    dx = torch.empty(p2.shape, dtype=p.dtype, device=p.device)
    if p2.numel():
        if p2.shape[1] <= MAX_COLS:
            row_launch(_project_bwd_kernel, p2, (p2, g2, dx, p2.shape[0], p2.shape[1]), ENTMAX=entmax)
        else:
            _project_bwd_long_kernel[(p2.shape[0],)](p2, g2, dx, p2.shape[1], ENTMAX=entmax, BLOCK=CHUNK, num_warps=8)
    return dx.view(p.shape)
