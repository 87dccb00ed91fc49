"""The alpha-entmax terms of the fused linear + loss (:mod:`.linear_loss`), in units of the logits ``z``."""
from __future__ import annotations

from torch import Tensor


def p_of(u: Tensor, alpha: float) -> Tensor:
    """``p = [(alpha - 1) u]_+^{1/(alpha - 1)}`` for ``u = z - t`` (in units of ``z``)."""
    u = u.clamp_min(0)
    if alpha == 2.0:
        return u
    if alpha == 1.5:
        return (u * 0.5).square_()
    return (u * (alpha - 1)).pow_(1 / (alpha - 1))


def threshold_from(p_max: Tensor, z_max: Tensor, alpha: float) -> Tensor:
    """``t`` from the largest entry: ``p_max = [(alpha - 1)(z_max - t)]^{1/(alpha - 1)}``."""
    if alpha == 2.0:
        return z_max - p_max
    if alpha == 1.5:
        return z_max - 2 * p_max.sqrt()
    return z_max - p_max.pow(alpha - 1) / (alpha - 1)


def tsallis_terms(p: Tensor, alpha: float) -> Tensor:
    """``p^alpha`` entry by entry (the Tsallis entropy is ``(1 - sum p^alpha) / (alpha(alpha-1))``)."""
    if alpha == 2.0:
        return p * p
    if alpha == 1.5:
        return p * p.sqrt()
    return p.pow(alpha)
