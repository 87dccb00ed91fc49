"""Hugging Face ``transformers`` integration: every sparsenorm normalizer as an ``attn_implementation``.

    import sparsenorm.hf  # registers "sparsenorm_<name>" for every registry normalizer
    model = AutoModel.from_pretrained(path, attn_implementation="sparsenorm_ev_softmax")
    model.set_attn_implementation("sparsenorm_sparsemax")
    name = sparsenorm.hf.register("entmax_bisect", alpha=1.3)  # "sparsenorm_entmax_bisect"; pass name= to keep both

:func:`register` puts an attention function (the signature of transformers'
``sdpa_attention_forward``) into ``AttentionInterface`` and a mask function into
``AttentionMaskInterface`` under the same name; without the second, transformers builds no mask
for an unknown implementation and padding is silently attended. The mask function is
:func:`key_padding_mask`: for a plain causal mask (a decoder's self-attention, with or without a
key/value cache) it hands the attention function only the (batch, S) key-padding mask, or
``None`` without padding, as transformers' ``flash_attention_mask`` does for FlashAttention, and
the causal part is the attention function's ``is_causal``, aligned bottom-right (the last query
sees the last key); so padded prefill and batched ``generate()`` reach the memory-efficient
kernels instead of a dense (B, 1, L, S) mask. Any other mask (bidirectional, sliding window,
packed sequences, a static cache's layout) is transformers' ``sdpa_mask`` (boolean, True = attend).

The attention function reads every mask transformers hands it: a (batch, S) boolean key-padding
mask (the causal part from ``is_causal``), a 4-D boolean or additive mask (``finfo.min`` entries
are "not there", see :mod:`sparsenorm.attention.masks`), ``None`` with ``module.is_causal`` (the
causal mask, bottom-right: the L queries are the last L of the S positions, as in chunked prefill
and cached decoding; top-left and bottom-right agree when L = S), T5's ``position_bias`` (added to
the scores, with ``scaling=1.0``), grouped-query key/value heads. Not-there keys get exactly zero weight and are left
out of ev-softmax's mean. Dropout applies only in ``module.training``. The weights are returned
(for ``output_attentions=True``) when the call or the config asks for them; otherwise ev-softmax
may run on the memory-efficient blockwise path.

``key_lengths`` (batch,) may be passed through to the attention function (keys ``j >= len`` not
there, no boolean matrix). ``"sparsenorm_posthoc_evidential"``: softmax while the model is in
``train()`` mode, ev-softmax in ``eval()`` mode (``Normalizer.for_mode``; post-hoc evidential
sparsification of a softmax-trained model: Theorem 3.1 of the ev-softmax paper with the keys as the
linear layer).

Sparse next-token distributions: :class:`SparseSampling` is a ``LogitsProcessor`` with which
``generate(do_sample=True)`` draws exactly from ``p = normalizer(logits / temperature)``, and
:func:`sampling_kwargs` the ``generate`` arguments that leave nothing else between that ``p`` and
the draw. With ev-softmax this is the post-hoc evidential sparsification of the LM head (Theorem
3.1 of the ev-softmax paper, the head as the linear layer).

Requires the ``[hf]`` extra (``pip install sparsenorm[hf]``).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

try:
    from transformers import AttentionInterface, LogitsProcessor, LogitsProcessorList
    from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "sparsenorm.hf needs Hugging Face transformers: pip install 'sparsenorm[hf]'"
    ) from err

from . import registry
from .attention.functional import resolve_normalizer, sparse_attention_from_parts
from .attention.masks import merge, split_mask

__all__ = ["PREFIX", "make_attention_function", "key_padding_mask", "register", "REGISTERED", "SparseSampling",
           "sampling_kwargs"]  # the public names

PREFIX = "sparsenorm_"
"""The prefix of every ``attn_implementation`` name registered here without an explicit ``name``."""


def key_padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                     mask_function: Callable = causal_mask_function, attention_mask: Optional[Tensor] = None,
                     **kwargs) -> Optional[Tensor]:
    """The mask function registered for every sparsenorm implementation (``AttentionMaskInterface``).

    For a plain causal mask whose queries are the last ``q_length`` of the ``kv_length`` key
    positions (no cache, or a dynamic cache: chunked prefill, decoding): the (batch, kv_length)
    boolean key-padding mask (True = attend), or ``None`` where nothing is padded; the attention
    function adds the causal part, aligned bottom-right. Everything else (another mask function,
    offsets that do not align the queries with the last keys, a padding mask shorter than the keys,
    a caller that needs the mask materialised): transformers' ``sdpa_mask``, unchanged.
    """
    plain = (mask_function is causal_mask_function and kwargs.get("allow_is_causal_skip", True)
             and isinstance(q_offset, int) and isinstance(kv_offset, int)
             and q_offset + q_length == kv_offset + kv_length)
    if plain and attention_mask is not None:
        plain = attention_mask.dim() == 2 and attention_mask.shape[-1] >= kv_offset + kv_length
    if not plain:
        return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                         mask_function=mask_function, attention_mask=attention_mask, **kwargs)
    if attention_mask is None:
        return None
    keys = attention_mask[:, kv_offset:kv_offset + kv_length].to(torch.bool)
    if torch.compiler.is_compiling():  # no host read in a graph: an all-True key mask is no mask
        return keys
    return None if bool(keys.all()) else keys


def make_attention_function(normalizer: Union[str, Callable] = "ev_softmax", **params) -> Callable:
    """An attention function for ``AttentionInterface`` with ``normalizer`` in place of softmax.

    The normalizer is resolved once, here, in both modes (``Normalizer.for_mode``); each call
    takes the form of ``module.training``.
    """
    forms = (resolve_normalizer(normalizer, params, training=False),
             resolve_normalizer(normalizer, params, training=True))

    def sparsenorm_attention_forward(
        module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
        dropout: float = 0.0, scaling: Optional[float] = None, is_causal: Optional[bool] = None,
        position_bias: Optional[Tensor] = None, key_lengths: Optional[Tensor] = None, **kwargs,
    ):
        key_padding = (attention_mask is not None and attention_mask.dim() == 2
                       and attention_mask.dtype == torch.bool)
        mask = attention_mask[:, None, None, :] if key_padding else attention_mask  # (B, 1, 1, S)
        keep, bias = merge(split_mask(mask, "attention_mask"), (None, position_bias))
        if is_causal is None:
            is_causal = getattr(module, "is_causal", False)
        # As SDPA in transformers: the causal flag stands in for a mask only when none (or only the
        # key padding) was built; bottom-right, so that a cache's last queries see every earlier key
        # (one query then sees them all: no causal mask at all).
        causal = bool(is_causal) and (attention_mask is None or key_padding) and query.shape[2] > 1
        want_weights = bool(kwargs.get("output_attentions") or getattr(getattr(module, "config", None),
                                                                        "output_attentions", False))
        result = sparse_attention_from_parts(
            forms[module.training], query, key, value, keep, bias, key_lengths=key_lengths, is_causal=causal,
            dropout_p=float(dropout) if module.training else 0.0, scale=scaling, return_weights=want_weights,
            stats_module=module, causal_alignment="bottom_right",
        )
        out, weights = result if want_weights else (result, None)
        return out.transpose(1, 2).contiguous(), weights

    sparsenorm_attention_forward.__doc__ = f"transformers attention with {normalizer!r} in place of softmax."
    return sparsenorm_attention_forward


def register(normalizer: Union[str, Callable] = "ev_softmax", name: Optional[str] = None, **params) -> str:
    """Register ``normalizer`` (a registry name or a callable; ``**params`` its parameters) as a
    transformers attention implementation and mask function; returns the name, by default
    ``"sparsenorm_<normalizer>"`` (a callable's ``__name__``). Registering a name again replaces it."""
    if name is None:
        name = PREFIX + (normalizer if isinstance(normalizer, str) else getattr(normalizer, "__name__", "custom"))
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    AttentionInterface.register(name, make_attention_function(normalizer, **params))
    AttentionMaskInterface.register(name, key_padding_mask)
    return name


REGISTERED = [register(n) for n in registry.names()]
"""The names registered on import: ``sparsenorm_<name>`` for every registry normalizer."""


class SparseSampling(LogitsProcessor):
    """A logits processor that makes sampling draw from ``p = normalizer(scores / temperature)``.

    It returns ``log p`` (``-inf`` off the support). ``generate`` samples from
    ``softmax(log p) = p``, so a token outside the support is never drawn and a token inside is
    drawn with probability ``p``, not with softmax's probability renormalised on the support (for
    sparsemax and the entmaxes these differ; for ev-softmax, Eq. 7, they coincide). Greedy decoding
    is unchanged: every registry normalizer is monotone, so ``argmax p = argmax scores``.

    ``normalizer``: a registry name (its evaluation form) with ``**params``; ``temperature > 0``
    divides the scores before the normalizer. Put nothing after it that changes the scores
    (transformers' temperature, top-k, top-p, min-p warpers): :func:`sampling_kwargs` turns them off.
    """

    def __init__(self, normalizer: str = "ev_softmax", temperature: float = 1.0, **params):
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not (
                math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        self.normalizer = registry.get(normalizer, **params).for_mode(training=False)
        self.temperature = float(temperature)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        logits = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return self.normalizer.forward(logits, dim=-1).log().to(scores.dtype)


def sampling_kwargs(normalizer: str = "ev_softmax", temperature: float = 1.0, **params) -> dict:
    """``generate`` keyword arguments to sample from ``normalizer(logits / temperature)`` exactly:
    ``do_sample=True``, a :class:`SparseSampling` processor, and transformers' own temperature,
    top-k, top-p, min-p, typical-p, epsilon and eta warpers turned off (a model's generation config
    may set them, and top-k is 50 by default: it would cut a support longer than 50 tokens)."""
    processor = SparseSampling(normalizer, temperature, **params)
    return dict(do_sample=True, logits_processor=LogitsProcessorList([processor]), temperature=1.0, top_k=0, top_p=1.0,
                min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
