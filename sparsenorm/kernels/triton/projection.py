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
lower bound (the same closed forms).

Rows longer than ``MAX_COLS`` (a vocabulary) are split into segments of ``SEGMENT`` entries, one
program per (row, segment), with no host synchronisation: every launch's programs reduce their
row's float32 partials themselves, in segment order. Every ``tau`` the iteration evaluates is at
least the lower bound (-1, resp. -2, on the max-shifted row), where the entries at or below it
weigh nothing, so the threshold depends only on the entries above ``max - 1`` (resp. ``max - 2``):
a few out of a vocabulary's tens of thousands. Five launches: (1) each segment's max, count and
NaN/+inf count; (2) the entries above the bound gathered into a per-row buffer of
``SPLIT_CANDIDATES`` (an atomic counter per row; walked backwards, for the L2); (3) one program
per row solves the exact threshold on them in registers (sorted first, so the result does not
depend on the gather's order; the iteration above, bisection included, so it always finishes);
(4) the guarded finish: rows with more candidates than the buffer holds (many entries within 1,
resp. 2, of the max: ties, clustered values) are finished by one program per row streaming the
iteration over the whole row, every pass a read; the other rows' programs return at once; (5)
the output. Three reads and one write per entry (rows needing the finish: more), against a
copy's one and one; the second and third reads may be served by the L2 in part.

Rules as the reference: entries at or below
``finfo(input dtype).min / 2`` (``-inf`` included) or masked out are not there; a row with none
there gives zeros; a row holding NaN or ``+inf`` gives NaN in that row only.

Backward (both): ``w * (g - sum(w g) / sum(w))`` with ``w = 1{p > 0}`` (sparsemax) or ``sqrt(p)``
(1.5-entmax); NaN rows stay NaN. Long rows: two launches, per-segment sums of ``w`` and ``w g``,
then ``dx``; two reads of ``p`` and ``g`` and one write per entry.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, check_tensor, not_there_level
from ..tiles import TRITON_TILE_COLS
from ._rows import as_rows, load_there, row_launch, row_tile, segment_chunk, split_grid, split_program

MAX_COLS = TRITON_TILE_COLS["sparsemax"]  # the same for 1.5-entmax (one kernel)
"""The longest row a program holds in registers; longer rows (a vocabulary) are split into
segments of ``SEGMENT`` entries, each streamed in chunks of ``CHUNK``."""
CHUNK = 4096
SEGMENT = 8192
"""Rows longer than ``MAX_COLS`` are split into segments of this many entries, one program each."""
SPLIT_CANDIDATES = 64 if INTERPRET else 2048
"""Split rows: the entries within the lower bound of the row max (1 for sparsemax, 2 for
1.5-entmax) are gathered, up to this many per row (a power of two), and the threshold is solved
on them in registers; a row with more is finished by the one-program-per-row kernel. (Under the
interpreter, whose ``tl.sort`` of 2048 entries takes seconds, 64.)"""
_observe = None
"""Test hook: a callable given the split forward's per-row ``candidates`` count, ``done`` flags
and ``tau`` (before the guarded finish), or None."""
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
def _tile_threshold(z, done, eps, ENTMAX: tl.constexpr, MAX_ITER: tl.constexpr, BISECT_STEPS: tl.constexpr,
                    ROWS: tl.constexpr):
    """The exact threshold of each row of the tile ``z`` (rows shifted to max 0, not there ``-inf``;
    rows already ``done`` get 0): the iteration of the module doc, then bisection for the rows it
    did not finish. Every ``tau`` it evaluates is at least the lower bound (-1, resp. -2), so the
    entries at or below that bound never count and may be left out of ``z`` (the split solve)."""
    if ENTMAX:
        lower = -2.0
    else:
        lower = -1.0
    tau = tl.full((ROWS,), lower, tl.float32)  # lower bound: p_max <= 1
    tau_out = tl.zeros((ROWS,), tl.float32)
    prev_n = tl.full((ROWS,), -1.0, tl.float32)
    was_root = tl.zeros((ROWS,), tl.int1)
    it = 0
    while (tl.sum((~done).to(tl.int32), axis=0) > 0) & (it < MAX_ITER):
        s1, s2, n = _f_and_sums(z, tau, ENTMAX)
        final = _closed_form(tau, s1, s2, n, ENTMAX)
        if ENTMAX:
            f = s2 / 4 - 1
            now = (was_root & (n == prev_n)) | (tl.abs(f) <= 16 * eps) | (n == 0)
            below = f >= 0
            newton = tl.maximum(tau + 2 * f / tl.maximum(s1, eps), lower)  # tau >= lower always
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

    return tau_out


@triton.jit
def _project_fwd_kernel(
    x_ptr, mask_ptr, out_ptr, n_rows, n_cols, level, eps,
    HAS_MASK: tl.constexpr, ENTMAX: tl.constexpr, MAX_ITER: tl.constexpr, BISECT_STEPS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, inb = row_tile(n_rows, n_cols, ROWS, BLOCK)
    x, there = load_there(x_ptr, mask_ptr, offs, inb, level, HAS_MASK)
    bad = tl.sum((there & ((x != x) | (x == float("inf")))).to(tl.int32), axis=1) > 0
    empty = tl.sum(there.to(tl.int32), axis=1) == 0
    xt = tl.where(there & ~bad[:, None], x, float("-inf"))
    row_max = tl.max(xt, axis=1)
    z = xt - tl.where(empty | bad, 0.0, row_max)[:, None]  # row max 0; not there: -inf

    tau_out = _tile_threshold(z, empty | bad, eps, ENTMAX, MAX_ITER, BISECT_STEPS, ROWS)

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
def _long_z(x_ptr, mask_ptr, base, cols, inb, level, shift, HAS_MASK: tl.constexpr):
    """A chunk of a long row shifted by ``shift`` (its max): not there (or out of bounds) ``-inf``."""
    x, there = load_there(x_ptr, mask_ptr, base + cols, inb, level, HAS_MASK)
    return tl.where(there, x - shift, float("-inf"))


@triton.jit
def _long_sums(x_ptr, mask_ptr, base, n_cols, level, shift, tau, HAS_MASK: tl.constexpr, ENTMAX: tl.constexpr,
               BLOCK: tl.constexpr):
    """``(s1, s2, n)`` of :func:`_f_and_sums` over a long row, chunk by chunk; each of shape (1,)."""
    a1 = tl.zeros((BLOCK,), tl.float32)
    a2 = tl.zeros((BLOCK,), tl.float32)
    an = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = _long_z(x_ptr, mask_ptr, base, cols, cols < n_cols, level, shift, HAS_MASK)
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
    x_ptr, mask_ptr, done_ptr, tau_ptr, n_cols, level, eps,
    HAS_MASK: tl.constexpr, ENTMAX: tl.constexpr, MAX_ITER: tl.constexpr, BISECT_STEPS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The split forward's guarded finish, one long row per program: the iteration of
    :func:`_project_fwd_kernel`, every pass streamed, for the rows whose ``done`` flag is 0 (more
    candidates than the solve holds); it writes their ``tau``. A row already done returns at once:
    its loops have no iterations."""
    row = tl.program_id(0).to(tl.int64)
    base = row * n_cols
    finished = tl.load(done_ptr + row) != 0
    n_cols = tl.where(finished, 0, n_cols)  # a finished row reads nothing and is "empty" below
    top = tl.full((BLOCK,), float("-inf"), tl.float32)
    count = tl.zeros((BLOCK,), tl.int32)
    n_bad = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, n_cols, BLOCK):  # the max, the count of entries there, NaN/+inf
        cols = start + tl.arange(0, BLOCK)
        inb = cols < n_cols
        x, there = load_there(x_ptr, mask_ptr, base + cols, inb, level, HAS_MASK)
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

    tl.store(tau_ptr + row + tl.arange(0, 1), tau_out, mask=tl.arange(0, 1) < tl.where(finished, 0, 1))


@triton.jit
def _project_fwd_stats_kernel(x_ptr, mask_ptr, part_ptr, n_cols, n_segments, level,
                              HAS_MASK: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """Split rows, launch 1: a segment's max and count of the entries there and its count of
    NaN/+inf, into ``part[row, segment, 0:3]``."""
    row, seg = split_program(n_segments, False)
    base = row * n_cols
    top = tl.full((BLOCK,), float("-inf"), tl.float32)
    count = tl.zeros((BLOCK,), tl.float32)
    n_bad = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        x, there = load_there(x_ptr, mask_ptr, base + cols, inb, level, HAS_MASK)
        top = tl.maximum(top, tl.where(there, x, float("-inf")))
        count += there.to(tl.float32)
        n_bad += (there & ((x != x) | (x == float("inf")))).to(tl.float32)
    out = part_ptr + (row * n_segments + seg) * 3
    tl.store(out, tl.max(top, axis=0))
    tl.store(out + 1, tl.sum(count, axis=0))
    tl.store(out + 2, tl.sum(n_bad, axis=0))


@triton.jit
def _project_row_shift(part_ptr, row, n_segments):
    """``(shift, bad, skip)`` of a row from its segments' statistics (in segment order; the max is
    exact in any order): the row max (0 for rows with no threshold to find), whether the row holds
    NaN/+inf, and whether it is such a row (NaN/+inf, or no entry there)."""
    p = part_ptr + row * n_segments * 3
    top = tl.load(p)
    count = tl.load(p + 1)
    n_bad = tl.load(p + 2)
    for s in range(1, n_segments):
        top = tl.maximum(top, tl.load(p + 3 * s))
        count += tl.load(p + 3 * s + 1)
        n_bad += tl.load(p + 3 * s + 2)
    skip = (count == 0) | (n_bad > 0)
    return tl.where(skip, 0.0, top), n_bad > 0, skip


@triton.jit
def _project_fwd_gather_kernel(
    x_ptr, mask_ptr, part_ptr, count_ptr, cand_ptr, n_cols, n_segments, level,
    HAS_MASK: tl.constexpr, ENTMAX: tl.constexpr, CANDIDATES: tl.constexpr, SEGMENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Split rows, launch 2: the shifted entries above the lower bound (``z > -1``, resp. ``-2``),
    the only ones that can be on the support, appended to the row's ``cand`` (first ``CANDIDATES``
    kept; ``count`` counts them all). Grid walked backwards, for the L2."""
    row, seg = split_program(n_segments, True)
    base = row * n_cols
    shift, bad, skip = _project_row_shift(part_ptr, row, n_segments)
    if ENTMAX:
        lower = -2.0
    else:
        lower = -1.0
    cut = tl.where(skip, float("inf"), lower)  # NaN/+inf and empty rows gather nothing
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        z = _long_z(x_ptr, mask_ptr, base, cols, inb, level, shift, HAS_MASK)
        take = (z > cut).to(tl.int32)
        k = tl.sum(take, axis=0)
        if k > 0:  # most chunks of a long row hold none: no atomic for them
            pos = tl.atomic_add(count_ptr + row, k) + tl.cumsum(take, axis=0) - 1
            tl.store(cand_ptr + row * CANDIDATES + pos, z, mask=(take != 0) & (pos < CANDIDATES))


@triton.jit
def _project_fwd_solve_kernel(
    part_ptr, count_ptr, cand_ptr, tau_ptr, done_ptr, n_segments, eps,
    ENTMAX: tl.constexpr, MAX_ITER: tl.constexpr, BISECT_STEPS: tl.constexpr, CANDIDATES: tl.constexpr,
):
    """Split rows, launch 3, one program per row: the exact threshold on the gathered candidates
    in registers (:func:`_tile_threshold`; the entries left out are at or below its lower bound and
    never count), ``done = 1``; a row with more than ``CANDIDATES`` gets ``done = 0``."""
    row = tl.program_id(0).to(tl.int64)
    shift, bad, skip = _project_row_shift(part_ptr, row, n_segments)
    k = tl.load(count_ptr + row)
    fits = k <= CANDIDATES
    idx = tl.arange(0, CANDIDATES)
    z = tl.load(cand_ptr + row * CANDIDATES + idx, mask=idx < tl.where(fits, k, 0), other=float("-inf"))
    # The gather's order depends on the programs' timing; sorted, the sums (and tau) do not.
    z = tl.sort(z, descending=True)
    done = (tl.zeros((1,), tl.int32) + tl.where(skip | (k > CANDIDATES), 1, 0)) != 0
    tau = _tile_threshold(z[None, :], done, eps, ENTMAX, MAX_ITER, BISECT_STEPS, 1)
    tl.store(tau_ptr + row + tl.arange(0, 1), tau)
    tl.store(done_ptr + row, fits.to(tl.int32))


@triton.jit
def _project_fwd_out_kernel(
    x_ptr, mask_ptr, part_ptr, tau_ptr, out_ptr, n_cols, n_segments, level,
    HAS_MASK: tl.constexpr, ENTMAX: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr,
):
    """Split rows, last launch: ``[z - tau]_+`` (1.5-entmax: ``[(z - tau) / 2]_+^2``) of a segment."""
    row, seg = split_program(n_segments, False)
    base = row * n_cols
    shift, bad, skip = _project_row_shift(part_ptr, row, n_segments)
    tau = tl.load(tau_ptr + row)
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        z = _long_z(x_ptr, mask_ptr, base, cols, inb, level, shift, HAS_MASK)
        p = tl.maximum(z - tau, 0.0)
        if ENTMAX:
            p = p * 0.5
            p = p * p
        p = tl.where(bad, float("nan"), p)
        tl.store(out_ptr + base + cols, p.to(out_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _project_bwd_partial_kernel(p_ptr, grad_ptr, part_ptr, n_cols, n_segments, ENTMAX: tl.constexpr,
                                SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """Split rows, launch 1 of 2: a segment's sums of ``w`` and ``w g``, into ``part[row, segment, 0:2]``."""
    row, seg = split_program(n_segments, False)
    base = row * n_cols
    acc_w = tl.zeros((BLOCK,), tl.float32)
    acc_wg = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        p = tl.load(p_ptr + base + cols, mask=inb, other=0.0).to(tl.float32)
        g = tl.load(grad_ptr + base + cols, mask=inb, other=0.0).to(tl.float32)
        w = _backward_weight(p, ENTMAX)
        acc_w += w
        acc_wg += w * g
    out = part_ptr + (row * n_segments + seg) * 2
    tl.store(out, tl.sum(acc_w, axis=0))
    tl.store(out + 1, tl.sum(acc_wg, axis=0))


@triton.jit
def _project_bwd_split_kernel(p_ptr, grad_ptr, part_ptr, dx_ptr, n_cols, n_segments, ENTMAX: tl.constexpr,
                              SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """Split rows, launch 2 of 2: ``(g - q) w`` of a segment, ``q`` from the row's sums reduced in
    segment order (grid walked backwards, for the L2)."""
    row, seg = split_program(n_segments, True)
    base = row * n_cols
    part = part_ptr + row * n_segments * 2
    total = tl.load(part)
    total_wg = tl.load(part + 1)
    for s in range(1, n_segments):
        total += tl.load(part + 2 * s)
        total_wg += tl.load(part + 2 * s + 1)
    q = total_wg / tl.where(total > 0, total, 1.0)
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
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
            _project_split_rows(x2, m2, out, x.dtype, entmax, eps, flags)
    return out.view(x.shape)


def _project_split_rows(x2: Tensor, m2: Tensor, out: Tensor, dtype: torch.dtype, entmax: int, eps: float,
                        flags: dict) -> None:
    """Rows longer than ``MAX_COLS``: five launches, no host synchronisation (module doc)."""
    n_rows, n_cols = x2.shape
    n_segments, grid, sizes = split_grid(n_rows, n_cols, SEGMENT, CHUNK)
    f32 = dict(dtype=torch.float32, device=x2.device)
    part = torch.empty(n_rows, n_segments, 3, **f32)
    count = torch.zeros(n_rows, dtype=torch.int32, device=x2.device)
    cand = torch.empty(n_rows, SPLIT_CANDIDATES, **f32)
    tau = torch.empty(n_rows, **f32)
    done = torch.empty(n_rows, dtype=torch.int32, device=x2.device)
    level = not_there_level(dtype)
    has_mask = flags["HAS_MASK"]
    _project_fwd_stats_kernel[grid](x2, m2, part, n_cols, n_segments, level, HAS_MASK=has_mask, num_warps=8, **sizes)
    _project_fwd_gather_kernel[grid](x2, m2, part, count, cand, n_cols, n_segments, level, HAS_MASK=has_mask,
                                     ENTMAX=entmax, CANDIDATES=SPLIT_CANDIDATES, num_warps=8, **sizes)
    _project_fwd_solve_kernel[(n_rows,)](part, count, cand, tau, done, n_segments, eps, ENTMAX=entmax,
                                         MAX_ITER=MAX_ITER, BISECT_STEPS=BISECT_STEPS, CANDIDATES=SPLIT_CANDIDATES,
                                         num_warps=8)
    if _observe is not None:
        _observe(dict(candidates=count, done=done, tau=tau))
    _project_fwd_long_kernel[(n_rows,)](x2, m2, done, tau, n_cols, level, eps, BLOCK=CHUNK, num_warps=8, **flags)
    _project_fwd_out_kernel[grid](x2, m2, part, tau, out, n_cols, n_segments, level, HAS_MASK=has_mask,
                                  ENTMAX=entmax, num_warps=8, **sizes)


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
            n_segments, grid, sizes = split_grid(p2.shape[0], p2.shape[1], SEGMENT, CHUNK)
            part = torch.empty(p2.shape[0], n_segments, 2, dtype=torch.float32, device=p.device)
            _project_bwd_partial_kernel[grid](p2, g2, part, p2.shape[1], n_segments, ENTMAX=entmax, num_warps=8,
                                              **sizes)
            _project_bwd_split_kernel[grid](p2, g2, part, dx, p2.shape[1], n_segments, ENTMAX=entmax, num_warps=8,
                                            **sizes)
    return dx.view(p.shape)
