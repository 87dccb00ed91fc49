"""The catalogue's "checked by tests" rows cite tests that exist, and the parts of the sparsemax paper's Prop. 2
that no unit test covered: rho(0) = 1/K, the zero-temperature limit, and sparsemax's exact bound on it."""
import ast
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import sparsenorm
from sparsenorm.experiments import catalogue

ROOT = Path(__file__).resolve().parents[2]


def _cited(tests: str):
    """``(file, test name or prefix*)`` for every test a catalogue row cites (``path::name``, then ``::name`` for
    more names of the same file)."""
    out, current = [], None
    for path, name in re.findall(r"(tests/[\w/]+\.py)?::([\w*]+)", tests):
        current = path or current
        out.append((current, name))
    return out


def test_every_cited_test_exists():
    rows = [c for c in catalogue.CLAIMS if c.tests]
    assert rows
    for c in rows:
        files = re.findall(r"tests/[\w/]+\.py", c.tests)
        assert files, c.key
        assert all((ROOT / f).is_file() for f in files), (c.key, files)
        for path, name in _cited(c.tests):
            assert path is not None and (ROOT / path).is_file(), (c.key, path)
            defined = {n.name for n in ast.walk(ast.parse((ROOT / path).read_text())) if isinstance(n, ast.FunctionDef)}
            found = any(d.startswith(name[:-1]) for d in defined) if name.endswith("*") else name in defined
            assert found, (c.key, path, name)


def _tied_rows(seed: int, rows: int = 64, k: int = 9):
    """Random scores whose top entry is tied ``|A|`` times (|A| from 1 to 3), with their gap gamma(z) to the next."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        z = rng.normal(size=k)
        ties = int(rng.integers(1, 4))
        top = np.argsort(-z)[:ties]
        z[top] = z.max()
        gap = z.max() - np.max(np.delete(z, top))
        out.append((torch.tensor(z, dtype=torch.float64), sorted(top.tolist()), float(gap)))
    return out


@pytest.mark.parametrize("fn", [torch.softmax, sparsenorm.sparsemax], ids=["softmax", "sparsemax"])
def test_prop2_zero_scores_give_the_uniform_distribution(fn):
    for k in (1, 2, 7, 100):
        assert torch.equal(fn(torch.zeros(3, k, dtype=torch.float64), dim=-1),
                           torch.full((3, k), 1.0 / k, dtype=torch.float64))


def test_prop2_sparsemax_is_uniform_on_the_argmax_for_every_eps_up_to_gap_times_ties():
    # Prop. 2.1: sparsemax(z / eps) = 1_A(z) / |A(z)| for any eps <= gamma(z) |A(z)| (exactly, not only in the limit),
    # and not beyond: at eps slightly above the bound the next entry enters the support
    for z, top, gap in _tied_rows(0):
        uniform = torch.zeros_like(z)
        uniform[top] = 1.0 / len(top)
        bound = gap * len(top)
        for eps in (bound, 0.5 * bound, 1e-3 * bound):
            assert torch.allclose(sparsenorm.sparsemax(z / eps, dim=-1), uniform, rtol=0, atol=1e-12), (eps, bound)
        beyond = sparsenorm.sparsemax(z / (1.01 * bound), dim=-1)
        assert int((beyond > 0).sum()) > len(top)


def test_prop2_softmax_tends_to_the_uniform_argmax_distribution():
    # Prop. 2.1 for softmax: only in the limit; the mass off A(z) is at most (K - |A|) exp(-gamma / eps) / |A|
    for z, top, gap in _tied_rows(1):
        off = [i for i in range(z.numel()) if i not in top]
        for scale in (5.0, 20.0, 50.0):
            p = torch.softmax(z / (gap / scale), dim=-1)
            assert float(p[off].sum()) <= len(off) * np.exp(-scale) / len(top) * (1 + 1e-9)
            assert torch.allclose(p[top], torch.full((len(top),), float(p[top].mean()), dtype=torch.float64))
