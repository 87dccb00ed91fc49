"""Batched greedy and beam search; the output layer's normalizer gives the token log-probabilities.

A sparse output normalizer gives ``-inf`` to tokens outside its support; such continuations are
never chosen while a finite one exists. Beam search keeps ``beam`` live hypotheses per sentence,
moves a hypothesis that emits EOS to the sentence's finished list with the score
``log p / lp(len)``, ``lp = ((5 + len) / 6) ** alpha`` (Wu et al. 2016), and stops once every
sentence has ``beam`` finished hypotheses or the length limit is reached.
"""
from __future__ import annotations

from typing import Callable, List

import torch
from torch import Tensor

from ... import registry
from .model import BOS, EOS, PAD, Seq2Seq


def output_log_probs(model: Seq2Seq, name: str) -> Callable[[Tensor], Tensor]:
    """``features (N, D) -> log-probabilities (N, V)`` of the output layer with normalizer ``name``."""
    entry = registry.get(name)
    if not entry.sparse:
        return lambda h: torch.log_softmax(model.out(h), dim=-1)
    return lambda h: entry.probs_from_linear(h, model.out).log()


def _max_len(src: Tensor, extra: int, limit: int) -> int:
    return min(int((src != PAD).sum(1).max()) * 3 // 2 + extra, limit - 1)


@torch.no_grad()
def greedy(model: Seq2Seq, src: Tensor, log_probs: Callable[[Tensor], Tensor], extra: int = 10) -> List[List[int]]:
    """Token ids (without BOS/EOS) of the greedy translation of each source row."""
    memory, src_valid = model.encode(src)
    kv = model.memory_kv(memory)
    caches = [{} for _ in model.decoder]
    batch = src.shape[0]
    token = torch.full((batch,), BOS, dtype=torch.long, device=src.device)
    out, done = [], torch.zeros(batch, dtype=torch.bool, device=src.device)
    for t in range(_max_len(src, extra, model.cfg.max_len)):
        token = log_probs(model.step(token, t, kv, src_valid, caches)).argmax(-1)
        token = token.masked_fill(done, PAD)
        out.append(token)
        done |= token == EOS
        if bool(done.all()):
            break
    rows = torch.stack(out, 1).tolist()
    return [[tok for tok in row[:row.index(EOS)] if tok != PAD] if EOS in row else [t for t in row if t != PAD]
            for row in rows]


@torch.no_grad()
def beam_search(model: Seq2Seq, src: Tensor, log_probs: Callable[[Tensor], Tensor], beam: int = 4,
                alpha: float = 0.6, extra: int = 10) -> List[List[int]]:
    """Token ids (without BOS/EOS) of the best finished hypothesis per source row."""
    batch, device = src.shape[0], src.device
    memory, src_valid = model.encode(src)
    memory = memory.repeat_interleave(beam, 0)
    src_valid = src_valid.repeat_interleave(beam, 0)
    kv = model.memory_kv(memory)
    caches = [{} for _ in model.decoder]
    scores = torch.full((batch, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live hypothesis at the start
    tokens = torch.full((batch * beam, 1), BOS, dtype=torch.long, device=device)
    finished: List[List[tuple]] = [[] for _ in range(batch)]
    max_len = _max_len(src, extra, model.cfg.max_len)
    for t in range(max_len):
        logp = log_probs(model.step(tokens[:, -1], t, kv, src_valid, caches))
        vocab = logp.shape[-1]
        cand = (scores[:, :, None] + logp.view(batch, beam, vocab)).view(batch, -1)
        top_scores, top_idx = cand.topk(2 * beam, dim=1)
        origin, token = top_idx // vocab, top_idx % vocab
        is_eos = token == EOS
        lp = ((5 + t + 1) / 6) ** alpha
        for b, j in (is_eos[:, :beam] & torch.isfinite(top_scores[:, :beam])).nonzero().tolist():
            if len(finished[b]) < beam:
                row = b * beam + int(origin[b, j])
                finished[b].append((float(top_scores[b, j]) / lp, tokens[row, 1:].tolist()))
        # The best `beam` continuations that are not EOS stay live.
        live_scores = top_scores.masked_fill(is_eos, float("-inf"))
        keep_scores, keep_pos = live_scores.topk(beam, dim=1)
        rows = (torch.arange(batch, device=device)[:, None] * beam + origin.gather(1, keep_pos)).view(-1)
        tokens = torch.cat([tokens[rows], token.gather(1, keep_pos).view(-1, 1)], 1)
        for cache in caches:
            cache["k"], cache["v"] = cache["k"][rows], cache["v"][rows]
        scores = keep_scores
        if all(len(f) >= beam for f in finished):
            break
    lp = ((5 + tokens.shape[1] - 1) / 6) ** alpha
    results = []
    for b in range(batch):
        pool = finished[b] or [(float(scores[b, j]) / lp, tokens[b * beam + j, 1:].tolist()) for j in range(beam)]
        results.append(max(pool, key=lambda x: x[0])[1])
    return results
