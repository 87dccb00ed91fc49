"""Per-call cost of the ``torch.autograd.Function`` classes around the registered operators
(r-/t-softmax, sparsehourglass): on a small input their Python cost, not the rows, is the time.

* :class:`PositionalFunction`: torch's ``Function.apply`` (2.13), for a Function that defines
  ``setup_context`` (the form ``generate_vmap_rule`` needs), binds the arguments to
  ``inspect.signature(cls.forward)`` on every call (``inspect`` rebuilds the signature each time)
  to fill in defaults. These forwards take positional arguments without defaults, for which that
  binding returns the arguments unchanged, so :meth:`PositionalFunction.apply` skips it and does
  the rest of torch's ``apply`` as torch does: about 15 us less per forward+backward (4 x 16 rows,
  thread CPU time). Under functorch transforms (``torch.vmap``) it is torch's ``apply`` itself;
  ``torch.compile`` traces a Function's ``apply`` without calling it.
* Their ``apply`` returns the differentiable output ``p`` and per-row parts for the backward
  (non-differentiable). By default autograd hands the backward a zero tensor for every output
  that got no gradient (about 1 us each per call: six for r-softmax);
  :func:`unused_grads_not_materialized` turns that off, and :func:`incoming_grad` makes ``p``'s own
  incoming gradient the zero tensor autograd would have made when it is None (a later Function
  returned None for it), so nothing else changes.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch._functorch.utils import unwrap_dead_wrappers
from torch.autograd import Function


class PositionalFunction(Function):
    """A ``Function`` whose ``forward`` takes positional arguments only, none with a default."""

    @classmethod
    def apply(cls, *args):
        if torch._C._are_functorch_transforms_active():
            return super().apply(*args)  # torch's path (custom_function_call: generated vmap rule)
        # torch's Function.apply without the binding (see the module docstring): the C++ apply
        return super(Function, cls).apply(*unwrap_dead_wrappers(args))


def unused_grads_not_materialized(ctx) -> None:
    """In ``setup_context``: no zero tensors for outputs without a gradient (see module docstring)."""
    ctx.set_materialize_grads(False)


def incoming_grad(grad: Optional[Tensor], output: Tensor) -> Tensor:
    """``grad``, or the zeros autograd materializes for ``output`` when ``grad`` is None."""
    return torch.zeros_like(output) if grad is None else grad
