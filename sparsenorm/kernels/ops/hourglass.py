"""Sparsehourglass on the op layer: ``sparsenorm::hourglass_forward`` / ``hourglass_backward``
(``sparsemax(alpha(z) z)`` and its closed-form backward, the gradient through ``alpha(z)``
included; a fused C++ kernel on CPU where built, else ``kernels/reference/hourglass.py``) and
:class:`HourglassFunction`, which wires them into autograd (double backward through the
reference's differentiable formula)."""
from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import Tensor

from ..._validation import per_row_tensor
from .. import cpu
from ..reference import hourglass as ref_hourglass
from ..reference import projection as ref_projection
from ._autograd import PositionalFunction, closed_form_backward, incoming_grad, unused_grads_not_materialized
from ._common import empty_like_contiguous, fresh_outputs


@torch.library.custom_op("sparsenorm::hourglass_forward", mutates_args=())
def hourglass_forward(x: Tensor, q: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``(p, alpha, sum z)`` of the rows of ``x``, ``q`` of shape ``x.shape[:-1] + (1,)``; see
    ``kernels/reference/hourglass.py``."""
    return fresh_outputs(ref_hourglass.forward(x, q), (x, q))


@hourglass_forward.register_kernel("cpu")
def _hourglass_forward_cpu(x: Tensor, q: Tensor):
    ext = cpu.PROJECTION.kernel_for(x)
    if ext is None or x.shape[-1] == 0:
        rows = lambda z: ref_projection.project(z, -1, "sparsemax")  # noqa: E731  (the CPU iteration)
        return fresh_outputs(ref_hourglass.forward(x, q, rows), (x, q))
    return tuple(ext.hourglass_forward(x, q))  # any shape in, outputs in the op's shapes (no Python reshapes)


@hourglass_forward.register_fake
def _hourglass_forward_fake(x: Tensor, q: Tensor):
    shape = x.shape[:-1] + (1,)
    return empty_like_contiguous(x), x.new_empty(shape), x.new_empty(shape)


@torch.library.custom_op("sparsenorm::hourglass_backward", mutates_args=())
def hourglass_backward(g: Tensor, p: Tensor, x: Tensor, alpha: Tensor, total: Tensor,
                       q: Tensor) -> Tuple[Tensor, Tensor]:
    """``(dL/dx, dL/dq per row)`` of :func:`hourglass_forward` from its outputs."""
    return fresh_outputs(ref_hourglass.backward(g, p, x, alpha, total, q), (g, p, x, alpha, total, q))


@hourglass_backward.register_kernel("cpu")
def _hourglass_backward_cpu(g, p, x, alpha, total, q):
    ext = cpu.PROJECTION.kernel_for(p)
    if ext is None or p.shape[-1] == 0:
        return fresh_outputs(ref_hourglass.backward(g, p, x, alpha, total, q), (g, p, x, alpha, total, q))
    return tuple(ext.hourglass_backward(g, p, x, alpha, total, q))


@hourglass_backward.register_fake
def _hourglass_backward_fake(g, p, x, alpha, total, q):
    return empty_like_contiguous(p), alpha.new_empty(alpha.shape)


def _differentiable_backward(g: Tensor, p: Tensor, x: Tensor, alpha: Tensor, total: Tensor, q_rows: Tensor):
    # alpha and sum z recomputed from x and q, so that their dependence on them is in the graph
    alpha, _, _, total = ref_hourglass.scale_parts(x, q_rows)
    return ref_hourglass.backward(g, p, x, alpha, total, q_rows)


class HourglassFunction(PositionalFunction):
    """Sparsehourglass over the last dim; ``q`` a float or a tensor broadcastable to ``x[..., :1]``.

    ``apply`` returns ``(p, alpha, sum z)``, only ``p`` differentiable: forward and ``setup_context``
    are separate and the forward op carries a vmap rule, so torch generates this Function's vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, q: Union[float, Tensor]):
        return hourglass_forward(x, per_row_tensor(x, q))

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
        q_rows = per_row_tensor(x, ctx.q if q is None else q)
        grad, grad_q = closed_form_backward(hourglass_backward, _differentiable_backward,
                                            incoming_grad(g, p), p, x, alpha, total, q_rows)
        if q is None or not ctx.needs_input_grad[1]:
            return grad, None
        return grad, grad_q.sum_to_size(q.shape)


def sparsehourglass_rows(rows: Tensor, q: Union[float, Tensor]) -> Tensor:
    """Sparsehourglass of the rows of ``rows`` (last dim), differentiable in ``rows`` and a tensor ``q``."""
    return HourglassFunction.apply(rows, q)[0]


OPS = (hourglass_forward, hourglass_backward)

# The entry path need not mark the not-there entries: these read finfo.min / 2 entries as not there themselves.
sparsehourglass_rows.treats_not_there = True
