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

import functools
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
           "sampling_kwargs", "DEFAULT_SAMPLING", "check_attn_implementation"]  # the public names

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


def check_attn_implementation(name) -> None:
    """Raise sparsenorm's ``ValueError`` for an ``attn_implementation`` that looks like one of
    sparsenorm's (it starts with ``sparsenorm``) but is not registered, listing the registered
    ``sparsenorm_*`` names and the closest one. Any other name is left to transformers' own check.

    ``import sparsenorm.hf`` runs it ahead of transformers' check
    (``PreTrainedModel.get_correct_attn_implementation``), so that
    ``from_pretrained(..., attn_implementation="sparsenorm_evsoftmax")`` says which names exist,
    instead of transformers' list of eager/sdpa/flash/flex only."""
    if not isinstance(name, str) or not name.lower().startswith(PREFIX.rstrip("_")):
        return
    known = [k for k in AttentionInterface().valid_keys() if k.lower().startswith(PREFIX.rstrip("_"))]
    if name in known:
        return
    import difflib

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"attn_implementation {name!r} is not a registered sparsenorm attention{hint}; registered: "
                     f"{', '.join(sorted(known))} (sparsenorm.hf.register(normalizer, name=...) adds one)")


def _install_name_check() -> None:
    """Wrap transformers' ``get_correct_attn_implementation`` once with :func:`check_attn_implementation`."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.get_correct_attn_implementation
    if getattr(original, "_sparsenorm_checked", False):
        return

    @functools.wraps(original)
    def get_correct_attn_implementation(self, requested_attention, *args, **kwargs):
        check_attn_implementation(requested_attention)
        return original(self, requested_attention, *args, **kwargs)

    get_correct_attn_implementation._sparsenorm_checked = True
    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation


_install_name_check()


DEFAULT_SAMPLING = "entmax15"
"""The default normalizer of :class:`SparseSampling` and :func:`sampling_kwargs`, chosen on the llm
experiment's measurements of SmolLM2-135M's next-token distributions (``results/decisive/llm``: 16
chunks of Jane Austen, temperature 1): 1.5-entmax keeps 4.0 tokens on average and the true next
token in 51.1 % of positions, more often than top-p (42.9 %) and min-p (49.6 %) at the same mean
support (claims reproduced, p 3e-5 and 9e-5), and not separable from top-k (51.2 %). ev-softmax
keeps 24,536 of the 49,152 tokens (half the vocabulary, at any temperature: its threshold is the
mean logit, which scales with the logits) and covers 100 %: a cut of the least likely half, close
to plain sampling, not a sparse sampler. Sparsemax keeps 2.0 (coverage 40.3 %), near greedy;
``entmax_bisect`` with ``alpha=1.25`` keeps 17.7 (coverage 71.1 %), for more diverse samples."""

_AFTER_THE_NORMALIZER = {"top_k": (0, None), "top_p": (1.0, None), "min_p": (None,), "typical_p": (1.0, None),
                         "epsilon_cutoff": (0.0, None), "eta_cutoff": (0.0, None), "top_h": (None,)}
"""transformers' warpers (applied after every logits processor) and their neutral values."""


class SparseSampling(LogitsProcessor):
    """A logits processor that makes sampling draw from ``p = normalizer(scores / temperature)``.

    It returns ``log p`` (``-inf`` off the support). ``generate`` samples from
    ``softmax(log p) = p``, so a token outside the support is never drawn and a token inside is
    drawn with probability ``p``, not with softmax's probability renormalised on the support (for
    sparsemax and the entmaxes these differ; for ev-softmax, Eq. 7, they coincide). Greedy decoding
    is unchanged: every registry normalizer is monotone, so ``argmax p = argmax scores``.

    ``normalizer``: a registry name (its evaluation form) with ``**params``, by default
    ``"entmax15"`` (:data:`DEFAULT_SAMPLING` has the evidence for it); ``temperature > 0`` divides
    the scores before the normalizer: below 1 it shrinks the support of sparsemax and the entmaxes,
    above 1 it widens it; ev-softmax's support (the tokens above the mean logit) does not move with
    the temperature, only the probabilities on it do. Put nothing after it that changes the scores
    (transformers' temperature, top-k, top-p, min-p warpers): :func:`sampling_kwargs` turns them off.
    """

    def __init__(self, normalizer: str = DEFAULT_SAMPLING, temperature: float = 1.0, **params):
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


def sampling_kwargs(normalizer: str = DEFAULT_SAMPLING, temperature: float = 1.0, **kwargs) -> dict:
    """``generate`` keyword arguments to sample from ``normalizer(logits / temperature)`` exactly:
    ``do_sample=True``, a :class:`SparseSampling` processor, and transformers' own temperature,
    top-k, top-p, min-p, typical-p, epsilon and eta warpers turned off (a model's generation config
    may set them, and top-k is 50 by default: it would cut a support longer than 50 tokens).

    ``normalizer`` defaults to ``"entmax15"`` (:data:`DEFAULT_SAMPLING`: why). ``temperature`` is the
    normalizer's (applied before it). The other keywords compose: the normalizer's parameters
    (``alpha=1.25`` for ``entmax_bisect``) go to it, and every other keyword is the caller's own
    ``generate`` argument, returned with the rest (``max_new_tokens``, ``input_ids``, ``attention_mask``,
    a ``logits_processor`` list, whose processors run before the normalizer, ...). So
    ``model.generate(**sampling_kwargs("entmax15", temperature=0.7, **inputs, max_new_tokens=40))``
    is one call with no duplicate keyword; ``model.generate(**inputs, **sampling_kwargs(...),
    max_new_tokens=40)`` works too, for any keyword this function does not return. A warper keyword
    with a value that would change the scores after the normalizer (``top_k=10``, ``top_p=0.9``,
    ``min_p=0.1``, ...) or ``do_sample=False`` raises ``ValueError`` naming it; their neutral values
    (``top_k=0``, ``top_p=1.0``, ...) are accepted.
    """
    entry = registry.get(normalizer) if isinstance(normalizer, str) else None
    if entry is None:
        raise TypeError(f"normalizer must be a registry name, got {type(normalizer).__name__}")
    params = {k: kwargs.pop(k) for k in list(kwargs) if k in entry.params}
    processor = SparseSampling(normalizer, temperature, **params)
    for key, neutral in _AFTER_THE_NORMALIZER.items():
        if key in kwargs and kwargs[key] not in neutral:
            raise ValueError(f"{key}={kwargs[key]!r} would change the scores after the {normalizer!r} processor, so "
                             f"the draws would not follow p; leave it out (sampling_kwargs turns it off) or use "
                             f"temperature= and the normalizer to shape p")
        kwargs.pop(key, None)
    if kwargs.pop("do_sample", True) is not True:
        raise ValueError("do_sample=False decodes greedily: the normalizer would not be sampled "
                         "(greedy decoding is unchanged by every normalizer: call generate without sampling_kwargs)")
    theirs = kwargs.pop("logits_processor", None) or []
    return dict(kwargs, do_sample=True, logits_processor=LogitsProcessorList([*theirs, processor]), temperature=1.0,
                top_k=0, top_p=1.0, min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, top_h=None)
