"""Sparsehourglass (Laha, Chemmengath, Agrawal, Khapra, Sankaranarayanan, Ramaswamy,
"On Controllable Sparse Alternatives to Softmax", NeurIPS 2018).

``sparsehourglass(z) = sparsemax(alpha(z) * z)`` with ``alpha(z) = (1 + q K) / (|sum_i z_i| + q K)``
(formulas in ``shared/papers/README.md``). The scale ``alpha`` is computed here with plain
differentiable torch ops, so the gradient through ``alpha(z)`` comes from autograd composed with
sparsemax's closed-form backward (``sparsenorm.entmax``).
"""
from __future__ import annotations

from typing import Optional, Union

from torch import Tensor, nn

from ._validation import check_param, normalize, not_there_level
from .entmax import sparsemax

Param = Union[float, int, Tensor]


def hourglass_scale(z: Tensor, q: Param = 1.0, dim: int = -1) -> Tensor:
    """``alpha(z) = (1 + q K) / (|sum z| + q K)`` over the entries of each row that are there (keepdim).

    Entries that are not there (``-inf`` or ``<= finfo(dtype).min / 2``) are left out of both
    ``sum z`` and ``K``, so padding a row does not change the result (counting them would make
    the sum ``-inf`` and ``alpha`` 0). A row with no entry there gets ``alpha = 1``. ``q`` is a
    number or a tensor broadcastable to the keepdim row shape. Sync-free.
    """
    return _scale_and_mask(z, q, dim)[0]


def _scale_and_mask(z: Tensor, q: Param, dim: int):
    """``(alpha, absent)``: the scale, and the mask of the entries that are not there."""
    absent = z <= not_there_level(z.dtype)
    k = (~absent).sum(dim, keepdim=True).to(z.dtype)
    total = z.masked_fill(absent, 0.0).sum(dim, keepdim=True)
    qk = q * k
    denom = (total.abs() + qk).masked_fill(k == 0, 1.0)  # then qk = 0 too: alpha = 1, no 1/0 in the graph
    return (1 + qk) / denom, absent


def _sparsehourglass_rows(z: Tensor, q: Param) -> Tensor:
    alpha, absent = _scale_and_mask(z, q, -1)
    # Not-there entries stay -inf, but multiply finite values only: d(z * alpha)/d alpha = z would
    # put 0 * -inf = NaN into alpha's gradient.
    scaled = (z.masked_fill(absent, 0.0) * alpha).masked_fill(absent, float("-inf"))
    return sparsemax(scaled, dim=-1)


def sparsehourglass(x: Tensor, q: Param = 1.0, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    r"""Sparsehourglass (Laha et al. 2018): sparsemax of the rescaled scores ``alpha(z) z``.

    .. math:: \mathrm{sparsehg}(z) = \mathrm{sparsemax}(\alpha(z) z), \quad
              \alpha(z) = \frac{1 + qK}{|\sum_i z_i| + qK}

    ``q > 0`` controls sparsity: ``q -> inf`` gives ``alpha -> 1`` (sparsemax); small ``q``
    gives a large ``alpha`` (sparser) near ``sum z = 0`` and a small one (denser) for large
    ``|sum z|``. ``alpha`` uses ``|sum z|``, so the map is **not** translation invariant
    (sparsemax is); it is permutation equivariant and scale-free only through ``alpha``.

    Args:
        x: floating tensor of scores.
        q: ``q > 0``; a number, or a tensor broadcastable to ``x`` with size 1 along ``dim``
            (per row), or one value per row. A tensor ``q`` with ``requires_grad`` gets a
            gradient (autograd).
        dim: dimension to normalize over.
        mask: optional boolean tensor broadcastable to ``x``; True = keep.

    Edge cases: entries that are not there (``-inf``, ``mask == False`` or ``<= finfo(dtype).min
    / 2``) get exactly 0 and are excluded from ``sum z`` and from ``K`` (so padding/masking leaves
    the other entries' output unchanged); a row with no entry there returns zeros with zero
    gradient; NaN in a row gives NaN in that row; float16/bfloat16 are computed in float32 and
    returned in the input dtype. ``q <= 0`` raises ``ValueError``; a non-floating ``x`` raises
    ``TypeError``. Gradient: autograd through ``alpha`` composed with sparsemax's closed-form
    backward.
    """
    check_param(q, "q", low=0.0, low_inclusive=False)
    return normalize(_sparsehourglass_rows, x, dim, mask, params={"q": q})


class SparseHourglass(nn.Module):
    """Sparsehourglass as a module: ``SparseHourglass(q=1.0, dim=-1)``; ``forward(x, mask=None)``."""

    def __init__(self, q: float = 1.0, dim: int = -1):
        super().__init__()
        check_param(q, "q", low=0.0, low_inclusive=False)
        self.q = float(q)
        self.dim = dim

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return sparsehourglass(x, q=self.q, dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"q={self.q}, dim={self.dim}"
