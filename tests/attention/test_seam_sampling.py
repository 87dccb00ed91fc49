"""The seam with transformers' sampling (issue 50, item 3): ``sparsenorm.hf.sampling_kwargs`` and
``SparseSampling`` default to a normalizer that is sparse (1.5-entmax, on the llm experiment's
evidence), compose with the caller's own ``generate`` keywords (no duplicate keyword), and the
temperature does what the guide says: it shrinks or widens the support of sparsemax and the
entmaxes, and leaves ev-softmax's support (the tokens at or above the mean logit) where it is.
A tiny random Llama built from a config (no hub access).
"""
import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

import sparsenorm.hf as snhf  # noqa: E402
from sparsenorm import registry  # noqa: E402

VOCAB = 40


def tiny_llama():
    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=None)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


def test_the_default_is_sparse_and_documented():
    assert snhf.DEFAULT_SAMPLING == "entmax15"
    processor = snhf.sampling_kwargs()["logits_processor"][-1]
    assert processor.normalizer.name == "entmax15"
    assert snhf.SparseSampling().normalizer.name == "entmax15"
    source = inspect.getsource(snhf)  # the evidence, stated where the default is set
    for figure in ("24,536", "51.1 %", "4.0 tokens"):
        assert figure in source


def test_caller_keywords_compose_without_a_duplicate_keyword():
    """``temperature=`` with the caller's own generate keywords (lengths, inputs, a processor of
    theirs): one call, their processor before the normalizer, the draw still from ``p``'s support."""
    model = tiny_llama()
    ids = torch.tensor([[1, 5, 7]])
    seen = []

    class Spy(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            seen.append(scores.clone())
            return scores

    kwargs = snhf.sampling_kwargs("entmax15", temperature=0.7, input_ids=ids, attention_mask=torch.ones_like(ids),
                                  max_new_tokens=1, logits_processor=[Spy()], top_k=0, top_p=1.0)
    assert kwargs["max_new_tokens"] == 1 and kwargs["temperature"] == 1.0 and kwargs["top_k"] == 0
    assert isinstance(kwargs["logits_processor"][0], Spy)
    assert isinstance(kwargs["logits_processor"][-1], snhf.SparseSampling)
    torch.manual_seed(0)
    out = model.generate(**kwargs, num_return_sequences=200)
    assert len(seen) == 1  # the caller's processor ran, once
    p = registry.get("entmax15").forward(seen[0][0].double() / 0.7, dim=-1)
    drawn = out[:, -1]
    assert bool((p[drawn] > 0).all())  # never outside the support
    # and alongside: keywords this function does not return go straight to generate
    torch.manual_seed(0)
    again = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1,
                           **snhf.sampling_kwargs("entmax15", temperature=0.7))
    assert again.shape == (1, 4)


def test_normalizer_parameters_go_to_the_normalizer():
    kwargs = snhf.sampling_kwargs("entmax_bisect", alpha=1.25, max_new_tokens=5)
    assert kwargs["logits_processor"][-1].normalizer.params["alpha"] == 1.25
    assert kwargs["max_new_tokens"] == 5 and "alpha" not in kwargs


@pytest.mark.parametrize("key, value", [("top_k", 10), ("top_p", 0.9), ("min_p", 0.1), ("typical_p", 0.5),
                                        ("do_sample", False)])
def test_keywords_that_would_change_p_name_themselves(key, value):
    with pytest.raises(ValueError, match=key):
        snhf.sampling_kwargs("entmax15", **{key: value})


def test_temperature_moves_entmax_support_and_not_ev_softmax():
    """At lower temperature sparsemax/1.5-entmax keep fewer tokens (never more), at higher more;
    ev-softmax keeps the same tokens at every temperature (its threshold, the mean logit, scales
    with the logits), only its probabilities sharpen or flatten."""
    g = torch.Generator().manual_seed(21)
    scores = torch.randn(64, 500, generator=g, dtype=torch.float64) * 3
    ids = torch.zeros(64, 1, dtype=torch.long)

    def support(name, t):
        return torch.isfinite(snhf.SparseSampling(name, temperature=t)(ids, scores))

    for name in ("sparsemax", "entmax15"):
        cold, base, hot = (support(name, t).sum(-1) for t in (0.5, 1.0, 2.0))
        assert bool((cold <= base).all() and (base <= hot).all()) and int(cold.sum()) < int(hot.sum())
    ev = [support("ev_softmax", t) for t in (0.25, 1.0, 4.0)]
    # entries within rounding of the mean may flip; none here is closer than 1e-9 to it
    mean = scores.mean(-1, keepdim=True)
    assert float((scores - mean).abs().min()) > 1e-9
    assert torch.equal(ev[0], ev[1]) and torch.equal(ev[1], ev[2])
    p_cold = torch.exp(snhf.SparseSampling("ev_softmax", temperature=0.25)(ids, scores))
    p_hot = torch.exp(snhf.SparseSampling("ev_softmax", temperature=4.0)(ids, scores))
    assert bool((p_cold.max(-1).values > p_hot.max(-1).values).all())
