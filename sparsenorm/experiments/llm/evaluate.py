"""What one job measures: the model's NLL per chunk with an attention variant, the attention it keeps per layer and
head, its greedy continuations; one layer at a time; and sparse next-token distributions beside truncation sampling.

* :func:`attention_run`: every layer with one normalizer. Per chunk: the mean NLL of each token given the ones
  before it (nats), and the fraction of attention weights kept (nonzero among the causally visible keys, over all
  layers and heads); over all chunks, that fraction per layer and head (:mod:`sparsenorm.attention.stats`); and
  per chunk the greedy continuation of its first ``prompt_tokens`` tokens (``new_tokens`` tokens, a plain loop over
  the key-value cache: no generation config between the logits and the argmax).
* :func:`layer_sweep`: the normalizer in one layer, softmax in the others, for every layer in turn: NLL and the
  fraction kept in that layer.
* :func:`next_token_run`: the unmodified model's logits; each output normalizer's support per position (tokens with
  nonzero probability), whether the true next token is in it, and the NLL of the true token given that it is (the
  sparse distribution's own probability); and top-k, top-p (nucleus) and min-p truncations of softmax calibrated to
  the same mean support on the calibration chunks, scored the same way (their probability renormalised on the kept
  set, as a sampler draws).
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Sequence

import torch
import torch.nn.functional as F

from .data import Chunk

LAYER = re.compile(r"layers\.(\d+)\.")


def _ids(chunk: Chunk, length: int | None = None) -> torch.Tensor:
    ids = chunk.ids if length is None else chunk.ids[:length]
    return torch.tensor([ids], dtype=torch.long)


@torch.no_grad()
def chunk_nll(model, ids: torch.Tensor) -> torch.Tensor:
    """Per-token NLL (nats) of ``ids[0, 1:]`` given the tokens before each, as float64 ``(L - 1,)``."""
    logits = model(ids).logits[0, :-1].double()
    return F.cross_entropy(logits, ids[0, 1:], reduction="none")


def _kept_matrix(stats: Sequence[Any]) -> List[List[float]]:
    """``kept[layer][head]``: attention weights kept / causally visible keys, summed over the ``record()`` results
    ``stats`` (one per chunk; the blocks are not nested)."""
    sums: Dict[int, List[torch.Tensor]] = {}
    for one in stats:
        for name, layer in one.layers.items():
            match = LAYER.search(name + ".")
            if match:
                got = sums.setdefault(int(match.group(1)), [torch.zeros_like(layer.support_sum, dtype=torch.float64),
                                                            torch.zeros_like(layer.valid_sum, dtype=torch.float64)])
                got[0] += layer.support_sum.double()
                got[1] += layer.valid_sum.double()
    return [(sums[i][0] / sums[i][1].clamp_min(1)).tolist() for i in sorted(sums)]


def _overall_kept(stats) -> float:
    support = sum(float(s.support_sum.sum()) for s in stats.layers.values())
    valid = sum(float(s.valid_sum.sum()) for s in stats.layers.values())
    return support / max(valid, 1.0)


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int) -> List[int]:
    """``new_tokens`` argmax tokens after ``prompt`` (1, P), decoded one at a time over the key-value cache."""
    out = model(prompt, use_cache=True)
    tokens: List[int] = []
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(new_tokens):
        tokens.append(int(nxt))
        if len(tokens) == new_tokens:
            break
        out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return tokens


@torch.no_grad()
def attention_run(model, chunks: Sequence[Chunk], implementation: str, prompt_tokens: int, new_tokens: int,
                  progress=lambda xs: xs) -> Dict[str, Any]:
    """The record of one attention variant over the evaluation chunks (see the module docstring)."""
    from sparsenorm.attention import stats as attention_stats

    model.set_attn_implementation(implementation)
    nll, kept, continuations, recorded = [], [], [], []
    for chunk in progress(chunks):
        with attention_stats.record(model) as one:
            nll.append(float(chunk_nll(model, _ids(chunk)).mean()))
        kept.append(_overall_kept(one))
        recorded.append(one)
    for chunk in chunks:
        continuations.append(greedy(model, _ids(chunk, prompt_tokens), new_tokens))
    return {"nll": nll, "kept": kept, "kept_layer_head": _kept_matrix(recorded),
            "continuations": continuations}


@torch.no_grad()
def layer_sweep(model, chunks: Sequence[Chunk], label: str, normalizer: str, params: Dict[str, Any], tokens: int,
                progress=lambda xs: xs) -> Dict[str, Any]:
    """NLL per chunk with ``normalizer`` in one layer at a time (softmax elsewhere) and the fraction kept there."""
    from sparsenorm.attention import stats as attention_stats

    from .model import attention_name, layer_swap

    model.set_attn_implementation(attention_name("softmax", "softmax", {}))
    base = [float(chunk_nll(model, _ids(c, tokens)).mean()) for c in chunks]
    layers = []
    for layer in progress(range(model.config.num_hidden_layers)):
        model.set_attn_implementation(layer_swap(label, normalizer, params, layer))
        with attention_stats.record(model) as stats:
            nll = [float(chunk_nll(model, _ids(c, tokens)).mean()) for c in chunks]
        matrix = _kept_matrix([stats])
        heads = matrix[layer] if layer < len(matrix) else []
        layers.append({"layer": layer, "nll": nll, "kept": sum(heads) / max(len(heads), 1)})
    return {"softmax_nll": base, "layers": layers}


# ---------------------------------------------------------------- next-token distributions

def _sparse_scores(probs: torch.Tensor, target: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Per row: support size, whether the target is in it, and ``-log p(target)`` (inf when it is not)."""
    support = (probs > 0).sum(-1).double()
    p_true = probs.gather(-1, target[:, None])[:, 0].double()
    return {"support": support, "covered": p_true > 0, "nll": -torch.log(p_true)}


