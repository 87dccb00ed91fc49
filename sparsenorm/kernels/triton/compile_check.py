"""Compile every Triton kernel ahead of time for a GPU architecture, without a GPU.

``python -m sparsenorm.kernels.triton.compile_check [--arch 90] [--quick | --smoke]`` runs Triton's whole
compiler (Triton IR -> GPU IR -> LLVM -> PTX -> cubin with the bundled ``ptxas``) on
representative specializations of each kernel (dtypes, masks, causal, key lengths, head dims), so
code that the interpreter accepts but the GPU compiler rejects fails here. It needs no GPU, but
must run with ``TRITON_INTERPRET`` unset (the interpreter replaces the kernels). Prints one line
per kernel and its shared memory; exits 1 if any fails.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import traceback
from typing import Dict, List

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import attention, evidential, projection
from ._common import INTERPRET


def _jit_function(kernel):
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn  # unwrap the autotuner
    return kernel


def compile_one(kernel, types: Dict[str, str], constexprs: Dict[str, object], target: GPUTarget,
                num_warps: int = 4, num_stages: int = 3):
    fn = _jit_function(kernel)
    signature = {name: "constexpr" if name in constexprs else types[name] for name in fn.arg_names}
    return triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=target,
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def _row_cases(quick: bool):
    dtypes = ["fp32", "bf16"] if quick else ["fp32", "fp16", "bf16"]
    for dt in dtypes:
        for has_mask, (train, log) in itertools.product((False, True), ((False, False), (True, False), (True, True))):
            if quick and has_mask and train:
                continue
            mask = "*u8" if has_mask else f"*{dt}"
            flags = dict(HAS_MASK=has_mask, TRAIN=train, LOG=log)
            yield (evidential._ev_softmax_fwd_kernel,
                   dict(x_ptr=f"*{dt}", mask_ptr=mask, out_ptr=f"*{dt}", n_rows="i32", n_cols="i32", level="fp32",
                        shift="fp32"), dict(flags, ROWS=2, BLOCK=1024), 4)
            split = dict(x_ptr=f"*{dt}", mask_ptr=mask, part_ptr="*fp32", n_cols="i32", n_segments="i32",
                         level="fp32")
            sizes = dict(SEGMENT=evidential.SEGMENT, BLOCK=evidential.CHUNK)
            yield evidential._ev_fwd_stats_kernel, split, dict(sizes, HAS_MASK=has_mask), 8
            yield (evidential._ev_fwd_denom_kernel, dict(split, denom_ptr="*fp32", shift="fp32"),
                   dict(sizes, HAS_MASK=has_mask, TRAIN=train), 8)
            yield (evidential._ev_fwd_out_kernel, dict(split, denom_ptr="*fp32", out_ptr=f"*{dt}", shift="fp32"),
                   dict(sizes, **flags), 8)
        grads = dict(out_ptr=f"*{dt}", grad_ptr=f"*{dt}", dx_ptr=f"*{dt}", n_cols="i32")
        split = dict(out_ptr=f"*{dt}", grad_ptr=f"*{dt}", part_ptr="*fp32", n_cols="i32", n_segments="i32")
        sizes = dict(SEGMENT=evidential.SEGMENT, BLOCK=evidential.CHUNK)
        for log in (False, True):
            yield evidential._ev_softmax_bwd_kernel, dict(grads, n_rows="i32"), dict(LOG=log, ROWS=1, BLOCK=8192), 16
            yield evidential._ev_softmax_bwd_partial_kernel, split, dict(sizes, LOG=log), 8
            yield evidential._ev_softmax_bwd_split_kernel, dict(split, dx_ptr=f"*{dt}"), dict(sizes, LOG=log), 8
        for entmax in (0, 1):
            yield (projection._project_fwd_kernel,
                   dict(x_ptr=f"*{dt}", mask_ptr="*u8", out_ptr=f"*{dt}", n_rows="i32", n_cols="i32", level="fp32",
                        eps="fp32"),
                   dict(HAS_MASK=True, ENTMAX=entmax, MAX_ITER=projection.MAX_ITER,
                        BISECT_STEPS=projection.BISECT_STEPS, ROWS=4, BLOCK=512), 4)
            yield (projection._project_bwd_kernel,
                   dict(p_ptr=f"*{dt}", grad_ptr=f"*{dt}", dx_ptr=f"*{dt}", n_rows="i32", n_cols="i32"),
                   dict(ENTMAX=entmax, ROWS=4, BLOCK=512), 4)
            sizes = dict(SEGMENT=projection.SEGMENT, BLOCK=projection.CHUNK)
            iters = dict(MAX_ITER=projection.MAX_ITER, BISECT_STEPS=projection.BISECT_STEPS)
            split = dict(x_ptr=f"*{dt}", mask_ptr="*u8", part_ptr="*fp32", n_cols="i32", n_segments="i32",
                         level="fp32")
            yield projection._project_fwd_stats_kernel, split, dict(sizes, HAS_MASK=True), 8
            yield (projection._project_fwd_gather_kernel, dict(split, count_ptr="*i32", cand_ptr="*fp32"),
                   dict(sizes, HAS_MASK=True, ENTMAX=entmax, CANDIDATES=projection.SPLIT_CANDIDATES), 8)
            yield (projection._project_fwd_solve_kernel,
                   dict(part_ptr="*fp32", count_ptr="*i32", cand_ptr="*fp32", tau_ptr="*fp32", done_ptr="*i32",
                        n_segments="i32", eps="fp32"),
                   dict(iters, ENTMAX=entmax, CANDIDATES=projection.SPLIT_CANDIDATES), 8)
            yield (projection._project_fwd_long_kernel,
                   dict(x_ptr=f"*{dt}", mask_ptr="*u8", done_ptr="*i32", tau_ptr="*fp32", n_cols="i32", level="fp32",
                        eps="fp32"),
                   dict(iters, HAS_MASK=True, ENTMAX=entmax, BLOCK=projection.CHUNK), 8)
            yield (projection._project_fwd_out_kernel, dict(split, tau_ptr="*fp32", out_ptr=f"*{dt}"),
                   dict(sizes, HAS_MASK=True, ENTMAX=entmax), 8)
            grads = dict(p_ptr=f"*{dt}", grad_ptr=f"*{dt}", part_ptr="*fp32", n_cols="i32", n_segments="i32")
            yield projection._project_bwd_partial_kernel, grads, dict(sizes, ENTMAX=entmax), 8
            yield projection._project_bwd_split_kernel, dict(grads, dx_ptr=f"*{dt}"), dict(sizes, ENTMAX=entmax), 8


_STRIDES = ["stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
            "stride_vb", "stride_vh", "stride_vn"]


def _attention_cases(quick: bool):
    dtypes = ["bf16"] if quick else ["fp16", "bf16"]
    for dt, head_dim, causal, lens in itertools.product(dtypes, (64, 128), (False, True), (False, True)):
        if quick and lens != causal:
            continue
        keymask = lens  # key lengths and a key mask come together here, to keep the count down
        flags = dict(HAS_LENS=lens, HAS_KEYMASK=keymask, CAUSAL=causal, UPCAST=False, PRECISION="tf32",
                     BLOCK_D=head_dim)
        tensors = dict(Q=f"*{dt}", K=f"*{dt}", V=f"*{dt}", LENS="*i64" if lens else "*fp32", LSE="*fp32", THR="*fp32",
                       KEYMASK="*u8" if keymask else "*fp32", coff="i32")  # coff: the bottom-right causal offset
        ints = lambda names: {n: "i32" for n in names}  # noqa: E731
        yield (attention._attn_fwd_kernel,
               dict(tensors, KMEAN="*fp32", COUNTS="*i32", OUT=f"*{dt}", qk_scale="fp32",
                    **ints(_STRIDES + ["stride_ob", "stride_oh", "stride_om", "stride_mb", "stride_mh", "stride_mr",
                                       "stride_cb", "n_heads", "group", "seq_q", "seq_k", "head_dim"])),
               dict(flags, BLOCK_M=128, BLOCK_N=64), 8)
        grads = dict(tensors, DO=f"*{dt}", DELTA="*fp32", qk_scale="fp32", sm_scale="fp32")
        yield (attention._attn_bwd_dkdv_kernel,
               dict(grads, DK=f"*{dt}", DV=f"*{dt}",
                    **ints(_STRIDES + ["stride_dob", "stride_doh", "stride_dom", "stride_dkb", "stride_dkh",
                                       "stride_dkn", "stride_dvb", "stride_dvh", "stride_dvn", "n_heads",
                                       "n_kv_heads", "group", "seq_q", "seq_k", "head_dim"])),
               dict(flags, BLOCK_M=64, BLOCK_N=128), 8)
        yield (attention._attn_bwd_dq_kernel,
               dict(grads, DQ=f"*{dt}",
                    **ints(_STRIDES + ["stride_dob", "stride_doh", "stride_dom", "stride_dqb", "stride_dqh",
                                       "stride_dqm", "n_heads", "group", "seq_q", "seq_k", "head_dim"])),
               dict(flags, BLOCK_M=128, BLOCK_N=64), 8)


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparsenorm.kernels.triton.compile_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 80 or 90")
    parser.add_argument("--quick", action="store_true", help="fewer specializations")
    parser.add_argument("--smoke", action="store_true", help="one specialization per kernel")
    args = parser.parse_args(argv)
    if INTERPRET:
        print("compile_check: TRITON_INTERPRET is set; unset it to compile the kernels", file=sys.stderr)
        return 1
    target = GPUTarget("cuda", args.arch, 32)
    failures = 0
    seen = set()
    for kernel, types, constexprs, warps in itertools.chain(_row_cases(args.quick), _attention_cases(args.quick)):
        name = _jit_function(kernel).__name__
        if args.smoke and name in seen:
            continue
        seen.add(name)
        shown = {k: v for k, v in constexprs.items() if not k.startswith("BLOCK") and k not in ("ROWS", "PRECISION")}
        try:
            compiled = compile_one(kernel, types, constexprs, target, num_warps=warps)
            print(f"ok   sm_{args.arch} {name} {shown} shared={compiled.metadata.shared}")
        except Exception:  # noqa: BLE001 -- every failure is reported, then the exit status says so
            failures += 1
            print(f"FAIL sm_{args.arch} {name} {shown}\n{traceback.format_exc(limit=4)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
