"""The kernel layer: the registered operators with their autograd (``ops/``, one file per family),
their pure-PyTorch reference (``reference/``), fused C++ CPU kernels (``cpu/``) and Triton kernels
(``triton/``); for attention, the call and its masks, the dense path, FlexAttention and the
kernels by backend (``attention/``), and what ``auto`` runs (``auto_plan``, ``cuda_proof``).

Public switches:

* ``with sparsenorm.kernels.disabled(): ...`` runs the reference path on this thread (the one switch
  of every built-in kernel, C++ and Triton: ``kernels/policy.py``);
* :func:`build` compiles the CPU kernels once into the cache (``make venv`` and
  ``sparsenorm build-kernels`` call it); built kernels are then used by default;
* :func:`use_cpu_kernels` / ``SPARSENORM_CPU_KERNELS`` (see ``kernels/cpu``);
* :func:`plan` -- which kernel a row-wise function runs for a device, dtype and row length, and
  why (on CUDA: only kernels a committed GPU run proved, :mod:`.cuda_proof`).
"""
from __future__ import annotations

from typing import Dict, Optional

from . import cpu
from .cpu import cpu_kernels_enabled, use_cpu_kernels
from .policy import disabled
from .auto_plan import RowPlan
from .auto_plan import plan_rows as plan


def build(verbose: bool = False) -> Dict[str, Optional[str]]:
    """Compile every CPU kernel once into the cache (or find it built there).

    Returns ``{kernel: None if built, else the reason it failed}``; a failure also warns once.
    """
    result = {}
    for ext in cpu.EXTENSIONS:
        result[ext.stem] = None if ext.build(verbose=verbose) is not None else (ext.error or "unknown error")
    return result


def available() -> Dict[str, bool]:
    """Which CPU kernels are in use now (built and allowed), without compiling anything."""
    return {ext.stem: ext.get() is not None for ext in cpu.EXTENSIONS}


__all__ = ["disabled", "build", "available", "use_cpu_kernels", "cpu_kernels_enabled", "plan", "RowPlan"]
