"""sparsenorm.hf: tiny transformers models built from configs (no hub access), every mask route."""
import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="Hugging Face transformers is not installed (the [hf] extra); install .[hf] to run these")

import sparsenorm  # noqa: E402
import sparsenorm.hf as hf  # noqa: E402
from sparsenorm import registry  # noqa: E402
from sparsenorm.attention import record  # noqa: E402
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

VOCAB = 40


def bert(**overrides):
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32, **overrides)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg, add_pooling_layer=False)
    with torch.no_grad():  # spread the scores out: BERT's init gives nearly uniform attention
        for layer in model.encoder.layer:
            layer.attention.self.query.weight.mul_(20)
    return model.eval()


def marian():
    cfg = transformers.MarianConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                    decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=0,
                                    eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=None)
    torch.manual_seed(0)
    return transformers.MarianMTModel(cfg).eval()


def t5():
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=1,
                                num_heads=2, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
                                decoder_start_token_id=0)
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(cfg).eval()


def padded_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return ids, mask


def run(model, impl, **inputs):
    model.set_attn_implementation(impl)
    return model(**inputs, output_attentions=True)


def test_every_registry_normalizer_is_registered_in_both_interfaces():
    for name in registry.names():
        assert f"sparsenorm_{name}" in AttentionInterface._global_mapping
        assert f"sparsenorm_{name}" in AttentionMaskInterface._global_mapping


def test_bert_softmax_equals_eager_on_a_padded_batch():
    model = bert()
    ids, mask = padded_batch()
    eager = run(model, "eager", input_ids=ids, attention_mask=mask)
    ours = run(model, "sparsenorm_softmax", input_ids=ids, attention_mask=mask)
    valid = mask.bool()
    torch.testing.assert_close(ours.last_hidden_state[valid], eager.last_hidden_state[valid], atol=1e-5, rtol=1e-5)
    for a, b in zip(ours.attentions, eager.attentions):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bert_ev_softmax_weights_are_ev_softmax_of_the_eager_scores(monkeypatch):
    model = bert()
    ids, mask = padded_batch()
    seen = []
    inner = hf.make_attention_function("ev_softmax")

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append((query, key, attention_mask, kwargs["scaling"]))
        return inner(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "spy", spy)
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "spy",
                        AttentionMaskInterface._global_mapping["sparsenorm_ev_softmax"])
    out = run(model, "spy", input_ids=ids, attention_mask=mask)
    assert len(seen) == 2
    for (q, k, m, scaling), w in zip(seen, out.attentions):
        scores = (q @ k.transpose(-2, -1)) * scaling
        padded = ~mask.bool()[:, None, None, :]
        expected = sparsenorm.ev_softmax(scores.masked_fill(padded, float("-inf")), dim=-1)
        torch.testing.assert_close(w, expected)
        assert torch.equal(w.masked_select(padded), torch.zeros(int(padded.expand_as(w).sum())))
        mean = scores.masked_fill(padded, 0).sum(-1, keepdim=True) / (~padded).sum(-1, keepdim=True)
        below = (scores < mean) & ~padded
        assert below.any() and torch.equal(w[below], torch.zeros(int(below.sum())))
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_posthoc_evidential_is_softmax_in_train_and_ev_softmax_in_eval():
    model = bert(attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    ids, mask = padded_batch()
    model.train()
    torch.testing.assert_close(
        run(model, "sparsenorm_posthoc_evidential", input_ids=ids, attention_mask=mask).attentions,
        run(model, "sparsenorm_softmax", input_ids=ids, attention_mask=mask).attentions)
    model.eval()
    torch.testing.assert_close(
        run(model, "sparsenorm_posthoc_evidential", input_ids=ids, attention_mask=mask).attentions,
        run(model, "sparsenorm_ev_softmax", input_ids=ids, attention_mask=mask).attentions)


def test_training_step_and_dropout_only_in_training():
    model = bert(attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0)
    model.set_attn_implementation("sparsenorm_ev_softmax")
    ids, mask = padded_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    first = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not torch.equal(first, model(input_ids=ids, attention_mask=mask).last_hidden_state)  # dropout
    direction = torch.randn(16, generator=torch.Generator().manual_seed(5))
    loss = (first[mask.bool()] * direction).sum()  # (LayerNorm fixes the squared norm)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    before = model.encoder.layer[0].attention.self.key.weight.clone()
    opt.step()
    assert not torch.equal(before, model.encoder.layer[0].attention.self.key.weight)
    model.eval()
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state,
                               model(input_ids=ids, attention_mask=mask).last_hidden_state)


