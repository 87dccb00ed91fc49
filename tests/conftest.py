"""Fixtures shared by every test folder."""
import pytest
import torch


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
