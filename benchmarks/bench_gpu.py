"""GPU benchmark of the Triton kernels: ``python -m benchmarks.bench_gpu`` (needs CUDA and triton).

Row-wise kernels: time per call, GB/s (bytes read + written) and the fraction of the GPU's DRAM
bandwidth (from its memory clock and bus width), beside ``torch.softmax`` (and its backward),
sparsenorm's PyTorch path, and AdaSplash's ``triton_entmax`` where installed.

Attention (causal and not, L = 1k..32k, head dims 64 and 128, B*L = 16k tokens, H*D = 2048):
forward and forward+backward of the flash ev-softmax attention and of ev-softmax on FlexAttention
(``sparsenorm.kernels.flex_attention``, where torch has it) beside ``F.scaled_dot_product_attention``
restricted to its flash and its memory-efficient backends, FlashAttention-2 (``flash_attn``) and
AdaSplash (``adasplash``, entmax-1.5 attention) where installed.

Every number is the median over interleaved rounds (each round times every method once, after a
warm-up), with CUDA events. Without a CUDA device it exits with one line saying so.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Callable, Dict, List, Optional

import torch

DEVICE = "cuda"


def _no_gpu_reason() -> Optional[str]:
    if not torch.cuda.is_available():
        return "no CUDA GPU is available here (torch.cuda.is_available() is False)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install 'sparsenorm[gpu]')"
    return None


def dram_bandwidth_gbs() -> Optional[float]:
    """Peak DRAM bandwidth in GB/s from the device properties (double data rate), or None."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


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


def _fmt(v, digits=3) -> str:
    return v if isinstance(v, str) else f"{v:.{digits}f}"


def _table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- row-wise
ROW_SHAPES = [(65536, 1024), (8192, 8192), (2048, 32768), (512, 131072)]  # 64M entries each


def bench_rowwise(dtype: torch.dtype, rounds: int, quick: bool) -> List[dict]:
    import sparsenorm
    from sparsenorm.kernels.triton import evidential, projection

    try:
        from adasplash import triton_entmax
    except Exception:  # noqa: BLE001 -- optional competitor
        triton_entmax = None
    peak = dram_bandwidth_gbs()
    results = []
    for rows, cols in ROW_SHAPES[:2] if quick else ROW_SHAPES:
        x = torch.randn(rows, cols, device=DEVICE, dtype=dtype)
        out = torch.softmax(x, -1)
        g = torch.randn_like(x)
        ev_out = evidential.ev_softmax_forward(x)
        fwd = {
            "torch.softmax": lambda: torch.softmax(x, -1),
            "ev_softmax (Triton)": lambda: evidential.ev_softmax_forward(x),
            "log ev_softmax_train (Triton)": lambda: evidential.ev_softmax_forward(x, 1e-6, True),
            "ev_softmax (PyTorch path)": lambda: sparsenorm.ev_softmax(x),
        }
        if cols <= projection.MAX_COLS:
            fwd["sparsemax (Triton)"] = lambda: projection.project(x, "sparsemax")
            fwd["entmax15 (Triton)"] = lambda: projection.project(x, "entmax15")
        if triton_entmax is not None:
            fwd["entmax15 (AdaSplash triton_entmax)"] = lambda: triton_entmax(x, alpha=1.5)
        bwd = {
            "softmax backward (torch)": lambda: torch._softmax_backward_data(g, out, -1, x.dtype),
            "ev_softmax backward (Triton)": lambda: evidential.ev_softmax_backward(g, ev_out),
        }
        for kind, fns, passes in (("forward", fwd, 2), ("backward", bwd, 3)):
            timed = time_interleaved(fns, rounds, reps=10)
            base = timed[next(iter(fns))]
            for name, ms in timed.items():
                gbs = passes * x.numel() * x.element_size() / (ms * 1e-3) / 1e9 if not isinstance(ms, str) else ms
                results.append(dict(shape=f"{rows}x{cols}", pass_=kind, method=name, ms=ms, gbs=gbs,
                                    dram=(gbs / peak if peak and not isinstance(gbs, str) else None),
                                    vs_softmax=(ms / base if not isinstance(ms, str) and not isinstance(base, str)
                                                else None)))
        del x, out, g, ev_out
        torch.cuda.empty_cache()
    return results


# ------------------------------------------------------------------------------------- attention
ATTENTION_LENGTHS = [1024, 4096, 16384, 32768]
HEAD_DIMS = (64, 128)
TOKENS, WIDTH = 16384, 2048  # B * L and H * D