def _truncated(sorted_probs: torch.Tensor, cumsum: torch.Tensor, count: torch.Tensor, rank: torch.Tensor,
               p_true: torch.Tensor) -> Dict[str, torch.Tensor]:
    """A truncation keeping the ``count`` most probable tokens of each row (softmax renormalised on them)."""
    count = count.clamp(1, sorted_probs.shape[-1])
    mass = cumsum.gather(-1, (count - 1)[:, None])[:, 0]
    covered = rank <= count
    return {"support": count.double(), "covered": covered, "nll": -torch.log(p_true / mass)}


def _top_p_count(cumsum: torch.Tensor, p: float) -> torch.Tensor:
    """Tokens top-p keeps: the fewest whose probabilities sum to at least ``p`` (a row's cumsum reaching ``p``)."""
    return torch.searchsorted(cumsum, torch.full((cumsum.shape[0], 1), p, dtype=cumsum.dtype))[:, 0] + 1


def _min_p_count(sorted_probs: torch.Tensor, m: float) -> torch.Tensor:
    """Tokens min-p keeps: those with probability at least ``m`` times the row's largest."""
    return (sorted_probs >= m * sorted_probs[:, :1]).sum(-1)


def _bisect(mean_support, target: float, lo: float, hi: float, increasing: bool, steps: int = 60) -> float:
    """The parameter in [lo, hi] whose mean support is closest to ``target`` (monotone in the parameter)."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if (mean_support(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _sorted(logits: torch.Tensor):
    probs = torch.softmax(logits.double(), -1)
    sorted_probs, _ = probs.sort(-1, descending=True)
    return probs, sorted_probs, sorted_probs.cumsum(-1)


def calibrate(logits: torch.Tensor, targets: Dict[str, float]) -> Dict[str, Dict[str, float]]:
    """Per output normalizer: ``k`` of top-k, ``p`` of top-p and ``m`` of min-p whose mean support on the rows of
    ``logits`` (calibration chunks) equals the normalizer's mean support ``targets[label]`` there."""
    _, sorted_probs, cumsum = _sorted(logits)
    vocab = logits.shape[-1]
    out = {}
    for label, target in targets.items():
        top_p = _bisect(lambda p: float(_top_p_count(cumsum, p).clamp(max=vocab).double().mean()), target, 0.0, 1.0,
                        increasing=True)
        # min-p in log space: thresholds span many orders of magnitude for wide supports
        log_m = _bisect(lambda lm: float(_min_p_count(sorted_probs, math.exp(lm)).double().mean()), target, -80.0, 0.0,
                        increasing=False)
        out[label] = {"top_k": float(max(1, min(vocab, round(target)))), "top_p": top_p, "min_p": math.exp(log_m)}
    return out


