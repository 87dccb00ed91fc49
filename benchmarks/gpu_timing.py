"""The one timing helper of the GPU benchmarks (``bench_gpu``, ``bench_gpu_training``,
``bench_gpu_dispatch``): medians over interleaved rounds with CUDA events. Its own module, so that the
benchmarks import it without importing each other (``bench_gpu`` runs ``bench_gpu_training``'s parts)."""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List

import torch


def time_interleaved(fns: Dict[str, Callable[[], object]], rounds: int, reps: int) -> Dict[str, object]:
    """Median milliseconds per call of each function, over ``rounds`` interleaved rounds of ``reps``
    calls; a function that fails gives its error message instead."""
    times: Dict[str, List[float]] = {name: [] for name in fns}
    failed: Dict[str, str] = {}
    for name, fn in fns.items():  # warm-up: compilation, autotuning
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- reported in the table, the others still run
            failed[name] = "OOM" if isinstance(e, torch.cuda.OutOfMemoryError) else f"error: {type(e).__name__}"
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            if name in failed:
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / reps)
    return {name: failed.get(name) or statistics.median(times[name]) for name in fns}
