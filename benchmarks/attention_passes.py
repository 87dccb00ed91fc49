"""Count the searched blockwise attention's passes over the keys (no timing).

    python -m benchmarks.attention_passes [--lengths 512,1024,2048,4096] [--dim 64] [--recomputed]

For sparsemax and entmax15 attention (``sparsenorm::projection_attention``, B*H = 1, standard-normal
q, k, v, float32), one forward + backward: the score-tile products ``Q K^T`` made, in units of the
full L x L matrix (the forward's and the backward's), the threshold-search steps per query block
(the block stops when its slowest row is done), each row's own steps (the step at which it is
first done: mean and max) and its support size there. ``--recomputed`` counts with the scores
recomputed on every pass (``CACHE_KEY_BLOCKS = 0``). Counted is the reference's search, run with
the C++ kernels disabled: with them, a query block whose scores are kept is solved row by row by the
C++ row solver (no search step; the products are the same). The counts are the quantities of the bound in
docs/guide/attention.md (CPU performance of the searched path); they do not depend on the machine.
"""
from __future__ import annotations

import argparse
from typing import List, Optional
from unittest import mock

import torch

from sparsenorm._text import markdown_table
from sparsenorm.kernels import disabled
from sparsenorm.kernels.ops.projection_attention import projection_attention
from sparsenorm.kernels.reference import projection_attention as ref


def count(kind: str, length: int, dim: int, recomputed: bool) -> List[str]:
    """One table row: products per forward and backward, steps per block, per row, support."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, length, dim, generator=g).requires_grad_() for _ in range(3))
    grad = torch.randn(1, 1, length, dim, generator=g)
    tile_elements, block_steps, row_done = [0], [], []  # row_done: per block, (step, n) when first done
    score_tile, step, search = ref._Grouped.scores, ref.threshold_step, ref._search_threshold

    def counted_scores(self, q_blk, i0, i1, j0, j1):
        tile_elements[0] += (i1 - i0) * (j1 - j0)
        return score_tile(self, q_blk, i0, i1, j0, j1)

    def counted_search(*args):
        block_steps.append(0)
        row_done.append((torch.zeros(0), torch.zeros(0)))
        return search(*args)

    def counted_step(kind_, tau, s1, s2, n, prev_n, was_root):
        out = step(kind_, tau, s1, s2, n, prev_n, was_root)
        block_steps[-1] += 1
        first, support = row_done[-1]
        done = out[1].flatten()
        if first.numel() == 0:
            first, support = torch.zeros_like(done, dtype=torch.long), torch.zeros_like(done, dtype=n.dtype)
        new = done & (first == 0)
        first[new], support[new] = block_steps[-1], n.flatten()[new]
        row_done[-1] = (first, support)
        return out

    with mock.patch.object(ref._Grouped, "scores", counted_scores), \
            mock.patch.object(ref, "threshold_step", counted_step), \
            mock.patch.object(ref, "_search_threshold", counted_search), \
            mock.patch.object(ref, "CACHE_KEY_BLOCKS", 0 if recomputed else ref.CACHE_KEY_BLOCKS), \
            disabled():  # the search itself (with the C++ kernels a kept block is solved row by row instead)
        out = projection_attention(q, k, v, kind)
        forward = tile_elements[0] / length ** 2
        tile_elements[0] = 0
        out.backward(grad)
        backward = tile_elements[0] / length ** 2
    first = torch.cat([f for f, _ in row_done]).double()
    support = torch.cat([s for _, s in row_done]).double()
    return [str(length), kind, f"{forward:.2f}", f"{backward:.2f}", f"{sum(block_steps) / len(block_steps):.2f}",
            f"{first.mean():.2f} ({int(first.max())})", f"{support.mean():.1f}"]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.attention_passes", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="512,1024,2048,4096")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--recomputed", action="store_true")
    args = p.parse_args(argv)
    rows = [count(kind, int(length), args.dim, args.recomputed)
            for length in args.lengths.split(",") if length for kind in ("sparsemax", "entmax15")]
    print(markdown_table(["L", "kind", "Q K^T per forward (x L^2)", "Q K^T per backward (x L^2)",
                          "search steps per query block", "steps per row, mean (max)", "support per row"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