@torch.no_grad()
def next_token_run(model, calibration: Sequence[Chunk], chunks: Sequence[Chunk], output: Dict[str, tuple],
                   progress=lambda xs: xs) -> Dict[str, Any]:
    """Per output normalizer and its three calibrated truncations, per evaluation chunk: mean support, the fraction
    of positions whose true token is in the support, the mean NLL of the true token over those positions (the
    distribution's own probability) and softmax's NLL over the same positions; plus the calibration."""
    from sparsenorm import registry

    from .model import attention_name

    model.set_attn_implementation(attention_name("softmax", "softmax", {}))
    forms = {label: registry.get(name, **params).for_mode(training=False) for label, (name, params) in output.items()}

    def logits_of(chunk: Chunk):
        ids = _ids(chunk)
        return model(ids).logits[0, :-1].float(), ids[0, 1:]

    cal_logits = torch.cat([logits_of(c)[0] for c in calibration]) if calibration else None
    targets = {label: float((form.forward(cal_logits, dim=-1) > 0).sum(-1).double().mean())
               for label, form in forms.items()} if cal_logits is not None else {}
    params = calibrate(cal_logits, targets) if cal_logits is not None else {}
    del cal_logits
    methods = [(label, None) for label in forms] + [(label, t) for label in params for t in ("top_k", "top_p", "min_p")]
    per_chunk: Dict[str, List[Dict[str, float]]] = {_name(label, t): [] for label, t in methods}
    for chunk in progress(chunks):
        logits, target = logits_of(chunk)
        probs, sorted_probs, cumsum = _sorted(logits)
        p_true = probs.gather(-1, target[:, None])[:, 0]
        rank = (probs > p_true[:, None]).sum(-1) + 1
        softmax_nll = -torch.log(p_true)
        for label, trunc in methods:
            if trunc is None:
                scores = _sparse_scores(forms[label].forward(logits, dim=-1), target)
            else:
                value = params[label][trunc]
                count = (torch.full_like(rank, int(value)) if trunc == "top_k" else
                         _top_p_count(cumsum, value) if trunc == "top_p" else _min_p_count(sorted_probs, value))
                scores = _truncated(sorted_probs, cumsum, count, rank, p_true)
            covered = scores["covered"]
            n = int(covered.sum())
            per_chunk[_name(label, trunc)].append({
                "support": float(scores["support"].mean()), "coverage": n / covered.numel(),
                "nll_support": float(scores["nll"][covered].mean()) if n else None,
                "softmax_nll_support": float(softmax_nll[covered].mean()) if n else None,
            })
    return {"calibration_support": targets, "calibration": params, "per_chunk": per_chunk}


def _name(label: str, truncation) -> str:
    return label if truncation is None else f"{truncation}@{label}"


# ---------------------------------------------------------------- sparsity-matched rivals (issue 49)

@torch.no_grad()
def kept_on(model, chunks: Sequence[Chunk], implementation: str) -> Dict[str, Any]:
    """The kept fraction of attention weights with ``implementation`` over ``chunks``: overall (every layer and head)
    and per layer (mean over its heads, which see the same keys)."""
    from sparsenorm.attention import stats as attention_stats

    model.set_attn_implementation(implementation)
    recorded = []
    for chunk in chunks:
        with attention_stats.record(model) as one:
            model(_ids(chunk))
        recorded.append(one)
    matrix = _kept_matrix(recorded)
    layers = [sum(row) / max(len(row), 1) for row in matrix]
    return {"overall": sum(layers) / max(len(layers), 1), "layers": layers}


