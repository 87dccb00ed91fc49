"""The longest rows the Triton row-wise tile kernels hold in registers, per op family.

Rows up to this length are normalized by the tile kernels (one program per tile of whole rows);
longer rows by the split kernels (several programs per row, ``kernels/triton/_rows.py``). The two
regimes are different code, so a GPU run proves them apart (``cuda_proof``: kinds ``"rows"`` and
``"long_rows"``), and ``auto_plan`` must know where one ends without importing triton: hence this
module of constants, which the Triton kernels read too.
"""
from __future__ import annotations

TRITON_TILE_COLS = {"ev_softmax": 8192, "sparsemax": 1 << 14, "entmax15": 1 << 14}
"""Row length up to which each family's tile kernel runs (ev-softmax: one pass in registers;
sparsemax / 1.5-entmax: the threshold iteration in registers)."""

__all__ = ["TRITON_TILE_COLS"]
