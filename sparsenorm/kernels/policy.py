"""The one switch of every built-in kernel, C++ and Triton alike: ``sparsenorm.kernels.disabled()``.

Inside the block every operator runs its reference (pure-PyTorch) path on this thread: the C++
kernels (``kernels/cpu``), the Triton kernels (``kernels/triton``) and the choice of ``auto``
(``kernels/auto_plan.py``) all ask :func:`kernels_disabled`, and the Triton kernels are reached only
through :func:`triton_launchers` (None where triton is missing or the kernels are disabled).
Whether the C++ kernels are built and used at all (``use_cpu_kernels``, ``SPARSENORM_CPU_KERNELS``)
is the C++ layer's own setting, in ``kernels/cpu``.
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


_TRITON = None  # the Triton launchers once looked up: a module, or False where triton is missing


def triton_launchers():
    """The Triton launchers for CUDA tensors, or None (triton not installed, or kernels disabled).

    Imported on the first CUDA call only, so CPU-only use never imports triton.
    """
    global _TRITON
    if _TRITON is None:
        try:
            from . import triton as launchers
        except ImportError:
            launchers = False
        _TRITON = launchers
    if not _TRITON or kernels_disabled():
        return None
    return _TRITON


__all__ = ["disabled", "kernels_disabled", "triton_launchers"]
