"""Row layout and launch sizes shared by the row-wise kernels."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET


def as_rows(x: Tensor, mask: Optional[Tensor], max_cols: Optional[int] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """``x`` as contiguous (rows, n_cols) along its last dim, and ``mask`` (bool, broadcastable to
    ``x``) as contiguous uint8 of the same shape (or None)."""
    n_cols = x.shape[-1] if x.dim() else 1
    if max_cols is not None and n_cols > max_cols:
        raise ValueError(f"x has rows of {n_cols} entries; the Triton row kernels take at most {max_cols}")
    x2 = x.reshape(-1, n_cols).contiguous()
    if mask is None:
        return x2, None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError("mask must be a boolean tensor (True = keep)")
    try:
        mask = mask.expand(x.shape)
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to x's shape "
                         f"{tuple(x.shape)}") from None
    return x2, mask.reshape(-1, n_cols).contiguous().view(torch.uint8)


def tile(n_cols: int) -> Tuple[int, int, int]:
    """``(ROWS, BLOCK, num_warps)``: a power-of-two row block holding a whole row, and enough rows
    per program that a tile has ~2048 entries (short rows), as the fused-softmax tutorial sizes it."""
    block = triton.next_power_of_2(max(n_cols, 1))
    target = 256 if INTERPRET else 2048
    rows = max(1, min(64, target // block))
    entries = rows * block
    warps = 4 if entries <= 2048 else 8 if entries <= 8192 else 16
    return rows, block, warps


def row_launch(kernel, x2: Tensor, args: tuple, **constexprs) -> None:
    rows, block, warps = tile(x2.shape[1])
    grid = (triton.cdiv(x2.shape[0], rows),)
    kernel[grid](*args, ROWS=rows, BLOCK=block, num_warps=warps, **constexprs)


@triton.jit
def row_tile(n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """This program's tile of ``ROWS`` whole rows: ``(offsets, in_bounds)``, both (ROWS, BLOCK)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    return rows[:, None] * n_cols + cols[None, :], (rows[:, None] < n_rows) & (cols[None, :] < n_cols)


def split_grid(n_rows: int, n_cols: int, segment: int, chunk: int) -> Tuple[int, Tuple[int], dict]:
    """``(n_segments, grid, sizes)`` of a split-row launch: every row cut into ``n_segments``
    segments of ``segment`` entries (the last one ragged), one program per (row, segment),
    row-major, each streaming its segment in chunks of ``chunk``; ``sizes`` holds the kernels'
    ``SEGMENT`` and ``BLOCK``. A segment longer than the row is cut to the row (rounded up to a
    chunk), so a program never loops over chunks that are wholly past the row's end."""
    block = min(chunk, segment)
    segment = min(segment, triton.cdiv(n_cols, block) * block)
    n_segments = triton.cdiv(n_cols, segment)
    return n_segments, (n_rows * n_segments,), dict(SEGMENT=segment, BLOCK=block)


@triton.jit
def split_program(n_segments, REVERSE: tl.constexpr):
    """This program's ``(row, segment)`` in a :func:`split_grid` launch. ``REVERSE`` walks the grid
    from its end: a pass that re-reads what the previous pass read last finds it in the L2 cache."""
    pid = tl.program_id(0)
    if REVERSE:
        pid = tl.num_programs(0) - 1 - pid
    row = pid // n_segments
    return row.to(tl.int64), pid - row * n_segments


@triton.jit
def segment_chunk(seg, start, n_cols, SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """``(cols, in_bounds)`` of the chunk at ``start`` within segment ``seg`` (``BLOCK`` need not
    divide ``SEGMENT``: the mask keeps a chunk inside its segment)."""
    offs = start + tl.arange(0, BLOCK)
    cols = seg * SEGMENT + offs
    return cols, (cols < n_cols) & (offs < SEGMENT)


@triton.jit
def load_there(x_ptr, mask_ptr, offs, inb, level, HAS_MASK: tl.constexpr):
    """``(x, there)`` at ``offs``: the entries in float32 (``-inf`` out of bounds) and whether each is
    there -- in bounds, above the not-there ``level`` (``finfo(input dtype).min / 2``; NaN is there,
    so it reaches its row's output) and kept by the mask (uint8, read only with ``HAS_MASK``)."""
    x = tl.load(x_ptr + offs, mask=inb, other=float("-inf")).to(tl.float32)
    there = inb & ~(x <= level)
    if HAS_MASK:
        there = there & (tl.load(mask_ptr + offs, mask=inb, other=0) != 0)
    return x, there
