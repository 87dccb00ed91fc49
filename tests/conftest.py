"""Shared by every test: the header line saying which SIMD level and which C++ kernels this run
used, and the fixtures every test folder uses."""
import pytest
import torch


def pytest_report_header(config):
    from sparsenorm import kernels

    built = [name for name, ok in kernels.available().items() if ok]
    return (f"sparsenorm: SIMD level {torch.backends.cpu.get_cpu_capability()} "
            f"(ATEN_CPU_CAPABILITY to choose), C++ kernels built at it: {', '.join(built) or 'none'}")


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
