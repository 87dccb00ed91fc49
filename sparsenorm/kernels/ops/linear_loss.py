"""The fused linear + single-label loss op family: custom ops, fakes and autograd side by side.

* ``sparsenorm::linear_loss`` -- the loss of ``hidden @ weight.T + bias`` against class indices,
  without the N x V logits (algorithms: ``kernels/reference/linear_loss.py``), and, with
  ``with_grads``, the gradients of the weighted sum of the per-token losses, computed in the same
  pass over the vocabulary;
* ``sparsenorm::linear_loss_backward`` -- the gradients for arbitrary per-token weights (reduction
  ``'none'``) from the forward's per-token statistics, recomputing the logits.

One implementation serves every device: the chunk algorithm is PyTorch (matrix products by ATen
on CPU, cuBLAS on CUDA), and the row-wise step of the sparse kinds goes through the registered
row-wise ops (``kernels/ops/projection.py``), so the C++ kernel runs on CPU and the Triton kernel on CUDA;
softmax/ev-softmax's block step is one Triton kernel on CUDA (``kernels/triton/linear_loss.py``).

Autograd. When the loss is reduced to a scalar (``row_weight`` given, the functional's 'mean' and
'sum'), the forward computes the gradients (``with_grads``) and the backward scales them by the
incoming scalar gradient -- in place unless the graph is retained (``retain_graph=True``), so that
no second V x d tensor exists (the fused loss is meant to be the last operation). Why in the
forward: a backward pass of its own would recompute the N x V logits' products (a third more
matrix work for softmax and ev-softmax). Per-token losses
(``row_weight`` None) are differentiated by :func:`linear_loss_backward`. No double backward.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..reference import linear_loss as ref
from ..policy import triton_launchers
from .projection import entmax_bisect, project

_EMPTY = (0,)


def _project_rows(kind: str, param: float):
    """The row-wise map of a sparse kind, as the registered op (kernel chosen per device)."""
    if kind in ("sparsemax", "entmax15"):
        return lambda z: project(z, kind, None)
    if kind == "entmax_bisect":
        return lambda z: entmax_bisect(z, float(param), 50, True)
    return None


def _block_rows(hidden: Tensor):
    """softmax/ev-softmax's whole-row block step: the Triton kernel on CUDA where available, else the
    reference's (None)."""
    if not hidden.is_cuda:
        return None
    launchers = triton_launchers()
    if launchers is None or not launchers.linear_loss_supports(hidden):
        return None
    return launchers.linear_loss_block_rows


def _plan(hidden: Tensor, weight: Tensor, token_chunk: int, vocab_chunk: int, k: int) -> ref.Plan:
    return ref.make_plan(hidden.shape[0], weight.shape[0], token_chunk, vocab_chunk, k,
                         itemsize=hidden.element_size(), n_hidden=hidden.shape[-1])


def _or_empty(t: Optional[Tensor], like: Tensor) -> Tensor:
    return like.new_empty(_EMPTY) if t is None else t


