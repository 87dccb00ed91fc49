"""Primaries from the papers' own words (issue 49): every claim an experiment judges quotes the paper's sentence and
names the comparison it states, and the experiments judge that comparison as the primary part."""
import re
from pathlib import Path

import numpy as np
import pytest

from sparsenorm.experiments import catalogue
from sparsenorm.experiments._shared import verdict
from sparsenorm.experiments.evsoftmax_translation.claims import claims as mt_claims
from sparsenorm.experiments.evsoftmax_vqvae import claims as vq

JUDGED = [c for c in catalogue.CLAIMS if c.experiment]
PAPERS = next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "papers", Path("/work/shared/papers"))
               if p.is_dir()), None)


def _normal(text: str) -> str:
    """The papers' extracts as comparable text: Markdown emphasis and escapes, line-break hyphens and the fi/fl
    ligatures the PDF extraction dropped removed, curly apostrophes straightened, whitespace collapsed."""
    text = text.replace("\\", "").replace("*", "").replace("’", "'").replace("-\n", "").replace("- ", "")
    return re.sub(r"\s+", " ", re.sub(r"fi|fl", "", text))


def test_every_judged_claim_quotes_the_paper_and_names_its_primary():
    assert len(JUDGED) >= 30  # the six experiments' claims
    for c in JUDGED:
        assert c.quote and c.primary, c.key
        assert c.quote[-1] not in " ,;", c.key


@pytest.mark.skipif(PAPERS is None, reason="the papers' texts (shared/papers) are not on this machine")
def test_quotes_are_verbatim_in_the_papers():
    texts = [_normal(p.read_text()) for p in PAPERS.glob("*paper*")]
    assert len(texts) >= 3
    for c in JUDGED:
        for piece in c.quote.split(" … "):  # " … " joins verbatim pieces of one passage
            assert any(_normal(piece) in t for t in texts), (c.key, piece)


def _vq_summary(top1: dict, seeds: int = 6, seed: int = 0) -> dict:
    """VQ-VAE sample accuracies per normalizer: ``top1`` its mean; top-3 30 points above; seed noise shared."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, 0.01, seeds)
    own = {n: rng.normal(0, 0.001, seeds) for n in top1}
    norms = {}
    for n, m in top1.items():
        t1 = list(m + shared + own[n])
        norms[n] = {"seeds": list(range(seeds)), "top1_per_seed": t1, "top3_per_seed": [x + 0.3 for x in t1],
                    "top1": float(np.mean(t1)), "top3": float(np.mean(t1)) + 0.3, "nonzero_codes": 10.0,
                    "nonzero_codes_per_seed": [10.0] * seeds}
    return {"normalizers": norms}


def test_vqvae_most_accurate_is_judged_against_the_other_sparse_methods():
    # "ev-softmax outperforms other sparse methods in accuracy": entmax-1.5 ahead of ev-softmax in every seed leaves
    # the primary undecided at 6 seeds, even though ev-softmax beats softmax (now a secondary part)
    s = _vq_summary({"softmax": 0.49, "sparsemax": 0.45, "entmax15": 0.53, "posthoc_evidential": 0.48,
                     "ev_softmax": 0.51})
    c = {c.key: c for c in vq.claims(s, None)}["ev.vqvae.most_accurate"]
    assert c.verdict == verdict.INCONCLUSIVE
    assert "primary: top1, ev_softmax vs entmax15: inconclusive" in c.evidence
    assert "secondary: top1, ev_softmax vs softmax: reproduced" in c.evidence
    # ahead of every other sparse method but not of softmax: partly (softmax is the secondary part)
    s = _vq_summary({"softmax": 0.55, "sparsemax": 0.45, "entmax15": 0.47, "posthoc_evidential": 0.48,
                     "ev_softmax": 0.51}, seed=1)
    assert {c.key: c for c in vq.claims(s, None)}["ev.vqvae.most_accurate"].verdict == verdict.PARTLY


def test_vqvae_every_sparse_prior_must_beat_softmax():
    # "the sparse methods all outperform softmax": sparsemax below softmax in every seed keeps the claim from partly
    s = _vq_summary({"softmax": 0.49, "sparsemax": 0.45, "entmax15": 0.53, "posthoc_evidential": 0.48,
                     "ev_softmax": 0.51}, seed=2)
    c = {c.key: c for c in vq.claims(s, None)}["ev.vqvae.sparse_beats_softmax"]
    assert c.verdict == verdict.INCONCLUSIVE  # sparsemax against alone (p 0.031), not after Holm over the parts
    assert "primary: top-1, sparsemax vs softmax: inconclusive" in c.evidence
    s = _vq_summary({"softmax": 0.49, "sparsemax": 0.50, "entmax15": 0.53, "posthoc_evidential": 0.49,
                     "ev_softmax": 0.51}, seed=3)
    assert {c.key: c for c in vq.claims(s, None)}["ev.vqvae.sparse_beats_softmax"].verdict == verdict.REPRODUCED


def test_mt_rouge_primary_is_the_rivals_table_4_marks():
    # Table 4 marks sparsemax, entmax-1.5 and post-hoc as significantly below ev-softmax in ROUGE, not softmax:
    # ev-softmax ahead of the three marked rivals and tied with softmax is "partly", not "inconclusive"
    rng = np.random.default_rng(4)
    seeds = list(range(6))
    spread = rng.normal(0, 0.3, 6)

    def row(rouge, bleu=20.0):
        values = lambda v: {"mean": v, "std": 0.0, "values": list(v + spread + rng.normal(0, 0.01, 6))}  # noqa: E731
        return {"seeds": seeds, "bleu": values(bleu), "attended": {"cross": {"mean": values(5.0), "valid": 12.0}},
                "padding_max_abs_diff": 0.0, "first_step_support": values(5.0), "first_step_coverage": values(0.5),
                **{m: values(rouge) for m in ("rouge_1", "rouge_2", "rouge_l")}}

    rows = {"softmax": row(46.8), "sparsemax": row(44.5), "entmax15": row(45.9), "posthoc_evidential": row(46.0),
            "ev_softmax": row(46.8)}
    c = {c.key: c for c in mt_claims({"normalizers": rows, "significance": None}, None)}["ev.mt.rouge"]
    assert c.verdict == verdict.PARTLY
    assert "primary: ROUGE-1, ev-softmax vs sparsemax" in c.evidence
    assert "secondary: ROUGE-1, ev-softmax vs softmax" in c.evidence
