"""Test-set evaluation of a trained model: translations, sacrebleu BLEU/chrF, ROUGE-L, attended keys, maps.

* BLEU and chrF: sacrebleu on detokenised (SentencePiece-decoded) output against the raw
  references, with sacrebleu's signature; paired bootstrap resampling (sacrebleu's ``PairedTest``).
* ROUGE-1, ROUGE-2, ROUGE-L: Google's ``rouge-score`` (pure Python, offline) on sacrebleu's 13a tokens; its own
  tokenizer keeps only ``[a-z0-9]`` and would split German words at umlauts.
* METEOR: NLTK's ``meteor_score`` with WordNet 3.0 from Debian's ``wordnet-base`` and the German
  Snowball stemmer (:mod:`.meteor`), computed from the stored beam outputs by the aggregation.
* # attended: keys with nonzero weight per query, counted by :func:`sparsenorm.attention.record`
  over valid keys of valid queries only, with teacher forcing on the test references; mean and
  standard deviation over all queries, per site and per layer (from the per-head histograms).
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from ...attention import record
from .decode import beam_search, greedy, output_log_probs
from .model import SITES, Seq2Seq, attention_sites
from .train import Example, collate


def translate(model: Seq2Seq, examples: Sequence[Example], output: str, beam: int, alpha: float,
              batch_size: int, device: torch.device) -> List[List[int]]:
    """Token ids of each example's translation (greedy when ``beam == 1``), in the input order."""
    log_probs = output_log_probs(model, output)
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    out: Dict[int, List[int]] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        src, _, _ = collate([examples[i] for i in idx], device)
        hyps = greedy(model, src, log_probs) if beam == 1 else beam_search(model, src, log_probs, beam, alpha)
        out.update(zip(idx, hyps))
    return [out[i] for i in range(len(examples))]


def corpus_scores(hypotheses: List[str], references: List[str]) -> Dict[str, Any]:
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    per_sentence = rouge(hypotheses, references)
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score,
            "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
            **{name: sum(v) / max(len(v), 1) for name, v in per_sentence.items()},
            "rouge_per_sentence": per_sentence}


