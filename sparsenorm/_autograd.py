"""Per-call cost of the ``torch.autograd.Function`` classes around the registered operators.

Their ``apply`` returns the differentiable output ``p`` and per-row parts for the backward
(non-differentiable). By default autograd hands the backward a zero tensor for every output that
got no gradient (about 1 us each per call: six for r-softmax); :func:`unused_grads_not_materialized`
turns that off, and :func:`incoming_grad` makes ``p``'s own incoming gradient the zero tensor autograd
would have made when it is None (a later Function returned None for it), so nothing else changes.

torch's ``Function.apply`` (2.13) binds its arguments to ``inspect.signature(cls.forward)`` on every
call of a Function that defines ``setup_context`` (the form ``generate_vmap_rule`` needs), and
``inspect.signature`` rebuilds the signature each time: about 9 us per call on CPU, a twentieth of
a small r-/t-softmax or sparsehourglass forward and backward. ``inspect.signature`` returns a
function's ``__signature__`` when it has one, so :func:`signature_computed_once` stores it once;
the binding, and so every argument ``forward`` receives, is unchanged.
"""
from __future__ import annotations

import inspect
from typing import Optional, Type, TypeVar

import torch
from torch import Tensor
from torch.autograd import Function

F = TypeVar("F", bound=Type[Function])


def signature_computed_once(function_class: F) -> F:
    """Class decorator: compute ``function_class.forward``'s signature once (see module docstring)."""
    forward = function_class.forward  # the staticmethod's function
    forward.__signature__ = inspect.signature(forward)
    return function_class


def unused_grads_not_materialized(ctx) -> None:
    """In ``setup_context``: no zero tensors for outputs without a gradient (see module docstring)."""
    ctx.set_materialize_grads(False)


def incoming_grad(grad: Optional[Tensor], output: Tensor) -> Tensor:
    """``grad``, or the zeros autograd materializes for ``output`` when ``grad`` is None."""
    return torch.zeros_like(output) if grad is None else grad
