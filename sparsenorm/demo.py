"""``sparsenorm demo``: the worked examples for every normalizer and a numerical check of Table 1.

The worked examples are the ev-softmax slides' table (also the paper's Fig. 1 inputs); the
properties are those of the ev-softmax paper's Table 1 (after Laha et al.), checked on random
inputs and compared with what the paper claims where it makes a claim.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import registry

WORKED_INPUTS = [(1.3, 0.37, -0.67), (0.4, 1.4, -0.8)]
# The slides' table, rounded to two decimals as printed there.
SLIDES = {
    "softmax": [(0.65, 0.26, 0.09), (0.25, 0.67, 0.07)],
    "sparsemax": [(0.97, 0.03, 0.0), (0.0, 1.0, 0.0)],
    "ev_softmax": [(0.72, 0.28, 0.0), (0.27, 0.73, 0.0)],
}
# Table 1 of the ev-softmax paper: True = claimed, False = not claimed; "*" (conditional) = None.
PAPER_TABLE1 = {
    "softmax": {"idempotence": False, "monotonic": True, "translation": True, "scale": False},
    "sparsemax": {"idempotence": True, "monotonic": True, "translation": True, "scale": False},
    "sparsehourglass": {"idempotence": True, "monotonic": True, "translation": None, "scale": None},
    "ev_softmax": {"idempotence": False, "monotonic": True, "translation": True, "scale": False},
}
PROPERTIES = ["idempotence", "monotonic", "translation", "scale", "permutation"]


def normalizer_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Evaluation-time map of logits for a registry name (``Normalizer.for_mode``: post-hoc
    evidential evaluates as ev-softmax, Theorem 3.1 with an identity layer)."""
    norm = registry.get(name).for_mode(training=False)
    return lambda x: norm.forward(x, dim=-1)


def check_properties(fn: Callable, n: int = 200, k: int = 6, seed: int = 0) -> Dict[str, bool]:
    """Whether each Table 1 property held on ``n`` random inputs of size ``k`` (float64)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=gen, dtype=torch.float64) * 2
    p = fn(x)
    close = lambda a, b: bool(torch.allclose(a, b, atol=1e-9))  # noqa: E731
    bump = torch.zeros_like(x)
    bump[:, 0] = 0.5
    perm = torch.randperm(k, generator=gen)
    return {
        "idempotence": close(fn(p), p),
        "monotonic": bool((fn(x + bump)[:, 0] >= p[:, 0] - 1e-12).all()),
        "translation": close(fn(x + 3.7), p),
        "scale": close(fn(x * 2.5), p),
        "permutation": close(fn(x[:, perm]), p[:, perm]),
    }


def _fmt(v: Tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{a:.2f}" for a in v) + ")"


def worked_examples(names: List[str]) -> List[List[str]]:
    rows = []
    for name in names:
        fn = normalizer_fn(name)
        cells = [name]
        for i, v in enumerate(WORKED_INPUTS):
            out = fn(torch.tensor([v], dtype=torch.float64))[0]
            cell = _fmt(tuple(out.tolist()))
            if name in SLIDES:
                cell += f" (slides {_fmt(SLIDES[name][i])})"
            cells.append(cell)
        rows.append(cells)
    return rows


def main(names: Optional[List[str]] = None) -> int:
    from ._text import markdown_table

    names = names or registry.names()
    print("Worked examples (ev-softmax slides / paper Fig. 1 inputs)\n")
    header = ["normalizer"] + [f"v = {v}" for v in WORKED_INPUTS]
    print(markdown_table(header, worked_examples(names)))

    print("\nTable 1 properties, checked on 200 random float64 inputs of size 6")
    print("(yes/no = held/failed here; in brackets the paper's claim: + claimed, - not claimed, * conditional)\n")
    disagreements = []
    rows = []
    for name in names:
        measured = check_properties(normalizer_fn(name))
        claims = PAPER_TABLE1.get(name, {})
        cells = [name]
        for prop in PROPERTIES:
            cell = "yes" if measured[prop] else "no"
            if prop in claims:
                claim = claims[prop]
                cell += " [" + ("*" if claim is None else "+" if claim else "-") + "]"
                if claim is True and not measured[prop]:
                    disagreements.append(f"{name}: {prop} is claimed but failed")
            cells.append(cell)
        rows.append(cells)
    print(markdown_table(["normalizer"] + PROPERTIES, rows))
    print()
    if disagreements:
        print("Claims that did not hold:\n  " + "\n  ".join(disagreements))
        return 1
    print("Every property the paper claims held on these inputs.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
