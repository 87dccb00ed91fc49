"""Summaries of the job records and this experiment's claims, judged by the one rule (``_shared.verdict``).

The paired unit of every claim is an evaluation chunk (text not used for calibration): each attention variant and
each next-token method is scored on the same chunks, so a claim compares two of them chunk by chunk.
The claims are ours (no paper states them); their keys start with ``own.llm.``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional

import numpy as np

from .._shared import verdict
from .._shared.verdict import NEW, NOT_TESTABLE, Claim
from .paper import ALPHA, MATCH_TOLERANCE, MATCHED_RIVALS, NLL_MARGIN, TRUNCATIONS

POSTHOC = "posthoc_evidential"
UNITS = "chunks"


def prefix_agreement(a: List[int], b: List[int]) -> float:
    """The fraction of ``b``'s tokens that ``a`` repeats before the first difference."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n / max(len(b), 1)


def _mean(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def aggregate(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Means over chunks per attention variant, the per-layer sweep, and the next-token methods."""
    attention = {r["label"]: r for r in records if r["kind"] == "attention"}
    softmax = attention.get("softmax")
    summary: Dict[str, Any] = {"attention": {}, "sweep": {}, "next_token": {}, "per_chunk": {}}
    for label, r in attention.items():
        pairs = zip(r["continuations"], softmax["continuations"]) if softmax else ()
        agree = [prefix_agreement(c, s) for c, s in pairs]
        matrix = r["kept_layer_head"]
        summary["attention"][label] = {
            "nll": _mean(r["nll"]), "perplexity": math.exp(_mean(r["nll"])), "kept": _mean(r["kept"]),
            "kept_layer": [float(np.mean(row)) if row else None for row in matrix],
            "kept_layer_head": matrix, "greedy_agreement": _mean(agree) if agree else None,
            "match": r.get("match"),
        }
        summary["per_chunk"][label] = {"nll": r["nll"], "kept": r["kept"], "greedy_agreement": agree}
    for r in records:
        if r["kind"] == "sweep":
            base = _mean(r["softmax_nll"])
            summary["sweep"][r["label"]] = {
                "softmax_nll": base, "chunks": len(r["softmax_nll"]),
                "layers": [{"layer": l["layer"], "nll": _mean(l["nll"]), "delta_nll": _mean(l["nll"]) - base,
                            "perplexity": math.exp(_mean(l["nll"])), "kept": l["kept"]} for l in r["layers"]]}
        if r["kind"] == "next_token":
            summary["next_token"] = {
                "calibration_support": r["calibration_support"], "calibration": r["calibration"],
                "methods": {m: {k: _mean(c[k] for c in chunks) for k in
                                ("support", "coverage", "nll_support", "softmax_nll_support")}
                            for m, chunks in r["per_chunk"].items()}}
            summary["per_chunk"]["next_token"] = {m: [c["coverage"] for c in chunks]
                                                  for m, chunks in r["per_chunk"].items()}
    return summary


def _claim(text: str, parts: List[verdict.Test], **kwargs) -> Claim:
    """:func:`verdict.claim` with each part's paired units named (evaluation chunks)."""
    return verdict.claim(text, [dataclasses.replace(t, unit=UNITS) for t in parts], **kwargs)


def _nll(summary, label) -> Optional[List[float]]:
    got = summary["per_chunk"].get(label)
    return got["nll"] if got else None


def _nll_parts(summary, subject: str, rivals: List[str], words: Dict[str, str]) -> List[verdict.Test]:
    parts = []
    for rival in rivals:
        d = verdict.paired_differences(_nll(summary, subject), _nll(summary, rival), higher_is_better=False)
        what = f"NLL per token, {words.get(subject, subject)} below {words.get(rival, rival)}"
        parts.append(verdict.direction(d, what))
    return parts


WORDS = {"softmax": "softmax", POSTHOC: "post-hoc ev-softmax", "entmax15": "1.5-entmax", "sparsemax": "sparsemax",
         "entmax_a1.25": "1.25-entmax", "entmax_a1.75": "1.75-entmax",
         "entmax_matched": "alpha-entmax at post-hoc's kept fraction", "topk_matched": "top-k at post-hoc's kept "
         "fraction per layer"}
MATCHED = tuple(MATCHED_RIVALS)


def _match_words(summary, label: str) -> str:
    """How a matched rival was calibrated, in words (alpha or the k per layer, and the kept fractions)."""
    m = summary["attention"].get(label, {}).get("match") or {}
    how = (f"alpha {m['alpha']:.4f}" if "alpha" in m else
           f"k per layer {min(m['k_per_layer'])}-{max(m['k_per_layer'])}" if m.get("k_per_layer") else "?")
    return (f"{label}: {how}, kept {m.get('calibration_kept', float('nan')):.3f} on the calibration chunks vs "
            f"post-hoc's {m.get('target', float('nan')):.3f}; on the evaluation chunks "
            f"{summary['attention'].get(label, {}).get('kept', float('nan')):.3f} vs "
            f"{summary['attention'].get(POSTHOC, {}).get('kept', float('nan')):.3f}")


def _unmatched(summary, labels) -> List[str]:
    """The matched rivals whose calibration missed post-hoc's kept fraction by more than :data:`MATCH_TOLERANCE`."""
    out = []
    for label in labels:
        m = summary["attention"].get(label, {}).get("match") or {}
        if not m or abs(m.get("calibration_kept", math.inf) - m.get("target", math.inf)) > MATCH_TOLERANCE:
            out.append(label)
    return out


def claims(summary: Dict[str, Any]) -> List[Claim]:
    claims: List[Claim] = []
    have = set(summary["per_chunk"])

    def missing(text: str, key: str, need) -> bool:
        lack = [n for n in need if n not in have]
        if lack:
            claims.append(Claim(text, NOT_TESTABLE, f"needs {', '.join(lack)}, not run here", key=key))
        return bool(lack)

    text = (f"Post-hoc ev-softmax in every attention layer of the softmax-trained model, without training, keeps the "
            f"NLL per token within {NLL_MARGIN:g} nats of softmax's (perplexity within "
            f"{100 * (math.exp(NLL_MARGIN) - 1):.1f} %)")
    key = "own.llm.posthoc_on_par"
    if not missing(text, key, ["softmax", POSTHOC]):
        d = verdict.paired_differences(_nll(summary, POSTHOC), _nll(summary, "softmax"), higher_is_better=False)
        claims.append(_claim(text, [verdict.non_inferiority(
            d, NLL_MARGIN, "NLL per token, post-hoc ev-softmax vs softmax",
            margin_source="our choice: about the gap between neighbouring sizes of a model family")],
            key=key))

    text = ("At equal kept fraction of attention weights (matched on the calibration chunks), post-hoc ev-softmax "
            "swapped in without training costs less NLL per token than alpha-entmax (alpha matched) and top-k "
            "attention (k matched per layer); both primary (pre-registered, paper.PREREGISTERED)")
    key = "own.llm.posthoc_least_cost"
    if not missing(text, key, [POSTHOC, *MATCHED]):
        off = _unmatched(summary, MATCHED)
        if off:
            claims.append(Claim(text, NOT_TESTABLE, "the match missed post-hoc's kept fraction by more than "
                                f"{MATCH_TOLERANCE:g}: " + "; ".join(_match_words(summary, m) for m in off), key=key))
        else:
            claims.append(_claim(text, _nll_parts(summary, POSTHOC, list(MATCHED), WORDS), key=key,
                                 primary=len(MATCHED), note="; ".join(_match_words(summary, m) for m in MATCHED)))
    rivals = [r for r in ("entmax_a1.25", "entmax15", "entmax_a1.75", "sparsemax") if r in have]
    if POSTHOC in have and rivals:
        kept = summary["attention"]
        parts = _nll_parts(summary, POSTHOC, rivals, WORDS)
        claims.append(Claim(
            "post-hoc ev-softmax against the sparser attentions at unequal kept fraction (issue 37's comparison; "
            "lower NLL largely follows from keeping more weights)", NEW,
            f"kept fraction: post-hoc {kept[POSTHOC]['kept']:.3f}, " + ", ".join(
                f"{WORDS[r]} {kept[r]['kept']:.3f}" for r in rivals) + "; " + "; ".join(
                f"{t.label}: mean {t.mean:+.3f} nats, p {t.p:.2g}" if t.p is not None else t.label for t in parts)))

    order = [label for label, _ in sorted(ALPHA.items(), key=lambda kv: kv[1]) if label != "softmax" and label in have]
    text = ("The larger alpha-entmax's alpha (1.25, 1.5, 1.75, 2 = sparsemax), the higher the NLL per token "
            "(primary) and "
            "the fewer attention weights kept (secondary), chunk by chunk")
    key = "own.llm.alpha_order"
    if len(order) < 2:
        claims.append(Claim(text, NOT_TESTABLE, "needs two alpha-entmax variants", key=key))
    else:
        parts = []
        for lo, hi in zip(order, order[1:]):
            d = verdict.paired_differences(_nll(summary, hi), _nll(summary, lo))
            parts.append(verdict.direction(d, f"NLL, alpha {ALPHA[hi]:g} above alpha {ALPHA[lo]:g}"))
        for lo, hi in zip(order, order[1:]):
            d = verdict.paired_differences(summary["per_chunk"][lo]["kept"], summary["per_chunk"][hi]["kept"])
            parts.append(verdict.direction(d, f"attention kept, alpha {ALPHA[lo]:g} above alpha {ALPHA[hi]:g}"))
        claims.append(_claim(text, parts, key=key, primary=len(order) - 1))

    text = ("Greedy continuations with post-hoc ev-softmax attention follow softmax's for longer than those with "
            "alpha-entmax and top-k attention at the same kept fraction (both primary; the fraction of the "
            "continuation before the first differing token)")
    key = "own.llm.greedy_agreement"
    off = [] if any(m not in have for m in MATCHED) else _unmatched(summary, MATCHED)
    if off:
        claims.append(Claim(text, NOT_TESTABLE, "the match missed post-hoc's kept fraction by more than "
                            f"{MATCH_TOLERANCE:g}: " + "; ".join(_match_words(summary, m) for m in off), key=key))
    elif not missing(text, key, ["softmax", POSTHOC, *MATCHED]):
        parts = []
        for rival in MATCHED:
            d = verdict.paired_differences(summary["per_chunk"][POSTHOC]["greedy_agreement"],
                                           summary["per_chunk"][rival]["greedy_agreement"])
            parts.append(verdict.direction(d, f"agreement with softmax, post-hoc ev-softmax above {WORDS[rival]}"))
        claims.append(_claim(text, parts, key=key, primary=len(parts)))

    coverage = summary["per_chunk"].get("next_token", {})
    # (ev-softmax's own support is about half the vocabulary: it and its truncations keep the true token at nearly
    # every position, so a paired coverage test has no nonzero pairs; the report shows its row.)
    for label, words, key in (("entmax15", "1.5-entmax", "own.llm.coverage_entmax15"),
                              ("sparsemax", "sparsemax", "own.llm.coverage_sparsemax")):
        text = (f"{words} on the LM head (next-token distribution) keeps the true next token in "
                f"its support more often than top-p (primary), top-k and min-p truncations of softmax at the same mean "
                f"support (calibrated on separate chunks)")
        if label not in coverage:
            claims.append(Claim(text, NOT_TESTABLE, f"needs the next-token job with {label}", key=key))
            continue
        parts = []
        for trunc in ("top_p", "top_k", "min_p"):
            d = verdict.paired_differences(coverage[label], coverage[f"{trunc}@{label}"])
            parts.append(verdict.direction(d, f"coverage of the true token, {words} above {trunc.replace('_', '-')}"))
        claims.append(_claim(text, parts, key=key))
    return claims


__all__ = ["aggregate", "claims", "prefix_agreement", "TRUNCATIONS"]
