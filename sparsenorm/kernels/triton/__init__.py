"""Triton kernels for CUDA (optional extra ``sparsenorm[gpu]``, which installs ``triton``).

Launchers take torch tensors and follow the reference semantics of ``kernels/reference``
exactly (rows along the LAST dimension; "not there" = ``-inf``, ``mask == False`` or at or below
``finfo(input dtype).min / 2``; empty rows give zeros, log forms ``-inf``; NaN/``+inf`` make their
row NaN; float16/bfloat16/float32 in, float32 compute, output in ``out_dtype``, default the input's):

* :func:`ev_softmax_forward` ``(x, eps=None, log=False, mask=None, out_dtype=None)`` and
  :func:`ev_softmax_backward` ``(grad, out, log=False)``: Eq. 7 (``eps`` None or 0), Eq. 10 (``eps > 0``)
  and their log; rows of any length (longer than 8192 entries split over several programs per row);
* :func:`project` ``(x, kind, mask=None, out_dtype=None)`` and :func:`project_backward`
  ``(p, grad, kind)``: sparsemax / 1.5-entmax with the exact threshold, rows of any length (longer
  than 16384 entries split over several programs per row; :func:`project_supports` says whether a
  tensor qualifies);
* :func:`linear_loss_block_rows` ``(z, thr, y, w, wy, ev, shift, grad)``: the fused linear + loss's
  block step for softmax / ev-softmax (loss, ``log Z``, threshold, and the gradient in place), float32
  rows of any length (:func:`linear_loss_supports`);
* :func:`flash_ev_softmax_attention_forward` ``(q, k, v, key_lengths=None, is_causal=False,
  scale=None, key_mask=None)`` and :func:`flash_ev_softmax_attention_backward`: flash ev-softmax
  attention, the two halves of the op ``sparsenorm::ev_softmax_attention_flash``
  (:mod:`sparsenorm.kernels.ops.evidential_attention`, whose ``ev_softmax_attention_flash`` is differentiable).

* :func:`key_prefix_sums` ``(k)``: float32 prefix sums of the keys along the sequence (the causal
  ev-softmax threshold's input; the op ``sparsenorm::key_prefix_sums``).

They run on CUDA tensors, or on CPU tensors when ``TRITON_INTERPRET=1`` was set before ``triton``
was first imported (Triton's interpreter: how the tests run without a GPU). Importing this package
raises ``ImportError`` where triton is not installed.
"""
from .attention import flash_ev_softmax_attention_backward, flash_ev_softmax_attention_forward
from .prefix import key_prefix_sums
from .linear_loss import block_rows as linear_loss_block_rows
from .linear_loss import supports as linear_loss_supports
from .evidential import ev_softmax_backward, ev_softmax_forward
from .evidential import supports as ev_softmax_supports
from .projection import project, project_backward
from .projection import supports as project_supports

__all__ = [
    "ev_softmax_forward", "ev_softmax_backward", "ev_softmax_supports",
    "project", "project_backward", "project_supports",
    "flash_ev_softmax_attention_forward", "flash_ev_softmax_attention_backward",
    "linear_loss_block_rows", "linear_loss_supports", "key_prefix_sums",
]
