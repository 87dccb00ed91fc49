"""GPU benchmark of what ``backend="auto"`` runs (issue 48): ``python -m benchmarks.bench_gpu_dispatch``.

* ``plans``: the plan table (``sparsenorm.attention.plan`` / ``sparsenorm.kernels.plan``) for the
  common cases as this machine's record gives them, and as it will once every obligation is proven
  (``cuda_proof.trusting()``).
* ``attention``: ev-softmax attention forward+backward, B = 4, H = 32, L = S = 4096, D = 64,
  bfloat16, on FlexAttention (``backend="flex"``), causal and not, beside SDPA. Target: Flex causal
  <= 0.6x Flex non-causal. (The flash kernel is left out: its autotuning compiles for minutes, and
  ``benchmarks.bench_gpu --only attention`` times it beside Flex.)
* ``decode``: a few queries over a long cache (1 query, S = 8k / 32k, 8 sequences, 9/3 heads as
  SmolLM2), the ``decode`` path against Flex (compiled per shape) and SDPA's softmax.
* ``entry``: the public ``sparsenorm.ev_softmax`` in bfloat16 (the 16-bit entry path) against its
  Triton kernel called directly and ``torch.softmax``. Target: <= 1.2x the kernel.
* ``train``: one training step of a SmolLM2-135M-sized Llama (random weights), bfloat16,
  ``attn_implementation="sparsenorm_ev_softmax"`` against ``"sdpa"`` (as ``benchmarks.bench_gpu
  --only train``). Target: <= 1.1x.

Parts that need an unproven path run under ``cuda_proof.trusting()`` and say so in their rows.
Every time is the median of interleaved rounds with CUDA events (``benchmarks.gpu_timing.time_interleaved``).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import traceback
from typing import Dict, List, Optional

import torch

from .gpu_timing import time_interleaved

DEVICE = "cuda"
PARTS = ("plans", "entry", "attention", "train", "decode")


def bench_plans() -> List[dict]:
    from sparsenorm.attention import plan
    from sparsenorm.kernels import cuda_proof
    from sparsenorm.kernels import plan as row_plan

    rows = []
    cases = [("ev_softmax", dict(causal=False, q_len=4096, k_len=4096)), ("ev_softmax", dict(causal=True, q_len=4096,
                                                                                               k_len=4096)),
             ("ev_softmax", dict(causal=True, q_len=1, k_len=32768)), ("softmax", dict(causal=True, q_len=4096,
                                                                                         k_len=4096)),
             ("sparsemax", dict(causal=True, q_len=4096, k_len=4096))]
    for trusted in (False, True):
        for name, shape in cases:
            for dtype in (torch.bfloat16, torch.float32):
                def one():
                    return plan(name, device="cuda", dtype=dtype, head_dim=64, mask="keys", **shape)
                if trusted:
                    with cuda_proof.trusting():
                        p = one()
                else:
                    p = one()
                rows.append(dict(kind="attention", normalizer=name, dtype=str(dtype)[6:], **shape,
                                 record="all proven (trusting)" if trusted else "committed record",
                                 backend=p.backend, reason=p.reason, proof=p.proof))
        for name in ("ev_softmax", "sparsemax", "entmax15"):
            for dtype in (torch.bfloat16, torch.float32):
                if trusted:
                    with cuda_proof.trusting():
                        p = row_plan(name, device="cuda", dtype=dtype, row_len=32768)
                else:
                    p = row_plan(name, device="cuda", dtype=dtype, row_len=32768)
                rows.append(dict(kind="rows", normalizer=name, dtype=str(dtype)[6:], row_len=32768,
                                 record="all proven (trusting)" if trusted else "committed record",
                                 backend=p.backend, reason=p.reason, proof=p.proof))
    return rows


def _fwd_bwd(fn, inputs, grad):
    def run():
        out = fn()
        torch.autograd.grad(out, inputs, grad)
    return run


def bench_attention(rounds: int) -> List[dict]:
    import torch.nn.functional as F

    from sparsenorm.attention import sparse_attention
    from sparsenorm.kernels import cuda_proof

    B, H, L, D = 4, 32, 4096, 64
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device=DEVICE, dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    do = torch.randn_like(q)
    rows = []
    for causal in (False, True):
        methods = {
            "SDPA (softmax)": lambda c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c),
            "ev-softmax Flex": lambda c=causal: sparse_attention(q, k, v, "ev_softmax", is_causal=c, backend="flex"),
        }
        with cuda_proof.trusting():  # explicit backends: no warning, the same kernels
            timed = time_interleaved({n: _fwd_bwd(f, (q, k, v), do) for n, f in methods.items()}, rounds, reps=3)
        base = timed.get("SDPA (softmax)")
        for name, ms in timed.items():
            rows.append(dict(part="attention", method=name, causal=causal, B=B, H=H, L=L, D=D, dtype="bfloat16",
                             ms_fwd_bwd=ms, vs_sdpa=(ms / base if isinstance(ms, float) and isinstance(base, float)
                                                     else None)))
    return rows


def attention_targets(rows: List[dict]) -> List[dict]:
    def ms(method, causal):
        found = [r["ms_fwd_bwd"] for r in rows if r.get("part") == "attention" and r["method"] == method
                 and r["causal"] == causal]
        return found[0] if found and isinstance(found[0], float) else None

    targets = []
    flex_c, flex_n = ms("ev-softmax Flex", True), ms("ev-softmax Flex", False)
    if flex_c and flex_n:
        targets.append(dict(target="Flex ev-softmax causal fwd+bwd <= 0.6x non-causal (L=4096, D=64, bf16)",
                            measured=flex_c / flex_n, met=flex_c / flex_n <= 0.6))
    for causal in (False, True):
        flash, flex = ms("ev-softmax flash (Triton)", causal), ms("ev-softmax Flex", causal)
        if flash and flex:
            targets.append(dict(target=f"flash kernel faster than Flex (causal={causal}): auto may choose it",
                                measured=flash / flex, met=flash < flex))
    return targets


def bench_decode(rounds: int) -> List[dict]:
    import torch.nn.functional as F

    from sparsenorm.attention import sparse_attention
    from sparsenorm.kernels import cuda_proof

    rows = []
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    for S in (8192, 32768):
        q = torch.randn(8, 9, 1, 64, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(8, 3, S, 64, device=DEVICE, dtype=torch.bfloat16, generator=gen) for _ in range(2))
        methods = {
            "decode": lambda: sparse_attention(q, k, v, "ev_softmax", backend="decode"),
            "flex": lambda: sparse_attention(q, k, v, "ev_softmax", backend="flex"),
            "SDPA (softmax)": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        }
        with torch.no_grad(), cuda_proof.trusting():
            timed = time_interleaved(methods, rounds, reps=10)
        for name, ms in timed.items():
            rows.append(dict(part="decode", method=name, L=1, S=S, B=8, heads="9/3", ms=ms))
    return rows


def bench_entry(rounds: int) -> List[dict]:
    import sparsenorm
    from sparsenorm.kernels import cuda_proof
    from sparsenorm.kernels.triton import ev_softmax_forward

    rows = []
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    for n_rows, n_cols in ((16384, 4096), (2048, 32768)):
        x = torch.randn(n_rows, n_cols, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        methods = {
            "sparsenorm.ev_softmax (public)": lambda: sparsenorm.ev_softmax(x),
            "Triton kernel (launcher)": lambda: ev_softmax_forward(x),
            "torch.softmax": lambda: torch.softmax(x, -1),
        }
        with torch.no_grad(), cuda_proof.trusting():
            timed = time_interleaved(methods, rounds, reps=10)
        kernel = timed.get("Triton kernel (launcher)")
        for name, ms in timed.items():
            rows.append(dict(part="entry", method=name, rows=n_rows, cols=n_cols, dtype="bfloat16", ms=ms,
                             vs_kernel=ms / kernel if isinstance(ms, float) and isinstance(kernel, float) else None))
    return rows


def entry_targets(rows: List[dict]) -> List[dict]:
    return [dict(target=f"public ev_softmax bf16 <= 1.2x its kernel ({r['rows']}x{r['cols']})", measured=r["vs_kernel"],
                 met=r["vs_kernel"] is not None and r["vs_kernel"] <= 1.2)
            for r in rows if r.get("part") == "entry" and r["method"].startswith("sparsenorm")]


def bench_train(rounds: int) -> List[dict]:
    from sparsenorm.kernels import cuda_proof

    from . import bench_gpu_training

    models = dict(bench_gpu_training.TRAIN_MODELS)
    bench_gpu_training.TRAIN_MODELS = {k: v for k, v in models.items() if "SmolLM2" in k}
    try:
        with cuda_proof.trusting():
            rows = bench_gpu_training.bench_train(rounds, quick=True)
    finally:
        bench_gpu_training.TRAIN_MODELS = models
    for r in rows:
        r["part"] = "train"
        r["note"] = "ev-softmax attention as auto runs it once Flex is proven (trusting)"
    return rows


def train_targets(rows: List[dict]) -> List[dict]:
    out = []
    for r in rows:
        if r.get("part") == "train" and r.get("attn_implementation") == "sparsenorm_ev_softmax":
            ratio = r.get("vs_sdpa") or r.get("time_vs_sdpa")
            out.append(dict(target="SmolLM2 training step sparsenorm_ev_softmax <= 1.1x sdpa", measured=ratio,
                            met=ratio is not None and ratio <= 1.1))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu_dispatch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=PARTS, help="run only these parts (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the rows and targets here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_dispatch: no CUDA device here; nothing to measure.")
        return 0
    import triton

    report: Dict[str, object] = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                     triton=triton.__version__, python=platform.python_version(),
                                     command="python -m benchmarks.bench_gpu_dispatch "
                                     + " ".join(argv or sys.argv[1:]),
                                     rows=[], targets=[], errors=[])

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)

    runners = dict(plans=lambda: bench_plans(), attention=lambda: bench_attention(args.rounds),
                   decode=lambda: bench_decode(args.rounds), entry=lambda: bench_entry(args.rounds),
                   train=lambda: bench_train(max(3, args.rounds // 2)))
    checks = dict(attention=attention_targets, entry=entry_targets, train=train_targets)
    for part in args.only or PARTS:
        try:
            rows = runners[part]()
        except Exception:  # noqa: BLE001 -- the other parts still run; the error is reported
            report["errors"].append(dict(part=part, error=traceback.format_exc()[-1500:]))
            print(f"[{part}] FAILED:\n{traceback.format_exc()[-1500:]}", flush=True)
            save()
            continue
        report["rows"].extend(rows)
        if part in checks:
            report["targets"].extend(checks[part](rows))
        for r in rows:
            print(json.dumps(r, default=str), flush=True)
        save()
    for t in report["targets"]:
        print(f"TARGET {'met' if t['met'] else 'MISSED'}: {t['target']}: {t['measured']}", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
