"""The CUDA suite (``pytest -m cuda``; ``make gpu-check`` runs it on a lent GPU).

Every test here is marked ``cuda`` (``pytestmark`` in each file) and gets its device from the
``device`` fixture: ``"cuda"``, skipped where no CUDA device is present. With
``SPARSENORM_CUDA_SUITE_DEVICE=cpu`` the same bodies run on CPU instead (Triton kernels under its
interpreter, the other paths on the CPU kernels), which is how the suite is shaken out on a machine
without a GPU; the variable must be set before pytest starts (Triton reads ``TRITON_INTERPRET``
once, when first imported, and this file sets it then).

The flash-attention kernels are autotuned per shape; benchmarking every configuration for every
shape a test draws would spend minutes of GPU time, so the suite pins each autotuner to one
configuration (``test_attention_cuda.py::test_every_autotune_configuration`` runs each in turn).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

from cuda_helpers import FULL_CONFIGS, autotuners

CPU_ENV = "SPARSENORM_CUDA_SUITE_DEVICE"
ON_CPU = os.environ.get(CPU_ENV, "cuda") == "cpu"
if ON_CPU and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _triton_interprets() -> bool:
    try:
        from sparsenorm.kernels.triton import _common
    except ImportError:
        return False
    return _common.INTERPRET


@pytest.fixture(scope="session")
def device() -> str:
    """``"cuda"``; skipped without a CUDA device (``"cpu"`` under ``SPARSENORM_CUDA_SUITE_DEVICE=cpu``)."""
    if ON_CPU:
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    return "cuda"


@pytest.fixture(scope="session")
def launchers(device):
    """The Triton launchers (``sparsenorm.kernels.triton``) for ``device``; skipped where they cannot run."""
    triton_pkg = pytest.importorskip("sparsenorm.kernels.triton", reason="triton is not installed")
    if device == "cpu" and not _triton_interprets():
        pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process")
    return triton_pkg


@pytest.fixture(scope="session", autouse=True)
def _one_autotune_configuration():
    """Pin every autotuned kernel to its first configuration for the session (see the module doc)."""
    if ON_CPU or not torch.cuda.is_available():
        yield
        return
    try:
        from sparsenorm.kernels.triton import attention
    except ImportError:
        yield
        return
    for tuner in autotuners(attention):
        tuner.configs = FULL_CONFIGS.setdefault(tuner, list(tuner.configs))[:1]
    yield
    for tuner, configs in FULL_CONFIGS.items():
        tuner.configs = configs


@pytest.fixture(autouse=True)
def _every_cuda_path_reachable():
    """The suite proves the CUDA paths (``sparsenorm.kernels.cuda_proof``): ``auto`` must reach every
    candidate kernel here, proven before or not, so each test of this folder runs with the rule lifted."""
    from sparsenorm.kernels import cuda_proof

    with cuda_proof.trusting():
        yield


FAILURE_LOG_ENV = "SPARSENORM_FAILURE_LOG"
FAILURE_TEXT_LIMIT = 4000


def pytest_runtest_logreport(report):
    """Append each failure's traceback to ``$SPARSENORM_FAILURE_LOG`` as it happens: a lent GPU window
    that stops the suite at its time limit still brings back why each finished test failed (pytest
    prints tracebacks only at the end; ``scripts/gpu_check.py`` sets the variable)."""
    path = os.environ.get(FAILURE_LOG_ENV)
    if not path or not report.failed:
        return
    with open(path, "a") as log:
        log.write(f"\n----- {report.when} FAILED {report.nodeid}\n{report.longreprtext[-FAILURE_TEXT_LIMIT:]}\n")
