"""``MultiheadAttention``: ``torch.nn.MultiheadAttention`` with a sparsenorm normalizer."""
from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_multihead_inputs
from . import stats
from .functional import resolve_normalizer, sparse_attention


def _as_keep(mask: Optional[Tensor], name: str, dtype: torch.dtype) -> Optional[Tensor]:
    """PyTorch's MHA masks (bool True = NOT allowed; float added) as SDPA's (bool True = attend; float added)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return ~mask
    if not mask.is_floating_point():
        raise TypeError(f"{name} must be a boolean or floating-point tensor, got dtype {mask.dtype}")
    return mask.to(dtype)


def _merge(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    """Combine two SDPA-style masks (bool: AND; float: sum, a boolean one turned into -inf)."""
    if a is None or b is None:
        return b if a is None else a
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return a & b
    if a.dtype == torch.bool:
        a, b = b, a
    if b.dtype == torch.bool:
        b = torch.zeros(b.shape, dtype=a.dtype, device=a.device).masked_fill(~b, float("-inf"))
    return a + b


class MultiheadAttention(nn.MultiheadAttention):
    """Drop-in for ``torch.nn.MultiheadAttention`` (same arguments, parameters, state dict and
    ``forward``) whose attention weights come from ``normalizer`` (a registry name or a callable;
    ``**params`` its parameters, e.g. ``alpha=1.3``).

    ``normalizer="posthoc_evidential"`` is softmax in ``train()`` mode and ev-softmax in
    ``eval()`` mode. Masks keep PyTorch's MHA conventions (``key_padding_mask`` and a boolean
    ``attn_mask``: True = not allowed; float masks are added); masked keys are "not there" as in
    :func:`sparsenorm.attention.sparse_attention`. Where PyTorch gives NaN for a query with every
    key masked, this gives a zero attention output (the output projection's bias then).
    ``is_causal=True`` without ``attn_mask`` applies the causal mask (PyTorch requires the mask).

    Inside ``nn.TransformerEncoderLayer``, PyTorch's inference fast path (eval mode without
    gradients) computes softmax attention in a fused kernel and never calls this module's
    ``forward``; turn it off with ``torch.backends.mha.set_fastpath_enabled(False)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: Optional[int] = None,
                 vdim: Optional[int] = None, batch_first: bool = False, device=None, dtype=None,
                 normalizer: Union[str, Callable] = "ev_softmax", **params):
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim,
                         batch_first, device, dtype)
        resolve_normalizer(normalizer, params)  # fail here, not at the first forward
        self.normalizer = normalizer
        self.params = dict(params)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params.items())
        name = self.normalizer if isinstance(self.normalizer, str) else getattr(self.normalizer, "__name__", "callable")
        return f"normalizer={name}{extra}"

    def _current_normalizer(self):
        if self.normalizer == "posthoc_evidential":
            return "softmax" if self.training else "ev_softmax"
        return self.normalizer

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                need_weights: bool = True, attn_mask: Optional[Tensor] = None,
                average_attn_weights: bool = True, is_causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        check_multihead_inputs(query, key, value, embed_dim=self.embed_dim, kdim=self.kdim, vdim=self.vdim,
                               num_heads=self.num_heads, batch_first=self.batch_first,
                               key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        batched = query.dim() == 3
        if not batched:  # (L, E): one sequence
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:  # work in (L, N, E) as PyTorch does
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        L, N, E = query.shape
        H, Dh = self.num_heads, self.head_dim

        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)

        mask = _as_keep(attn_mask, "attn_mask", q.dtype)
        pad = _as_keep(key_padding_mask, "key_padding_mask", q.dtype)
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.expand(1, N, E)])
            v = torch.cat([v, self.bias_v.expand(1, N, E)])
            mask, pad = _extend(mask), _extend(pad)
        # (L, N, E) -> (N, H, L, Dh)
        q = q.reshape(L, N, H, Dh).permute(1, 2, 0, 3)
        k = k.reshape(k.shape[0], N, H, Dh).permute(1, 2, 0, 3)
        v = v.reshape(v.shape[0], N, H, Dh).permute(1, 2, 0, 3)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(N, H, 1, Dh)], dim=2)
            v = torch.cat([v, v.new_zeros(N, H, 1, Dh)], dim=2)
            mask, pad = _extend(mask), _extend(pad)
        S = k.shape[2]
        if mask is not None:
            mask = mask.reshape(N, H, L, S) if mask.dim() == 3 else mask  # (N*H, L, S) or (L, S)
        if pad is not None:
            pad = pad.reshape(N, 1, 1, S)
        mask = _merge(mask, pad)
        causal = is_causal and attn_mask is None

        with stats.in_module(self):
            out, weights = sparse_attention(
                q, k, v, self._current_normalizer(), attn_mask=mask, is_causal=causal,
                dropout_p=self.dropout if self.training else 0.0, return_weights=True, **self.params,
            ) if need_weights else (sparse_attention(
                q, k, v, self._current_normalizer(), attn_mask=mask, is_causal=causal,
                dropout_p=self.dropout if self.training else 0.0, **self.params), None)

        out = out.permute(2, 0, 1, 3).reshape(L, N, E)  # (L, N, E)
        out = self.out_proj(out)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            out = out.squeeze(1)
            if weights is not None:
                weights = weights.squeeze(0)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, weights


def _extend(mask: Optional[Tensor]) -> Optional[Tensor]:
    """One more key column that is attended (the bias_k / zero-attention key)."""
    if mask is None:
        return None
    fill = True if mask.dtype == torch.bool else 0.0
    return F.pad(mask, (0, 1), value=fill)
