"""Argument checks and dtype/mask handling shared by every normalizer.

Each public function calls these first, so that bad input fails here with a message that names
the argument, never deep inside a kernel.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def check_floating(x: Tensor, name: str = "X") -> None:
    """Raise ``TypeError`` unless ``x`` is a floating-point tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def normalize_dim(x: Tensor, dim: int, name: str = "dim") -> int:
    """Return ``dim`` as a non-negative index, raising ``IndexError`` naming ``dim`` if out of range."""
    if not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"{name}={dim} is out of range for a tensor with {x.dim()} dimensions")
    return dim % ndim


def compute_dtype(x: Tensor) -> torch.dtype:
    """float16 and bfloat16 are computed in float32 (then cast back); other dtypes as they are."""
    return torch.float32 if x.dtype in _LOW_PRECISION else x.dtype


def upcast(x: Tensor) -> Tensor:
    return x.to(compute_dtype(x))


def apply_mask(x: Tensor, mask: Optional[Tensor], dim: int, name: str = "mask") -> Tensor:
    """Return ``x`` with entries where ``mask`` is False set to ``-inf`` (True = keep).

    ``mask`` must be boolean and broadcastable to ``x``. ``-inf`` means "not there" for every
    normalizer in sparsenorm, so a boolean mask and ``-inf`` padding behave the same way.
    """
    if mask is None:
        return x
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a boolean tensor (True = keep), got {got}")
    try:
        torch.broadcast_shapes(mask.shape, x.shape)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the input's shape {tuple(x.shape)}"
        ) from None
    return x.masked_fill(~mask, float("-inf"))


Number = Union[float, int, Tensor]


def check_param(
    value: Number,
    name: str,
    *,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise ``ValueError`` naming ``name`` if ``value`` (number or tensor) leaves the given range.

    NaN parameters are rejected too: a NaN ``t`` or ``r`` is a bug in the caller, not data.
    """
    if isinstance(value, Tensor):
        if value.numel() == 0:
            return
        v = value.detach()
        if torch.isnan(v).any():
            raise ValueError(f"{name} contains NaN")
        vmin, vmax = float(v.min()), float(v.max())
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")
        if value != value:
            raise ValueError(f"{name} is NaN")
        vmin = vmax = float(value)
    if low is not None and (vmin < low or (not low_inclusive and vmin == low)):
        op = ">=" if low_inclusive else ">"
        raise ValueError(f"{name} must be {op} {low}, got {vmin}")
    if high is not None and (vmax > high or (not high_inclusive and vmax == high)):
        op = "<=" if high_inclusive else "<"
        raise ValueError(f"{name} must be {op} {high}, got {vmax}")
