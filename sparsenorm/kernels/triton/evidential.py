"""Row-wise ev-softmax kernels: Eq. 7, Eq. 10 and the log of Eq. 10, forward and backward.

Rows of up to ``TILE_COLS`` entries: one program normalizes a tile of ``ROWS`` whole rows held in
registers, one read and one write per entry, as ``torch.softmax``. The rules are those of the
reference (``kernels/reference/evidential.py``): an entry is not there when it is ``-inf``, masked
out, or at or below ``finfo(input dtype).min / 2``; the threshold is ``min(mean, max)`` over the
entries that are there (ties kept, ``>=``); Eq. 10 weighs the off-support entries by
``eps / (1 + eps)`` (a log-shift, Eq. 10 up to the normalizer); a row with no entry there gives
zeros (log: ``-inf``); a row holding NaN or ``+inf`` gives NaN in that row only. Inputs
float32/float16/bfloat16, computed in float32, written in ``out_dtype``.

Longer rows (a vocabulary) are split into segments of ``SEGMENT`` entries, one program per
(row, segment), each streaming its segment in chunks of ``CHUNK``. A launch's per-segment
statistics go to a small float32 scratch tensor, and every program of the next launch reduces its
row's partials itself, in segment order, so all programs of a row derive the same bits; there is
no host synchronisation and no wait between programs. Forward, three launches: (1) count, sum, max
and NaN/+inf count of each segment; (2) each segment's share of the normalizer; (3) the output.

Three reads (and one write) per entry is the least without a grid-wide barrier: the support
``x >= min(mean, max)`` is known only once every entry of the row has been read (read 1); the
normalizer sums over the support (Eq. 7; Eq. 10 is ``eps / (1 + eps)`` times the sum over the
row plus ``1 / (1 + eps)`` times the sum over the support), and as a function of the unknown
threshold that sum is a step function with a step at every entry, which no fixed-size summary of a
segment holds, so it needs a second read once the threshold is known (read 2); the output needs
the whole row's normalizer, which a program can only have after every program of its row has
finished read 2, i.e. in a later launch (read 3), since programs may not wait for each other
(they need not be resident together, and the interpreter runs them one after another). So a long
row moves 3 reads + 1 write against a copy's 1 + 1: from DRAM alone at most half the copy
bandwidth in the benchmark's measure (``benchmarks/bench_gpu.py``: 2 x bytes / time). The rest can
only come from the L2 cache serving re-reads: launch 2 walks the grid from its end, so it starts
on the segments launch 1 read last (still in the L2), and launch 3 walks forwards again, starting
on what launch 2 read last.

The backward is softmax's (resp. log-softmax's) on the saved output (Eq. 9): the support
indicator and Eq. 10's shift are piecewise constant. Log form: a ``-inf`` output (not there, or
off the support with ``eps = 0``) is constant, so its incoming gradient is dropped. Long rows: two
launches, per-segment sums of ``g * out`` (log: ``g``), then ``dx`` (grid walked backwards); two
reads of ``out`` and ``g`` and one write per entry, the least possible (the sum precedes every
``dx``).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import check_tensor, not_there_level
from ..tiles import TRITON_TILE_COLS
from ._rows import as_rows, load_there, row_launch, row_tile, segment_chunk, split_grid, split_program

TILE_COLS = TRITON_TILE_COLS["ev_softmax"]
"""Rows up to this length are held in registers; longer rows are split into segments."""
CHUNK = 4096
SEGMENT = 8192
"""Rows longer than ``TILE_COLS`` are split into segments of this many entries (a multiple of
``CHUNK``), one program each, so a row is read by many programs at once."""


@triton.jit
def _ev_softmax_fwd_kernel(
    x_ptr, mask_ptr, out_ptr, n_rows, n_cols, level, shift,
    HAS_MASK: tl.constexpr, TRAIN: tl.constexpr, LOG: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, inb = row_tile(n_rows, n_cols, ROWS, BLOCK)
    x, there = load_there(x_ptr, mask_ptr, offs, inb, level, HAS_MASK)  # NaN is there, so it reaches its row's output
    count = tl.sum(there.to(tl.float32), axis=1)
    total = tl.sum(tl.where(there, x, 0.0), axis=1)
    xt = tl.where(there, x, float("-inf"))
    row_max = tl.max(xt, axis=1)
    bad = tl.sum((there & ((x != x) | (x == float("inf")))).to(tl.int32), axis=1) > 0
    threshold = tl.minimum(total / tl.maximum(count, 1.0), row_max)
    on = there & (xt >= threshold[:, None])
    if TRAIN:
        z = tl.where(on, xt, xt + shift)  # -inf stays -inf
    else:
        z = tl.where(on, xt, float("-inf"))
    z_max = tl.where(count > 0, tl.max(z, axis=1), 0.0)  # the row max is on the support
    z = z - z_max[:, None]
    e = tl.exp(z)
    denom = tl.sum(e, axis=1)
    if LOG:
        out = z - tl.log(denom)[:, None]
        out = tl.where((count > 0)[:, None], out, float("-inf"))
    else:
        out = e / denom[:, None]
        out = tl.where((count > 0)[:, None], out, 0.0)
    out = tl.where(bad[:, None], float("nan"), out)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _ev_softmax_bwd_kernel(
    out_ptr, grad_ptr, dx_ptr, n_rows, n_cols,
    LOG: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs, inb = row_tile(n_rows, n_cols, ROWS, BLOCK)
    g, out = _grad_and_out(grad_ptr, out_ptr, offs, inb, LOG)
    if LOG:
        dx = g - tl.exp(out) * tl.sum(g, axis=1)[:, None]
    else:
        dx = out * (g - tl.sum(g * out, axis=1)[:, None])
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _ev_fwd_stats_kernel(
    x_ptr, mask_ptr, part_ptr, n_cols, n_segments, level,
    HAS_MASK: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr,
):
    """Split rows, launch 1 of 3: a segment's count, sum and max of the entries there, and its
    count of NaN/+inf, into ``part[row, segment, 0:4]``."""
    row, seg = split_program(n_segments, False)
    base = row * n_cols
    count = tl.zeros((BLOCK,), tl.float32)
    total = tl.zeros((BLOCK,), tl.float32)
    top = tl.full((BLOCK,), float("-inf"), tl.float32)
    n_bad = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        x, there = load_there(x_ptr, mask_ptr, base + cols, inb, level, HAS_MASK)
        count += there.to(tl.float32)
        total += tl.where(there, x, 0.0)
        top = tl.maximum(top, tl.where(there, x, float("-inf")))
        n_bad += (there & ((x != x) | (x == float("inf")))).to(tl.float32)
    out = part_ptr + (row * n_segments + seg) * 4
    tl.store(out, tl.sum(count, axis=0))
    tl.store(out + 1, tl.sum(total, axis=0))
    tl.store(out + 2, tl.max(top, axis=0))
    tl.store(out + 3, tl.sum(n_bad, axis=0))


@triton.jit
def _ev_row_stats(part_ptr, row, n_segments):
    """``(count, threshold, z_max, bad)`` of a row from its segments' statistics, reduced in segment
    order so that every program of the row derives the same bits: the threshold ``min(mean, max)``
    (Eq. 7) and the row max (on the support; 0 for an empty row)."""
    p = part_ptr + row * n_segments * 4
    count = tl.load(p)
    total = tl.load(p + 1)
    top = tl.load(p + 2)
    n_bad = tl.load(p + 3)
    for s in range(1, n_segments):
        count += tl.load(p + 4 * s)
        total += tl.load(p + 4 * s + 1)
        top = tl.maximum(top, tl.load(p + 4 * s + 2))
        n_bad += tl.load(p + 4 * s + 3)
    threshold = tl.minimum(total / tl.maximum(count, 1.0), top)
    return count, threshold, tl.where(count > 0, top, 0.0), n_bad > 0


@triton.jit
def _ev_fwd_denom_kernel(
    x_ptr, mask_ptr, part_ptr, denom_ptr, n_cols, n_segments, level, shift,
    HAS_MASK: tl.constexpr, TRAIN: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr,
):
    """Split rows, launch 2 of 3: a segment's share of the normalizer (grid walked backwards)."""
    row, seg = split_program(n_segments, True)
    base = row * n_cols
    count, threshold, z_max, bad = _ev_row_stats(part_ptr, row, n_segments)
    denom = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        z = _ev_support_logits(x_ptr, mask_ptr, base, cols, inb, level, shift, threshold, HAS_MASK, TRAIN)
        denom += tl.exp(z - z_max)
    tl.store(denom_ptr + row * n_segments + seg, tl.sum(denom, axis=0))


