"""Sparsehourglass (Laha et al. 2018) over the rows of ``x`` (last dim), in pure PyTorch: the
reference of the ``sparsenorm::hourglass_forward`` / ``hourglass_backward`` operators.

``p = sparsemax(alpha z)`` with ``alpha = (1 + qK) / (|sum z| + qK)`` over the ``K`` entries there
(entries at or below ``finfo.min / 2``, ``-inf`` included, are not there: left out of ``sum z``
and ``K``, probability 0; a row with none there has ``alpha = 1`` and gives zeros).

Backward from the forward's outputs (``s`` the support, ``D = |sum z| + qK``)::

    gy      = s (g - mean_s g)                        (sparsemax's backward at alpha z)
    c       = sum_i gy_i z_i
    dL/dz_j = alpha gy_j - c alpha sign(sum z) / D    (entries there; 0 for the others)
    dL/dq   = c K (|sum z| - 1) / D^2

written in differentiable ops (double backward runs through it).
"""
from __future__ import annotations

from typing import Callable, Tuple

import torch
from torch import Tensor

from ..._validation import not_there_level
from . import projection as ref_projection


def _absent(x: Tensor) -> Tensor:
    return x <= not_there_level(x.dtype)


def scale_parts(z: Tensor, q, dim: int = -1) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(alpha, absent, K, sum z)`` along ``dim`` (keepdim), over the entries there; a row with
    none there gets ``alpha = 1`` (with no ``1 / 0`` in the graph). Differentiable in ``z``, ``q``."""
    absent = _absent(z)
    k = (~absent).sum(dim, keepdim=True).to(z.dtype)
    total = z.masked_fill(absent, 0.0).sum(dim, keepdim=True)
    qk = q * k
    alpha = (1 + qk) / (total.abs() + qk).masked_fill(k == 0, 1.0)  # k = 0: qk = 0, alpha = 1
    return alpha, absent, k, total


def forward(x: Tensor, q: Tensor, sparsemax: Callable[[Tensor], Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """``(p, alpha, sum z)`` (the last two of shape ``x.shape[:-1] + (1,)``); ``q`` per row.

    ``sparsemax`` of the rows (default: the sync-free sorted reference)."""
    sparsemax = sparsemax or (lambda rows: ref_projection.project_sorted(rows, "sparsemax"))
    alpha, absent, _, total = scale_parts(x, q)
    scaled = (x.masked_fill(absent, 0.0) * alpha).masked_fill(absent, float("-inf"))
    return sparsemax(scaled), alpha, total


def backward(g: Tensor, p: Tensor, x: Tensor, alpha: Tensor, total: Tensor, q: Tensor) -> Tuple[Tensor, Tensor]:
    """``(dL/dx, dL/dq per row)`` of :func:`forward` (see the module docstring)."""
    absent = _absent(x)
    z = x.masked_fill(absent, 0.0)
    gy = ref_projection.dense_backward(p, g, "sparsemax")
    c = (gy * z).sum(-1, keepdim=True)
    k = (~absent).sum(-1, keepdim=True).to(x.dtype)
    d = (total.abs() + q * k).masked_fill(k == 0, 1.0)
    grad = (alpha * gy - c * alpha * torch.sign(total) / d).masked_fill(absent, 0.0)
    grad_q = torch.where(k == 0, torch.zeros_like(c), c * k * (total.abs() - 1) / (d * d))
    return grad, grad_q