def bench_attention(dtype: torch.dtype, rounds: int, quick: bool) -> List[dict]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sparsenorm.kernels.ops.evidential_attention import flash_ev_softmax_attention

    try:
        from flash_attn import flash_attn_func
    except Exception:  # noqa: BLE001 -- optional competitor
        flash_attn_func = None
    try:
        from adasplash import adasplash
    except Exception:  # noqa: BLE001 -- optional competitor
        adasplash = None

    from sparsenorm.kernels.flex_attention import ev_softmax_flex_attention, flex_available

    def sdpa_with(backend):
        def run(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    methods = {
        "ev-softmax flash (Triton)": lambda q, k, v, c: flash_ev_softmax_attention(q, k, v, is_causal=c),
        "SDPA flash (softmax)": sdpa_with(SDPBackend.FLASH_ATTENTION),
        "SDPA efficient (softmax)": sdpa_with(SDPBackend.EFFICIENT_ATTENTION),
    }
    if flex_available():
        methods["ev-softmax Flex"] = lambda q, k, v, c: ev_softmax_flex_attention(q, k, v, is_causal=c)
    if flash_attn_func is not None:
        methods["FlashAttention-2 (softmax)"] = (
            lambda q, k, v, c: flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=c))
    if adasplash is not None:
        methods["AdaSplash (entmax-1.5)"] = lambda q, k, v, c: adasplash(q, k, v, alpha=1.5, is_causal=c)

    results = []
    lengths = ATTENTION_LENGTHS[:2] if quick else ATTENTION_LENGTHS
    for D in HEAD_DIMS[:1] if quick else HEAD_DIMS:  # quick: D = 64 only (autotuning compiles per head dim)
        for L in lengths:
            for causal in (False, True):
                B, H = max(1, TOKENS // L), WIDTH // D
                q, k, v = (torch.randn(B, H, L, D, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(3))
                do = torch.randn(B, H, L, D, device=DEVICE, dtype=dtype)
                flops = 4 * B * H * L * L * D / (2 if causal else 1)
                for kind in ("forward", "forward+backward"):
                    fns = {}
                    for name, f in methods.items():
                        if kind == "forward":
                            fns[name] = (lambda f=f: f(q, k, v, causal))
                        else:
                            fns[name] = (lambda f=f: torch.autograd.grad(f(q, k, v, causal), (q, k, v), do))
                    with torch.no_grad() if kind == "forward" else torch.enable_grad():
                        timed = time_interleaved(fns, rounds, reps=5)
                    base = timed["SDPA flash (softmax)"]
                    total = flops * (1 if kind == "forward" else 3.5)
                    for name, ms in timed.items():
                        ok = not isinstance(ms, str)
                        results.append(dict(D=D, L=L, B=B, H=H, causal=causal, pass_=kind, method=name, ms=ms,
                                            tflops=(total / (ms * 1e-3) / 1e12 if ok else None),
                                            vs_sdpa=(ms / base if ok and not isinstance(base, str) else None)))
                del q, k, v, do
                torch.cuda.empty_cache()
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes (L <= 4096, D = 64, two row shapes)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (median reported)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                        help="input dtype (attention: bfloat16 or float16)")
    parser.add_argument("--only", choices=["rowwise", "attention"], help="run one part only")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    reason = _no_gpu_reason()
    if reason is not None:
        print(f"benchmarks.bench_gpu: {reason}; GPU timings are not measured.", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    peak = dram_bandwidth_gbs()
    print(f"# GPU benchmark: {torch.cuda.get_device_name()}, DRAM peak "
          f"{_fmt(peak, 0) if peak else 'unknown'} GB/s, torch {torch.__version__}, {args.dtype}, "
          f"median of {args.rounds} interleaved rounds\n")
    report: Dict[str, object] = {"device": torch.cuda.get_device_name(), "dram_peak_gbs": peak, "dtype": args.dtype}
    if args.only in (None, "rowwise"):
        rows = bench_rowwise(dtype, args.rounds, args.quick)
        report["rowwise"] = rows
        print("## Row-wise kernels\n")
        print(_table(["shape", "pass", "method", "ms", "GB/s", "of DRAM peak", "time vs torch"],
                     [[r["shape"], r["pass_"], r["method"], _fmt(r["ms"]), _fmt(r["gbs"], 0),
                       "-" if r["dram"] is None else f"{100 * r['dram']:.0f} %",
                       "-" if r["vs_softmax"] is None else f"{r['vs_softmax']:.2f}x"] for r in rows]))
        print()
    if args.only in (None, "attention"):
        if dtype == torch.float32:
            print("attention is benchmarked in bfloat16/float16 only", file=sys.stderr)
        else:
            rows = bench_attention(dtype, args.rounds, args.quick)
            report["attention"] = rows
            print("## Attention\n")
            print(_table(["D", "L", "B x H", "causal", "pass", "method", "ms", "TFLOP/s", "time vs SDPA flash"],
                         [[str(r["D"]), str(r["L"]), f"{r['B']}x{r['H']}", str(r["causal"]), r["pass_"], r["method"],
                           _fmt(r["ms"]), "-" if r["tflops"] is None else f"{r['tflops']:.0f}",
                           "-" if r["vs_sdpa"] is None else f"{r['vs_sdpa']:.2f}x"] for r in rows]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
