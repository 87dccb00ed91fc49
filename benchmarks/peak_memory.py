"""Peak memory of one call, the CPU benchmarks' method (``bench_attention``, ``bench_linear_loss``,
``bench_linear_ce_torch``).

Each measurement runs in a fresh subprocess (:func:`in_subprocess`: ``python -m BENCHMARK --_peak ...``,
which calls :func:`peak_extra_bytes` there). After the benchmark's warm-up and once its inputs are
made, ``/proc/self/clear_refs`` resets the process's peak resident size (VmHWM); the figure is the
peak resident size during the call minus the resident size before it. Blocks of 64 KiB and more come
straight from and go back to the OS (``MALLOC_MMAP_THRESHOLD_``), so a block freed by the warm-up is
not reused unseen and the peak is the peak of live allocations. Linux only.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_status(field: str) -> int:
    """A size field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_bytes(call: Callable[[], object]) -> int:
    """Peak extra resident bytes of ``call()`` in this process (warm-up and inputs done before)."""
    before = read_status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    call()
    return read_status("VmHWM") - before


def in_subprocess(module: str, args: Sequence[object], what: str) -> Optional[int]:
    """``python -m MODULE --_peak ARGS...`` in a fresh process: the number on the last line of its output
    (the module's ``--_peak`` prints :func:`peak_extra_bytes`); None if it failed (e.g. not Linux, out of
    memory), said on stderr with ``what``."""
    cmd = [sys.executable, "-m", module, "--_peak", *map(str, args)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    # From the repository root, so that ``-m benchmarks.<module>`` resolves wherever this was started.
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    if proc.returncode != 0:
        print(f"  memory of {what} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return int(proc.stdout.strip().splitlines()[-1])