@triton.jit
def _ev_fwd_out_kernel(
    x_ptr, mask_ptr, part_ptr, denom_ptr, out_ptr, n_cols, n_segments, level, shift,
    HAS_MASK: tl.constexpr, TRAIN: tl.constexpr, LOG: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr,
):
    """Split rows, launch 3 of 3: the output of a segment."""
    row, seg = split_program(n_segments, False)
    base = row * n_cols
    count, threshold, z_max, bad = _ev_row_stats(part_ptr, row, n_segments)
    log_denom = tl.log(_row_total(denom_ptr, row, n_segments))
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        z = _ev_support_logits(x_ptr, mask_ptr, base, cols, inb, level, shift, threshold, HAS_MASK, TRAIN)
        if LOG:
            out = tl.where(count > 0, z - z_max - log_denom, float("-inf"))
        else:
            out = tl.where(count > 0, tl.exp(z - z_max - log_denom), 0.0)
        out = tl.where(bad, float("nan"), out)
        tl.store(out_ptr + base + cols, out.to(out_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _ev_support_logits(x_ptr, mask_ptr, base, cols, inb, level, shift, threshold,
                       HAS_MASK: tl.constexpr, TRAIN: tl.constexpr):
    """A chunk's logits with the support rule applied: off the support -inf (Eq. 7) or shifted
    by ``log(eps / (1 + eps))`` (Eq. 10); not there -inf."""
    x, there = load_there(x_ptr, mask_ptr, base + cols, inb, level, HAS_MASK)
    xt = tl.where(there, x, float("-inf"))
    if TRAIN:
        z = tl.where(xt >= threshold, xt, xt + shift)
    else:
        z = tl.where(xt >= threshold, xt, float("-inf"))
    return z


@triton.jit
def _grad_and_out(grad_ptr, out_ptr, offs, inb, LOG: tl.constexpr):
    """The incoming gradient and the saved output, float32; for the log form the gradient of a
    ``-inf`` output (a constant) is dropped."""
    g = tl.load(grad_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    if LOG:
        out = tl.load(out_ptr + offs, mask=inb, other=float("-inf")).to(tl.float32)
        g = tl.where(out == float("-inf"), 0.0, g)
    else:
        out = tl.load(out_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    return g, out


@triton.jit
def _ev_softmax_bwd_partial_kernel(out_ptr, grad_ptr, part_ptr, n_cols, n_segments,
                                   LOG: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """Split rows, launch 1 of 2: each segment's sum of ``g`` (log) or of ``g * out``."""
    row, seg = split_program(n_segments, False)
    base = row * n_cols
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        g, out = _grad_and_out(grad_ptr, out_ptr, base + cols, inb, LOG)
        if LOG:
            acc += g
        else:
            acc += g * out
    tl.store(part_ptr + row * n_segments + seg, tl.sum(acc, axis=0))


@triton.jit
def _row_total(part_ptr, row, n_segments):
    """The sum of a row's per-segment partials, always in segment order: every program of the row
    gets the same bits (no tree whose shape the compiler chooses)."""
    total = tl.load(part_ptr + row * n_segments)
    for s in range(1, n_segments):
        total += tl.load(part_ptr + row * n_segments + s)
    return total


@triton.jit
def _ev_softmax_bwd_split_kernel(out_ptr, grad_ptr, part_ptr, dx_ptr, n_cols, n_segments,
                                 LOG: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """Split rows, launch 2 of 2: ``dx`` of a segment from the row's total (grid walked backwards)."""
    row, seg = split_program(n_segments, True)
    base = row * n_cols
    total = _row_total(part_ptr, row, n_segments)
    for start in range(0, SEGMENT, BLOCK):
        cols, inb = segment_chunk(seg, start, n_cols, SEGMENT, BLOCK)
        g, out = _grad_and_out(grad_ptr, out_ptr, base + cols, inb, LOG)
        if LOG:
            dx = g - tl.exp(out) * total
        else:
            dx = out * (g - total)
        tl.store(dx_ptr + base + cols, dx.to(dx_ptr.dtype.element_ty), mask=inb)


def supports(x: Tensor) -> bool:
    """Whether :func:`ev_softmax_forward` runs a kernel on ``x`` (device, dtype, row length)."""
    from ._common import _DTYPES, runnable_on

    return x.dtype in _DTYPES and runnable_on(x) and x.dim() > 0 and x.shape[-1] > 0


def ev_softmax_forward(
    x: Tensor, eps: Optional[float] = None, log: bool = False, mask: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """ev-softmax of the rows of ``x`` (last dim): the reference's ``ev_softmax_forward(x, eps, log)``.

    ``eps=None`` or ``0``: Eq. 7 (log: ``-inf`` off the support); ``eps > 0``: Eq. 10 (log: its
    log). ``mask`` (bool, broadcastable to ``x``, True = keep) is optional. The not-there level is
    ``finfo(x.dtype).min / 2``. Returns a contiguous tensor of ``x``'s shape in ``out_dtype``
    (default ``x.dtype``), computed in float32.
    """
    check_tensor(x, "x")
    if eps is not None and not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number >= 0 or None, got {eps}")
    out_dtype = out_dtype or x.dtype
    x2, m2 = as_rows(x, mask)
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if x2.numel():
        train = eps is not None and eps > 0
        shift = math.log(eps) - math.log1p(eps) if train else 0.0
        n_rows, n_cols = x2.shape
        m2 = m2 if m2 is not None else x2  # an unused pointer without a mask
        flags = dict(HAS_MASK=m2 is not x2, TRAIN=train, LOG=bool(log))
        if n_cols <= TILE_COLS:
            row_launch(_ev_softmax_fwd_kernel, x2, (x2, m2, out, n_rows, n_cols, not_there_level(x.dtype), shift),
                       **flags)
        else:
            n_segments, grid, sizes = split_grid(n_rows, n_cols, SEGMENT, CHUNK)
            part = torch.empty(n_rows, n_segments, 4, dtype=torch.float32, device=x.device)
            denom = torch.empty(n_rows, n_segments, dtype=torch.float32, device=x.device)
            level = not_there_level(x.dtype)
            meta = dict(HAS_MASK=flags["HAS_MASK"], num_warps=8, **sizes)
            _ev_fwd_stats_kernel[grid](x2, m2, part, n_cols, n_segments, level, **meta)
            _ev_fwd_denom_kernel[grid](x2, m2, part, denom, n_cols, n_segments, level, shift, TRAIN=train, **meta)
            _ev_fwd_out_kernel[grid](x2, m2, part, denom, out, n_cols, n_segments, level, shift, TRAIN=train,
                                     LOG=bool(log), **meta)
    return out.view(x.shape)


def ev_softmax_backward(grad: Tensor, out: Tensor, log: bool = False) -> Tensor:
    """The input gradient from the saved output ``out`` (rows along the last dim): softmax's
    backward ``out * (g - sum(g out))``, or for ``log=True`` log-softmax's ``g - exp(out) sum(g)``
    with ``g`` zeroed where ``out`` is ``-inf``. Returns ``out``'s dtype and shape."""
    check_tensor(out, "out")
    check_tensor(grad, "grad")
    grad = grad.expand_as(out)
    out2, _ = as_rows(out, None)
    g2, _ = as_rows(grad, None)
    dx = torch.empty(out2.shape, dtype=out.dtype, device=out.device)
    if out2.numel():
        n_rows, n_cols = out2.shape
        if n_cols <= TILE_COLS:
            row_launch(_ev_softmax_bwd_kernel, out2, (out2, g2, dx, n_rows, n_cols), LOG=bool(log))
        else:
            n_segments, grid, sizes = split_grid(n_rows, n_cols, SEGMENT, CHUNK)
            part = torch.empty(n_rows, n_segments, dtype=torch.float32, device=out.device)
            meta = dict(LOG=bool(log), num_warps=8, **sizes)
            _ev_softmax_bwd_partial_kernel[grid](out2, g2, part, n_cols, n_segments, **meta)
            _ev_softmax_bwd_split_kernel[grid](out2, g2, part, dx, n_cols, n_segments, **meta)
    return dx.view(out.shape)
