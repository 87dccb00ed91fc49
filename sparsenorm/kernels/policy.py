"""The one switch of every built-in kernel, C++ and Triton alike: ``sparsenorm.kernels.disabled()``.

Inside the block every operator runs its reference (pure-PyTorch) path on this thread: the C++
kernels (``kernels/cpu``), the Triton kernels (``kernels/triton``) and the choice of ``auto``
(``kernels/auto_plan.py``) all ask :func:`kernels_disabled`. Whether the C++ kernels are built and used
at all (``use_cpu_kernels``, ``SPARSENORM_CPU_KERNELS``) is the C++ layer's own setting, in
``kernels/cpu``.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator


class _ThreadState(threading.local):
    disabled = 0  # depth of `disabled()` blocks in this thread (a class default: no getattr)


_local = _ThreadState()


def kernels_disabled() -> bool:
    """Whether this thread is inside :func:`disabled` (every operator on its reference path)."""
    return _local.disabled > 0


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run every operator's reference (pure-PyTorch) path inside the block, on this thread."""
    _local.disabled += 1
    try:
        yield
    finally:
        _local.disabled -= 1


__all__ = ["disabled", "kernels_disabled"]
