"""CPU time and peak extra memory: blockwise sparsemax / 1.5-entmax attention vs SDPA and the dense path.

Paths: ``sdpa-math`` and ``sdpa-default`` (``F.scaled_dot_product_attention`` with the math
backend, resp. whatever CPU backend torch picks), ``dense-<kind>`` (``sparsenorm.sparse_attention``,
which builds the L x S weights) and ``blockwise-<kind>`` (``sparsenorm::projection_attention``).
Inputs: batch 1, ``--heads`` heads, head dim ``--dim``, float32, self-attention (S = L), no mask.

Peak extra memory is measured in a fresh subprocess per (path, length): after a warm-up call on a
small input (libraries loaded, thread pools started) and after the inputs exist, the kernel's
peak-RSS counter is reset (``/proc/self/clear_refs``), the path runs once, and the extra memory is
the peak RSS (``VmHWM``) minus the RSS before. It counts every allocation the call touches
(torch's CPU allocator has no statistics of its own) and is not affected by machine load.
Times are the best of ``--repeat`` runs, single-threaded by default.

    python benchmarks/bench_attention_projection.py --lengths 512 1024 2048 4096
    python benchmarks/bench_attention_projection.py --memory-only --lengths 16384 --paths blockwise-sparsemax
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: import this checkout's sparsenorm
    sys.path.insert(0, str(ROOT))

KINDS = ("sparsemax", "entmax15", "entmax_bisect")  # entmax_bisect: alpha = 1.5, 50 halvings
PATHS = ["sdpa-math", "sdpa-default"] + [f"{p}-{k}" for p in ("dense", "blockwise") for k in KINDS]
DEFAULT_PATHS = [p for p in PATHS if not p.endswith("entmax_bisect")]  # bisection: 50 passes, run on request
DENSE_MAX_LENGTH = 8192
"""Above this the dense paths are not run (their L x L weights no longer fit comfortably)."""


def attention_fn(path: str) -> Callable:
    import sparsenorm
    from sparsenorm.kernels.attention_projection_ops import projection_attention

    if path == "sdpa-math":
        def run(q, k, v):
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, k, v)
        return run
    if path == "sdpa-default":
        return F.scaled_dot_product_attention
    family, kind = path.split("-", 1)
    if family == "dense":
        return lambda q, k, v: sparsenorm.attention.sparse_attention(q, k, v, normalizer=kind)
    if family == "blockwise":
        return lambda q, k, v: projection_attention(q, k, v, kind)
    raise ValueError(f"unknown path {path!r}; choose from {PATHS}")


def inputs(L: int, dim: int, heads: int, backward: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, L, dim, generator=g).requires_grad_(backward) for _ in range(3))


def call(fn: Callable, q, k, v, backward: bool) -> None:
    out = fn(q, k, v)
    if backward:
        out.backward(torch.ones_like(out))


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _child(path: str, L: int, dim: int, heads: int, backward: bool) -> Dict:
    torch.set_num_threads(1)
    fn = attention_fn(path)
    call(fn, *inputs(64, dim, heads, backward), backward)  # warm-up
    q, k, v = inputs(L, dim, heads, backward)
    gc.collect()
    before = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
    call(fn, q, k, v, backward)
    return {"extra_bytes": (_rss_kib("VmHWM") - before) * 1024}


def peak_extra_bytes(path: str, L: int, dim: int = 64, heads: int = 1, backward: bool = False) -> Optional[int]:
    """Peak memory (bytes) one call of ``path`` takes beyond its inputs, in a fresh process; None
    where the peak-RSS counter cannot be reset (not Linux)."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        return None
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", path, str(L), str(dim), str(heads),
           str(int(backward))]
    # Large blocks straight from and back to the OS (mmap), so a freed block is not silently reused
    # from an earlier call and the peak RSS is the peak of live allocations.
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory measurement of {path} at L={L} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["extra_bytes"]


def best_time(fn: Callable, L: int, dim: int, heads: int, backward: bool, repeat: int) -> float:
    q, k, v = inputs(L, dim, heads, backward)
    times = []
    for _ in range(repeat):
        for t in (q, k, v):
            t.grad = None
        start = time.perf_counter()
        call(fn, q, k, v, backward)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--paths", nargs="+", default=DEFAULT_PATHS, choices=PATHS)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-only", action="store_true", help="measure peak memory, not time")
    parser.add_argument("--no-backward", action="store_true", help="time the forward pass only")
    parser.add_argument("--backward-memory", action="store_true", help="also measure forward+backward peak memory")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        path, L, dim, heads, backward = args.child
        print(json.dumps(_child(path, int(L), int(dim), int(heads), bool(int(backward)))))
        return
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'L':>6} {'path':<23} {'fwd ms':>9} {'fwd+bwd ms':>11} {'fwd extra MiB':>14} {'f+b extra MiB':>14} "
          f"{'L*L fp32 MiB':>13}")
    for L in args.lengths:
        for path in args.paths:
            if path.startswith("dense") and L > DENSE_MAX_LENGTH:
                continue
            row = {"L": L, "path": path, "dim": args.dim, "heads": args.heads, "threads": args.threads}
            if not args.memory_only:
                fn = attention_fn(path)
                row["forward_s"] = best_time(fn, L, args.dim, args.heads, False, args.repeat)
                if not args.no_backward:
                    row["forward_backward_s"] = best_time(fn, L, args.dim, args.heads, True, args.repeat)
            row["forward_extra_bytes"] = peak_extra_bytes(path, L, args.dim, args.heads, backward=False)
            if args.backward_memory:
                row["forward_backward_extra_bytes"] = peak_extra_bytes(path, L, args.dim, args.heads, backward=True)
            rows.append(row)
            ms = lambda key: f"{row[key] * 1e3:9.1f}" if key in row else f"{'-':>9}"  # noqa: E731
            mib = lambda key: "-" if row.get(key) is None else f"{row[key] / 2**20:.1f}"  # noqa: E731
            print(f"{L:>6} {path:<23} {ms('forward_s')} {ms('forward_backward_s'):>11} "
                  f"{mib('forward_extra_bytes'):>14} {mib('forward_backward_extra_bytes'):>14} "
                  f"{args.heads * L * L * 4 / 2**20:>13.1f}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
