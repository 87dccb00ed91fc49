"""Forward+backward timing of sparsenorm's sparsemax / entmax15 against the entmax package and softmax.

    python benchmarks/sparsemax_entmax.py [--shapes 4096x128,1024x1024] [--rounds 9] [--threads N]

float32 on CPU, inputs ``2 * randn`` (as ``python -m sparsenorm.bench``), upstream gradient
``randn``. Each round times every candidate once, in a fresh random order (interleaved, so
machine noise hits all alike); the table shows the median over rounds and the ratio to
``torch.softmax``. The issue-2 targets: ``sparsemax`` and ``entmax15`` faster than the entmax
package's best setting (full sort or ``k=64``) on every shape, and <= 4x softmax.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import entmax
from sparsenorm import _cpu_kernels, _sparsemax_kernels, entmax15, sparsemax


def _with_kernel(fn):
    """``fn`` with the opt-in fused C++ CPU kernel switched on for the call."""
    def run(x):
        _cpu_kernels.use_cpu_kernels(True)
        try:
            return fn(x)
        finally:
            _cpu_kernels.use_cpu_kernels(False)
    return run

SHAPES = [(4096, 128), (1024, 1024), (256, 32000), (4 * 8 * 512, 512)]

CANDIDATES = {
    "torch.softmax": lambda x: torch.softmax(x, -1),
    "sparsenorm.sparsemax": lambda x: sparsemax(x),
    "entmax.sparsemax": lambda x: entmax.sparsemax(x),
    "entmax.sparsemax(k=64)": lambda x: entmax.sparsemax(x, k=64),
    "sparsenorm.entmax15": lambda x: entmax15(x),
    "entmax.entmax15": lambda x: entmax.entmax15(x),
    "entmax.entmax15(k=64)": lambda x: entmax.entmax15(x, k=64),
    "sparsenorm.sparsemax [C++ kernel]": _with_kernel(sparsemax),
    "sparsenorm.entmax15 [C++ kernel]": _with_kernel(entmax15),
}


def time_shape(shape, rounds: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=gen) * 2).requires_grad_(True)
    grad = torch.randn(shape, generator=gen)
    times = {name: [] for name in CANDIDATES}
    for r in range(rounds + 1):  # round 0 warms up
        order = list(CANDIDATES)
        random.Random(r).shuffle(order)
        for name in order:
            x.grad = None
            start = time.perf_counter()
            CANDIDATES[name](x).backward(grad)
            if r:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) * 1e3 for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{a}x{b}" for a, b in SHAPES))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    _cpu_kernels.use_cpu_kernels(True)
    if _sparsemax_kernels.load() is None:  # build once up front (or drop the kernel rows)
        for name in [n for n in CANDIDATES if "C++" in n]:
            del CANDIDATES[name]
    _cpu_kernels.use_cpu_kernels(False)
    print(f"float32 CPU forward+backward, median of {args.rounds} interleaved rounds, {torch.get_num_threads()} threads")
    print("| shape | candidate | ms | x softmax |\n| --- | --- | ---: | ---: |")
    for shape in shapes:
        med = time_shape(shape, args.rounds)
        base = med["torch.softmax"]
        for name, ms in med.items():
            print(f"| {shape[0]}x{shape[1]} | {name} | {ms:.2f} | {ms / base:.1f} |", flush=True)
        for ours, refs in (("sparsemax", ("entmax.sparsemax", "entmax.sparsemax(k=64)")),
                           ("entmax15", ("entmax.entmax15", "entmax.entmax15(k=64)"))):
            best = min(med[r] for r in refs)
            print(f"| {shape[0]}x{shape[1]} | {ours}: entmax best / ours | | {best / med['sparsenorm.' + ours]:.1f} |")
            kernel = f"sparsenorm.{ours} [C++ kernel]"
            if kernel in med:
                print(f"| {shape[0]}x{shape[1]} | {ours} [C++ kernel]: entmax best / ours | | {best / med[kernel]:.1f} |")


if __name__ == "__main__":
    main()
