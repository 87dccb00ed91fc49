"""A compact pre-LN encoder-decoder transformer whose attention is :func:`sparsenorm.attention.sparse_attention`.

Each attention site (encoder self-, decoder self-, cross-attention) has its own normalizer (a
registry name). ``posthoc_evidential`` is softmax while training and ev-softmax at evaluation
(Theorem 3.1 with the keys as the linear layer). Masks follow SDPA's convention (True = attend);
a padded *query* row is masked entirely, so it has no valid key, a zero attention output, and is
left out of the attended-key statistics: those count valid keys of valid queries only.

The output layer is tied to the shared source/target embedding (``out.weight is embed.weight``);
its normalizer is applied by :meth:`Seq2Seq.log_probs` and the loss in :mod:`.train`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from ...attention.functional import resolve_normalizer, sparse_attention_from_parts
from ...attention.masks import split_mask

SITES = ("encoder", "decoder", "cross")
PAD, UNK, BOS, EOS = 0, 1, 2, 3


@dataclass
class ModelConfig:
    vocab: int
    d_model: int = 128
    heads: int = 4
    ffn: int = 256
    enc_layers: int = 2
    dec_layers: int = 2
    dropout: float = 0.1
    max_len: int = 256


class Attention(nn.Module):
    """Multi-head attention with a sparsenorm normalizer; ``capture`` keeps the last weights (maps)."""

    def __init__(self, d_model: int, heads: int, dropout: float, normalizer: str, params: Dict[str, float]):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))
        self._normalizer, self.params = normalizer, dict(params)
        resolve_normalizer(normalizer, params, training=False)  # a bad name or parameter fails here
        self.capture = False
        self.weights: Optional[Tensor] = None

    @property
    def normalizer(self) -> str:
        """The registry name (read-only: a post-hoc evaluation rebuilds the model, see ``with_attention``)."""
        return self._normalizer

    def form(self):
        """The normalizer's form in the module's current mode, from the registry at call time
        (``Normalizer.for_mode``): ``posthoc_evidential`` is softmax in ``train()``, ev-softmax in ``eval()``."""
        return resolve_normalizer(self._normalizer, self.params, training=self.training)

    def split(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> Tuple[Tensor, Tensor]:
        return self.split(self.k(memory)), self.split(self.v(memory))

    def forward(self, x: Tensor, kv: Tuple[Tensor, Tensor], keep: Optional[Tensor], is_causal: bool = False) -> Tensor:
        result = sparse_attention_from_parts(self.form(), self.split(self.q(x)), *kv, *split_mask(keep),
                                             is_causal=is_causal, dropout_p=self.dropout if self.training else 0.0,
                                             return_weights=self.capture, stats_module=self)
        if self.capture:
            result, self.weights = result[0], result[1].detach()
        b, h, n, dh = result.shape
        return self.o(result.transpose(1, 2).reshape(b, n, h * dh))


class Block(nn.Module):
    """Pre-LN block: self-attention, optional cross-attention, feed-forward, each ``x + f(LN(x))``."""

    def __init__(self, cfg: ModelConfig, self_norm: Tuple[str, dict], cross_norm: Optional[Tuple[str, dict]]):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.self_attn = Attention(cfg.d_model, cfg.heads, cfg.dropout, *self_norm)
        self.cross_attn = None
        if cross_norm is not None:
            self.ln2 = nn.LayerNorm(cfg.d_model)
            self.cross_attn = Attention(cfg.d_model, cfg.heads, cfg.dropout, *cross_norm)
        self.ln3 = nn.LayerNorm(cfg.d_model)
        self.ffn = nn.Sequential(nn.Linear(cfg.d_model, cfg.ffn), nn.ReLU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(cfg.ffn, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, self_keep: Optional[Tensor], is_causal: bool = False,
                memory_kv: Optional[Tuple[Tensor, Tensor]] = None, cross_keep: Optional[Tensor] = None,
                cache: Optional[Dict[str, Tensor]] = None) -> Tensor:
        h = self.ln1(x)
        k, v = self.self_attn.project_kv(h)
        if cache is not None:  # incremental decoding: keys/values of the earlier positions
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
            cache["k"], cache["v"] = k, v
        x = x + self.drop(self.self_attn(h, (k, v), self_keep, is_causal))
        if self.cross_attn is not None:
            x = x + self.drop(self.cross_attn(self.ln2(x), memory_kv, cross_keep))
        return x + self.drop(self.ffn(self.ln3(x)))


def _keep(query_valid: Tensor, key_valid: Tensor) -> Tensor:
    """(B, 1, L, S) boolean mask: valid query rows attend to valid keys; padded rows to nothing."""
    return query_valid[:, None, :, None] & key_valid[:, None, None, :]


class Seq2Seq(nn.Module):
    """Encoder-decoder transformer; ``attention`` maps each site to ``(normalizer, params)``."""

    def __init__(self, cfg: ModelConfig, attention: Dict[str, Tuple[str, dict]]):
        super().__init__()
        missing = set(SITES) - set(attention)
        if missing:
            raise ValueError(f"attention: no normalizer for site(s) {sorted(missing)}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, std=cfg.d_model ** -0.5)
        self.register_buffer("positions", _sinusoids(cfg.max_len, cfg.d_model), persistent=False)
        self.encoder = nn.ModuleList(Block(cfg, attention["encoder"], None) for _ in range(cfg.enc_layers))
        self.decoder = nn.ModuleList(Block(cfg, attention["decoder"], attention["cross"])
                                     for _ in range(cfg.dec_layers))
        self.enc_ln, self.dec_ln = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.out.weight = self.embed.weight  # tied embeddings
        self.drop = nn.Dropout(cfg.dropout)

    def embed_tokens(self, tokens: Tensor, offset: int = 0) -> Tensor:
        n = tokens.shape[1]
        if offset + n > self.cfg.max_len:
            raise ValueError(f"sequence of {offset + n} tokens exceeds max_len={self.cfg.max_len}")
        return self.drop(self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.positions[offset:offset + n])

    def encode(self, src: Tensor) -> Tuple[Tensor, Tensor]:
        """(B, S) token ids -> memory (B, S, D) and the source's validity (B, S)."""
        valid = src != PAD
        keep = _keep(valid, valid)
        x = self.embed_tokens(src)
        for block in self.encoder:
            x = block(x, keep)
        return self.enc_ln(x), valid

    def memory_kv(self, memory: Tensor) -> List[Tuple[Tensor, Tensor]]:
        return [block.cross_attn.project_kv(memory) for block in self.decoder]

    def decode(self, tgt_in: Tensor, memory: Tensor, src_valid: Tensor) -> Tensor:
        """Teacher-forced decoder features (B, T, D) for target inputs (B, T)."""
        valid = tgt_in != PAD
        self_keep, cross_keep = _keep(valid, valid), _keep(valid, src_valid)
        x = self.embed_tokens(tgt_in)
        for block, kv in zip(self.decoder, self.memory_kv(memory)):
            x = block(x, self_keep, True, kv, cross_keep)
        return self.dec_ln(x)

    def step(self, token: Tensor, offset: int, memory_kv: List[Tuple[Tensor, Tensor]], src_valid: Tensor,
             caches: List[Dict[str, Tensor]]) -> Tensor:
        """One decoding step: features (B, D) of the newest token (B,) given cached keys/values."""
        x = self.embed_tokens(token[:, None], offset)
        cross_keep = src_valid[:, None, None, :]
        for block, kv, cache in zip(self.decoder, memory_kv, caches):
            x = block(x, None, False, kv, cross_keep, cache)
        return self.dec_ln(x)[:, 0]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, src_valid = self.encode(src)
        return self.decode(tgt_in, memory, src_valid)


def _sinusoids(n: int, d: int) -> Tensor:
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return table


def with_attention(model: Seq2Seq, attention: Dict[str, Tuple[str, dict]]) -> Seq2Seq:
    """A new model of ``model``'s configuration and parameters whose attention sites use ``attention``
    (site -> ``(normalizer, params)``), in ``model``'s mode and on its device: e.g. post-hoc evidential
    evaluation of a softmax-trained model. ``model`` itself is left unchanged."""
    with torch.random.fork_rng(devices=[]):  # the throwaway initialization leaves the global RNG as it was
        rebuilt = Seq2Seq(model.cfg, attention)
    rebuilt.load_state_dict(model.state_dict())
    rebuilt = rebuilt.to(model.embed.weight.device)
    return rebuilt.train(model.training)


def attention_sites(model: Seq2Seq) -> Dict[str, List[Attention]]:
    """The model's attention modules by site, in layer order."""
    return {"encoder": [b.self_attn for b in model.encoder], "decoder": [b.self_attn for b in model.decoder],
            "cross": [b.cross_attn for b in model.decoder]}
