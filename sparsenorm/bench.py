"""Benchmark: every normalizer against ``torch.softmax`` and the ``entmax`` package, side by side.

    python -m sparsenorm.bench [--shapes 4096x128,1024x1024] [--rounds 7] [--normalizers a,b]
                               [--device cpu] [--json FILE] [--cpu-kernels] [--clock wall|thread]

Times float32 forward and forward+backward for each shape. Every candidate is timed once per round,
in a fresh random order each round (interleaved, so machine noise hits all alike), and the
median over rounds is reported. Ratios are against ``torch.softmax`` (``torch.log_softmax`` for
log-probability functions) and against the ``entmax`` package's best setting of the same
function (full sort or ``k=64``), when that package is installed. ``--cpu-kernels`` adds
"[cpp]" rows for the functions that have an opt-in fused C++ kernel (ev-softmax's three forms,
sparsemax, entmax15), built first.
``--clock thread`` runs on one thread and times per-thread CPU time (``time.thread_time``), which
other processes on a busy machine disturb much less than wall time.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import registry

DEFAULT_SHAPES = [(4096, 128), (1024, 1024), (256, 32000), (4 * 8 * 512, 512)]


@dataclass
class Candidate:
    label: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    baseline: str  # "softmax" or "log_softmax": what its ratio is taken against
    entmax_twin: Optional[str] = None  # the entmax-package function it replaces, if any


def _entmax_references() -> Dict[str, Dict[str, Callable]]:
    """The entmax package's implementations, by our name, each with and without k (if installed)."""
    try:
        import entmax
    except ImportError:
        return {}
    return {
        "sparsemax": {
            "entmax.sparsemax": lambda x: entmax.sparsemax(x, dim=-1),
            "entmax.sparsemax(k=64)": lambda x: entmax.sparsemax(x, dim=-1, k=64),
        },
        "entmax15": {
            "entmax.entmax15": lambda x: entmax.entmax15(x, dim=-1),
            "entmax.entmax15(k=64)": lambda x: entmax.entmax15(x, dim=-1, k=64),
        },
        "entmax_bisect": {"entmax.entmax_bisect": lambda x: entmax.entmax_bisect(x, alpha=1.5, dim=-1)},
    }


def build_candidates(names: List[str]) -> Tuple[List[Candidate], Dict[str, Dict[str, Callable]]]:
    candidates = [
        Candidate("torch.softmax", lambda x: torch.softmax(x, dim=-1), "softmax"),
        Candidate("torch.log_softmax", lambda x: torch.log_softmax(x, dim=-1), "log_softmax"),
    ]
    refs = _entmax_references()
    for name in names:
        norm = registry.get(name)
        if name in ("softmax", "posthoc_evidential"):
            continue  # softmax is the baseline; post-hoc evidential is not a function of logits alone
        candidates.append(Candidate(name, lambda x, f=norm.forward: f(x, dim=-1), "softmax",
                                    entmax_twin=name if name in refs else None))
        if norm.train_forward is not norm.forward and name == "ev_softmax":
            candidates.append(Candidate(f"{name} (train, Eq. 10)",
                                        lambda x, f=norm.train_forward: f(x, dim=-1), "softmax"))
        if norm.log_prob is not None:
            candidates.append(Candidate(f"{name} (log, train)",
                                        lambda x, f=norm.log_prob: f(x, dim=-1), "log_softmax"))
    for twin, impls in refs.items():
        if twin in names:
            candidates += [Candidate(label, fn, "softmax") for label, fn in impls.items()]
    return candidates, refs


_clock = time.perf_counter  # time.thread_time with --clock thread
# Registry names whose forward has an opt-in fused C++ CPU kernel (sparsenorm.use_cpu_kernels).
KERNEL_FUNCTIONS = ("ev_softmax", "sparsemax", "entmax15")


def _with_cpu_kernels(fn: Callable) -> Callable:
    """fn with sparsenorm's opt-in C++ CPU kernels switched on for the call (forward only: the
    backward is the same either way)."""
    from . import _cpu_kernels

    def run(x):
        saved = _cpu_kernels._enabled
        _cpu_kernels.use_cpu_kernels(True)
        try:
            return fn(x)
        finally:
            _cpu_kernels._enabled = saved

    return run


def _time_once(fn: Callable, x: torch.Tensor, grad: Optional[torch.Tensor], reps: int) -> float:
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    start = _clock()
    for _ in range(reps):
        if grad is None:
            with torch.no_grad():
                fn(x)
        else:
            x.grad = None
            fn(x).backward(grad)
    sync()
    return (_clock() - start) / reps


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
    parser = argparse.ArgumentParser(prog="python -m sparsenorm.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=_parse_shapes, default=DEFAULT_SHAPES)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--normalizers", default="ev_softmax,sparsemax,entmax15,r_softmax,t_softmax,sparsehourglass",
                        help=f"comma-separated registry names (known: {', '.join(registry.names())})")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--cpu-kernels", action="store_true",
                        help="add rows run by the opt-in fused C++ CPU kernels")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="thread: one thread, per-thread CPU time (less noisy on a busy machine)")
    args = parser.parse_args(argv)
    global _clock
    if args.clock == "thread":
        torch.set_num_threads(1)
        _clock = time.thread_time
    names = [n.strip() for n in args.normalizers.split(",") if n.strip()]
    for n in names:
        registry.get(n)  # unknown names fail here, listing the known ones
    candidates, refs = build_candidates(names)
    if args.cpu_kernels:
        from ._cpu_kernels import EVIDENTIAL, SPARSEMAX

        for kernels in (EVIDENTIAL, SPARSEMAX):  # build now, not inside a timing
            if kernels.load() is None:
                parser.error(f"--cpu-kernels: a C++ kernel could not be built: {kernels.error}")
        candidates += [Candidate(f"{c.label} [cpp]", _with_cpu_kernels(c.fn), c.baseline, c.entmax_twin)
                       for c in list(candidates) if c.label.split(" ")[0] in KERNEL_FUNCTIONS]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
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
