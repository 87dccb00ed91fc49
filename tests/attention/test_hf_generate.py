"""Greedy generation through sparsenorm.hf on a tiny random Llama (transformers ``LlamaConfig``,
grouped-query attention): ``sparsenorm_softmax`` gives sdpa's tokens, and for every normalizer the
cached generation equals the uncached one and a left-padded batch equals each prompt alone; the
mask function hands the kernels a key-padding mask (or none) with the causal flag, never a dense
(B, 1, L, S) mask, and the runs also pass with the memory-efficient kernels forced at every size.

The model is float64: paths that round differently (cached against uncached, batched against
alone) then differ by ~1e-15, far below any gap between the two best logits or between a score
and its threshold that random weights give, so the tokens are compared by equality.
"""
import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="Hugging Face transformers is not installed (the [hf] extra); install .[hf] to run these")

import sparsenorm.hf as hf  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

VOCAB = 64
NEW_TOKENS = 6
NAMES = [name[len(hf.PREFIX):] for name in hf.REGISTERED]


@pytest.fixture(scope="module")
def llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():  # spread the attention scores out (random init gives near-uniform attention)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(2, VOCAB, (n,), generator=g) for n in (9, 5, 7)]


def left_padded(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = s
        mask[i, width - len(s):] = 1
    return ids, mask


def generate(model, impl, ids, mask, use_cache=True):
    model.set_attn_implementation(impl)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                         do_sample=False, use_cache=use_cache)
    return out[:, ids.shape[1]:]


@pytest.fixture(params=["auto", "kernels forced"])
def kernels_at_every_size(request, monkeypatch):
    """"kernels forced": the blockwise kernels from one score on (``BLOCKWISE_MIN_SCORES = 1``), so
    that the tiny model runs the memory-efficient ev-softmax / sparsemax / entmax kernels too."""
    if request.param == "kernels forced":
        monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 1)
    return request.param


def test_softmax_generates_sdpas_tokens(llama, kernels_at_every_size):
    ids, mask = left_padded(prompts())
    want = generate(llama, "sdpa", ids, mask)
    assert torch.equal(generate(llama, "sparsenorm_softmax", ids, mask), want)
    for i, p in enumerate(prompts()):
        assert torch.equal(generate(llama, "sdpa", p[None], torch.ones(1, len(p), dtype=torch.long)), want[i:i + 1])


@pytest.mark.parametrize("name", NAMES)
def test_cached_equals_uncached_and_padded_equals_alone(llama, name, kernels_at_every_size):
    impl = hf.PREFIX + name
    ids, mask = left_padded(prompts())
    batched = generate(llama, impl, ids, mask)
    assert torch.equal(generate(llama, impl, ids, mask, use_cache=False), batched)
    for i, p in enumerate(prompts()):
        alone = generate(llama, impl, p[None], torch.ones(1, len(p), dtype=torch.long))
        assert torch.equal(alone, batched[i:i + 1]), f"prompt {i}: alone {alone.tolist()} != batched"


def test_chunked_prefill_equals_one_prefill(llama):
    """A prompt fed in two chunks through a cache (the second chunk's queries are the last of the
    keys: bottom-right causal) gives the logits of one pass, for ev-softmax and sparsemax."""
    ids, mask = left_padded(prompts())
    for name in ("ev_softmax", "sparsemax", "softmax"):
        llama.set_attn_implementation(hf.PREFIX + name)
        with torch.no_grad():
            whole = llama(input_ids=ids, attention_mask=mask).logits
            cache = transformers.DynamicCache(config=llama.config)
            first = llama(input_ids=ids[:, :6], attention_mask=mask[:, :6], past_key_values=cache)
            second = llama(input_ids=ids[:, 6:], attention_mask=mask, past_key_values=first.past_key_values)
        valid = mask.bool()
        torch.testing.assert_close(torch.cat([first.logits, second.logits], 1)[valid], whole[valid],
                                   rtol=1e-10, atol=1e-10)


def test_mask_function_hands_a_key_mask_and_the_causal_flag(llama, monkeypatch):
    """What the attention function receives in padded prefill and batched decoding: a (B, S) key
    mask or None, never a 4-D mask; bidirectional masks still go through transformers' sdpa_mask."""
    seen = []
    inner = hf.make_attention_function("ev_softmax")

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append((query.shape[2], key.shape[2], None if attention_mask is None else tuple(attention_mask.shape)))
        return inner(module, query, key, value, attention_mask, **kwargs)

    name = hf.register("ev_softmax", name="test_spy_ev_softmax")
    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, name, spy)
    ids, mask = left_padded(prompts())
    generate(llama, name, ids, mask)
    width = ids.shape[1]
    assert seen[0] == (width, width, (3, width))  # prefill: the key-padding mask, 2-D
    assert all(lq == 1 and m == (3, s) for lq, s, m in seen[2:])  # decoding: one query, the key mask
    generate(llama, name, ids[:1, -5:], mask[:1, -5:])  # no padding: no mask at all
    assert all(m is None for _, _, m in seen[-2 * NEW_TOKENS:])
    assert AttentionMaskInterface._global_mapping[name] is hf.key_padding_mask
    padding = torch.tensor([[True, True, True], [False, True, True]])
    bidirectional = hf.key_padding_mask(2, 3, 3, mask_function=lambda b, h, q, kv: kv >= 0, attention_mask=padding)
    assert torch.equal(bidirectional, padding[:, None, None, :].expand(2, 1, 3, 3))
    causal = hf.key_padding_mask(2, 3, 3, attention_mask=padding)
    assert torch.equal(causal, padding)
