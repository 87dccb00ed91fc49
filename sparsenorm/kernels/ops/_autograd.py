"""What every backward on the op layer shares: the one double-backward switch, and the per-call
cost of the ``torch.autograd.Function`` classes around the registered operators (r-/t-softmax,
sparsehourglass), whose Python cost, not the rows, is the time on a small input.

* :func:`closed_form_backward`: inside a backward, grad mode is on exactly when autograd records
  the backward itself (``create_graph=True``). Then the closed form runs in differentiable ops (its
  derivative enters the graph), else the fused backward op (a kernel, not differentiable). Every
  Python backward here makes that choice through it (the C++ autograd kernels of ``kernels/cpu``
  make the same one and call the same differentiable Python formulas).

* :class:`PositionalFunction`: torch's ``Function.apply`` (2.13), for a Function that defines
  ``setup_context`` (the form ``generate_vmap_rule`` needs), binds the arguments to
  ``inspect.signature(cls.forward)`` on every call (``inspect`` rebuilds the signature each time)
  to fill in defaults. These forwards take positional arguments without defaults, for which that
  binding returns the arguments unchanged, so :meth:`PositionalFunction.apply` skips it and does
  the rest of torch's ``apply`` as torch does (what that saves per forward+backward:
  ``benchmarks/results/tuning_cpu.json#positional_apply``). Under functorch transforms
  (``torch.vmap``) it is torch's ``apply`` itself;
  ``torch.compile`` traces a Function's ``apply`` without calling it.
* Their ``apply`` returns the differentiable output ``p`` and per-row parts for the backward
  (non-differentiable). By default autograd hands the backward a zero tensor for every output
  that got no gradient (six for r-softmax; their cost:
  ``benchmarks/results/tuning_cpu.json#materialized_grads``);
  :func:`unused_grads_not_materialized` turns that off, and :func:`incoming_grad` makes ``p``'s own
  incoming gradient the zero tensor autograd would have made when it is None (a later Function
  returned None for it), so nothing else changes.
"""
from __future__ import annotations

from typing import Callable, Optional

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


def closed_form_backward(fused: Callable, differentiable: Optional[Callable], *args):
    """The one double-backward switch: ``fused(*args)`` outside ``create_graph``, else
    ``differentiable(*args)`` (the same closed form in differentiable ops). ``differentiable`` may be
    :func:`first_order_only`'s refusal, for a closed form whose own derivative is not implemented."""
    return differentiable(*args) if torch.is_grad_enabled() else fused(*args)


def first_order_only(what: str) -> Callable:
    """A ``differentiable`` form for :func:`closed_form_backward` that refuses: a clear error for
    double backward instead of a silent wrong answer (``what`` names the functions)."""

    def refuse(*_args):
        raise RuntimeError(f"{what} support first derivatives only: double backward (create_graph=True) "
                           "is not implemented")

    return refuse


def first_output(function) -> Callable:
    """``function.apply``'s differentiable output ``p`` (its ``apply`` also returns the per-row parts
    its backward saves)."""
    return lambda *args: function.apply(*args)[0]
