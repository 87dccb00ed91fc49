"""Prefix sums of the keys along the sequence, in float32: the causal ev-softmax threshold's input.

ev-softmax's threshold for query ``i`` under a causal mask is ``q_i . mean(k_0 .. k_{e_i}) * scale``
(Eq. 7 with the mean over the keys the query sees), so what it needs of the keys is their prefix
sums ``P_s = k_0 + ... + k_s``. ``torch.cumsum`` along the sequence (not the last dimension) took
over a third of FlexAttention's causal forward+backward on an H200 at B = 4, H = 32, L = 4096,
D = 64 (``results/gpu/h200-2026-11-28-window1/probe.json#flex``: "threshold alone causal=True"
against "ev Flex causal (ours)"); this kernel reads each key once and
writes each sum once: one program per (batch * head, block of head dims) walks the sequence in
tiles, a ``tl.cumsum`` per tile plus the running total of the tiles before.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, check_tensor


@triton.jit
def _key_prefix_sums_kernel(K, OUT, seq, head_dim, stride_kr, stride_ks, stride_or, stride_os,
                            BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    carry = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, seq, BLOCK_S):
        offs_s = start + tl.arange(0, BLOCK_S)
        ok = (offs_s[:, None] < seq) & d_ok[None, :]
        tile = tl.load(K + row * stride_kr + offs_s[:, None] * stride_ks + offs_d[None, :], mask=ok,
                       other=0.0).to(tl.float32)
        sums = tl.cumsum(tile, axis=0) + carry[None, :]
        tl.store(OUT + row * stride_or + offs_s[:, None] * stride_os + offs_d[None, :], sums, mask=ok)
        carry += tl.sum(tile, axis=0)


def key_prefix_sums(k: Tensor) -> Tensor:
    """float32 prefix sums of ``k`` (..., S, D) along S: ``out[..., s, :] = sum_{j <= s} k[..., j, :]``."""
    check_tensor(k, "k")
    S, D = k.shape[-2], k.shape[-1]
    out = torch.empty(k.shape, device=k.device, dtype=torch.float32)
    if k.numel() == 0:
        return out
    rows = k.reshape(-1, S, D)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    flat = out.view(-1, S, D)
    block_d = 16 if INTERPRET else min(32, triton.next_power_of_2(D))
    block_s = 16 if INTERPRET else 64
    grid = (rows.shape[0], triton.cdiv(D, block_d))
    _key_prefix_sums_kernel[grid](rows, flat, S, D, rows.stride(0), rows.stride(1), flat.stride(0), flat.stride(1),
                                  BLOCK_S=block_s, BLOCK_D=block_d)
    return out
