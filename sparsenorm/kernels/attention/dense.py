"""The dense attention path: the L x S weights of any normalizer (a function of the scores), with
weights, dropout and float-mask gradients; what ``backend="dense"`` runs and ``"auto"`` falls back to."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._validation import compute_dtype
from .call import AttentionCall, expand_heads, kernel_mask


def dense_attention(fn: Callable[..., Tensor], call: AttentionCall, dropout_p: float = 0.0):
    """``(out, weights, support, valid)`` with the L x S weights ``fn(scores, dim=-1)``; every
    normalizer (a function of the scores). Not-there keys are ``-inf`` for ``fn``; a row with no
    valid key is given zeros (no normalizer sees an all ``-inf`` row) and, through ``masked_fill``,
    no gradient."""
    q, k, v = call.q.to(compute_dtype(call.q)), expand_heads(call.q, call.k), expand_heads(call.q, call.v)
    k, v = k.to(q.dtype), v.to(q.dtype)
    S = call.scores_shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)) * call.scale
    if call.bias is not None:
        scores = scores + call.bias.to(q.dtype)
    keep = kernel_mask(call, "dense")
    if keep is None:
        weights = fn(scores, dim=-1)
    else:
        empty = ~keep.any(-1, keepdim=True)
        weights = fn(scores.masked_fill(~keep, float("-inf")).masked_fill(empty, 0.0), dim=-1)
        weights = weights.masked_fill(empty, 0.0)
    support = valid = None
    if call.count_support:
        support = (weights != 0).sum(-1)
        valid = (keep.expand(call.scores_shape).sum(-1) if keep is not None
                 else torch.full((), S, dtype=torch.long, device=q.device))
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p, training=True)
    return torch.matmul(weights, v), weights, support, valid


__all__ = ["dense_attention"]
