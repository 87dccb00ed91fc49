"""The fused linear + loss's block step for softmax and ev-softmax on CUDA: a block of whole vocabulary
rows of logits -> each row's loss, ``log Z`` and threshold, and the block turned in place into the
gradient ``w_r (p - e_y)`` -- what ``kernels/reference/linear_loss.dense_block_`` computes, in one
kernel (the role of Liger-Kernel's cross-entropy kernel in its fused linear cross-entropy).

One program per row, streaming it in chunks of ``BLOCK`` entries: the max; with ``EV`` the threshold
``t = min(thr, max)`` and Eq. 10's log-weights (``z + log(eps/(1+eps))`` below ``t``); the sum of
``exp(z - max)``; then, with ``GRAD``, the gradient written over the logits. float32 logits (the
fused op's compute dtype); not-there entries are ``-inf`` already.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import check_tensor

BLOCK = 4096


@triton.jit
def _weighted(z, t, shift, EV: tl.constexpr):
    if EV:
        z = tl.where(z >= t, z, z + shift)
    return z


@triton.jit
def _block_rows_kernel(z_ptr, thr_ptr, y_ptr, w_ptr, wy_ptr, loss_ptr, lse_ptr, t_ptr, n_cols, shift,
                       EV: tl.constexpr, GRAD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = row.to(tl.int64) * n_cols
    top = tl.full((BLOCK,), float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        top = tl.maximum(top, tl.load(z_ptr + base + cols, mask=cols < n_cols, other=float("-inf")))
    m = tl.max(top, axis=0)
    if EV:
        t = tl.minimum(tl.load(thr_ptr + row), m)
    else:
        t = m
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(z_ptr + base + cols, mask=cols < n_cols, other=float("-inf"))
        acc += tl.exp(_weighted(z, t, shift, EV) - m_safe)
    lse = m_safe + tl.log(tl.sum(acc, axis=0))
    y = tl.load(y_ptr + row)
    zy = _weighted(tl.load(z_ptr + base + y), t, shift, EV)
    tl.store(loss_ptr + row, lse - zy)
    tl.store(lse_ptr + row, lse)
    if EV:
        tl.store(t_ptr + row, t)
    else:
        tl.store(t_ptr + row, lse)
    if GRAD:
        w = tl.load(w_ptr + row)
        wy = tl.load(wy_ptr + row)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inb = cols < n_cols
            z = tl.load(z_ptr + base + cols, mask=inb, other=float("-inf"))
            g = tl.exp(_weighted(z, t, shift, EV) - lse) * w
            g = tl.where(cols == y, g - wy, g)
            tl.store(z_ptr + base + cols, g, mask=inb)


def block_rows(z: Tensor, thr: Optional[Tensor], y: Tensor, w: Tensor, wy: Tensor, ev: bool, shift: float,
               grad: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """``(loss, log Z, t)`` per row of the float32 block ``z`` (rows, V), contiguous; with ``grad``,
    ``z`` is overwritten by the gradient (the signature of ``reference.linear_loss.dense_block_``)."""
    check_tensor(z, "z", (torch.float32,))
    if not z.is_contiguous():
        raise ValueError("z must be contiguous (a block of whole vocabulary rows)")
    n_rows, n_cols = z.shape
    loss, lse, t = (torch.empty(n_rows, dtype=torch.float32, device=z.device) for _ in range(3))
    if n_rows:
        thr_arg = thr.to(torch.float32).contiguous() if ev else lse
        _block_rows_kernel[(n_rows,)](z, thr_arg, y.contiguous(), w.to(torch.float32).contiguous(),
                                     wy.to(torch.float32).contiguous(), loss, lse, t, n_cols, float(shift),
                                     EV=bool(ev), GRAD=bool(grad), BLOCK=BLOCK, num_warps=8)
    return loss, lse, t


def supports(z: Tensor) -> bool:
    """Whether :func:`block_rows` runs on ``z`` (device and dtype)."""
    from ._common import runnable_on

    return z.dtype == torch.float32 and runnable_on(z)
