"""Shared by every test: the header line saying which SIMD level and which C++ kernels this run used."""
import torch


def pytest_report_header(config):
    from sparsenorm import kernels

    built = [name for name, ok in kernels.available().items() if ok]
    return (f"sparsenorm: SIMD level {torch.backends.cpu.get_cpu_capability()} "
            f"(ATEN_CPU_CAPABILITY to choose), C++ kernels built at it: {', '.join(built) or 'none'}")
