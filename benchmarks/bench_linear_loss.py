"""Benchmark: the fused linear + loss (``sparsenorm.fused_linear_loss``) against the materialised
``single_label_loss(F.linear(hidden, weight), target)``, forward + backward, time and peak memory.

    python -m benchmarks.bench_linear_loss [--tokens 4096] [--dim 576] [--vocab 49152]
        [--losses softmax,ev_softmax,sparsemax,entmax15] [--rounds 3] [--threads 2]
        [--logit-scale 1.0] [--token-chunk 0] [--clock wall|thread] [--json FILE] [--no-time] [--no-memory]
    python -m benchmarks.bench_linear_loss --report FILE.json

Shapes of issue 38: N = 4096 tokens, d = 576 (SmolLM2-135M's width), V = 49,152 (its vocabulary),
float32 on the CPU, no bias; ``hidden`` and ``weight`` require gradients and ``loss.backward()``
runs (reduction 'mean'). Inputs: ``hidden ~ N(0, 1)``, ``weight ~ N(0, 1/d) * logit_scale``, so the
logits are about ``N(0, logit_scale^2)`` (the scale sets the support sizes of sparsemax/entmax).

* Time: every candidate once per round, in a fresh random order each round (interleaved), wall
  clock on ``--threads`` threads (``--clock thread``: per-thread CPU time on one thread), median over rounds.
  Targets (issue 38): fused time over the materialised softmax cross-entropy's <= 1.2 for softmax and
  ev-softmax, <= 1.5 for sparsemax and 1.5-entmax.
* Peak memory: each candidate in a fresh subprocess (``peak_memory.py``, as ``bench_attention.py``): after a
  small warm-up and the inputs are made, ``/proc/self/clear_refs`` resets the peak resident size;
  the figure is the peak resident size during one forward + backward minus the resident size before
  it, with blocks of 64 KiB and more mapped from the OS and given back (``MALLOC_MMAP_THRESHOLD_``).
  It includes the gradients (``weight``'s: V x d floats). Target: <= 10 % of the materialised
  softmax cross-entropy's.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

from benchmarks.bench import cpu_model, machine_load
from benchmarks.peak_memory import in_subprocess, peak_extra_bytes
from sparsenorm import fused_linear_loss, registry
from sparsenorm._text import markdown_table

LOSSES = ["softmax", "ev_softmax", "sparsemax", "entmax15"]
TIME_TARGET = {"softmax": 1.2, "ev_softmax": 1.2, "sparsemax": 1.5, "entmax15": 1.5, "entmax_bisect": 1.5}
MEMORY_TARGET = 0.10
BASELINE = "materialised softmax"
SCHEMA = "sparsenorm.bench_linear_loss/1"
"""Marks this benchmark's JSON (the docs' hook renders each file with its own report)."""


def labels_for(losses: List[str]) -> List[str]:
    return [f"{path} {name}" for name in losses for path in ("materialised", "fused")]


def loss_fn(label: str, token_chunk: int = 0):
    """The candidate's forward; ``token_chunk``: the fused loss's tokens per block (0: its default plan)."""
    path, name = label.split(" ", 1)
    if path == "materialised":
        single = registry.get(name).single_label_loss
        return lambda h, w, y: single(F.linear(h, w), y)
    return lambda h, w, y: fused_linear_loss(h, w, y, normalizer=name, token_chunk=token_chunk)


def make_inputs(tokens: int, dim: int, vocab: int, scale: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, dim, generator=g).requires_grad_()
    w = (torch.randn(vocab, dim, generator=g) * (scale / dim ** 0.5)).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g)
    return h, w, y


def run_once(fn, h, w, y) -> None:
    h.grad = None
    w.grad = None
    fn(h, w, y).backward()


def time_candidates(fns: Dict[str, Callable], args, scale: float, clock: Callable[[], float]) -> Dict[str, float]:
    """Median forward + backward time of each candidate at ``args``' shapes (logit scale ``scale``), timed by
    ``clock`` over ``args.rounds`` rounds, every candidate once per round in a fresh random order, after a
    warm-up on small inputs (the time method of this benchmark and of ``bench_linear_ce_torch``)."""
    small = make_inputs(64, args.dim, 1024, scale)
    for fn in fns.values():
        run_once(fn, *small)
    inputs = make_inputs(args.tokens, args.dim, args.vocab, scale)
    times: Dict[str, List[float]] = {label: [] for label in fns}
    for _ in range(args.rounds):
        order = list(fns)
        random.shuffle(order)
        for label in order:
            t0 = clock()
            run_once(fns[label], *inputs)
            times[label].append(clock() - t0)
            print(f"  {label}: {times[label][-1]:.2f} s", flush=True)
    return {label: statistics.median(ts) for label, ts in times.items()}


def time_all(labels: List[str], args) -> Dict[str, float]:
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    return time_candidates({label: loss_fn(label, args.token_chunk) for label in labels}, args, args.logit_scale,
                           clock)


def loss_peak_here(fn, tokens: int, dim: int, vocab: int, scale: float, threads: int) -> int:
    """Peak extra resident bytes of one forward + backward of ``fn`` at these shapes, in this process, after a
    warm-up on small inputs (the memory method of this benchmark and of ``bench_linear_ce_torch``)."""
    torch.set_num_threads(threads)
    run_once(fn, *make_inputs(64, dim, 1024, scale))
    inputs = make_inputs(tokens, dim, vocab, scale)
    return peak_extra_bytes(lambda: run_once(fn, *inputs))


def measure_peak(label: str, args) -> Optional[int]:
    return in_subprocess("benchmarks.bench_linear_loss", [label, args.tokens, args.dim, args.vocab, args.logit_scale,
                                                          args.threads, args.token_chunk], label)


def fused_plan(args) -> tuple:
    """(tokens, vocabulary entries) per block of the fused losses at these shapes (the op's own plan)."""
    from sparsenorm.kernels.reference.linear_loss import make_plan

    itemsize = torch.empty((), dtype=torch.float32).element_size()  # the benchmark's float32 hidden states
    plan = make_plan(args.tokens, args.vocab, args.token_chunk, 0, 0, itemsize=itemsize, n_hidden=args.dim)
    return plan.token_chunk, plan.vocab_chunk


def support_sizes(losses: List[str], args, rows: int = 256) -> Dict[str, float]:
    """Mean support size per token of the sparse maps on these inputs (what the sparse backward touches)."""
    h, w, _ = make_inputs(args.tokens, args.dim, args.vocab, args.logit_scale)
    with torch.no_grad():
        z = h[:rows] @ w.t()
        out = {}
        for name in losses:
            entry = registry.get(name)
            if entry.sparse and name != "ev_softmax":
                out[name] = float((entry.forward(z, dim=-1) > 0).sum(-1).float().mean())
    return out


def markdown_report(results: Dict) -> str:
    times, peaks = results.get("time_s", {}), results.get("peak_bytes", {})
    base_t, base_m = times.get(BASELINE), peaks.get(BASELINE)
    rows = []
    for name in results["losses"]:
        for path in ("materialised", "fused"):
            label = f"{path} {name}"
            t, m = times.get(label), peaks.get(label)
            t_ratio = None if t is None or not base_t else t / base_t
            m_ratio = None if m is None or not base_m else m / base_m
            verdict = []
            if path == "fused" and t_ratio is not None:
                verdict.append("time " + ("met" if t_ratio <= TIME_TARGET[name] else "missed"))
            if path == "fused" and m_ratio is not None:
                verdict.append("memory " + ("met" if m_ratio <= MEMORY_TARGET else "missed"))
            verdict = ", ".join(verdict)
            rows.append([label, "-" if t is None else f"{t:.2f}", "-" if t_ratio is None else f"{t_ratio:.2f}",
                         "-" if m is None else f"{m / 2**20:.0f}", "-" if m_ratio is None else f"{m_ratio:.3f}",
                         f"{TIME_TARGET[name]} / {MEMORY_TARGET}" if path == "fused" else "", verdict])
    chunk = results.get("token_chunk") or 0
    head = (f"N = {results['tokens']}, d = {results['dim']}, V = {results['vocab']}, logit scale "
            f"{results['logit_scale']}, fused blocks of "
            + (f"{chunk} tokens" if chunk else
               f"{results['plan'][0]} tokens x {results['plan'][1]} entries (the default plan)" if results.get("plan")
               else "the default plan of the run's commit")
            + f", {results['threads']} thread(s), {results['cpu']}; median of "
            f"{results['rounds']} interleaved rounds; memory = peak RSS increase")
    if results.get("note"):
        head += f"\n\nNote: {results['note']}."
    return head + "\n\n" + markdown_table(
        ["candidate", "fwd+bwd (s)", f"x {BASELINE}", "peak extra (MB)", f"x {BASELINE}", "targets (time / memory)",
         "verdict"], rows)


def add_shared_arguments(p: argparse.ArgumentParser) -> None:
    """The options of this benchmark that ``bench_linear_ce_torch`` has too: the shapes, the losses, rounds and
    threads, the JSON output, what to skip, a saved file's report."""
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--dim", type=int, default=576)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--losses", default=",".join(LOSSES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--report")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_peak"]:
        label, tokens, dim, vocab, scale, threads = argv[1], *map(int, argv[2:5]), float(argv[5]), int(argv[6])
        print(loss_peak_here(loss_fn(label, int(argv[7])), tokens, dim, vocab, scale, threads))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_arguments(p)
    p.add_argument("--logit-scale", type=float, default=1.0)
    p.add_argument("--token-chunk", type=int, default=0,
                   help="the fused losses' tokens per block (default 0: the default plan)")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="thread: per-thread CPU time on one thread (less disturbed by other processes)")
    args = p.parse_args(argv)
    if args.clock == "thread":
        args.threads = 1
    if args.report:
        with open(args.report) as f:
            print(markdown_report(json.load(f)))
        return
    torch.set_num_threads(args.threads)
    losses = args.losses.split(",")
    if "softmax" not in losses:
        losses.insert(0, "softmax")
    labels = labels_for(losses)
    results = {"schema": SCHEMA, "tokens": args.tokens, "dim": args.dim, "vocab": args.vocab,
               "logit_scale": args.logit_scale, "token_chunk": args.token_chunk, "threads": args.threads,
               "rounds": args.rounds, "clock": args.clock,
               "losses": losses, "cpu": cpu_model(),
               "torch": torch.__version__, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "load_at_start": machine_load(), "support_sizes": support_sizes(losses, args),
               "plan": list(fused_plan(args))}
    print(f"support sizes: {results['support_sizes']}", flush=True)
    if not args.no_memory:
        results["peak_bytes"] = {label: measure_peak(label, args) for label in labels}
        print("peak bytes:", results["peak_bytes"], flush=True)
    if not args.no_time:
        results["time_s"] = time_all(labels, args)
        results["load_at_end"] = machine_load()
    print(markdown_report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
