"""What the op files share: the row layout the C++ kernels take, fresh outputs, the Triton
launchers (looked up once), and the row-wise vmap rule."""
from __future__ import annotations

import torch
from torch import Tensor



def rows(x: Tensor) -> Tensor:
    """``x`` as contiguous ``(rows, K)``: the C++ kernels' layout."""
    # The common case, without reshape's Python dispatch (benchmarks/results/tuning_cpu.json#python_dispatch).
    if x.dim() == 2 and x.is_contiguous():
        return x
    return x.reshape(-1, x.shape[-1]).contiguous()


def unrows(out: Tensor, like: Tensor) -> Tensor:
    """A kernel's ``(rows, K)`` output in the shape of ``like`` (a 2-D ``like`` has it already)."""
    return out if like.dim() == 2 else out.view_as(like)


def grad_as(grad: Tensor, out: Tensor) -> Tensor:
    """An incoming gradient in ``out``'s dtype and shape (broadcast); as it is in the common case,
    without the ``to`` and ``expand_as`` calls (``benchmarks/results/tuning_cpu.json#python_dispatch``)."""
    if grad.dtype == out.dtype and grad.shape == out.shape:
        return grad
    return grad.to(out.dtype).expand_as(out)


def fresh_outputs(outs, inputs):
    """Outputs as fresh contiguous tensors: an op's outputs may alias neither its inputs nor each other."""
    fresh, seen = [], {t.untyped_storage().data_ptr() for t in inputs}
    for t in outs:
        if t.untyped_storage().data_ptr() in seen or not t.is_contiguous():
            t = t.clone(memory_format=torch.contiguous_format)
        seen.add(t.untyped_storage().data_ptr())
        fresh.append(t)
    return tuple(fresh)


def empty_like_contiguous(x: Tensor) -> Tensor:
    """A fake (shape) implementation's output of ``x``'s shape and dtype."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# vmap: every row-wise op works row by row along the last dim, and each tensor argument has the
# input's leading dims (per-row parameters have a last dim of 1; a backward's incoming gradient may
# broadcast). So the vmapped dim is just more rows: move it to the front of every tensor argument
# (expanding an unbatched one), call the op once, and its outputs are batched along dim 0. Without
# this rule torch.vmap falls back to one call per batch entry (slow, with a warning). Gradients: take
# them with ordinary autograd outside vmap (what experiments/_shared/stacking.py does); torch.func.grad
# through a custom op is refused by torch 2.13 (torch.library's generated autograd.Function has no
# setup_context; the C++ autograd kernels on CPU are torch::autograd::Functions, refused as well). The
# autograd.Functions around these ops (r-/t-softmax, sparsehourglass, the bisections) let torch
# generate their vmap rules from these.
def register_rowwise_vmap(*ops) -> None:
    """Register the row-wise vmap rule (above) on each of ``ops``."""
    for op in ops:
        _register_rowwise_vmap(op)


def _register_rowwise_vmap(op) -> None:
    def rule(info, in_dims, *args):
        tensors = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        rank = max(args[i].dim() - (in_dims[i] is not None) for i in tensors)  # the largest per-entry rank
        batched = list(args)
        for i in tensors:
            t, dim = args[i], in_dims[i]
            t = t.unsqueeze(0).expand(info.batch_size, *t.shape) if dim is None else t.movedim(dim, 0)
            # a broadcast argument of lower rank keeps broadcasting: its missing leading dims go after the batch dim
            batched[i] = t[(slice(None),) + (None,) * (rank - (t.dim() - 1))]
        out = op(*batched)
        return out, (tuple(0 for _ in out) if isinstance(out, tuple) else 0)

    torch.library.register_vmap(op, rule)
