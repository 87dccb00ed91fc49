"""Benchmark: every normalizer against ``torch.softmax`` and the ``entmax`` package, side by side.

    python -m benchmarks.bench [--shapes 4096x128,1024x1024] [--rounds 7] [--normalizers a,b]
                               [--device cpu] [--json FILE] [--no-compile] [--clock wall|thread]

Times float32 forward and forward+backward for each shape. Every candidate is timed once per round,
in a fresh random order each round (interleaved, so machine noise hits all alike), and the
median over rounds is reported. Ratios are against ``torch.softmax`` (``torch.log_softmax`` for
log-probability functions) and against the ``entmax`` package's best setting of the same
function (full sort or ``k=64``), when that package is installed.

Rows come from the registry (``sparsenorm.registry``), which says what each normalizer has:
the default path (what a user gets: the C++ CPU kernels where built), a "[reference]" row (the
pure-PyTorch path, ``sparsenorm.kernels.disabled()``) for those with ``cpu_kernel``, a
"[compile]" row (``torch.compile(dynamic=True)`` of the default path, compiled in the warm-up) for each,
and the ``entmax`` package's twin (``entmax_twin``). ``--clock thread`` runs on one thread and
times per-thread CPU time (``time.thread_time``), which other processes on a busy machine
disturb much less than wall time.
"""
from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable, Dict, List, Optional, Tuple

import torch

from sparsenorm import kernels, registry

DEFAULT_SHAPES = [(4096, 128), (1024, 1024), (256, 32000), (4 * 8 * 512, 512)]


@dataclass
class Candidate:
    label: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    baseline: str  # "softmax" or "log_softmax": what its ratio is taken against
    entmax_twin: Optional[str] = None  # the registry name whose entmax-package twin it is compared with


def default_names() -> List[str]:
    """Every registry normalizer that is a function of the logits alone, softmax (the baseline) aside."""
    return [n for n in registry.names() if n != "softmax" and not registry.get(n).posthoc]


def _entmax_references(names: List[str]) -> Dict[str, Dict[str, Callable]]:
    """The entmax package's twins of the given normalizers, by registry name, each with and
    without ``k`` where the twin takes it (if the package is installed)."""
    try:
        import entmax
    except ImportError:
        return {}
    refs: Dict[str, Dict[str, Callable]] = {}
    for name in names:
        norm = registry.get(name)
        twin = getattr(entmax, norm.entmax_twin, None) if norm.entmax_twin else None
        if twin is None:
            continue
        params = dict(norm.params)
        impls = {f"entmax.{norm.entmax_twin}": lambda x, f=twin, kw=params: f(x, dim=-1, **kw)}
        if "k" in inspect.signature(twin).parameters:
            impls[f"entmax.{norm.entmax_twin}(k=64)"] = lambda x, f=twin, kw=params: f(x, dim=-1, k=64, **kw)
        refs[name] = impls
    return refs


def _same_function(f: Callable, g: Callable) -> bool:
    """f and g are the same callable, or partials of one function with the same arguments."""
    if isinstance(f, partial) and isinstance(g, partial):
        return f.func is g.func and f.args == g.args and f.keywords == g.keywords
    return f is g


def _reference_path(fn: Callable) -> Callable:
    """fn on the pure-PyTorch path (forward and backward)."""

    def run(x):
        with kernels.disabled():
            return fn(x)

    run.disables_kernels = True  # backward must run inside the block too
    return run


def build_candidates(names: List[str], compile_rows: bool = True) -> Tuple[List[Candidate], Dict]:
    candidates = [
        Candidate("torch.softmax", lambda x: torch.softmax(x, dim=-1), "softmax"),
        Candidate("torch.log_softmax", lambda x: torch.log_softmax(x, dim=-1), "log_softmax"),
    ]
    refs = _entmax_references(names)
    for name in names:
        norm = registry.get(name)
        forms = [(name, norm.forward, "softmax")]
        if not _same_function(norm.train_forward, norm.forward):
            forms.append((f"{name} (train)", norm.train_forward, "softmax"))
        if norm.log_prob is not None:
            forms.append((f"{name} (log, train)", norm.log_prob, "log_softmax"))
        for label, f, base in forms:
            fn = (lambda x, f=f: f(x, dim=-1))
            twin = name if name in refs and label == name else None
            candidates.append(Candidate(label, fn, base, twin))
            if norm.cpu_kernel:
                candidates.append(Candidate(f"{label} [reference]", _reference_path(fn), base, twin))
            if compile_rows and label == name:
                candidates.append(Candidate(f"{label} [compile]", torch.compile(fn, dynamic=True), base, twin))
    for impls in refs.values():
        candidates += [Candidate(label, fn, "softmax") for label, fn in impls.items()]
    return candidates, refs


_clock = time.perf_counter  # time.thread_time with --clock thread


