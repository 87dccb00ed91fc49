"""Per-call cost of the ``torch.autograd.Function`` classes around the registered operators.

torch's ``Function.apply`` (2.13) binds its arguments to ``inspect.signature(cls.forward)`` on every
call of a Function that defines ``setup_context`` (the form ``generate_vmap_rule`` needs), and
``inspect.signature`` rebuilds the signature each time: about 9 us per call on CPU, a twentieth of
a small r-/t-softmax or sparsehourglass forward and backward. ``inspect.signature`` returns a
function's ``__signature__`` when it has one, so :func:`signature_computed_once` stores it once;
the binding, and so every argument ``forward`` receives, is unchanged.
"""
from __future__ import annotations

import inspect
from typing import Type, TypeVar

from torch.autograd import Function

F = TypeVar("F", bound=Type[Function])


def signature_computed_once(function_class: F) -> F:
    """Class decorator: compute ``function_class.forward``'s signature once (see module docstring)."""
    forward = function_class.forward  # the staticmethod's function
    forward.__signature__ = inspect.signature(forward)
    return function_class
