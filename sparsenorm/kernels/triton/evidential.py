"""Row-wise ev-softmax kernels: Eq. 7, Eq. 10 and the log of Eq. 10, forward and backward.

One program normalizes a tile of ``ROWS`` rows of ``BLOCK >= n_cols`` entries held in registers:
one read and one write per entry, as ``torch.softmax``. The rules are those of the reference
(``kernels/reference/evidential.py``): an entry is not there when it is ``-inf``, masked out, or at
or below ``finfo(input dtype).min / 2``; the threshold is ``min(mean, max)`` over the entries that
are there (ties kept, ``>=``); Eq. 10 weighs the off-support entries by ``eps / (1 + eps)`` (a
log-shift, Eq. 10 up to the normalizer); a row with no entry there gives zeros (log: ``-inf``); a
row holding NaN or ``+inf`` gives NaN in that row only. Inputs float32/float16/bfloat16, computed
in float32, written in ``out_dtype``.

The backward is softmax's (resp. log-softmax's) on the saved output (Eq. 9): the support
indicator and Eq. 10's shift are piecewise constant. Log form: a ``-inf`` output (not there, or
off the support with ``eps = 0``) is constant, so its incoming gradient is dropped.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import check_tensor, not_there_level
from ._rows import as_rows, row_launch

MAX_COLS = 1 << 15
"""The longest row these kernels hold in registers; :func:`supports` is False beyond it."""


@triton.jit
def _ev_softmax_fwd_kernel(
    x_ptr, mask_ptr, out_ptr, n_rows, n_cols, level, shift,
    HAS_MASK: tl.constexpr, TRAIN: tl.constexpr, LOG: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    inb = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=inb, other=float("-inf")).to(tl.float32)
    there = inb & ~(x <= level)  # NaN is there, so it reaches its row's output
    if HAS_MASK:
        there = there & (tl.load(mask_ptr + offs, mask=inb, other=0) != 0)
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
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    inb = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    g = tl.load(grad_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    if LOG:
        out = tl.load(out_ptr + offs, mask=inb, other=float("-inf")).to(tl.float32)
        g = tl.where(out == float("-inf"), 0.0, g)
        dx = g - tl.exp(out) * tl.sum(g, axis=1)[:, None]
    else:
        out = tl.load(out_ptr + offs, mask=inb, other=0.0).to(tl.float32)
        dx = out * (g - tl.sum(g * out, axis=1)[:, None])
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=inb)


def supports(x: Tensor) -> bool:
    """Whether :func:`ev_softmax_forward` runs a kernel on ``x`` (device, dtype, row length)."""
    from ._common import _DTYPES, runnable_on

    return x.dtype in _DTYPES and runnable_on(x) and x.dim() > 0 and 0 < x.shape[-1] <= MAX_COLS


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
    x2, m2 = as_rows(x, mask, MAX_COLS)
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if x2.numel():
        train = eps is not None and eps > 0
        shift = math.log(eps) - math.log1p(eps) if train else 0.0
        row_launch(_ev_softmax_fwd_kernel, x2, (x2, m2 if m2 is not None else x2, out, x2.shape[0], x2.shape[1],
                   not_there_level(x.dtype), shift), HAS_MASK=m2 is not None, TRAIN=train, LOG=bool(log))
    return out.view(x.shape)


def ev_softmax_backward(grad: Tensor, out: Tensor, log: bool = False) -> Tensor:
    """The input gradient from the saved output ``out`` (rows along the last dim): softmax's
    backward ``out * (g - sum(g out))``, or for ``log=True`` log-softmax's ``g - exp(out) sum(g)``
    with ``g`` zeroed where ``out`` is ``-inf``. Returns ``out``'s dtype and shape."""
    check_tensor(out, "out")
    check_tensor(grad, "grad")
    grad = grad.expand_as(out)
    out2, _ = as_rows(out, None, MAX_COLS)
    g2, _ = as_rows(grad, None, MAX_COLS)
    dx = torch.empty(out2.shape, dtype=out.dtype, device=out.device)
    if out2.numel():
        row_launch(_ev_softmax_bwd_kernel, out2, (out2, g2, dx, out2.shape[0], out2.shape[1]), LOG=bool(log))
    return dx.view(out.shape)
