"""Shared by every test: the header line saying which SIMD level and which C++ kernels this run
used, and the fixtures every test folder uses.

No test reads or writes the user's caches (issue 50, item 6): every test gets its own, empty
sparsenorm cache (``SPARSENORM_CACHE``: data sets, pinned artifacts, converted models) and the
session its own Hugging Face home (``HF_HOME``), both in a temporary folder removed at the end, so
the suite passes the same whether the caches are empty or full after the main job. The C++ kernels
stay where they are built (``TORCH_EXTENSIONS_DIR`` is pinned to their folder first), so the suite
still runs them.
"""
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import pytest
import torch

_CACHES = {}  # "root": this process's temporary folder for the isolated caches
USER_CACHE_ENV = "SPARSENORM_TEST_USER_CACHE"
"""Names the user's own sparsenorm cache, for the one kind of test that may look into it: read-only, copying a
pinned file out into its ``tmp_path`` (and skipping when it is not there)."""


def pytest_configure(config):
    from sparsenorm._cache import cache_dir

    # Before SPARSENORM_CACHE moves: the kernels' build folder stays the user's (cache_dir()/torch_extensions).
    os.environ.setdefault(USER_CACHE_ENV, str(cache_dir()))  # xdist workers inherit the first value
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_dir() / "torch_extensions"))
    root = Path(tempfile.mkdtemp(prefix="sparsenorm-test-caches-"))
    _CACHES["root"] = root
    os.environ["HF_HOME"] = str(root / "huggingface")
    os.environ["SPARSENORM_CACHE"] = str(root / "session")  # replaced per test by _isolated_caches


def pytest_unconfigure(config):
    root = _CACHES.pop("root", None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def isolated_cache_path(nodeid: str) -> Path:
    """The sparsenorm cache a test sees: a folder of its own under this process's temporary root."""
    return _CACHES["root"] / "tests" / f"{zlib.crc32(nodeid.encode()):08x}"


@pytest.fixture(autouse=True)
def _isolated_caches(request, monkeypatch):
    """Each test starts with an empty sparsenorm cache of its own (created by whatever writes to it)."""
    monkeypatch.setenv("SPARSENORM_CACHE", str(isolated_cache_path(request.node.nodeid)))
    yield


def pytest_report_header(config):
    from sparsenorm import kernels

    import nudge

    built = [name for name, ok in kernels.available().items() if ok]
    salt = nudge.salt()
    return (f"sparsenorm: SIMD level {torch.backends.cpu.get_cpu_capability()} "
            f"(ATEN_CPU_CAPABILITY to choose), C++ kernels built at it: {', '.join(built) or 'none'}; "
            f"{torch.get_num_threads()} thread(s); perturbation mode: "
            + (f"on ({nudge.ENV}={salt})" if salt is not None else "off"))


@pytest.fixture(params=[False, True], ids=["default", "use_deterministic_algorithms"])
def deterministic_mode(request):
    """Runs the test with ``torch.use_deterministic_algorithms`` off, then on; restores the setting."""
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(request.param)
    try:
        yield request.param
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


@pytest.fixture(autouse=True)
def _nudged_reference_scores(monkeypatch):
    """``SPARSENORM_TEST_NUDGE=<salt>``: the reference path sees its scores moved by 1-2 ulp (tests/nudge.py)."""
    import nudge

    salt = nudge.salt()
    if salt is not None:
        nudge.install(monkeypatch, salt)
    yield


@pytest.fixture(autouse=True)
def _seeded_and_isolated(request):
    """Every test starts from its own seed and leaves the process as it found it.

    The global generators (torch, random, NumPy) are seeded from the test's id, so a test that
    draws from them (or builds a module whose initialisation does) gets the same inputs whatever
    ran before it in the same worker, in any order (issue 34). The process-wide settings a test
    may change (default dtype, threads, deterministic algorithms, grad mode, the C++ kernel
    switch) are restored afterwards.
    """
    import random

    import numpy as np

    from sparsenorm.kernels import cpu as cpu_kernels

    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    saved = (torch.get_default_dtype(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.is_grad_enabled(),
             cpu_kernels._code_setting)
    yield
    dtype, threads, deterministic, warn_only, grad, code_setting = saved
    torch.set_default_dtype(dtype)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.set_grad_enabled(grad)
    cpu_kernels._code_setting = code_setting
