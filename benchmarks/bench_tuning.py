"""The measurements behind the library's tuning constants and per-call cost notes (CPU).

The library states no timings of its own; where a constant or a design choice rests on a
measurement, its docstring cites an entry of the committed JSON this script writes, as
``benchmarks/results/tuning_cpu.json#<case>`` (``tests/unit/test_named_paths.py`` checks that
every cited file and case exists). Each case times its variants side by side in one process,
medians over interleaved rounds (each round in a fresh random order), one thread, thread CPU time
(so another process's load moves the figures less than wall clock would; the machine's load is
recorded all the same).

    python -m benchmarks.bench_tuning --json benchmarks/results/tuning_cpu.json
    python -m benchmarks.bench_tuning --cases attention_tiles --rounds 3   # one case, quicker
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Callable, Dict, List, Optional

import torch

import sparsenorm
from benchmarks.bench import cpu_model, machine_load


SCHEMA = "sparsenorm-bench-tuning/1"


def interleaved_medians(variants: Dict[str, Callable[[], object]], rounds: int, reps: int) -> Dict[str, float]:
    """Median microseconds per call of each variant: ``rounds`` rounds, each timing every variant
    ``reps`` times in a fresh random order, thread CPU time."""
    for fn in variants.values():  # warm-up: first-call costs (kernel builds, caches) stay out
        fn()
        fn()
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            fn = variants[name]
            start = time.thread_time_ns()
            for _ in range(reps):
                fn()
            samples[name].append((time.thread_time_ns() - start) / reps / 1e3)
    return {name: round(statistics.median(values), 3) for name, values in samples.items()}


def _fwd_bwd(fn: Callable, *inputs: torch.Tensor) -> Callable[[], None]:
    def step():
        out = fn(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        out.sum().backward()
    return step


# --- the cases -------------------------------------------------------------------------------------

def case_attention_tiles(rounds: int) -> Dict:
    """The blockwise ev-softmax C++ kernel's query x key tile (``CPU_BLOCKS_KNOWN``)."""
    from sparsenorm.kernels.ops.evidential_attention import ev_softmax_attention_blockwise

    gen = torch.Generator().manual_seed(0)
    heads, length, dim = 9, 512, 64
    q, k, v = (torch.randn(1, heads, length, dim, generator=gen, requires_grad=True) for _ in range(3))
    tiles = [(64, 128), (128, 128), (256, 256), (256, 512)]
    variants = {f"{bq}x{bk}": _fwd_bwd(lambda q, k, v, bq=bq, bk=bk: ev_softmax_attention_blockwise(
        q, k, v, None, None, True, None, False, bq, bk), q, k, v) for bq, bk in tiles}
    return {"what": "blockwise ev-softmax attention op (C++ kernels), forward+backward, per tile (block_q x block_k)",
            "settings": {"batch": 1, "heads": heads, "L": length, "S": length, "E": dim, "causal": True},
            "us": interleaved_medians(variants, rounds, reps=2)}


def case_attention_known_min_scores(rounds: int) -> Dict:
    """Where ``auto`` moves ev-softmax attention from the dense path to the blockwise C++ kernel
    (``KNOWN_BLOCKWISE_MIN_SCORES``), with SDPA's softmax for scale."""
    from sparsenorm.attention import sparse_attention

    gen = torch.Generator().manual_seed(0)
    result = {"what": "ev-softmax attention forward+backward: dense path vs blockwise C++ kernel (64 x 128 tiles); "
                      "softmax through SDPA for scale. GQA 9 query / 3 key-value heads, causal",
              "settings": {"batch": 1, "query_heads": 9, "kv_heads": 3, "E": 64, "causal": True}, "us": {}}
    for length in (64, 128, 256, 512):
        q = torch.randn(1, 9, length, 64, generator=gen, requires_grad=True)
        k, v = (torch.randn(1, 3, length, 64, generator=gen, requires_grad=True) for _ in range(2))
        variants = {
            "dense": _fwd_bwd(lambda q, k, v: sparse_attention(q, k, v, "ev_softmax", is_causal=True,
                                                               backend="dense"), q, k, v),
            "blockwise": _fwd_bwd(lambda q, k, v: sparse_attention(q, k, v, "ev_softmax", is_causal=True,
                                                                   backend="blockwise"), q, k, v),
            "sdpa_softmax": _fwd_bwd(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True), q, k, v),
        }
        result["us"][f"L=S={length} ({length * length} scores)"] = interleaved_medians(variants, rounds, reps=3)
    return result