def softmax_equals_eager(model, decoder_length, seed):
    """A padded seq2seq batch: sparsenorm_softmax gives eager's logits and every attention group."""
    ids, mask = padded_batch()
    dec = torch.randint(2, VOCAB, (3, decoder_length), generator=torch.Generator().manual_seed(seed))
    inputs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
    eager = run(model, "eager", **inputs)
    ours = run(model, "sparsenorm_softmax", **inputs)
    torch.testing.assert_close(ours.logits, eager.logits, atol=1e-5, rtol=1e-5)
    for name in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        for a, b in zip(getattr(ours, name), getattr(eager, name)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    return inputs, mask


def test_marian_softmax_equals_eager_and_sparse_decoder_is_causal():
    model = marian()
    inputs, mask = softmax_equals_eager(model, 5, seed=3)
    sparse = run(model, "sparsenorm_sparsemax", **inputs)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert torch.equal(sparse.decoder_attentions[0][..., future], torch.zeros(3, 2, int(future.sum())))
    padded = ~mask.bool()[:, None, None, :]
    cross = sparse.cross_attentions[0]
    assert torch.equal(cross.masked_select(padded), torch.zeros(int(padded.expand_as(cross).sum())))


def test_t5_softmax_equals_eager_with_position_bias():
    model = t5()
    inputs, mask = softmax_equals_eager(model, 4, seed=4)
    ev = run(model, "sparsenorm_ev_softmax", **inputs)
    padded = ~mask.bool()[:, None, None, :]
    w = ev.encoder_attentions[0]
    assert torch.equal(w.masked_select(padded), torch.zeros(int(padded.expand_as(w).sum())))
    assert (w == 0).sum() > padded.expand_as(w).sum()  # sparse beyond the padding


@pytest.mark.parametrize("factory, impl", [(marian, "sparsenorm_ev_softmax"), (t5, "sparsenorm_entmax15")])
def test_generate_with_a_sparse_normalizer(factory, impl):
    model = factory()
    ids, mask = padded_batch()
    model.set_attn_implementation("eager")
    reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    model.set_attn_implementation(impl)
    with record(model) as stats:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert out.shape[0] == 3 and 2 <= out.shape[1] <= 7 and reference.shape[0] == 3
    assert stats.layers and all(s.queries.sum() > 0 for s in stats.layers.values())
    assert any("decoder" in name for name in stats.layers)
    # Greedy decoding with cache equals a full forward pass over the generated prefix.
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=out[:, :-1]).logits
    steps = out[:, 1:]
    alive = torch.ones_like(steps, dtype=torch.bool)
    alive[:, 1:] = (steps[:, :-1] != 1).cumprod(1).bool()  # after EOS only padding follows
    # Compared by the contract: the cached and the full pass round differently, so a step whose two
    # best logits are within rounding (times a support flip's effect) may go either way; every
    # step with a clear winner must agree, and most steps have one.
    top2 = logits.topk(2, dim=-1).values
    clear = alive & (top2[..., 0] - top2[..., 1] > 1e-3)
    assert clear.sum() >= 0.8 * alive.sum()
    assert torch.equal(logits.argmax(-1)[clear], steps[clear])


def test_gqa_model_softmax_equals_eager():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaModel(cfg).eval()
    ids, mask = padded_batch()
    eager = run(model, "eager", input_ids=ids, attention_mask=mask)
    ours = run(model, "sparsenorm_softmax", input_ids=ids, attention_mask=mask)
    valid = mask.bool()
    torch.testing.assert_close(ours.last_hidden_state[valid], eager.last_hidden_state[valid], atol=1e-5, rtol=1e-5)
    no_pad = torch.ones_like(mask)  # no padding: transformers hands a None mask, module.is_causal applies
    eager = run(model, "eager", input_ids=ids, attention_mask=no_pad)
    ours = run(model, "sparsenorm_softmax", input_ids=ids, attention_mask=no_pad)
    torch.testing.assert_close(ours.attentions[0], eager.attentions[0], atol=1e-5, rtol=1e-5)


def test_register_with_parameters_and_bad_input():
    name = hf.register("entmax_bisect", name="test_entmax13", alpha=1.3)
    assert name == "test_entmax13" and name in AttentionMaskInterface._global_mapping
    model = bert()
    ids, mask = padded_batch()
    ours = run(model, name, input_ids=ids, attention_mask=mask)
    ref = run(model,
              hf.register(lambda x, dim: sparsenorm.entmax_bisect(x, alpha=1.3, dim=dim), name="test_entmax13_fn"),
              input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(ours.attentions, ref.attentions)
    assert hf.register("sparsemax") == "sparsenorm_sparsemax"
    with pytest.raises(ValueError, match="unknown normalizer"):
        hf.register("nope")
    with pytest.raises(ValueError, match="alpha"):
        hf.register("sparsemax", alpha=1.3)
