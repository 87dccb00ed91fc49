"""Optional fused C++/OpenMP CPU kernel for sparsemax and 1.5-entmax (opt-in, like ev-softmax's).

Turned on by the same switch as the other CPU kernels (``sparsenorm.use_cpu_kernels(True)`` or
``SPARSENORM_CPU_KERNELS=1``, see :mod:`sparsenorm._cpu_kernels`); off by default, so nothing is
compiled unless asked. The first use compiles ``csrc/sparsemax_cpu.cpp`` once (cached on disk);
if that fails, one warning says why and the pure-PyTorch path is used. Results are those of the
entmax package's sort-based formula applied to each row's candidates (exact).
"""
from __future__ import annotations

import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch

from . import _cpu_kernels

_SOURCE = Path(__file__).resolve().parent / "csrc" / "sparsemax_cpu.cpp"
_module: Optional[ModuleType] = None
_build_error: Optional[str] = None
_lock = threading.Lock()


def build_error() -> Optional[str]:
    return _build_error


def load() -> Optional[ModuleType]:
    """The compiled extension, building it on first use; None (after one warning) if that fails."""
    global _module, _build_error
    if _module is not None or _build_error is not None:
        return _module
    with _lock:
        if _module is not None or _build_error is not None:
            return _module
        try:
            from torch.utils import cpp_extension

            suffix, simd_flags = _cpu_kernels._capability_flags()
            name = f"sparsenorm_sparsemax_cpu_{suffix}"
            build_dir = _cpu_kernels._build_directory() / name
            build_dir.mkdir(parents=True, exist_ok=True)
            _module = cpp_extension.load(
                name=name, sources=[str(_SOURCE)], extra_cflags=["-O3", "-fopenmp", *simd_flags],
                extra_ldflags=["-fopenmp"], build_directory=str(build_dir), verbose=False,
            )
        except Exception as exc:  # no compiler/ninja, compile error: fall back and say why
            _build_error = f"{type(exc).__name__}: {exc}".strip()[:2000]
            warnings.warn(
                "sparsenorm: could not build the sparsemax C++ CPU kernel, using the pure-PyTorch path. "
                f"Reason: {_build_error}", RuntimeWarning, stacklevel=3,
            )
    return _module


def kernel_for(x: torch.Tensor) -> Optional[ModuleType]:
    """The extension if CPU kernels are on and can take ``x`` (CPU float32/float64, non-empty)."""
    if not _cpu_kernels.cpu_kernels_enabled():
        return None
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.numel() == 0:
        return None
    return load()