def _time_once(fn: Callable, x: torch.Tensor, grad: Optional[torch.Tensor], reps: int) -> float:
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    guard = kernels.disabled if getattr(fn, "disables_kernels", False) else _no_guard
    sync()
    start = _clock()
    with guard():
        for _ in range(reps):
            if grad is None:
                with torch.no_grad():
                    fn(x)
            else:
                x.grad = None
                fn(x).backward(grad)
    sync()
    return (_clock() - start) / reps


class _no_guard:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def bench_shape(candidates: List[Candidate], shape: Tuple[int, int], rounds: int, device: str,
                seed: int = 0) -> Dict[str, Dict[str, float]]:
    """Median seconds per call, {label: {"fwd": s, "fwd+bwd": s}}, over interleaved rounds."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 2).to(device).requires_grad_(True)
    grad = torch.randn(shape, generator=gen).to(device)
    jobs = [(c, mode) for c in candidates for mode in ("fwd", "fwd+bwd")]
    times: Dict[Tuple[str, str], List[float]] = {(c.label, mode): [] for c, mode in jobs}
    reps: Dict[Tuple[str, str], int] = {}
    for c, mode in jobs:  # warm-up, and pick reps so that one timing lasts about 20 ms
        t = _time_once(c.fn, x, None if mode == "fwd" else grad, 1)
        reps[(c.label, mode)] = max(1, min(50, int(0.02 / max(t, 1e-6))))
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(jobs)
        for c, mode in jobs:
            key = (c.label, mode)
            times[key].append(_time_once(c.fn, x, None if mode == "fwd" else grad, reps[key]))
    out: Dict[str, Dict[str, float]] = {}
    for c in candidates:
        out[c.label] = {mode: statistics.median(times[(c.label, mode)]) for mode in ("fwd", "fwd+bwd")}
    return out


def ratio_rows(candidates: List[Candidate], refs, result: Dict[str, Dict[str, float]]):
    rows = []
    for c in candidates:
        base = result["torch.softmax" if c.baseline == "softmax" else "torch.log_softmax"]
        row = {
            "function": c.label,
            "fwd_ms": result[c.label]["fwd"] * 1e3,
            "fwdbwd_ms": result[c.label]["fwd+bwd"] * 1e3,
            "fwd_vs_softmax": result[c.label]["fwd"] / base["fwd"],
            "fwdbwd_vs_softmax": result[c.label]["fwd+bwd"] / base["fwd+bwd"],
            "fwdbwd_vs_entmax_best": None,
        }
        if c.entmax_twin:
            best = min(result[label]["fwd+bwd"] for label in refs[c.entmax_twin])
            row["fwdbwd_vs_entmax_best"] = result[c.label]["fwd+bwd"] / best
        rows.append(row)
    return rows


def format_table(shape, rows) -> str:
    lines = [
        f"### {shape[0]} x {shape[1]} (float32)",
        "",
        "| function | fwd ms | fwd+bwd ms | fwd / softmax | fwd+bwd / softmax | fwd+bwd / entmax pkg best |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs_entmax = "" if r["fwdbwd_vs_entmax_best"] is None else f"{r['fwdbwd_vs_entmax_best']:.2f}x"
        lines.append(
            f"| {r['function']} | {r['fwd_ms']:.2f} | {r['fwdbwd_ms']:.2f} | {r['fwd_vs_softmax']:.2f}x "
            f"| {r['fwdbwd_vs_softmax']:.2f}x | {vs_entmax} |"
        )
    return "\n".join(lines)


def _parse_shapes(text: str) -> List[Tuple[int, int]]:
    try:
        return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]  # type: ignore[misc]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes must look like 4096x128,1024x1024; got {text!r}") from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=_parse_shapes, default=DEFAULT_SHAPES)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--normalizers", default=",".join(default_names()),
                        help=f"comma-separated registry names (known: {', '.join(registry.names())})")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="thread: one thread, per-thread CPU time (less noisy on a busy machine)")
    args = parser.parse_args(argv)
    global _clock
    if args.clock == "thread":
        torch.set_num_threads(1)
        _clock = time.thread_time
    names = [n.strip() for n in args.normalizers.split(",") if n.strip()]
    for n in names:
        if registry.get(n).posthoc:  # unknown names fail in get(), listing the known ones
            parser.error(f"{n} is not a function of the logits alone (post-hoc); it cannot be timed here")
    # One compiled graph per (normalizer, grad mode, shape): more than dynamo's default cache holds.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    candidates, refs = build_candidates(names, compile_rows=not args.no_compile)
    print(f"kernels in use: {kernels.available()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
          f"SIMD level {torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY), "
          f"median of {args.rounds} interleaved rounds, {args.clock} clock")
    report = {}
    for shape in args.shapes:
        result = bench_shape(candidates, shape, args.rounds, args.device)
        rows = ratio_rows(candidates, refs, result)
        report[f"{shape[0]}x{shape[1]}"] = rows
        print()
        print(format_table(shape, rows), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
