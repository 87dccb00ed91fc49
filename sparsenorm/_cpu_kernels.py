"""Optional fused C++/OpenMP CPU kernels (opt-in), built just in time with ``torch.utils.cpp_extension``.

Off by default: a compiler run on the first call of a library function must never surprise a
user. Turn on with :func:`use_cpu_kernels` (``sparsenorm.use_cpu_kernels(True)``) or the environment
variable ``SPARSENORM_CPU_KERNELS=1``. The first use of a kernel then compiles its source
(``csrc/evidential_cpu.cpp`` for the three ev-softmax forwards, ``csrc/sparsemax_cpu.cpp`` for
sparsemax/entmax15, which applies the exact sort-based formula to each row's candidates; needs a
C++ compiler and ``ninja``: ``pip install sparsenorm[fast]``; about a minute each) into
``$TORCH_EXTENSIONS_DIR`` or else ``<sparsenorm cache dir>/torch_extensions``, where later runs find
it. If the build fails, one warning names the reason and the pure-PyTorch path is used.
"""
from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch

_ENV_VAR = "SPARSENORM_CPU_KERNELS"
_CSRC = Path(__file__).resolve().parent / "csrc"

_enabled: Optional[bool] = None  # None: not set in code, the environment variable decides


def use_cpu_kernels(enabled: bool = True) -> None:
    """Turn the opt-in fused C++ CPU kernels on or off (process-wide; off by default).

    When on, the first CPU call of ``ev_softmax``/``ev_softmax_train``/``log_ev_softmax_train``
    (and of sparsemax/entmax15) compiles its kernel once
    (cached on disk across runs); results equal the pure-PyTorch path up to floating-point
    rounding. Falls back to that path, with one warning, if the build fails.
    """
    global _enabled
    _enabled = bool(enabled)


def cpu_kernels_enabled() -> bool:
    if _enabled is not None:
        return _enabled
    return os.environ.get(_ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def _build_directory() -> Path:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env).expanduser()
    from ._cache import cache_dir

    return cache_dir() / "torch_extensions"


def _capability_flags():
    """The SIMD level ATen dispatches to here, as a name suffix and compiler flags, so at::vec's
    exp is the same (exported) Sleef routine torch's own kernels call."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return "avx512", ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma",
                          "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]
    if capability == "AVX2":
        return "avx2", ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return "default", ["-DCPU_CAPABILITY=DEFAULT"]


class JitExtension:
    """One C++ source under ``csrc/``, compiled on first use (cached on disk), or None if it fails."""

    def __init__(self, stem: str, what: str):
        self.source = _CSRC / f"{stem}.cpp"
        self.stem = stem
        self.what = what  # for the warning: which functions fall back
        self.module: Optional[ModuleType] = None
        self.error: Optional[str] = None  # why the build failed (None if not tried or fine)
        self._lock = threading.Lock()

    def load(self) -> Optional[ModuleType]:
        """The compiled extension, building it on first use; None (after one warning) if that fails."""
        if self.module is not None or self.error is not None:
            return self.module
        with self._lock:
            if self.module is not None or self.error is not None:
                return self.module
            try:
                from torch.utils import cpp_extension

                suffix, simd_flags = _capability_flags()
                name = f"sparsenorm_{self.stem}_{suffix}"
                build_dir = _build_directory() / name
                build_dir.mkdir(parents=True, exist_ok=True)
                self.module = cpp_extension.load(
                    name=name,
                    sources=[str(self.source)],
                    extra_cflags=["-O3", "-fopenmp", *simd_flags],
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(build_dir),
                    verbose=False,
                )
            except Exception as exc:  # compiler/ninja missing, compile error, ...: fall back, say why
                self.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
                warnings.warn(
                    f"sparsenorm: could not build the C++ CPU kernels for {self.what}, using the "
                    f"pure-PyTorch path (install a C++ compiler and `pip install ninja`). Reason: {self.error}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return self.module

    def kernel_for(self, x: torch.Tensor) -> Optional[ModuleType]:
        """The extension if the kernels are on and can take ``x`` (CPU float32/float64, non-empty)."""
        if not cpu_kernels_enabled():
            return None
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or x.numel() == 0:
            return None
        return self.load()


EVIDENTIAL = JitExtension("evidential_cpu", "ev-softmax")
SPARSEMAX = JitExtension("sparsemax_cpu", "sparsemax/entmax15")