def topk_kept(k: int, lengths: Sequence[int]) -> float:
    """The kept fraction of causal top-k attention over chunks of ``lengths`` tokens: query ``i`` sees ``i + 1`` keys
    and keeps ``min(k, i + 1)`` of them, whatever the scores."""
    kept = sum(min(k, i + 1) for n in lengths for i in range(n))
    return kept / max(sum(n * (n + 1) // 2 for n in lengths), 1)


def topk_for(target: float, lengths: Sequence[int]) -> int:
    """The ``k`` whose causal top-k kept fraction over ``lengths`` is closest to ``target`` (``topk_kept`` grows with
    ``k``; the smaller ``k`` on a tie)."""
    lo, hi = 1, max(lengths)
    while lo < hi:  # the smallest k reaching the target
        mid = (lo + hi) // 2
        if topk_kept(mid, lengths) < target:
            lo = mid + 1
        else:
            hi = mid
    below = max(lo - 1, 1)
    return below if abs(topk_kept(below, lengths) - target) <= abs(topk_kept(lo, lengths) - target) else lo


def match_alpha(model, chunks: Sequence[Chunk], target: float, bracket: Sequence[float], steps: int,
                progress=lambda xs: xs) -> Dict[str, Any]:
    """alpha-entmax's alpha whose overall kept fraction on ``chunks`` is closest to ``target``: bisection on
    ``bracket`` (the kept fraction falls as alpha grows), every alpha tried recorded with its kept fraction."""
    from .model import attention_name

    lo, hi = float(bracket[0]), float(bracket[1])
    tried = []
    for _ in progress(range(steps)):
        mid = 0.5 * (lo + hi)
        kept = kept_on(model, chunks, attention_name("alpha_match", "entmax_bisect", {"alpha": mid}))["overall"]
        tried.append({"alpha": mid, "kept": kept})
        if kept > target:
            lo = mid
        else:
            hi = mid
    best = min(tried, key=lambda t: abs(t["kept"] - target))
    return {"alpha": best["alpha"], "kept": best["kept"], "tried": tried}


@torch.no_grad()
def matched_run(model, calibration: Sequence[Chunk], chunks: Sequence[Chunk], label: str, prompt_tokens: int,
                new_tokens: int, bracket: Sequence[float] = (1.001, 1.5), steps: int = 12,
                progress=lambda xs: xs) -> Dict[str, Any]:
    """A sparsity-matched rival of post-hoc ev-softmax attention (``label``: ``entmax_matched`` or ``topk_matched``,
    see :data:`.paper.MATCHED_RIVALS`): post-hoc's kept fraction measured on the calibration chunks, the rival
    calibrated to it there, then scored on the evaluation chunks as :func:`attention_run` scores any variant."""
    from .model import attention_name, per_layer_attention, topk_softmax

    if not calibration:
        raise ValueError("a matched rival needs calibration chunks")
    target = kept_on(model, calibration, attention_name("posthoc_evidential", "posthoc_evidential", {}))
    lengths = [len(c.ids) for c in calibration]
    if label == "entmax_matched":
        found = match_alpha(model, calibration, target["overall"], bracket, steps, progress)
        implementation = attention_name(label, "entmax_bisect", {"alpha": found["alpha"]})
        match = {"alpha": found["alpha"], "tried": found["tried"], "calibration_kept": found["kept"]}
    elif label == "topk_matched":
        ks = [topk_for(t, lengths) for t in target["layers"]]
        implementation = per_layer_attention(f"sparsenorm_llm_{label}", {i: topk_softmax(k) for i, k in enumerate(ks)})
        kept_layers = [topk_kept(k, lengths) for k in ks]
        match = {"k_per_layer": ks, "calibration_kept_layers": kept_layers,
                 "calibration_kept": sum(kept_layers) / max(len(kept_layers), 1)}
    else:
        raise ValueError(f"unknown matched rival {label!r}")
    record = attention_run(model, chunks, implementation, prompt_tokens, new_tokens, progress)
    record["match"] = {"target": target["overall"], "target_layers": target["layers"], **match}
    return record
