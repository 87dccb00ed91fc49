"""Shape handling and reduction shared by every loss, following ``torch.nn.CrossEntropyLoss``.

Logits are ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)`` (classes on dim 1), with an optional boolean
``mask`` broadcastable to them (True = keep): classes that are not there (``mask == False``,
``-inf``, or ``<= finfo(dtype).min / 2``) are ``-inf`` in the flattened logits, which are in the
compute dtype (float32 for float16/bfloat16). Targets are either class
indices (integer dtype, the logits' shape without the class dim) or a target distribution /
multi-hot vector (floating, the logits' shape). Every loss flattens to ``(M, C)`` rows with
:func:`flatten_logits_and_target`, computes a per-row loss, and finishes with :func:`reduce_loss`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._validation import check_floating, mark_not_there, value_checks_enabled

REDUCTIONS = ("mean", "sum", "none", "elementwise_mean")


@dataclass
class FlatBatch:
    """Logits and target flattened to rows, plus what is needed to undo it."""

    logits: Tensor  # (M, C)
    target_index: Optional[Tensor]  # (M,) long with ignored rows replaced by 0, or None
    target_dist: Optional[Tensor]  # (M, C) floating, or None
    valid: Optional[Tensor]  # (M,) bool: False where target == ignore_index; None for distribution targets
    out_shape: Tuple[int, ...]  # shape of the unreduced loss


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _to_rows(t: Tensor) -> Tensor:
    """(C,) -> (1, C); (N, C, d1, ...) -> (N * d1 * ..., C)."""
    if t.dim() == 1:
        return t.unsqueeze(0)
    return t.movedim(1, -1).reshape(-1, t.shape[1])


def flatten_logits_and_target(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    allow_index: bool = True,
    allow_dist: bool = True,
    logits_name: str = "input",
    target_name: str = "target",
    mask: Optional[Tensor] = None,
) -> FlatBatch:
    """Validate shapes/dtypes and flatten ``logits`` (not-there classes as ``-inf``, compute dtype)
    and ``target`` to rows of classes. Sync-free (value checks of the target run in eager mode
    on CPU only)."""
    check_floating(logits, logits_name)
    if not isinstance(target, Tensor):
        raise TypeError(f"{target_name} must be a torch.Tensor, got {type(target).__name__}")
    if logits.dim() == 0:
        raise ValueError(f"{logits_name} must have a class dimension, got a 0-d tensor")
    if target.device != logits.device:
        raise ValueError(f"{target_name} is on {target.device} but {logits_name} is on {logits.device}")
    logits = mark_not_there(logits, mask)
    class_dim = 0 if logits.dim() == 1 else 1
    n_classes = logits.shape[class_dim]
    if n_classes == 0:
        raise ValueError(f"{logits_name} has no classes (size 0 along dim {class_dim})")

    if target.is_floating_point():
        if not allow_dist:
            raise TypeError(f"{target_name} must hold class indices (an integer tensor), got dtype {target.dtype}")
        if target.shape != logits.shape:
            raise ValueError(
                f"a floating {target_name} is a distribution over classes and must have the "
                f"{logits_name}'s shape {tuple(logits.shape)}, got {tuple(target.shape)}"
            )
        out_shape = tuple(logits.shape[:class_dim]) + tuple(logits.shape[class_dim + 1:])
        dist = _to_rows(target).to(logits.dtype)
        return FlatBatch(_to_rows(logits), None, dist, None, out_shape)

    if target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"{target_name} must be class indices (integer) or a distribution (floating), "
                        f"got {target.dtype}")
    if not allow_index:
        raise TypeError(f"{target_name} must be a floating distribution/multi-hot tensor, got dtype {target.dtype}")
    expected = tuple(logits.shape[:class_dim]) + tuple(logits.shape[class_dim + 1:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"{target_name} of class indices must have shape {expected} for {logits_name} of shape "
            f"{tuple(logits.shape)}, got {tuple(target.shape)}"
        )
    flat_t = target.reshape(-1).long()
    valid = flat_t != ignore_index
    if value_checks_enabled(flat_t):
        checked = flat_t[valid]
        if checked.numel() and (checked.min() < 0 or checked.max() >= n_classes):
            bad = checked[(checked < 0) | (checked >= n_classes)][0].item()
            raise IndexError(
                f"{target_name} contains class index {bad}, outside [0, {n_classes}) (ignore_index={ignore_index})"
            )
    safe_t = flat_t.masked_fill(~valid, 0)
    return FlatBatch(_to_rows(logits), safe_t, None, valid, expected)


def one_hot_like(batch: FlatBatch) -> Tensor:
    """The target as a (M, C) distribution (one-hot rows for class indices)."""
    if batch.target_dist is not None:
        return batch.target_dist
    out = torch.zeros_like(batch.logits)
    return out.scatter_(1, batch.target_index.unsqueeze(1), 1.0)


def class_weight_per_row(batch: FlatBatch, weight: Optional[Tensor]) -> Optional[Tensor]:
    """Per-row weights from a per-class ``weight`` (C,), as CrossEntropyLoss applies them."""
    if weight is None:
        return None
    n_classes = batch.logits.shape[1]
    if weight.dim() != 1 or weight.numel() != n_classes:
        raise ValueError(f"weight must be a 1-D tensor with one entry per class ({n_classes}), "
                         f"got shape {tuple(weight.shape)}")
    weight = weight.to(batch.logits)
    if batch.target_index is not None:
        return weight[batch.target_index]
    # Distribution targets: weight each row by the target-weighted class weight.
    return batch.target_dist @ weight


def reduce_loss(
    per_row: Tensor,
    batch: FlatBatch,
    reduction: str,
    row_weight: Optional[Tensor] = None,
) -> Tensor:
    """Zero ignored rows, weight, and reduce like CrossEntropyLoss.

    'mean' (alias 'elementwise_mean', the ``entmax`` package's name) divides by the total weight of
    the rows that are not ignored (their count when there is no weight). When every row is ignored
    the mean is 0 with a zero gradient (CrossEntropyLoss returns NaN there).
    """
    check_reduction(reduction)
    if batch.valid is not None:
        per_row = per_row.masked_fill(~batch.valid, 0.0)
    if row_weight is not None:
        per_row = per_row * row_weight
    if reduction == "none":
        return per_row.reshape(batch.out_shape)
    total = per_row.sum()
    if reduction == "sum":
        return total
    if row_weight is not None:
        denom = row_weight if batch.valid is None else row_weight.masked_fill(~batch.valid, 0.0)
        denom = denom.sum()
    else:
        denom = (per_row.new_tensor(float(per_row.numel())) if batch.valid is None
                 else batch.valid.sum().to(per_row.dtype))
    # total is 0 when denom is 0 (all rows ignored), so dividing by 1 there gives 0, not NaN.
    return total / torch.where(denom == 0, torch.ones_like(denom), denom)
