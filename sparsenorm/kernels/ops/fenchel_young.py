"""The Fenchel--Young loss on the op layer: its ``autograd.Function`` (per-row loss
``H(p*) - H(q) + <p* - q, z>``, closed-form backward ``p* - q`` and the gradient w.r.t. ``alpha``)
and the Tsallis entropies it uses; :mod:`sparsenorm.losses.fenchel_young` validates, computes
``p*`` and reduces."""
from __future__ import annotations

from typing import Union

import torch
from torch import Tensor
from torch.autograd import Function

from ..reference.projection import sqrt_nonneg


# ----------------------------------------------------------------------------- entropies

def tsallis_entropy(p: Tensor, alpha: Union[float, Tensor]) -> Tensor:
    """``H_alpha(p) = (1 - sum p^alpha) / (alpha (alpha - 1))`` over the last dim; Shannon at 1.

    ``alpha`` is a float or a tensor of shape ``(M, 1)`` for ``p`` of shape ``(M, C)``.
    """
    on = p > 0
    p_on = torch.where(on, p, torch.ones_like(p))
    shannon = -torch.where(on, p * torch.log(p_on), torch.zeros_like(p)).sum(-1)
    if not isinstance(alpha, Tensor):
        if alpha == 1:
            return shannon
        if alpha == 2:
            return (1 - (p * p).sum(-1)) / 2
        if alpha == 1.5:
            return (1 - (p * sqrt_nonneg(p)).sum(-1)) / 0.75
        alpha = torch.tensor(float(alpha), dtype=p.dtype, device=p.device)
    a = alpha.reshape(-1) if alpha.dim() else alpha
    a_safe = torch.where(a == 1, torch.full_like(a, 2.0), a)
    powsum = torch.where(on, p_on ** a_safe.unsqueeze(-1) if a.dim() else p_on ** a_safe, torch.zeros_like(p)).sum(-1)
    tsallis = (1 - powsum) / (a_safe * (a_safe - 1))
    return torch.where(a == 1, shannon, tsallis)


def _tsallis_entropy_dalpha(p: Tensor, a: Tensor) -> Tensor:
    """``d H_alpha(p) / d alpha`` at fixed ``p`` (rows of ``p``; ``a`` of shape (M,)); 0 at alpha = 1."""
    on = p > 0
    p_on = torch.where(on, p, torch.ones_like(p))
    a_safe = torch.where(a == 1, torch.full_like(a, 2.0), a)
    pa = torch.where(on, p_on ** a_safe.unsqueeze(-1), torch.zeros_like(p))
    num_a = 1 - pa.sum(-1)
    d_num = -(pa * torch.log(p_on)).sum(-1)
    den = a_safe * (a_safe - 1)
    d = (d_num * den - num_a * (2 * a_safe - 1)) / den ** 2
    return torch.where(a == 1, torch.zeros_like(d), d)


class FenchelYoungLossFunction(Function):
    """Per-row ``H(p*) - H(q) + <p* - q, z>`` with backward ``p* - q`` (and d/d alpha); ``p`` is
    ``p*(z)``, computed by the caller without a graph."""

    @staticmethod
    def forward(ctx, z: Tensor, q: Tensor, alpha: Union[float, Tensor], p: Tensor) -> Tensor:
        diff = p - q
        # Shift by the row max: <p - q, z> is unchanged (both sum to 1) and large logits keep
        # their precision. 0 * (-inf) for absent classes is 0, not NaN.
        row_max = z.amax(-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        inner = torch.where(diff != 0, diff * (z - row_max), torch.zeros_like(diff)).sum(-1)
        loss = tsallis_entropy(p, alpha) - tsallis_entropy(q, alpha) + inner
        # Rounding can make a perfect prediction give -1e-17; the exact loss is >= 0.
        loss = loss.clamp_min(0)
        ctx.alpha_is_tensor = isinstance(alpha, Tensor)
        if ctx.alpha_is_tensor:
            ctx.save_for_backward(diff, p, q, alpha)
        else:
            ctx.save_for_backward(diff)
        return loss

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        diff = ctx.saved_tensors[0]
        grad_z = grad_output.unsqueeze(-1) * diff
        grad_alpha = None
        if ctx.alpha_is_tensor and ctx.needs_input_grad[2]:
            _, p, q, alpha = ctx.saved_tensors
            a = alpha.reshape(-1).expand(p.shape[0]) if alpha.dim() else alpha.expand(p.shape[0])
            # Danskin: only H_alpha's explicit dependence on alpha counts at the optimum p*.
            d = _tsallis_entropy_dalpha(p, a) - _tsallis_entropy_dalpha(q, a)
            grad_alpha = (grad_output * d).sum_to_size(alpha.shape) if alpha.dim() else (grad_output * d).sum()
        return grad_z, None, grad_alpha, None
