"""Tabulate the perf reports in this folder (written by record.sh) as markdown.

    python -m benchmarks.profiles.summarize [GLOB]     (default: *_avx512.txt)

Each report lists the top 40 (shared object, symbol) entries of `perf report --no-children` over
the timed loop; this groups their percentages into: the row kernel (sparsenorm's .so, or ATen's
softmax kernels for the baselines), exp (Sleef), other ATen ops (TensorIterator loops: extra
elementwise passes in Python code around the kernel), Python + dispatch (libpython, torch's
Python bindings, c10, libc malloc/free) and the OS (page faults of fresh allocations). Entries
below the top 40 are not counted, so rows sum to a little under 100 %.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GROUPS = ("kernel", "exp", "other ATen ops", "Python + dispatch", "OS (page faults)")
_ATEN_ROW_KERNELS = ("softmax_lastdim_kernel_impl", "softmax_backward_lastdim_kernel_impl",
                     "serial_vec_log_softmax_lastdim_range", "log_softmax_backward_lastdim_kernel_impl")


def group_of(dso: str, symbol: str) -> str:
    if "Sleef" in symbol:
        return "exp"
    if dso.startswith("sparsenorm_") or any(k in symbol for k in _ATEN_ROW_KERNELS):
        return "kernel"
    if dso.startswith("[kernel"):
        return "OS (page faults)"
    if dso.startswith("libtorch_cpu"):
        return "other ATen ops"
    return "Python + dispatch"


def summarize(path: Path):
    lines = path.read_text().splitlines()
    timing = lines[1].lstrip("# ").replace(" (loaded machine)", "")
    shares = dict.fromkeys(GROUPS, 0.0)
    top = None
    for line in lines[3:]:
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*)", line)
        if not m:
            continue
        pct, dso, symbol = float(m.group(1)), m.group(2), m.group(3)
        shares[group_of(dso, symbol)] += pct
        if top is None:
            top = f"{pct:.0f}% {re.sub(r'[(<].*', '', symbol.replace('(anonymous namespace)::', ''))[:48]}"
    return timing, shares, top


def main() -> None:
    pattern = sys.argv[1] if len(sys.argv) > 1 else "*_avx512.txt"
    print("| run (median ms/call, loaded machine) | top entry | " + " | ".join(GROUPS) + " |")
    print("|---|---|" + "---|" * len(GROUPS))
    for path in sorted(HERE.glob(pattern)):
        timing, shares, top = summarize(path)
        print(f"| {timing} | {top} | " + " | ".join(f"{shares[g]:.0f}%" for g in GROUPS) + " |")


if __name__ == "__main__":
    main()