@torch.library.custom_op("sparsenorm::linear_loss", mutates_args=())
def linear_loss(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], target: Tensor,
                vocab_mask: Optional[Tensor], row_weight: Optional[Tensor], kind: str, param: float,
                ignore_index: int, with_grads: bool, token_chunk: int, vocab_chunk: int,
                k: int, label_smoothing: float = 0.0,
                softcap: float = 0.0) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(loss, grad_hidden, grad_weight, grad_bias, stats)`` of the rows ``hidden`` (N, d) against
    ``target`` (N,) with the classifier ``weight`` (V, d), ``bias`` (V,) or None.

    ``loss``: (N,) per-token losses when ``row_weight`` is None, else the scalar
    ``sum_r row_weight_r loss_r``; the gradients (of that scalar; shape (0,) where not computed:
    ``with_grads`` False or no bias) and ``stats`` (N, 2) as ``kernels/reference/linear_loss.forward``.
    Chunk sizes and ``k`` (candidates per vocabulary chunk): 0 picks them. ``label_smoothing`` in
    [0, 1]; ``softcap`` > 0 caps the logits to ``softcap * tanh(z / softcap)`` (0: no cap).
    """
    plan = _plan(hidden, weight, token_chunk, vocab_chunk, k)
    loss, gh, gw, gb, stats = ref.forward(hidden, weight, bias, target, vocab_mask, kind, param, ignore_index,
                                          row_weight, with_grads and row_weight is not None, plan,
                                          _project_rows(kind, param), _block_rows(hidden),
                                          ref.Opts(label_smoothing, softcap))
    return loss, _or_empty(gh, hidden), _or_empty(gw, weight), _or_empty(gb, weight), stats


@linear_loss.register_fake
def _linear_loss_fake(hidden, weight, bias, target, vocab_mask, row_weight, kind, param, ignore_index, with_grads,
                      token_chunk, vocab_chunk, k, label_smoothing=0.0, softcap=0.0):
    n = hidden.shape[0]
    grads = with_grads and row_weight is not None
    loss = hidden.new_empty(()) if row_weight is not None else hidden.new_empty((n,))
    gh = torch.empty_like(hidden) if grads else hidden.new_empty(_EMPTY)
    gw = torch.empty_like(weight) if grads else weight.new_empty(_EMPTY)
    gb = torch.empty_like(bias) if grads and bias is not None else weight.new_empty(_EMPTY)
    return loss, gh, gw, gb, hidden.new_empty((n, 2))


@torch.library.custom_op("sparsenorm::linear_loss_backward", mutates_args=())
def linear_loss_backward(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], target: Tensor,
                         vocab_mask: Optional[Tensor], stats: Tensor, grad_rows: Tensor, kind: str, param: float,
                         ignore_index: int, token_chunk: int, vocab_chunk: int, label_smoothing: float = 0.0,
                         softcap: float = 0.0) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``sum_r grad_rows_r loss_r`` w.r.t. ``hidden``, ``weight``, ``bias`` (shape (0,)
    without a bias) from :func:`linear_loss`'s ``stats``."""
    plan = _plan(hidden, weight, token_chunk, vocab_chunk, 0)
    gh, gw, gb = ref.backward(hidden, weight, bias, target, vocab_mask, stats, grad_rows, kind, param, ignore_index,
                              plan, ref.Opts(label_smoothing, softcap))
    return gh, gw, _or_empty(gb, weight)


@linear_loss_backward.register_fake
def _linear_loss_backward_fake(hidden, weight, bias, target, vocab_mask, stats, grad_rows, kind, param,
                               ignore_index, token_chunk, vocab_chunk, label_smoothing=0.0, softcap=0.0):
    gb = torch.empty_like(bias) if bias is not None else weight.new_empty(_EMPTY)
    return torch.empty_like(hidden), torch.empty_like(weight), gb


def _setup(ctx, inputs, output) -> None:
    (hidden, weight, bias, target, vocab_mask, row_weight, kind, param, ignore_index, with_grads, tc, vc, _,
     smooth, cap) = inputs
    _, gh, gw, gb, stats = output
    ctx.fused = with_grads and row_weight is not None
    ctx.has_bias = bias is not None
    ctx.args = (kind, param, ignore_index, tc, vc, smooth, cap)
    ctx.mark_non_differentiable(gh, gw, gb, stats)
    ctx.set_materialize_grads(False)  # no zero gradients of the V x d output grad_weight in the backward
    if ctx.fused:
        ctx.save_for_backward(gh, gw, gb)
    else:
        ctx.save_for_backward(hidden, weight, bias, target, vocab_mask, stats)


def _backward(ctx, grad_loss: Optional[Tensor], *_unused):
    kind, param, ignore_index, tc, vc, smooth, cap = ctx.args
    if ctx.fused:
        gh, gw, gb = ctx.saved_tensors
        if grad_loss is None:  # the loss was not used: no gradient
            return (None,) * 15
        scale = grad_loss.to(gh.dtype)
        if torch._C._autograd._get_current_graph_task_keep_graph():  # retain_graph: keep the saved gradients
            gh, gw, gb = gh * scale, gw * scale, gb * scale
        else:  # the graph is freed after this backward: scale in place, no second V x d tensor
            gh, gw, gb = gh.mul_(scale), gw.mul_(scale), gb.mul_(scale)
        gb = gb if ctx.has_bias else None
    else:
        hidden, weight, bias, target, vocab_mask, stats = ctx.saved_tensors
        if grad_loss is None:
            return (None,) * 15
        gh, gw, gb = linear_loss_backward(hidden, weight, bias, target, vocab_mask, stats, grad_loss, kind, param,
                                          ignore_index, tc, vc, smooth, cap)
        gb = gb if ctx.has_bias else None
    needs = ctx.needs_input_grad
    return (gh if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None,
            None, None, None, None, None, None, None, None, None, None, None, None)


linear_loss.register_autograd(_backward, setup_context=_setup)

__all__ = ["linear_loss", "linear_loss_backward"]
