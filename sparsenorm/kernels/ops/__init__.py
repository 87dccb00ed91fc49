"""The op layer: one ``torch.library.custom_op`` per fused operation, with its kernels, its fake
(shape) implementation and its autograd, one file per family:

* :mod:`.evidential` -- ``ev_softmax`` (+ the fused backward of its log form);
* :mod:`.projection` -- ``project`` (sparsemax / 1.5-entmax), ``entmax_bisect``, their backward ops,
  and the bisection ``autograd.Function`` classes (tensor ``alpha``, sparsemax by bisection);
* :mod:`.hourglass` -- ``hourglass_forward`` / ``hourglass_backward`` and ``HourglassFunction``;
* :mod:`.rsoftmax` -- ``r_softmax_threshold``, ``r_softmax_forward``, ``t_softmax_forward``,
  ``r_softmax_backward`` and ``RSoftmaxFunction`` / ``TSoftmaxFunction``;
* :mod:`.fenchel_young` -- the Fenchel--Young loss's ``autograd.Function`` (backward ``p* - q``);
* :mod:`.evidential_attention` and :mod:`.projection_attention` -- the attention ops (see
  :mod:`sparsenorm.kernels.attention.dispatch` for which one runs).

Each row-wise op works on rows along the LAST dimension of its input (the entry path in
``sparsenorm._validation`` moves the normalized dimension there) and has

* a reference implementation (``kernels/reference``, pure PyTorch, sync-free) registered for
  every device;
* a CPU implementation: the fused C++ kernel (``kernels/cpu``) where it is built and allowed
  (see :func:`sparsenorm.kernels.disabled`), else the reference (or its CPU variant);
* a CUDA implementation: the Triton kernel (``kernels/triton``, extra ``[gpu]``) where triton is
  installed, the shape qualifies and kernels are allowed, else the reference;
* a fake (shape) implementation, so ``torch.compile(fullgraph=True)`` traces through it;
* its autograd formula, registered here: closed-form from the saved output, with the one
  double-backward switch (:func:`._autograd.closed_form_backward`);
* a vmap rule (the vmapped dim is more rows; :func:`._common.register_rowwise_vmap`).

The normalizers call these ops (or the ``*_rows`` functions beside them) and never ask which
kernel runs or how it differentiates.
"""
from __future__ import annotations

from . import evidential, hourglass, projection, rsoftmax
from ._common import register_rowwise_vmap
from .evidential import ev_softmax, ev_softmax_backward, ev_softmax_log_backward
from .hourglass import hourglass_backward, hourglass_forward
from .projection import _bisect_backward_reference  # noqa: F401  (kernels/cpu/projection.cpp calls it by this path)
from .projection import entmax_bisect, entmax_bisect_backward, project, project_backward
from .rsoftmax import r_softmax_backward, r_softmax_forward, r_softmax_threshold, t_softmax_forward

register_rowwise_vmap(*evidential.OPS, *projection.OPS, *hourglass.OPS, *rsoftmax.OPS)

__all__ = ["ev_softmax", "ev_softmax_backward", "ev_softmax_log_backward", "project", "project_backward",
           "entmax_bisect", "entmax_bisect_backward", "hourglass_forward", "hourglass_backward", "r_softmax_threshold",
           "r_softmax_forward", "t_softmax_forward", "r_softmax_backward"]
