"""``sparsenorm::ev_softmax`` (Eq. 7 with ``eps`` None or 0, Eq. 10 with ``eps > 0``, and their log
with ``log=True``) and the fused backward of its log form, with their autograd formula."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import cpu
from ..reference import evidential as ref_evidential
from ._autograd import closed_form_backward
from ._common import empty_like_contiguous, grad_as, rows, triton_launchers, unrows

_NEG_INF = float("-inf")


@torch.library.custom_op("sparsenorm::ev_softmax", mutates_args=())
def ev_softmax(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    """ev-softmax of the rows of ``x`` (last dim); see ``kernels/reference/evidential.py``."""
    return ref_evidential.ev_softmax_forward(x, eps, log)


@ev_softmax.register_kernel("cpu")
def _ev_softmax_cpu(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    ext = cpu.EVIDENTIAL.kernel_for(x)
    if ext is None or x.shape[-1] == 0:
        return ref_evidential.ev_softmax_forward(x, eps, log)
    if eps is None or eps == 0.0:
        kind, shift = 0, 0.0
    else:
        kind, shift = 1, ref_evidential.off_support_shift(eps)
    return unrows(ext.ev_softmax_forward(rows(x), kind, shift, log), x)


@ev_softmax.register_kernel("cuda")
def _ev_softmax_cuda(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    launchers = triton_launchers()
    if launchers is not None and launchers.ev_softmax_supports(x):
        return launchers.ev_softmax_forward(x, eps, log)
    return ref_evidential.ev_softmax_forward(x, eps, log)


@ev_softmax.register_fake
def _ev_softmax_fake(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    return empty_like_contiguous(x)


def _ev_softmax_setup(ctx, inputs, output) -> None:
    ctx.log = inputs[2]
    ctx.save_for_backward(output)


def _fused_backward(grad: Tensor, out: Tensor, log: bool) -> Tensor:
    launchers = triton_launchers() if out.is_cuda else None
    if launchers is not None:
        return launchers.ev_softmax_backward(grad, out, log)
    if log:
        return ev_softmax_log_backward(grad_as(grad, out), out)
    return torch._softmax_backward_data(grad, out, -1, out.dtype)


def _differentiable_backward(grad: Tensor, out: Tensor, log: bool) -> Tensor:
    if log:
        return _log_backward_reference(grad, out)
    return torch._softmax_backward_data(grad, out, -1, out.dtype)  # (differentiable: softmax's backward)


def _ev_softmax_backward(ctx, grad: Tensor):
    """Softmax's backward on the support (Eq. 9) from the saved output (log form: log-softmax's)."""
    (out,) = ctx.saved_tensors
    return closed_form_backward(_fused_backward, _differentiable_backward, grad, out, ctx.log), None, None


ev_softmax.register_autograd(_ev_softmax_backward, setup_context=_ev_softmax_setup)


def _log_backward_reference(grad: Tensor, out: Tensor) -> Tensor:
    # A -inf output is constant (the entry is not there): its incoming gradient is dropped
    # before the sum, and the entry itself then gets exactly 0.
    grad = grad.masked_fill(out == _NEG_INF, 0.0)
    return torch._log_softmax_backward_data(grad, out, -1, out.dtype)


@torch.library.custom_op("sparsenorm::ev_softmax_log_backward", mutates_args=())
def ev_softmax_log_backward(grad: Tensor, out: Tensor) -> Tensor:
    """The backward of :func:`ev_softmax`'s log form from its output ``out``: ``grad - exp(out)
    sum(grad)`` over the entries whose output is not ``-inf`` (they get 0)."""
    return _log_backward_reference(grad, out)


@ev_softmax_log_backward.register_kernel("cpu")
def _ev_softmax_log_backward_cpu(grad: Tensor, out: Tensor) -> Tensor:
    ext = cpu.EVIDENTIAL.kernel_for(out)
    if ext is None or out.shape[-1] == 0:
        return _log_backward_reference(grad, out)
    return unrows(ext.log_backward(rows(grad), rows(out)), out)  # one kernel, no masked copy


@ev_softmax_log_backward.register_fake
def _ev_softmax_log_backward_fake(grad: Tensor, out: Tensor) -> Tensor:
    return empty_like_contiguous(out)


OPS = (ev_softmax, ev_softmax_log_backward)
