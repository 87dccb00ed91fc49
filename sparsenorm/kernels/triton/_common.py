"""What every Triton launcher shares: where kernels may run, launch sizes, autotuning.

Kernels run on CUDA tensors, or on CPU tensors under Triton's interpreter. The interpreter is
chosen by ``TRITON_INTERPRET=1``, which Triton reads once, when it is imported (its own
``tl.sum`` etc. are decorated then): it must be set before anything imports ``triton``.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from ..._validation import not_there_level  # noqa: F401  (the one "not there" rule, for the launchers)

# Triton was imported in interpreter mode iff its standard library kernels are interpreted.
INTERPRET: bool = isinstance(triton.language.sum, InterpretedFunction)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def runnable_on(t: torch.Tensor) -> bool:
    """Whether these kernels can run on ``t``'s device in this process."""
    return t.device.type == "cpu" if INTERPRET else t.device.type == "cuda"


def check_tensor(t: torch.Tensor, name: str, dtypes: Sequence[torch.dtype] = _DTYPES) -> None:
    """A clear error naming the argument for a tensor these kernels cannot take."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}; got {t.dtype}")
    if not runnable_on(t):
        where = "CPU tensors (TRITON_INTERPRET=1 is set)" if INTERPRET else "CUDA tensors"
        raise ValueError(f"{name} is on {t.device}, but the Triton kernels in this process run on {where}")


def autotune(configs: Callable[[], list], key: Sequence[str]):
    """``triton.autotune`` on a GPU; nothing under the interpreter (whose launches pass the
    block sizes themselves), where benchmarking configurations is meaningless and slow."""
    if INTERPRET:
        return lambda fn: fn
    return triton.autotune(configs=configs(), key=list(key))
