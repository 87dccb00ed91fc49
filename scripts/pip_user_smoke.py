"""What a pip user gets with no extras installed (run by scripts/wheel_check.sh in a fresh venv):
every registry normalizer (forward, training form, log form), its two losses with a backward pass,
every attention path, and ``marginalize``. Exits non-zero on the first failure."""
import importlib.util

import torch

import sparsenorm
from sparsenorm import registry
from sparsenorm.marginalize import marginalize
from sparsenorm.attention import MultiheadAttention, ev_softmax_attention_blockwise, sparse_attention

import sys

for package in () if "--with-extras" in sys.argv else ("scipy", "sklearn", "matplotlib", "transformers", "sacrebleu"):
    assert importlib.util.find_spec(package) is None, f"{package} is installed: this is not a bare install"

gen = torch.Generator().manual_seed(0)
x = torch.randn(4, 7, generator=gen, dtype=torch.float64)
target = torch.tensor([0, 3, 6, 2])
multi_hot = (torch.rand(4, 7, generator=gen) > 0.5).double()
layer = torch.nn.Linear(5, 7).double()
features = torch.randn(4, 5, generator=gen, dtype=torch.float64)

for name in registry.names():
    entry = registry.get(name)
    probs = entry.probs_from_linear(features, layer)
    assert torch.allclose(probs.sum(-1), torch.ones(4, dtype=torch.float64)), name
    assert torch.allclose(entry.train_forward(x, dim=-1).sum(-1), torch.ones(4, dtype=torch.float64)), name
    if entry.log_prob is not None:
        assert torch.isfinite(entry.log_prob(x, dim=-1)).all(), name
    logits = x.clone().requires_grad_(True)
    (entry.single_label_loss(logits, target) + entry.multi_label_loss(logits, multi_hot)).backward()
    assert torch.isfinite(logits.grad).all(), name
    if entry.attention:
        q, k, v = (torch.randn(2, 3, 5, 4, generator=gen) for _ in range(3))
        keep = torch.rand(2, 1, 5, 5, generator=gen) > 0.3
        keep[..., 0] = True
        for kwargs in ({}, {"attn_mask": keep}, {"is_causal": True}):
            out = sparse_attention(q, k, v, normalizer=name, **kwargs)
            assert out.shape == v.shape and torch.isfinite(out).all(), (name, kwargs)
        mha = MultiheadAttention(8, 2, batch_first=True, normalizer=name)
        tokens = torch.randn(2, 5, 8, generator=gen)
        assert torch.isfinite(mha(tokens, tokens, tokens)[0]).all(), name
    print(f"ok {name}")

q, k, v = (torch.randn(2, 9, 4, generator=gen) for _ in range(3))
out, _, _ = ev_softmax_attention_blockwise(q, k, v, block_q=4, block_k=4)
assert torch.allclose(out, sparse_attention(q, k, v, normalizer="ev_softmax"), atol=1e-5)
probs = sparsenorm.ev_softmax(torch.randn(3, 6, generator=gen))
expected = marginalize(probs, lambda i, z: (i * 10 + z).float())
assert torch.allclose(expected, (probs * (torch.arange(3)[:, None] * 10 + torch.arange(6)).float()).sum(-1))
print("pip user smoke: every normalizer, loss, attention path and marginalize work without extras")
