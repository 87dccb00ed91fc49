"""sparsenorm.hf.SparseSampling: ``generate(do_sample=True)`` draws exactly from
``p = normalizer(logits / temperature)`` (a tiny random Llama built from a config, no hub access).

The draws are tested with Pearson's chi-squared test against ``p`` on its support (scipy), with a
fixed seed; tokens outside the support must never be drawn. For sparsemax and 1.5-entmax the test
also rejects the wrong distribution (softmax renormalised on the support), which shows the test has
the power to tell them apart at this number of draws.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")
stats = pytest.importorskip("scipy.stats")

import sparsenorm  # noqa: E402
import sparsenorm.hf as snhf  # noqa: E402
from sparsenorm import registry  # noqa: E402

VOCAB = 12
DRAWS = 20000


def tiny_llama():
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=None)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # logits of a few units' spread, so that the sparse maps keep several tokens
        model.lm_head.weight.mul_(4.0)
    return model


def first_step(model, kwargs, draws):
    ids = torch.tensor([[1, 5, 7]])
    torch.manual_seed(11)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1,
                         num_return_sequences=draws, **kwargs)
    return out[:, -1]


@pytest.mark.parametrize("name,temperature", [("ev_softmax", 1.0), ("sparsemax", 1.0), ("entmax15", 1.0),
                                              ("sparsemax", 0.5), ("posthoc_evidential", 1.0)])
def test_draws_follow_the_sparse_distribution(name, temperature):
    model = tiny_llama()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 5, 7]])).logits[0, -1].double()
    p = registry.get(name).for_mode(training=False).forward(logits / temperature, dim=-1)
    support = p > 0
    assert 2 <= int(support.sum()) < VOCAB  # the test is about a sparse distribution
    tokens = first_step(model, snhf.sampling_kwargs(name, temperature), DRAWS)
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    assert counts[~support].sum() == 0, "a token outside the support was drawn"
    expected = p[support] * DRAWS
    assert stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue > 1e-4
    # softmax renormalised on the support: the same as p for ev-softmax (Eq. 7), not for the others
    renormalised = torch.softmax(logits[support] / temperature, -1)
    if (renormalised - p[support]).abs().sum() / 2 > 0.05:
        assert stats.chisquare(counts[support].numpy(), (renormalised * DRAWS).numpy()).pvalue < 1e-4


@pytest.mark.parametrize("name", ["ev_softmax", "sparsemax", "entmax15", "entmax_bisect", "r_softmax"])
def test_greedy_decoding_is_unchanged(name):
    model = tiny_llama()
    ids = torch.tensor([[1, 5, 7], [1, 2, 3]])
    plain = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    processed = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                               logits_processor=transformers.LogitsProcessorList([snhf.SparseSampling(name)]))
    assert torch.equal(plain, processed)


def test_half_precision_scores_and_bad_arguments():
    scores = torch.tensor([[2.0, 1.0, -3.0, 0.5]], dtype=torch.bfloat16)
    out = snhf.SparseSampling("sparsemax")(torch.zeros(1, 1, dtype=torch.long), scores)
    assert out.dtype == torch.bfloat16 and torch.isinf(out[0, 2])
    torch.testing.assert_close(out.float().exp(), sparsenorm.sparsemax(scores.float()), atol=1e-2, rtol=0)
    for bad in (0.0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="temperature"):
            snhf.SparseSampling("ev_softmax", temperature=bad)
    with pytest.raises(ValueError):
        snhf.SparseSampling("no_such_normalizer")