def rouge(hypotheses: List[str], references: List[str]) -> Dict[str, List[float]]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F1 (x100) per sentence (Table 4's ROUGE rows), with whitespace tokens of
    sacrebleu's 13a tokenizer, lowercased."""
    from rouge_score import rouge_scorer
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok13a = Tokenizer13a()

    class Tokens:
        def tokenize(self, text: str) -> List[str]:
            return tok13a(text.lower()).split()

    names = {"rouge1": "rouge_1", "rouge2": "rouge_2", "rougeL": "rouge_l"}
    scorer = rouge_scorer.RougeScorer(list(names), tokenizer=Tokens())
    scores = [scorer.score(ref, hyp) for hyp, ref in zip(hypotheses, references)]
    return {ours: [100.0 * s[theirs].fmeasure for s in scores] for theirs, ours in names.items()}


def rouge_l(hypotheses: List[str], references: List[str]) -> float:
    """Mean ROUGE-L F1 (x100) over sentences."""
    scores = rouge(hypotheses, references)["rouge_l"]
    return sum(scores) / max(len(scores), 1)


def paired_bootstrap(baseline: Tuple[str, List[str]], systems: List[Tuple[str, List[str]]],
                     references: List[str], samples: int = 1000) -> Dict[str, Any]:
    """sacrebleu's paired bootstrap of BLEU and chrF, each system against ``baseline``: p-values."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    test = PairedTest([baseline, *systems], {"BLEU": BLEU(), "chrF": CHRF()}, [references],
                      test_type="bs", n_samples=samples)
    signatures, scores = test()
    out: Dict[str, Any] = {"baseline": baseline[0], "samples": samples,
                           "signatures": {k: str(v) for k, v in signatures.items()}, "systems": {}}
    short = {"BLEU": "BLEU", "chrF2": "chrF"}  # sacrebleu names chrF by its beta
    for i, name in enumerate(scores["System"][1:], start=1):
        out["systems"][name] = {short.get(metric, metric): {"score": res[i].score, "p_value": res[i].p_value}
                                for metric, res in scores.items() if metric != "System"}
    return out


@torch.no_grad()
def attended(model: Seq2Seq, examples: Sequence[Example], batch_size: int, device: torch.device) -> Dict[str, Any]:
    """# attended per site and layer: ``{site: {"mean", "std", "valid", "layers": [{"mean", "std", "valid"}]}}``."""
    model.eval()
    with record(model) as stats:
        for start in range(0, len(examples), batch_size):
            src, tgt_in, _ = collate(list(examples[start:start + batch_size]), device)
            model(src, tgt_in)
    names = {id(m): n for n, m in model.named_modules()}
    out: Dict[str, Any] = {}
    for site, modules in attention_sites(model).items():
        layers = [stats.layers[names[id(m)]] for m in modules]
        per_layer = [_moments(s.histogram.sum(0), s.valid_sum.sum(), s.queries.sum()) for s in layers]
        total = _moments(sum(_pad_to(s.histogram.sum(0), layers) for s in layers),
                         sum(s.valid_sum.sum() for s in layers), sum(s.queries.sum() for s in layers))
        out[site] = {**total, "layers": per_layer}
    return out


def _pad_to(hist: torch.Tensor, layers) -> torch.Tensor:
    width = max(s.histogram.shape[1] for s in layers)
    return torch.nn.functional.pad(hist, (0, width - hist.shape[0]))


def _moments(hist: torch.Tensor, valid_sum: torch.Tensor, queries: torch.Tensor) -> Dict[str, float]:
    """Mean and std of the support size from a histogram over support sizes; mean valid keys."""
    counts = hist.double()
    n = float(counts.sum())
    sizes = torch.arange(len(counts), dtype=torch.float64)
    mean = float((counts * sizes).sum()) / max(n, 1.0)
    var = float((counts * (sizes - mean) ** 2).sum()) / max(n, 1.0)
    return {"mean": mean, "std": var ** 0.5, "valid": float(valid_sum) / max(float(queries), 1.0), "queries": int(n)}


@torch.no_grad()
def cross_attention_maps(model: Seq2Seq, examples: Sequence[Example], device: torch.device) -> List[List[List[float]]]:
    """Last decoder layer's cross-attention weights (target x source, mean over heads), teacher-forced."""
    model.eval()
    last = model.decoder[-1].cross_attn
    maps = []
    try:
        last.capture = True
        for ex in examples:
            src, tgt_in, _ = collate([ex], device)
            model(src, tgt_in)
            maps.append(last.weights[0].mean(0).cpu().tolist())
    finally:
        last.capture, last.weights = False, None
    return maps


@torch.no_grad()
def padding_effect(model: Seq2Seq, examples: Sequence[Example], device: torch.device) -> float:
    """Max |difference| of the first example's decoder features alone vs. padded in a batch with longer ones.

    Zero (to float rounding) when padding is "not there"; the authors' masking (scores at -1e18
    before ev-softmax's mean) would change it."""
    model.eval()
    first = examples[0]
    longer = max(examples, key=lambda e: len(e[0]) + len(e[1]))
    src, tgt_in, _ = collate([first], device)
    alone = model(src, tgt_in)[0]
    src, tgt_in, _ = collate([first, longer], device)
    padded = model(src, tgt_in)[0, :alone.shape[0]]
    return float((alone - padded).abs().max())


def evaluate(model: Seq2Seq, test: Sequence[Example], references: List[str], decode_text, output: str,
             beam: int, alpha: float, batch_size: int, device: torch.device,
             map_examples: Sequence[Example]) -> Dict[str, Any]:
    """Everything measured for one (model, normalizer) on the test set."""
    model.eval()
    result: Dict[str, Any] = {}
    for mode, width in (("greedy", 1), ("beam", beam)):
        ids = translate(model, test, output, width, alpha, batch_size, device)
        hyps = [decode_text(h) for h in ids]
        result[mode] = corpus_scores(hyps, references)
        result[mode]["hypotheses"] = hyps
    result["attended"] = attended(model, test, batch_size, device)
    result["cross_maps"] = cross_attention_maps(model, map_examples, device)
    result["padding_max_abs_diff"] = padding_effect(model, test, device)
    return result


__all__ = ["evaluate", "paired_bootstrap", "corpus_scores", "rouge", "rouge_l", "attended", "SITES"]
