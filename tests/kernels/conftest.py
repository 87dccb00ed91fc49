"""Shared by the Triton test files: running a whole file again under Triton's CPU interpreter."""
import os
import subprocess
import sys

import pytest


@pytest.fixture
def run_under_interpreter():
    """Run a test file in a fresh interpreter with ``TRITON_INTERPRET=1`` and fail with its output.

    Triton reads the variable when first imported, so a process (e.g. an xdist worker) that has
    already imported triton normally cannot run the interpreter tests itself.
    """
    def run(path: str) -> None:
        env = dict(os.environ, TRITON_INTERPRET="1")
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
                              env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

    return run
