"""The fused C++/OpenMP CPU kernels: their sources (``*.cpp`` here), build and loading.

Used by default once built: :func:`sparsenorm.kernels.build` (run by ``make venv`` and
``sparsenorm build-kernels``) compiles every source once into ``$TORCH_EXTENSIONS_DIR`` or else
``<sparsenorm cache dir>/torch_extensions``; later processes load the built library without
compiling. An ordinary function call never compiles anything unless asked to:

* ``SPARSENORM_CPU_KERNELS`` unset: a kernel is used where it is built, else the reference path;
* ``SPARSENORM_CPU_KERNELS=0`` (or ``sparsenorm.use_cpu_kernels(False)``): never used;
* ``SPARSENORM_CPU_KERNELS=1`` (or ``sparsenorm.use_cpu_kernels(True)``): built on first use.

A failed build prints one line (a ``RuntimeWarning``) and leaves the reference path; so does the
first call that would have used a kernel that is not built (once per process, naming
``sparsenorm build-kernels``; ``SPARSENORM_CPU_KERNELS=0`` chooses the reference path silently). The library
file's name carries a hash of its source, its compiler flags and torch's version, so a stale build
(or one made for another torch) is never loaded.

Concurrent builds (two processes, e.g. pytest-xdist workers or two users of one cache) are safe:
a build holds a file lock (``<name>.lock`` next to the build folder; ``filelock``, which torch
itself depends on) and compiles into a fresh temporary folder, writes ``BUILD_COMPLETE`` there
after the library loaded, and renames that folder into place (atomic on one file system). So the
folder ``<name>`` either does not exist or holds a finished build, and a process that is killed
mid-build leaves only its temporary folder, which the next build removes.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch

from ..policy import kernels_disabled

_ENV_VAR = "SPARSENORM_CPU_KERNELS"
_HERE = Path(__file__).resolve().parent

_COMPLETE = "BUILD_COMPLETE"  # marker file written after a successful build
_code_setting: Optional[bool] = None  # set by use_cpu_kernels; None: the environment decides
_warned_not_built = False  # the one "not built" warning of this process was given


def _warn_not_built(what: str) -> None:
    global _warned_not_built
    _warned_not_built = True
    frame, level = sys._getframe(0), 1  # point the warning at the caller's line, outside sparsenorm and torch
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in ("sparsenorm", "torch"):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"sparsenorm: the C++ CPU kernels are not built, so {what} and the others run the pure-PyTorch "
        "reference path (same results, slower). Build them once with `sparsenorm build-kernels` (needs a C++ "
        "compiler and `pip install 'sparsenorm[fast]'`); SPARSENORM_CPU_KERNELS=0 uses the reference path "
        "without this warning.", RuntimeWarning, stacklevel=level)


# The values of SPARSENORM_CPU_KERNELS (stripped, lower case) that decide; any other value: None.
_ENV_POLICY = {**dict.fromkeys(("1", "true", "yes", "on"), True), **dict.fromkeys(("0", "false", "no", "off"), False)}


def use_cpu_kernels(enabled: Optional[bool] = True) -> None:
    """Process-wide switch: True builds the kernels on first use and uses them, False never
    uses them, None restores the default (use them where built; ``SPARSENORM_CPU_KERNELS``)."""
    global _code_setting
    _code_setting = None if enabled is None else bool(enabled)


def _policy() -> Optional[bool]:
    """True: build on demand; False: off; None: use if already built."""
    # Runs on every kernel call (twice per forward+backward), hence the plain lookups; the
    # environment is still read each time, so a changed variable takes effect at once.
    if kernels_disabled():  # sparsenorm.kernels.disabled(): the one switch of every kernel (kernels/policy.py)
        return False
    if _code_setting is not None:
        return _code_setting
    value = os.environ.get(_ENV_VAR)
    return None if value is None else _ENV_POLICY.get(value.strip().lower())


def cpu_kernels_enabled() -> bool:
    """Whether the kernels may be used now (built or to be built on demand)."""
    return _policy() is not False


def _build_directory() -> Path:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env).expanduser()
    from ..._cache import cache_dir

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


# Flags of every build besides the SIMD level's. -fno-trapping-math lets the compiler evaluate
# both sides of a select (`d > 0 ? d * d : 0`) unconditionally, i.e. if-convert such loops into
# blends: without AVX512's masked instructions GCC otherwise keeps them scalar with a branch per
# entry (the AVX2 build's 1.5-entmax threshold loop ran several times slower than the AVX512 build's
# on random rows: commit dcb2799 gives the figures). It changes no result: IEEE arithmetic is the
# same, only FP exception flags are no longer guaranteed to match the source's control flow (nothing here reads them).
_COMMON_FLAGS = ["-O3", "-fopenmp", "-fno-trapping-math"]


class Extension:
    """One C++ source here, built into the cache once; :meth:`get` loads it without compiling."""

    def __init__(self, stem: str, what: str, source_dir: Path = _HERE):
        self.source = Path(source_dir) / f"{stem}.cpp"
        self.stem = stem
        self.what = what  # for the warning: which functions fall back
        self.module: Optional[ModuleType] = None
        self.error: Optional[str] = None  # why the build failed (None if not tried or fine)
        self._lock = threading.Lock()
        self._looked = False  # whether get() has looked for a built library in this process

    def _name_and_flags(self):
        suffix, flags = _capability_flags()
        # torch's version too: a library built against another torch's headers is another binary (its ABI).
        digest = hashlib.sha256(self.source.read_bytes() + " ".join(_COMMON_FLAGS + flags).encode()
                                + torch.__version__.encode()).hexdigest()[:10]
        return f"sparsenorm_{self.stem}_{suffix}_{digest}", flags

    def _library_path(self, name: str) -> Path:
        return _build_directory() / name / f"{name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"

    def _import_built(self) -> Optional[ModuleType]:
        try:
            name, _ = self._name_and_flags()
        except OSError:
            return None
        path = self._library_path(name)
        if not (path.parent / _COMPLETE).exists():  # not built (folders appear only when complete)
            return None
        if not path.exists():
            path = path.with_name(f"{name}.so")
            if not path.exists():
                return None
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module

    def build(self, verbose: bool = False) -> Optional[ModuleType]:
        """Compile (or load the cached build); None, after one warning line, if that fails."""
        with self._lock:
            if self.module is not None:
                return self.module
            try:
                name, simd_flags = self._name_and_flags()
                root = _build_directory()
                root.mkdir(parents=True, exist_ok=True)
                from filelock import FileLock

                with FileLock(str(root / f"{name}.lock")):
                    # another process may have finished it while this one waited for the lock
                    self.module = self._import_built() or self._compile(name, simd_flags, root, verbose)
                self.error = None
            except Exception as exc:  # compiler/ninja missing, compile error, ...: fall back, say why
                self.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
                first_line = self.error.splitlines()[0][:300] if self.error else ""
                warnings.warn(
                    f"sparsenorm: could not build the C++ CPU kernel for {self.what}; using the reference "
                    f"path (needs a C++ compiler and `pip install ninja`). {first_line}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return self.module

    def _compile(self, name: str, simd_flags, root: Path, verbose: bool) -> ModuleType:
        """Build in a temporary folder and rename it to ``root/name`` once complete (lock held)."""
        from torch.utils import cpp_extension

        final = root / name
        for leftover in [*root.glob(f".{name}.*"), final]:  # killed builds (the lock is ours)
            shutil.rmtree(leftover, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
        try:
            module = cpp_extension.load(
                name=name,
                sources=[str(self.source)],
                extra_cflags=[*_COMMON_FLAGS, *simd_flags],
                extra_ldflags=["-fopenmp"],
                build_directory=str(staging),
                verbose=verbose,
            )
            (staging / _COMPLETE).touch()  # written only once the library has loaded
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone after the rename; else a failed build
        return module

    def load(self) -> Optional[ModuleType]:
        """The built extension, compiling it if needed (the old opt-in entry point)."""
        return self.module if self.module is not None else self.build()

    def get(self) -> Optional[ModuleType]:
        """The extension if the policy allows it: loaded if built, built only if asked to."""
        policy = _policy()
        if policy is False:
            return None
        if self.module is not None:
            return self.module
        if self.error is not None:
            return None
        if policy is None:
            # Looked for once per process: a kernel that another process builds meanwhile is not
            # picked up mid-run, so two calls of one function in one process take the same path
            # and round alike (a training run's numerics do not change when `build-kernels` runs).
            if self._looked:
                return self.module
            with self._lock:
                if self.module is None and not self._looked:
                    self._looked = True
                    try:
                        self.module = self._import_built()
                    except Exception as exc:  # a broken library file: say so once, use the reference
                        self.error = f"{type(exc).__name__}: {exc}"
                        warnings.warn(f"sparsenorm: could not load the built C++ kernel for {self.what}: "
                                      f"{self.error}", RuntimeWarning, stacklevel=3)
            return self.module
        return self.build()

    def kernel_for(self, x: torch.Tensor) -> Optional[ModuleType]:
        """The extension if it may be used and can take ``x`` (CPU float32/float64, non-empty)."""
        # (is_cpu: no Device object)
        if not x.is_cpu or x.dtype not in (torch.float32, torch.float64) or x.numel() == 0:
            return None
        module = self.get()
        if module is None and not _warned_not_built and self.error is None and _policy() is None:
            _warn_not_built(self.what)  # once per process: not built, and nothing asked for the reference path
        return module


EVIDENTIAL = Extension("evidential", "ev-softmax")
PROJECTION = Extension("projection", "sparsemax/entmax15/sparsehourglass")
RSOFTMAX = Extension("rsoftmax", "r-softmax/t-softmax")
EVIDENTIAL_ATTENTION = Extension("evidential_attention", "ev-softmax attention (blockwise forward)")
EXTENSIONS = (EVIDENTIAL, PROJECTION, RSOFTMAX, EVIDENTIAL_ATTENTION)
