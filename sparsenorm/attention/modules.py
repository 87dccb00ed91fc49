"""``MultiheadAttention``: ``torch.nn.MultiheadAttention`` with a sparsenorm normalizer."""
from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_multihead_inputs
from .functional import resolve_normalizer, sparse_attention_from_parts
from .masks import lengths_keep, merge, split_mask


class MultiheadAttention(nn.MultiheadAttention):
    """Drop-in for ``torch.nn.MultiheadAttention`` (same arguments, parameters, state dict and
    ``forward``) whose attention weights come from ``normalizer`` (a registry name or a callable;
    ``**params`` its parameters, e.g. ``alpha=1.3``). The default, ``normalizer="softmax"``, is
    PyTorch's module itself: given the same weights it gives ``nn.MultiheadAttention``'s output and
    weights; pass ``normalizer="ev_softmax"`` (or any other name) for sparse attention.

    The normalizer is resolved once, here; its form follows the module's mode through
    ``Normalizer.for_mode`` (``"posthoc_evidential"`` is softmax in ``train()`` mode and ev-softmax in
    ``eval()`` mode). ``forward`` also takes ``key_lengths`` (N,) integer: keys ``j >= key_lengths[n]``
    are not there, a key-padding mask without the boolean matrix. Masks keep PyTorch's MHA conventions
    (``key_padding_mask`` and a boolean ``attn_mask``: True = not allowed; float masks are added);
    masked keys are "not there" as in :func:`sparsenorm.attention.sparse_attention`. Where PyTorch gives
    NaN for a query with every key masked, this gives a zero attention output (the output projection's
    bias then).
    ``is_causal=True`` without ``attn_mask`` applies the causal mask (PyTorch requires the mask).

    Inside ``nn.TransformerEncoderLayer``, PyTorch's inference fast path (eval mode without
    gradients) computes softmax attention in a fused kernel and never calls this module's
    ``forward``; turn it off with ``torch.backends.mha.set_fastpath_enabled(False)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: Optional[int] = None,
                 vdim: Optional[int] = None, batch_first: bool = False, device=None, dtype=None,
                 normalizer: Union[str, Callable] = "softmax", **params):
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim,
                         batch_first, device, dtype)
        self.normalizer = normalizer
        self.params = dict(params)
        # Resolved once (a bad name or parameter fails here): the evaluation and the training form.
        self._forms = (resolve_normalizer(normalizer, params, training=False),
                       resolve_normalizer(normalizer, params, training=True))

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params.items())
        name = self.normalizer if isinstance(self.normalizer, str) else getattr(self.normalizer, "__name__", "callable")
        return f"normalizer={name}{extra}"

    def _heads(self, query: Tensor, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """The input projection of (L, N, E) / (S, N, E) inputs, split into heads (N, H, L or S', Dh), with the
        ``bias_k``/``bias_v`` and zero-attention keys appended (S' = S + those)."""
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
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.expand(1, N, E)])
            v = torch.cat([v, self.bias_v.expand(1, N, E)])
        # (L, N, E) -> (N, H, L, Dh)
        q = q.reshape(L, N, H, Dh).permute(1, 2, 0, 3)
        k = k.reshape(k.shape[0], N, H, Dh).permute(1, 2, 0, 3)
        v = v.reshape(v.shape[0], N, H, Dh).permute(1, 2, 0, 3)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(N, H, 1, Dh)], dim=2)
            v = torch.cat([v, v.new_zeros(N, H, 1, Dh)], dim=2)
        return q, k, v

    def _keep_and_bias(self, attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor],
                       key_lengths: Optional[Tensor], N: int, L: int, S: int
                       ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        """PyTorch's MHA masks (True = not allowed) over the ``S`` keys as one keep mask and one bias over the
        keys with the extra ones (``bias_k``, zero attention: always attended), shaped for (N, H, L, S'); and
        ``key_lengths`` where it still applies (with extra keys after the padding it becomes a mask)."""
        mask = split_mask(attn_mask, "attn_mask", true_means_attend=False)
        pad = split_mask(key_padding_mask, "key_padding_mask", true_means_attend=False)
        extra_keys = int(self.bias_k is not None) + int(self.add_zero_attn)
        if key_lengths is not None and extra_keys:  # the extra keys come after the padding: a mask
            pad = merge(pad, (lengths_keep(key_lengths, S, 2), None))
            key_lengths = None
        S += extra_keys
        mask, pad = (tuple(_extend(t, extra_keys) for t in m) for m in (mask, pad))
        if mask[0] is not None and mask[0].dim() == 3:  # (N*H, L, S) -> (N, H, L, S)
            mask = tuple(None if t is None else t.reshape(N, self.num_heads, L, S) for t in mask)
        pad = tuple(None if t is None else t.reshape(N, 1, 1, S) for t in pad)
        keep, bias = merge(mask, pad)
        return keep, bias, key_lengths

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor] = None,
                need_weights: bool = True, attn_mask: Optional[Tensor] = None,
                average_attn_weights: bool = True, is_causal: bool = False, *,
                key_lengths: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
        check_multihead_inputs(query, key, value, embed_dim=self.embed_dim, kdim=self.kdim, vdim=self.vdim,
                               num_heads=self.num_heads, batch_first=self.batch_first,
                               key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        batched = query.dim() == 3
        if not batched:  # (L, E): one sequence
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
            if key_lengths is not None:
                key_lengths = key_lengths.reshape(1)
        elif self.batch_first:  # work in (L, N, E) as PyTorch does
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        L, N, E = query.shape
        q, k, v = self._heads(query, key, value)
        keep, bias, key_lengths = self._keep_and_bias(attn_mask, key_padding_mask, key_lengths, N, L, key.shape[0])
        causal = is_causal and attn_mask is None

        result = sparse_attention_from_parts(
            self._forms[self.training], q, k, v, keep, bias, key_lengths=key_lengths, is_causal=causal,
            dropout_p=self.dropout if self.training else 0.0, return_weights=need_weights, stats_module=self,
        )
        out, weights = result if need_weights else (result, None)

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


def _extend(mask: Optional[Tensor], columns: int) -> Optional[Tensor]:
    """``columns`` more key columns that are attended (the bias_k / zero-attention keys): True in a
    keep mask, 0 in a bias."""
    if mask is None or columns == 0:
        return mask
    fill = True if mask.dtype == torch.bool else 0.0
    return F.pad(mask, (0, columns), value=fill)
