"""t-softmax and r-softmax on the op layer: ``sparsenorm::r_softmax_threshold``,
``r_softmax_forward``, ``t_softmax_forward`` and their shared ``r_softmax_backward`` (a fused C++
kernel on CPU where built, else ``kernels/reference/rsoftmax.py``), and the ``autograd.Function``
classes that save the output ``p``, the input ``x`` (the Jacobian has ``1 / w_i`` terms,
``w = x - tau``) and the per-row threshold data, and apply the closed-form backward (the formulas
are in :mod:`sparsenorm.rsoftmax`'s docstring). First derivatives only: the closed form uses
``e = p / w``, which is not an output of the forward, so a second derivative through it would miss
terms; double backward raises."""
from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import Tensor

from ..._validation import per_row_tensor
from .. import cpu
from ..reference import rsoftmax as ref_rsoftmax
from ._autograd import (PositionalFunction, closed_form_backward, first_order_only, first_output, incoming_grad,
                        unused_grads_not_materialized)
from ._common import empty_like_contiguous, fresh_outputs


@torch.library.custom_op("sparsenorm::r_softmax_threshold", mutates_args=())
def r_softmax_threshold(x: Tensor, r: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(tau, lo_idx, hi_idx, frac, dtau_dr)`` of each row; see ``kernels/reference/rsoftmax.py``."""
    return ref_rsoftmax.quantile_threshold_sorted(x, r)


@r_softmax_threshold.register_kernel("cpu")
def _r_softmax_threshold_cpu(x: Tensor, r: Tensor):
    tau, *rest = ref_rsoftmax.quantile_threshold(x, r)
    rest = [t.expand(tau.shape) if isinstance(t, Tensor) else torch.full_like(tau, t) for t in rest]
    return fresh_outputs((tau, *rest), (x, r))


@r_softmax_threshold.register_fake
def _r_softmax_threshold_fake(x: Tensor, r: Tensor):
    shape = x.shape[:-1] + (1,)
    value = x.new_empty(shape)
    index = x.new_empty(shape, dtype=torch.long)
    return value, index, index.clone(), value.clone(), value.clone()


@torch.library.custom_op("sparsenorm::r_softmax_forward", mutates_args=())
def r_softmax_forward(x: Tensor, r: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """r-softmax of the rows of ``x`` with ``r`` of shape ``x.shape[:-1] + (1,)``:
    ``(p, tau, lo_idx, hi_idx, frac, dtau_dr, dead)``; its autograd is :class:`RSoftmaxFunction`."""
    return fresh_outputs(ref_rsoftmax.forward(x, r, sorted_threshold=True), (x, r))


@r_softmax_forward.register_kernel("cpu")
def _r_softmax_forward_cpu(x: Tensor, r: Tensor):
    ext = cpu.RSOFTMAX.kernel_for(x)
    if ext is None or x.shape[-1] == 0:
        return fresh_outputs(ref_rsoftmax.forward(x, r, sorted_threshold=False), (x, r))
    return tuple(ext.forward(x, r))  # any shape in, outputs in the op's shapes (no Python reshapes)


@r_softmax_forward.register_fake
def _r_softmax_forward_fake(x: Tensor, r: Tensor):
    shape = x.shape[:-1] + (1,)
    index = x.new_empty(shape, dtype=torch.long)
    return (empty_like_contiguous(x), x.new_empty(shape), index,
            index.clone(), x.new_empty(shape), x.new_empty(shape), x.new_empty(shape, dtype=torch.bool))


@torch.library.custom_op("sparsenorm::t_softmax_forward", mutates_args=())
def t_softmax_forward(x: Tensor, t: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """t-softmax of the rows of ``x`` with ``t`` of shape ``x.shape[:-1] + (1,)``:
    ``(p, tau, argmax, dead)``; its backward is :func:`r_softmax_backward` with ``lo_idx = hi_idx
    = argmax`` and ``frac = 0`` (autograd: :class:`TSoftmaxFunction`)."""
    return fresh_outputs(ref_rsoftmax.t_forward(x, t), (x, t))


@t_softmax_forward.register_kernel("cpu")
def _t_softmax_forward_cpu(x: Tensor, t: Tensor):
    ext = cpu.RSOFTMAX.kernel_for(x)
    if ext is None or x.shape[-1] == 0:
        return fresh_outputs(ref_rsoftmax.t_forward(x, t), (x, t))
    return tuple(ext.t_forward(x, t))


@t_softmax_forward.register_fake
def _t_softmax_forward_fake(x: Tensor, t: Tensor):
    shape = x.shape[:-1] + (1,)
    return (empty_like_contiguous(x), x.new_empty(shape),
            x.new_empty(shape, dtype=torch.long), x.new_empty(shape, dtype=torch.bool))


@torch.library.custom_op("sparsenorm::r_softmax_backward", mutates_args=())
def r_softmax_backward(g: Tensor, p: Tensor, x: Tensor, tau: Tensor, lo_idx: Tensor, hi_idx: Tensor,
                       frac: Tensor, dead: Tensor) -> Tuple[Tensor, Tensor]:
    """``(dL/dx, C)`` of r-softmax from the forward's outputs; ``dL/dr = C dtau_dr``. Also
    t-softmax's (``lo_idx = hi_idx = argmax``, ``frac = 0``; ``dL/dt = -C``)."""
    return ref_rsoftmax.backward(g.contiguous(), p, x, tau, lo_idx, hi_idx, frac, dead)


@r_softmax_backward.register_kernel("cpu")
def _r_softmax_backward_cpu(g, p, x, tau, lo_idx, hi_idx, frac, dead):
    ext = cpu.RSOFTMAX.kernel_for(p)
    if ext is None or p.shape[-1] == 0:
        return ref_rsoftmax.backward(g.contiguous(), p, x, tau, lo_idx, hi_idx, frac, dead)
    return tuple(ext.backward(g, p, x, tau, lo_idx, hi_idx, frac, dead))


@r_softmax_backward.register_fake
def _r_softmax_backward_fake(g, p, x, tau, lo_idx, hi_idx, frac, dead):
    return empty_like_contiguous(p), tau.new_empty(tau.shape)


_FIRST_ORDER_ONLY = first_order_only("t_softmax/r_softmax")


class TSoftmaxFunction(PositionalFunction):
    """t-softmax over the last dim; ``t`` a float or a tensor broadcastable to ``x[..., :1]``.

    ``apply`` returns ``(p, tau, argmax, dead)`` (the per-row parts the backward needs; only ``p`` is
    differentiable): forward and ``setup_context`` are separate, and the ops it calls carry vmap
    rules, so torch generates its vmap rule (``torch.vmap`` over t-softmax works)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, t: Union[float, Tensor]):
        return t_softmax_forward(x, per_row_tensor(x, t))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, t = inputs
        p, tau, argmax, dead = output
        ctx.t_shape = t.shape if isinstance(t, Tensor) else None
        ctx.mark_non_differentiable(tau, argmax, dead)
        unused_grads_not_materialized(ctx)
        ctx.save_for_backward(p, x, tau, argmax, dead)

    @staticmethod
    def backward(ctx, g: Tensor, *_unused):
        p, x, tau, argmax, dead = ctx.saved_tensors
        # d tau / d x = indicator of the arg-max: r-softmax's backward with lo = hi = arg-max, frac = 0
        grad, c = closed_form_backward(r_softmax_backward, _FIRST_ORDER_ONLY, incoming_grad(g, p), p, x, tau,
                                       argmax, argmax, torch.zeros_like(tau), dead)
        grad_t = None
        if ctx.t_shape is not None and ctx.needs_input_grad[1]:
            grad_t = (-c).sum_to_size(ctx.t_shape)
        return grad, grad_t


class RSoftmaxFunction(PositionalFunction):
    """r-softmax over the last dim; ``r`` a float or a tensor broadcastable to ``x[..., :1]``.

    Forward and backward are the registered operators ``sparsenorm::r_softmax_forward`` /
    ``r_softmax_backward`` (a fused C++ kernel on CPU where built, else the reference)."""

    generate_vmap_rule = True  # as TSoftmaxFunction: apply returns the forward op's outputs, p first

    @staticmethod
    def forward(x: Tensor, r: Union[float, Tensor]):
        # tau >= max (r = 1, n = 1, or the quantile tied with the max) makes every weight 0: the
        # output is then the r -> 1 limit, uniform over the arg-max entries (a "dead" row).
        return r_softmax_forward(x, per_row_tensor(x, r))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, r = inputs
        p, tau, lo_idx, hi_idx, frac, dtau_dr, dead = output
        ctx.r_shape = r.shape if isinstance(r, Tensor) else None
        ctx.mark_non_differentiable(*output[1:])
        unused_grads_not_materialized(ctx)
        ctx.save_for_backward(p, x, tau, lo_idx, hi_idx, frac, dtau_dr, dead)

    @staticmethod
    def backward(ctx, g: Tensor, *_unused):
        p, x, tau, lo_idx, hi_idx, frac, dtau_dr, dead = ctx.saved_tensors
        grad, c = closed_form_backward(r_softmax_backward, _FIRST_ORDER_ONLY, incoming_grad(g, p), p, x, tau,
                                       lo_idx, hi_idx, frac, dead)
        grad_r = None
        if ctx.r_shape is not None and ctx.needs_input_grad[1]:
            grad_r = (c * dtau_dr).sum_to_size(ctx.r_shape)
        return grad, grad_r


t_softmax_rows = first_output(TSoftmaxFunction)
"""t-softmax of the rows of its first argument (last dim), ``t`` a number or per row; differentiable."""

r_softmax_rows = first_output(RSoftmaxFunction)
"""r-softmax of the rows of its first argument (last dim), ``r`` a number or per row; differentiable."""


OPS = (r_softmax_threshold, r_softmax_forward, t_softmax_forward, r_softmax_backward)

# The entry path need not mark the not-there entries: these read finfo.min / 2 entries as not there themselves.
t_softmax_rows.treats_not_there = True
r_softmax_rows.treats_not_there = True
