"""Benchmark: ``sparse_attention`` against ``F.scaled_dot_product_attention``, time and peak memory.

    python -m benchmarks.bench_attention [--lengths 512,2048,8192] [--batch-heads 8] [--dim 64]
        [--rounds 5] [--memory-lengths 1024,2048,4096,8192,16384] [--clock thread|wall]
        [--dense-limit-gb 16] [--json FILE] [--no-time] [--no-memory] [--forward-only]
    python -m benchmarks.bench_attention --report FILE.json   # the tables of a saved --json file

Self-attention without a mask, float32 on the CPU, queries/keys/values of shape (B*H, L, D).
Each candidate runs forward + backward (a fixed random output gradient), or with ``--forward-only``
the forward alone under ``torch.no_grad()``. Candidates: SDPA (math backend, default CPU kernel),
ev-softmax blockwise (the op's CPU kernel: the fused C++ forward where built, see
``sparsenorm.kernels.cpu``; and its pure-PyTorch reference, run inside
``sparsenorm.kernels.disabled()``) and dense, sparsemax/entmax15 dense (the L x S weights) and
blockwise (``sparsenorm::projection_attention``, O(L) extra memory); on request (``--candidates``)
the latter with its scores recomputed on every pass (``... (blockwise recomputed)``). Times are also given as a ratio
to SDPA's default CPU kernel, the target of issue 28.

* Time: every candidate once per round, in a fresh random order each round (interleaved), median
  over rounds; ratios against SDPA with the math backend (``sdpa_kernel(SDPBackend.MATH)``), the
  reference the issue names; SDPA's default CPU kernel (its fused flash kernel
  ``_scaled_dot_product_flash_attention_for_cpu``, given the inputs as (1, B*H, L, D) because it
  takes 4-D inputs only: 3-D ones silently run the math backend) is listed too. ``--clock thread``
  (default) runs on one thread and times per-thread CPU time, which other processes on a busy
  machine disturb much less than wall time.
* Peak memory (``peak_memory.py``): each (candidate, L) in a fresh subprocess, one thread: after a small warm-up call
  and the inputs are made, ``/proc/self/clear_refs`` resets the process's peak resident size
  (VmHWM); the reported figure is peak resident size during one forward + backward minus the
  resident size before it (Linux only). It includes the output and the gradients (4 B*H*L*D
  floats); allocations of 64 KiB and more are made to come from the OS and go back to it
  (``MALLOC_MMAP_THRESHOLD_``), so the allocator keeps no freed block to reuse unseen. Python's
  tracemalloc does not see torch's memory.

Dense candidates whose score matrices would exceed ``--dense-limit-gb`` (estimated as 5 float32
B*H*L*L tensors) are skipped and marked so.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional
from unittest import mock

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.bench import cpu_model, is_loaded, load_warning, machine_load
from benchmarks.peak_memory import in_subprocess, peak_extra_bytes
from sparsenorm._text import markdown_table
from sparsenorm.attention import sparse_attention
from sparsenorm.kernels import disabled
from sparsenorm.kernels.reference import projection_attention as attention_projection


MATH = "sdpa (math)"
PROJECTION = ["sparsemax (blockwise)", "entmax15 (blockwise)"]  # their threshold searched blockwise
FUSED = "sdpa (default CPU kernel)"
EV_REFERENCE = "ev_softmax (blockwise reference)"  # the blockwise op with the C++ kernels disabled
RECOMPUTED = {"sparsemax (blockwise recomputed)": "sparsemax", "entmax15 (blockwise recomputed)": "entmax15"}
"""The searched blockwise path with its scores recomputed on every pass (no query block's scores
kept: ``CACHE_KEY_BLOCKS = 0``), as before they were kept, and so solved by the search's passes
rather than by the C++ row solver that kept blocks get on CPU; results equal to rounding."""
CANDIDATES = [MATH, FUSED, "ev_softmax (blockwise)", EV_REFERENCE, "ev_softmax (dense)",
              "sparsemax (dense)", "entmax15 (dense)", *PROJECTION, *RECOMPUTED]
BLOCKWISE = {"ev_softmax (blockwise)", EV_REFERENCE, *PROJECTION, *RECOMPUTED}
DENSE_TENSORS = 5  # estimated live B*H*L*L float32 tensors of a dense forward + backward


def attention_fn(label: str) -> Callable:
    """``fn(q, k, v) -> out`` for a candidate label."""
    if label == MATH:
        def fn(q, k, v):
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, k, v)
        return fn
    if label == FUSED:
        def fn(q, k, v):  # as (1, B*H, L, D): SDPA's CPU flash kernel takes 4-D inputs only (3-D ones go to math)
            return F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)).squeeze(0)
        return fn
    if label == EV_REFERENCE:
        def fn(q, k, v):
            with disabled():
                return sparse_attention(q, k, v, "ev_softmax", backend="blockwise")
        return fn
    if label in RECOMPUTED:
        def fn(q, k, v):
            with mock.patch.object(attention_projection, "CACHE_KEY_BLOCKS", 0):
                return sparse_attention(q, k, v, RECOMPUTED[label], backend="blockwise")
        return fn
    name, backend = label.split(" ")
    return lambda q, k, v: sparse_attention(q, k, v, name, backend=backend.strip("()"))


def make_inputs(bh: int, length: int, dim: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(bh, length, dim, generator=g).requires_grad_() for _ in range(3))
    return q, k, v, torch.randn(bh, length, dim, generator=g)


def run_once(fn: Callable, q, k, v, grad, forward_only: bool = False) -> None:
    if forward_only:
        with torch.no_grad():
            fn(q, k, v)
        return
    for t in (q, k, v):
        t.grad = None
    fn(q, k, v).backward(grad)


def dense_fits(label: str, bh: int, length: int, limit_gb: float) -> bool:
    """Whether the candidate runs at this size: the O(L)-memory ones always (blockwise; SDPA's default
    CPU kernel, its flash kernel, which keeps one log-sum-exp per row for its backward), dense ones
    within ``limit_gb``. (Until the candidate passed 4-D inputs, SDPA ran its math backend on the
    3-D ones and held L x L matrices: that was the earlier "default CPU kernel" peak memory.)"""
    return label in BLOCKWISE or label == FUSED or DENSE_TENSORS * bh * length * length * 4 <= limit_gb * 2**30


def time_length(labels: List[str], bh: int, length: int, dim: int, rounds: int, clock,
                forward_only: bool = False) -> Dict[str, float]:
    fns = {label: attention_fn(label) for label in labels}
    for fn in fns.values():  # warm-up (first-call initialisation), on small inputs
        run_once(fn, *make_inputs(bh, 64, dim), forward_only=forward_only)
    q, k, v, grad = make_inputs(bh, length, dim)
    times: Dict[str, List[float]] = {label: [] for label in labels}
    for _ in range(rounds):
        order = list(labels)
        random.shuffle(order)
        for label in order:
            t0 = clock()
            run_once(fns[label], q, k, v, grad, forward_only)
            times[label].append(clock() - t0)
    return {label: statistics.median(ts) for label, ts in times.items()}


def measure_peak_here(label: str, bh: int, length: int, dim: int) -> int:
    """Peak extra resident bytes of one forward + backward, in this process (see module docstring)."""
    torch.set_num_threads(1)
    fn = attention_fn(label)
    run_once(fn, *make_inputs(bh, 64, dim))  # warm-up: lazy initialisation is not the candidate's memory
    q, k, v, grad = make_inputs(bh, length, dim)
    return peak_extra_bytes(lambda: run_once(fn, q, k, v, grad))


def measure_peak(label: str, bh: int, length: int, dim: int) -> Optional[int]:
    """:func:`measure_peak_here` in a fresh subprocess; None if it failed (e.g. not Linux, out of memory)."""
    return in_subprocess("benchmarks.bench_attention", [label, bh, length, dim], f"{label} at L={length}")


def _mb(n: Optional[int]) -> str:
    return "skipped" if n is None else f"{n / 2**20:.0f}"


def length_table(labels: List[str], times: Dict[str, float], peaks: Dict[str, Optional[int]]) -> str:
    """One length's Markdown table: time, ratios to SDPA's math backend and default CPU kernel, peak
    extra memory."""
    bases = (times.get(MATH), times.get(FUSED))
    rows = []
    for label in labels:
        t = times.get(label)
        rows.append([label, "skipped" if t is None else f"{t:.3f}",
                     *("n/a" if t is None or base is None else f"{t / base:.2f}" for base in bases),
                     _mb(peaks.get(label))])
    return markdown_table(["candidate", "time (s)", f"x {MATH}", f"x {FUSED}", "peak extra (MB)"], rows)


def scaling_table(scaling: Dict) -> str:
    """Peak extra memory (MB) against L, one column per candidate measured."""
    labels = list(dict.fromkeys(label for peaks in scaling.values() for label in peaks))
    return markdown_table(["L"] + labels, [[length] + [_mb(peaks.get(label)) for label in labels]
                                           for length, peaks in scaling.items()])


def markdown_report(results: dict) -> str:
    """The tables of a ``--json`` file, as ``main`` printed them when it was measured."""
    lines = [f"{results.get('pass', 'forward+backward')}, float32, B*H = {results['batch_heads']}, "
             f"D = {results['dim']}, "
             f"clock {results['clock']}, {results.get('threads', 1)} thread(s), SIMD level {results.get('simd', '?')}, "
             f"median of {results['rounds']} interleaved rounds; memory = peak RSS increase"]
    if results.get("load_at_start", {}).get("loaded"):
        lines += ["", "**Measured on a loaded machine** (see `load_at_start` in the JSON)."]
    for length, times in results["time_s"].items():
        peaks = results["peak_bytes"].get(length, {})
        labels = list(dict.fromkeys([*times, *peaks]))
        lines += ["", f"L = {length}:", "", length_table(labels, times, peaks)]
    if results.get("scaling_bytes"):
        lines += ["", "Peak extra memory (MB) of forward+backward against L:", "",
                  scaling_table(results["scaling_bytes"])]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--report"]:  # the tables of a saved --json file
        with open(argv[1]) as f:
            print(markdown_report(json.load(f)))
        return 0
    if argv[:1] == ["--_peak"]:
        label, bh, length, dim = argv[1], *map(int, argv[2:5])
        print(measure_peak_here(label, bh, length, dim))
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_attention", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="512,2048,8192")
    p.add_argument("--batch-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--candidates", default=",".join(c for c in CANDIDATES if c not in RECOMPUTED))
    p.add_argument("--memory-lengths", default="1024,2048,4096,8192,16384")
    p.add_argument("--dense-limit-gb", type=float, default=16.0)
    p.add_argument("--clock", choices=("thread", "wall"), default="thread")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for the timings (wall clock only: a per-thread clock misses the other threads)")
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--forward-only", action="store_true",
                   help="time the forward alone (under torch.no_grad); peak memory stays forward+backward")
    p.add_argument("--json")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    labels = [x for x in args.candidates.split(",") if x]
    unknown = set(labels) - set(CANDIDATES)
    if unknown:
        p.error(f"unknown candidates {sorted(unknown)}; known: {CANDIDATES}")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if args.clock == "thread" and args.threads != 1:
        p.error("--clock thread times one thread; use --clock wall with --threads > 1")
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    bh, dim = args.batch_heads, args.dim
    timed_pass = "forward" if args.forward_only else "forward+backward"
    load = machine_load()
    load["loaded"] = is_loaded(load, judge_loadavg=True)
    if load["loaded"]:
        print(load_warning(load), file=sys.stderr)
    results: dict = {"batch_heads": bh, "dim": dim, "clock": args.clock, "rounds": args.rounds, "pass": timed_pass,
                     "threads": args.threads, "simd": torch.backends.cpu.get_cpu_capability(),
                     "machine": {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "torch": torch.__version__},
                     "load_at_start": load, "time_s": {}, "peak_bytes": {}, "scaling_bytes": {}}
    print(f"# sparse_attention vs SDPA: {timed_pass}, float32, B*H={bh}, D={dim}, "
          f"clock={args.clock}, {args.threads} thread(s), SIMD level {torch.backends.cpu.get_cpu_capability()}, "
          f"median of {args.rounds} interleaved rounds; memory = peak RSS increase")
    for length in lengths:
        fit = [label for label in labels if dense_fits(label, bh, length, args.dense_limit_gb)]
        times = {} if args.no_time else time_length(fit, bh, length, dim, args.rounds, clock, args.forward_only)
        peaks = {} if args.no_memory else {label: measure_peak(label, bh, length, dim) for label in fit}
        results["time_s"][length], results["peak_bytes"][length] = times, peaks
        print(f"\n## L = {length}\n")
        print(length_table(labels, times, peaks))
        sys.stdout.flush()
    if not args.no_memory and args.memory_lengths:
        scaling_labels = [label for label in ("ev_softmax (blockwise)", *PROJECTION, MATH) if label in labels]
        for length in [int(x) for x in args.memory_lengths.split(",") if x]:
            results["scaling_bytes"][length] = {
                label: (measure_peak(label, bh, length, dim) if dense_fits(label, bh, length, args.dense_limit_gb)
                        else None) for label in scaling_labels}
        print("\n## Peak extra memory (MB) of forward+backward against L\n")
        print(scaling_table(results["scaling_bytes"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
