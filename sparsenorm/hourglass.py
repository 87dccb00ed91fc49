"""Sparsehourglass (Laha, Chemmengath, Agrawal, Khapra, Sankaranarayanan, Ramaswamy,
"On Controllable Sparse Alternatives to Softmax", NeurIPS 2018).

``sparsehourglass(z) = sparsemax(alpha(z) * z)`` with ``alpha(z) = (1 + q K) / (|sum_i z_i| + q K)``
(formulas in ``shared/papers/README.md``). Layering: the registered operators
``sparsenorm::hourglass_forward`` / ``hourglass_backward`` (``sparsenorm.kernels.ops``: a fused C++
kernel on CPU where built, else the reference ``kernels/reference/hourglass.py``) compute the map
and its closed-form backward, the gradient through ``alpha(z)`` included; :class:`HourglassFunction`
wires them into autograd (double backward through the reference's differentiable formula).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from ._autograd import PositionalFunction, incoming_grad, unused_grads_not_materialized
from ._validation import check_param, normalize, per_row_tensor
from .kernels import ops
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


class HourglassFunction(PositionalFunction):
    """Sparsehourglass over the last dim; ``q`` a float or a tensor broadcastable to ``x[..., :1]``.

    ``apply`` returns ``(p, alpha, sum z)``, only ``p`` differentiable: forward and ``setup_context``
    are separate and the forward op carries a vmap rule, so torch generates this Function's vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, q: Union[float, Tensor]):
        return ops.hourglass_forward(x, per_row_tensor(x, q))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, q = inputs
        p, alpha, total = output
        ctx.q = q if not isinstance(q, Tensor) else None
        ctx.mark_non_differentiable(alpha, total)
        unused_grads_not_materialized(ctx)
        ctx.save_for_backward(p, x, alpha, total, q if isinstance(q, Tensor) else None)

    @staticmethod
    def backward(ctx, g: Tensor, *_unused):
        p, x, alpha, total, q = ctx.saved_tensors
        g = incoming_grad(g, p)
        q_rows = per_row_tensor(x, ctx.q if q is None else q)
        if torch.is_grad_enabled():
            # double backward: differentiable ops, with alpha and sum z recomputed from x and q so
            # that their dependence on them is in the graph
            alpha, _, _, total = ref_hourglass.scale_parts(x, q_rows)
            grad, grad_q = ref_hourglass.backward(g, p, x, alpha, total, q_rows)
        else:
            grad, grad_q = ops.hourglass_backward(g, p, x, alpha, total, q_rows)
        if q is None or not ctx.needs_input_grad[1]:
            return grad, None
        return grad, grad_q.sum_to_size(q.shape)


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
    return normalize(lambda rows, q_rows: HourglassFunction.apply(rows, q_rows)[0], x, dim, mask, params={"q": q},
                     marks_not_there=False)


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
