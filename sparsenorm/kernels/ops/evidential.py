"""``sparsenorm::ev_softmax`` (Eq. 7 with ``eps`` None or 0, Eq. 10 with ``eps > 0``, and their log
with ``log=True``), its fused backward on every device (``sparsenorm::ev_softmax_backward``: the C++
log kernel on CPU, Triton on CUDA) and the CPU log form's (``ev_softmax_log_backward``, which the
C++ autograd kernel calls), with their autograd formula."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import cpu
from ..reference import evidential as ref_evidential
from ._autograd import closed_form_backward
from ..policy import triton_launchers
from ._common import empty_like_contiguous, grad_as, rows, unrows

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
    from ..auto_plan import row_backend  # (here: plan imports this package)

    launchers = triton_launchers()
    if launchers is not None and launchers.ev_softmax_supports(x) and row_backend("ev_softmax", x) == "triton":
        return launchers.ev_softmax_forward(x, eps, log)
    return ref_evidential.ev_softmax_forward(x, eps, log)


@ev_softmax.register_fake
def _ev_softmax_fake(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    return empty_like_contiguous(x)


def _ev_softmax_setup(ctx, inputs, output) -> None:
    ctx.log = inputs[2]
    ctx.save_for_backward(output)


def _differentiable_backward(grad: Tensor, out: Tensor, log: bool) -> Tensor:
    if log:
        return _log_backward_reference(grad, out)
    return torch._softmax_backward_data(grad, out, -1, out.dtype)  # (differentiable: softmax's backward)


def _ev_softmax_backward(ctx, grad: Tensor):
    """Softmax's backward on the support (Eq. 9) from the saved output (log form: log-softmax's)."""
    (out,) = ctx.saved_tensors
    return closed_form_backward(ev_softmax_backward, _differentiable_backward, grad, out, ctx.log), None, None


ev_softmax.register_autograd(_ev_softmax_backward, setup_context=_ev_softmax_setup)


def _log_backward_reference(grad: Tensor, out: Tensor) -> Tensor:
    # A -inf output is constant (the entry is not there): its incoming gradient is dropped
    # before the sum, and the entry itself then gets exactly 0.
    grad = grad.masked_fill(out == _NEG_INF, 0.0)
    return torch._log_softmax_backward_data(grad, out, -1, out.dtype)


# The fused backward is a registered op on every device, like the forward: torch.compile traces a
# backward with fake tensors, and a Triton launch called straight from the autograd formula would run
# on them (every ev-softmax function failed to compile on CUDA that way; on CPU the C++ autograd
# kernel already called ops only). The op is opaque to the trace; its CUDA kernel is the Triton one.
@torch.library.custom_op("sparsenorm::ev_softmax_backward", mutates_args=())
def ev_softmax_backward(grad: Tensor, out: Tensor, log: bool) -> Tensor:
    """The input gradient of :func:`ev_softmax` from its output ``out`` (Eq. 9): softmax's backward
    ``out * (grad - sum(grad * out))`` on the support, or for ``log=True`` log-softmax's
    ``grad - exp(out) sum(grad)`` with ``grad`` zeroed where ``out`` is ``-inf``."""
    return _differentiable_backward(grad, out, log)


@ev_softmax_backward.register_kernel("cpu")
def _ev_softmax_backward_cpu(grad: Tensor, out: Tensor, log: bool) -> Tensor:
    if log:
        return _ev_softmax_log_backward_cpu(grad_as(grad, out), out)
    return torch._softmax_backward_data(grad_as(grad, out), out, -1, out.dtype)


@ev_softmax_backward.register_kernel("cuda")
def _ev_softmax_backward_cuda(grad: Tensor, out: Tensor, log: bool) -> Tensor:
    from ..auto_plan import row_backend

    launchers = triton_launchers()
    if launchers is not None and launchers.ev_softmax_supports(out) and row_backend("ev_softmax", out) == "triton":
        return launchers.ev_softmax_backward(grad, out, log)
    return _differentiable_backward(grad_as(grad, out), out, log)


@ev_softmax_backward.register_fake
def _ev_softmax_backward_fake(grad: Tensor, out: Tensor, log: bool) -> Tensor:
    return empty_like_contiguous(out)


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


def _takes_low_precision(device_type: str, dtype: torch.dtype, row_len: int) -> bool:
    """Whether :func:`ev_softmax` takes float16/bfloat16 rows as they are: where its kernel is the
    Triton one (CUDA, proven), which accumulates in float32 inside and treats the entries at or below
    ``finfo(input dtype).min / 2`` itself, so the entry path skips its upcast and marking passes
    (``sparsenorm._validation.run_on_rows``). Elsewhere 16-bit rows are computed in float32."""
    from ..auto_plan import row_choice

    return device_type == "cuda" and row_choice("ev_softmax", device_type, dtype, row_len)[0] == "triton"


ev_softmax.takes_low_precision = _takes_low_precision
ev_softmax.treats_not_there = True  # (every kernel and the reference read finfo.min / 2 entries as not there)

OPS = (ev_softmax, ev_softmax_backward, ev_softmax_log_backward)
