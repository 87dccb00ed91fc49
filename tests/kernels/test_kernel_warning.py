"""The README's promise (issue 50, item 7): without the C++ kernels the pure-PyTorch path runs after
one warning, which names ``sparsenorm build-kernels``; none when the reference path was asked for."""
import warnings

import pytest
import torch

import sparsenorm
from sparsenorm.kernels import cpu as cpu_kernels


@pytest.fixture
def nothing_built(monkeypatch):
    """Every extension as in a process where no kernel is built, and no warning given yet."""
    for ext in cpu_kernels.EXTENSIONS:
        monkeypatch.setattr(ext, "module", None)
        monkeypatch.setattr(ext, "error", None)
        monkeypatch.setattr(ext, "_looked", False)
        monkeypatch.setattr(ext, "_import_built", lambda: None)
    monkeypatch.setattr(cpu_kernels, "_warned_not_built", False)
    monkeypatch.setattr(cpu_kernels, "_code_setting", None)
    monkeypatch.delenv("SPARSENORM_CPU_KERNELS", raising=False)


def _x():
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(0))


def test_one_warning_naming_build_kernels_then_the_reference_path(nothing_built):
    x = _x()
    with pytest.warns(RuntimeWarning, match="sparsenorm build-kernels") as record:
        out = sparsenorm.ev_softmax(x)
    assert len([w for w in record if "not built" in str(w.message)]) == 1
    assert record[0].filename == __file__  # points at the caller's line, not at sparsenorm or torch
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: no second warning, from any kernel
        again = sparsenorm.ev_softmax(x)
        sparsenorm.sparsemax(x)
        sparsenorm.r_softmax(x, 0.5)
    with sparsenorm.kernels.disabled():
        torch.testing.assert_close(out, sparsenorm.ev_softmax(x), rtol=0, atol=0)
    torch.testing.assert_close(again, out, rtol=0, atol=0)


@pytest.mark.parametrize("how", ["environment", "use_cpu_kernels", "disabled"])
def test_no_warning_when_the_reference_path_is_asked_for(nothing_built, monkeypatch, how):
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if how == "environment":
            monkeypatch.setenv("SPARSENORM_CPU_KERNELS", "0")
            sparsenorm.ev_softmax(x)
        elif how == "use_cpu_kernels":
            sparsenorm.use_cpu_kernels(False)
            sparsenorm.ev_softmax(x)
        else:
            with sparsenorm.kernels.disabled():
                sparsenorm.ev_softmax(x)
    assert not cpu_kernels._warned_not_built
