"""record(): attended keys per query, per layer and head, valid keys only, no weights kept."""
import gc
import weakref

import torch
from torch import nn

import sparsenorm.attention as attention
from sparsenorm.attention import MultiheadAttention, record, sparse_attention
from sparsenorm.attention import stats as stats_module


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = MultiheadAttention(8, 2, normalizer="ev_softmax", batch_first=True)
        self.second = MultiheadAttention(8, 2, normalizer="sparsemax", batch_first=True)

    def forward(self, x, pad):
        x = self.first(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        return self.second(x, x, x, key_padding_mask=pad, average_attn_weights=False)


def test_counts_per_layer_and_head_over_valid_keys():
    torch.manual_seed(0)
    model = TwoLayers()
    x = torch.randn(3, 6, 8)
    pad = torch.arange(6) >= torch.tensor([[6], [4], [2]])
    with record(model) as stats:
        _, w = model(x, pad)
    assert set(stats.layers) == {"first", "second"}
    second = stats.layers["second"]
    support = (w != 0).sum(-1)  # (N, H, L)
    assert torch.equal(second.queries, torch.full((2,), 18))
    assert torch.equal(second.support_sum, support.sum((0, 2)))
    assert torch.equal(second.valid_sum, torch.full((2,), 6 * 6 + 4 * 6 + 2 * 6))
    assert torch.equal(second.histogram.sum(1), second.queries)
    for h in range(2):
        assert torch.equal(second.histogram[h, : support.max() + 1],
                           torch.bincount(support[:, h].flatten(), minlength=int(support.max()) + 1))
    rows = stats.summary()
    assert len(rows) == 4 and all(0 < r["support_fraction"] <= 1 for r in rows)
    assert 0 < stats.mean_support() <= 6


def test_blockwise_path_counts_the_same_support(monkeypatch):
    q, k, v = (torch.randn(2, 2, 12, 4) for _ in range(3))
    keep = torch.rand(2, 1, 12, 12) > 0.3
    with record() as dense:
        sparse_attention(q, k, v, attn_mask=keep, return_weights=True)
    monkeypatch.setattr("sparsenorm.kernels.auto_plan.BLOCKWISE_MIN_SCORES", 0)
    with record() as blockwise:
        sparse_attention(q, k, v, attn_mask=keep)
    a, b = dense.layers["sparse_attention"], blockwise.layers["sparse_attention"]
    for field in ("queries", "support_sum", "valid_sum"):
        assert torch.equal(getattr(a, field), getattr(b, field))


def test_no_weight_tensor_is_kept_alive_and_nothing_is_recorded_outside():
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    with record() as stats:
        _, w = sparse_attention(q, k, v, return_weights=True)
        ref = weakref.ref(w)
        del w
        gc.collect()
        assert ref() is None
    assert all(t.numel() <= 2 * 6 for s in stats.layers.values()
               for t in (s.queries, s.support_sum, s.valid_sum, s.histogram))
    before = stats.layers["sparse_attention"].queries.clone()
    sparse_attention(q, k, v)
    assert torch.equal(stats.layers["sparse_attention"].queries, before)
    assert not attention.stats.recording()


def test_nested_blocks_each_collect_and_close():
    """An inner block closes without disturbing the outer one (both see the calls inside both)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=gen) for _ in range(3))
    with record() as outer:
        sparse_attention(q, k, v)
        with record() as inner:
            sparse_attention(q, k, v)
        sparse_attention(q, k, v)
    assert not stats_module.recording()
    assert int(inner.layers["sparse_attention"].queries.sum()) == 2 * 5
    assert int(outer.layers["sparse_attention"].queries.sum()) == 3 * 2 * 5