def case_positional_apply(rounds: int) -> Dict:
    """``PositionalFunction.apply`` (no signature binding; r-softmax's Function is one) against
    torch's ``Function.apply`` called on the same class."""
    from sparsenorm.kernels.ops.rsoftmax import RSoftmaxFunction

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, generator=gen, requires_grad=True)
    step = _fwd_bwd(lambda x: sparsenorm.r_softmax(x, r=0.5), x)
    ours = RSoftmaxFunction.__dict__.get("apply")  # None: inherited from PositionalFunction
    torchs = classmethod(lambda cls, *args: torch.autograd.Function.apply.__func__(cls, *args))

    def with_torchs_apply():
        RSoftmaxFunction.apply = torchs
        try:
            step()
        finally:
            if ours is None:
                del RSoftmaxFunction.apply
            else:
                RSoftmaxFunction.apply = ours
    return {"what": "r-softmax forward+backward, 4 x 16 rows: PositionalFunction.apply vs torch's Function.apply",
            "settings": {"rows": 4, "cols": 16, "r": 0.5},
            "us": interleaved_medians({"positional_apply": step, "torch_apply": with_torchs_apply}, rounds, 200)}


def case_materialized_grads(rounds: int) -> Dict:
    """r-softmax's Functions with and without autograd's zero tensors for outputs with no gradient."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, generator=gen, requires_grad=True)
    step = _fwd_bwd(lambda x: sparsenorm.r_softmax(x, r=0.5), x)
    ctx_class = torch.autograd.function.FunctionCtx
    original = ctx_class.set_materialize_grads

    def materialized():
        ctx_class.set_materialize_grads = lambda self, value: None  # autograd's default: zeros are made
        try:
            step()
        finally:
            ctx_class.set_materialize_grads = original
    return {"what": "r-softmax forward+backward, 4 x 16 rows: set_materialize_grads(False) (as shipped) vs "
                    "autograd's default (a zero tensor per output without a gradient: six for r-softmax)",
            "settings": {"rows": 4, "cols": 16, "r": 0.5},
            "us": interleaved_medians({"not_materialized": step, "materialized": materialized}, rounds, 200)}


_AUTOGRAD_CHILD = """
import json, sys, torch
sys.path.insert(0, {root!r})
from benchmarks.bench_tuning import interleaved_medians, _fwd_bwd
import sparsenorm
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
x = torch.randn(4, 16, generator=gen, requires_grad=True)
cases = {{name: _fwd_bwd(getattr(sparsenorm, name), x) for name in ("ev_softmax", "sparsemax", "entmax15")}}
print(json.dumps(interleaved_medians(cases, 1, 300)))
"""


def case_cpp_autograd(rounds: int) -> Dict:
    """Per-call cost of the C++ ``AutogradCPU`` kernels against the Python autograd formulas.

    Once an extension is loaded its autograd kernel stays registered, so each variant runs in its own
    process (alternating, ``rounds`` times each): the kernels built and loaded, or
    ``SPARSENORM_CPU_KERNELS=0`` (the Python autograd over the reference forward; at 4 x 16 the rows'
    work is a small part of either)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    samples: Dict[str, Dict[str, List[float]]] = {"cpp_autograd": {}, "python_autograd": {}}
    for _ in range(rounds):
        for variant, setting in (("cpp_autograd", "1"), ("python_autograd", "0")):
            env = dict(os.environ, SPARSENORM_CPU_KERNELS=setting, OMP_NUM_THREADS="1")
            out = subprocess.run([sys.executable, "-c", _AUTOGRAD_CHILD.format(root=root)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            for name, us in json.loads(out.strip().splitlines()[-1]).items():
                samples[variant].setdefault(name, []).append(us)
    return {"what": "forward+backward of 4 x 16 rows per public function, C++ autograd node + C++ kernels vs the "
                    "Python autograd (registered formulas) + reference forward; one process per variant and round",
            "settings": {"rows": 4, "cols": 16},
            "us": {variant: {name: round(statistics.median(v), 3) for name, v in by_name.items()}
                   for variant, by_name in samples.items()}}


def case_python_dispatch(rounds: int) -> Dict:
    """The small Python-level costs the op layer's fast paths avoid."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, generator=gen)
    g = torch.randn(4, 16, generator=gen)
    s = x.sum()
    variants = {
        "identity (the fast path)": lambda: x,
        "reshape(-1, K).contiguous()": lambda: x.reshape(-1, x.shape[-1]).contiguous(),
        "to(dtype).expand_as(out)": lambda: g.to(x.dtype).expand_as(x),
        "float(0-d tensor) (one host read)": lambda: float(s),
    }
    return {"what": "per-call cost of small Python-level tensor calls on a 4 x 16 float32 tensor",
            "settings": {"rows": 4, "cols": 16}, "us": interleaved_medians(variants, rounds, 2000)}


def case_sqrt_zeros(rounds: int) -> Dict:
    """torch's CPU sqrt on zeros against positive numbers (``reference/projection.py``'s sqrt_nonneg)."""
    from sparsenorm.kernels.reference.projection import sqrt_nonneg

    gen = torch.Generator().manual_seed(0)
    positive = torch.rand(1 << 20, generator=gen) + 0.5
    zeros = torch.zeros(1 << 20)
    variants = {"sqrt(positive)": lambda: positive.sqrt(), "sqrt(zeros)": lambda: zeros.sqrt(),
                "sqrt_nonneg(zeros)": lambda: sqrt_nonneg(zeros)}
    return {"what": "torch.sqrt on 2^20 float32 entries, positive vs zero, and sqrt_nonneg on zeros",
            "settings": {"entries": 1 << 20}, "us": interleaved_medians(variants, rounds, 5)}


CASES = {
    "attention_tiles": case_attention_tiles,
    "attention_known_min_scores": case_attention_known_min_scores,
    "positional_apply": case_positional_apply,
    "materialized_grads": case_materialized_grads,
    "cpp_autograd": case_cpp_autograd,
    "python_dispatch": case_python_dispatch,
    "sqrt_zeros": case_sqrt_zeros,
}


def markdown_report(document: Dict) -> str:
    """One table per case: its variants' medians (microseconds per call)."""
    lines = [f"{document['cpu']}, torch {document['torch']}, {document['threads']} thread, {document['clock']}; "
             f"written {document['written']}. Each case is cited by a library docstring as "
             f"`benchmarks/results/tuning_cpu.json#<case>`."]
    for name, case in document["cases"].items():
        lines += ["", f"### `{name}`", "",
                  f"{case['what']} (settings: {case['settings']}; measured {case['measured']}).",
                  "", "| variant | µs per call (median) |", "| --- | --- |"]
        for variant, value in case["us"].items():
            if isinstance(value, dict):
                lines += [f"| {variant}: {inner} | {us:,.1f} |" for inner, us in value.items()]
            else:
                lines.append(f"| {variant} | {value:,.1f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the results here (merged into an existing file case by case)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.cases.split(",") if name.strip()]
    unknown = [name for name in names if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    torch.set_num_threads(1)
    document = {"schema": SCHEMA, "cases": {}}
    if args.json and os.path.exists(args.json):
        with open(args.json) as f:
            document = json.load(f)
    document.update({
        "written": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), "cpu": cpu_model(),
        "torch": torch.__version__, "threads": 1, "clock": "thread CPU time", "load_before": machine_load(),
    })
    for name in names:
        document["cases"][name] = dict(CASES[name](args.rounds), measured=document["written"])
        print(name, json.dumps(document["cases"][name]["us"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
