"""Every claim of the three papers, in the order the index lists them, and the index built from them.

Each experiment's claims, with the paper's values built from its tables, live in its own ``paper.py``
(``PAPER_CLAIMS``); the claims that no experiment owns (properties checked by the test suite, the cost the
benchmark measures, the claim no experiment runs) in :mod:`._shared.paper_claims`. This module gathers them, per
paper, and hands them to :func:`._shared.paper_index.write_paper_index` (``sparsenorm reproduce --index``). It
reads the experiments' packages, so it lives above ``_shared``, which imports no experiment.
"""
from __future__ import annotations

from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Dict, Tuple

from . import EXPERIMENTS
from ._shared import paper_index
from ._shared.paper_claims import EV_THEORY, R_THEORY, SM_NOT_RUN, SM_THEORY, PaperClaim


def _paper(name: str) -> ModuleType:
    """The ``paper`` module of experiment ``name``."""
    return import_module(f"{EXPERIMENTS[name]}.paper")


CLAIMS: Tuple[PaperClaim, ...] = (
    *EV_THEORY, *_paper("cvae").PAPER_CLAIMS, *_paper("ssvae").PAPER_CLAIMS, *_paper("vqvae").PAPER_CLAIMS,
    *_paper("mt").PAPER_CLAIMS,
    *R_THEORY, *_paper("multilabel").PAPER_CLAIMS, *_paper("finetune").PAPER_CLAIMS,
    *SM_THEORY, *_paper("multilabel").SPARSEMAX_PAPER_CLAIMS, *SM_NOT_RUN,
)

OWN_CLAIMS: Tuple[PaperClaim, ...] = (*_paper("llm").OWN_CLAIMS,)
"""The claims of sparsenorm's own experiments (no paper's), listed in the index under their own heading."""

BY_KEY: Dict[str, PaperClaim] = {c.key: c for c in CLAIMS + OWN_CLAIMS}
if len(BY_KEY) != len(CLAIMS) + len(OWN_CLAIMS):
    raise RuntimeError("duplicate claim keys in the catalogue")


def write_paper_index(root: Path) -> Path:
    """Write ``root/README.md``, the index of every claim of :data:`CLAIMS` and :data:`OWN_CLAIMS` (see
    :mod:`._shared.paper_index`)."""
    return paper_index.write_paper_index(root, CLAIMS, OWN_CLAIMS)
