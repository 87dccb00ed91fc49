"""Sparsehourglass (Laha, Chemmengath, Agrawal, Khapra, Sankaranarayanan, Ramaswamy,
"On Controllable Sparse Alternatives to Softmax", NeurIPS 2018).

``sparsehourglass(z) = sparsemax(alpha(z) * z)`` with ``alpha(z) = (1 + q K) / (|sum_i z_i| + q K)``
(formulas in ``shared/papers/README.md``). This module validates and calls the op layer
(``sparsenorm.kernels.ops.hourglass``: the registered operators ``sparsenorm::hourglass_forward`` /
``hourglass_backward``, a fused C++ kernel on CPU where built, else the reference
``kernels/reference/hourglass.py``, and their autograd), which computes the map and its
closed-form backward, the gradient through ``alpha(z)`` included; double backward runs through the
reference's differentiable formula.
"""
from __future__ import annotations

from typing import Optional, Union

from torch import Tensor, nn

from ._validation import check_param, run_on_rows
from .kernels.ops import hourglass as ops
from .kernels.reference import hourglass as ref_hourglass

Param = Union[float, int, Tensor]


def hourglass_scale(z: Tensor, q: Param = 1.0, dim: int = -1) -> Tensor:
    """``alpha(z) = (1 + q K) / (|sum z| + q K)`` over the entries of each row that are there (keepdim).

    Entries that are not there (``-inf`` or ``<= finfo(dtype).min / 2``) are left out of both
    ``sum z`` and ``K``, so padding a row does not change the result (counting them would make
    the sum ``-inf`` and ``alpha`` 0). A row with no entry there gets ``alpha = 1``. ``q`` is a
    number or a tensor broadcastable to the keepdim row shape. Sync-free.
    """
    return ref_hourglass.scale_parts(z, q, dim)[0]


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
    ``TypeError``. Gradient: closed form, through ``alpha`` included (module docstring);
    double backward works.
    """
    check_param(q, "q", low=0.0, low_inclusive=False)
    return run_on_rows(ops.sparsehourglass_rows, x, dim, mask, params={"q": q})


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
