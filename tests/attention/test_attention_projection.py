"""Memory-efficient sparsemax / 1.5-entmax attention (``sparsenorm::projection_attention``) against
the dense path: ``sparsenorm.sparsemax`` / ``sparsenorm.entmax15`` over the full score matrix."""
import sys
from functools import partial
from contextlib import nullcontext
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsenorm
from benchmarks import bench_attention
from sparsenorm.kernels.ops import projection_attention as ops
from sparsenorm.kernels import available, disabled
from sparsenorm.kernels.reference import projection_attention as ref

ALPHA = 1.3  # alpha-entmax's alpha in these tests (passed to every kind; only entmax_bisect reads it)
DENSE = {"sparsemax": sparsenorm.sparsemax, "entmax15": sparsenorm.entmax15,
         "entmax_bisect": partial(sparsenorm.entmax_bisect, alpha=ALPHA)}
KINDS = list(DENSE)
SMALL_BLOCKS = dict(block_q=8, block_k=16, alpha=ALPHA)  # many blocks, ragged last ones
SCORE_CACHE = {"kept": 10**9, "recomputed": 0}  # ref.CACHE_KEY_BLOCKS: every query block's scores kept, resp. none


@pytest.fixture(params=list(SCORE_CACHE))
def score_cache(request, monkeypatch):
    """Run the test with the query blocks' scores kept between passes, and with them recomputed."""
    monkeypatch.setattr(ref, "CACHE_KEY_BLOCKS", SCORE_CACHE[request.param])
    return request.param


def qkv(B=2, Hq=4, Hk=2, L=37, S=53, E=8, Ev=5, dtype=torch.float64, seed=0, spread=2.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, L, E, generator=g, dtype=torch.float64) * spread).to(dtype)
    k = (torch.randn(B, Hk, S, E, generator=g, dtype=torch.float64) * spread).to(dtype)
    v = torch.randn(B, Hk, S, Ev, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def valid_mask(B, Hq, L, S, keep=None, key_lengths=None, is_causal=False):
    valid = torch.ones(B, Hq, L, S, dtype=torch.bool)
    if keep is not None:
        valid = valid & keep
    if key_lengths is not None:
        valid = valid & (torch.arange(S) < key_lengths.view(-1, 1, 1, 1))
    if is_causal:
        valid = valid & (torch.arange(S) <= torch.arange(L).unsqueeze(-1))
    return valid


def dense_weights(q, k, kind, scale, keep=None, key_lengths=None, is_causal=False):
    """The oracle: the normalizer over the full (B, Hq, L, S) scores with not-there keys at -inf."""
    B, Hq, L, _ = q.shape
    S = k.shape[2]
    k = k.repeat_interleave(Hq // k.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    valid = valid_mask(B, Hq, L, S, keep, key_lengths, is_causal)
    empty = ~valid.any(-1, keepdim=True)
    weights = DENSE[kind](scores.masked_fill(~valid, float("-inf")).masked_fill(empty, 0.0), dim=-1)
    return weights.masked_fill(empty, 0.0)


def dense_attention(q, k, v, kind, scale, **masks):
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return torch.matmul(dense_weights(q, k, kind, scale, **masks), v)


def output_tolerance(q, k, v, scale, dtype):
    """Error model for an output row ``sum_j p_j v_j`` computed in ``dtype``, oracle in float64.

    Each score carries at most ``E * eps * scale * max_j sum_d |q_d k_jd|`` (a length-E dot
    product), the threshold at most twice that (it is a mean of scores over the support minus a
    constant, resp. the root of a quadratic in them), so each weight moves by at most 3x a score's
    error (times ``max(1, 2 sqrt(p))`` <= 2 for 1.5-entmax); an output entry by the sum over the
    row of those, times ``max |v|``, plus the rounding of the ``P V`` sum itself.
    """
    eps = torch.finfo(dtype).eps
    E, S = q.shape[-1], k.shape[-2]
    q64, k64 = q.double().abs(), k.double().abs().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    dot = (torch.matmul(q64, k64.transpose(-2, -1)) * scale).max().item()
    score_err = E * eps * dot
    vmax = v.double().abs().max().item()
    return S * 6 * score_err * vmax + S * eps * vmax


MASK_CASES = {
    "none": lambda B, Hq, L, S: {},
    "causal": lambda B, Hq, L, S: {"is_causal": True},
    "key_lengths": lambda B, Hq, L, S: {"key_lengths": torch.tensor([S, 11])},
    "key_lengths zero": lambda B, Hq, L, S: {"key_lengths": torch.tensor([0, 20])},
    "bool (L, S)": lambda B, Hq, L, S: {"keep": torch.rand(L, S, generator=torch.Generator().manual_seed(1)) > 0.3},
    "bool per head": lambda B, Hq, L, S: {
        "keep": torch.rand(B, Hq, L, S, generator=torch.Generator().manual_seed(2)) > 0.5},
    "bool key padding + causal + lengths": lambda B, Hq, L, S: {
        "keep": (torch.arange(S) >= torch.tensor([[0], [3]])).view(B, 1, 1, S), "is_causal": True,
        "key_lengths": torch.tensor([40, S])},
}


def with_empty_rows(keep_case, L):
    keep = keep_case.get("keep")
    if keep is not None:
        keep = keep.expand(*keep.shape[:-2], L, keep.shape[-1]).clone()
        keep[..., 2, :] = False  # a query with no key there
        keep_case = {**keep_case, "keep": keep}
    return keep_case


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(MASK_CASES))
def test_equals_dense_in_float64(kind, case, score_cache):
    q, k, v = qkv()
    masks = with_empty_rows(MASK_CASES[case](2, 4, 37, 53), 37)
    out = ops.projection_attention(q, k, v, kind, scale=0.4, **SMALL_BLOCKS, **masks)
    expected = dense_attention(q, k, v, kind, 0.4, **masks)
    torch.testing.assert_close(out, expected, rtol=0, atol=output_tolerance(q, k, v, 0.4, torch.float64))
    assert output_tolerance(q, k, v, 0.4, torch.float64) < 1e-10


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ["none", "causal", "bool key padding + causal + lengths"])
def test_float32_within_error_model_of_float64_oracle(kind, case, score_cache):
    q, k, v = qkv(dtype=torch.float32, seed=3)
    masks = MASK_CASES[case](2, 4, 37, 53)
    out = ops.projection_attention(q, k, v, kind, scale=0.4, **SMALL_BLOCKS, **masks)
    assert out.dtype == torch.float32
    expected = dense_attention(q.double(), k.double(), v.double(), kind, 0.4, **masks)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=output_tolerance(q, k, v, 0.4, torch.float32))


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(KINDS), L=st.integers(1, 20), S=st.integers(1, 20), block_q=st.integers(1, 9),
       block_k=st.integers(1, 9), causal=st.booleans(), masked=st.booleans(), seed=st.integers(0, 2**16),
       spread=st.sampled_from([0.1, 1.0, 10.0]), cache=st.sampled_from(list(SCORE_CACHE)),
       start_top=st.sampled_from([1, 2, 8]))
def test_property_equals_dense_for_any_shape_block_and_mask(kind, L, S, block_q, block_k, causal, masked, seed,
                                                           spread, cache, start_top):
    q, k, v = qkv(B=2, Hq=2, Hk=1, L=L, S=S, E=4, Ev=3, seed=seed, spread=spread)
    g = torch.Generator().manual_seed(seed)
    masks = {"is_causal": causal}
    if masked:
        masks["keep"] = torch.rand(2, 1, L, S, generator=g) > 0.3
        masks["key_lengths"] = torch.randint(0, S + 1, (2,), generator=g)
    with mock.patch.object(ref, "CACHE_KEY_BLOCKS", SCORE_CACHE[cache]), \
            mock.patch.object(ref, "SPARSEMAX_START_TOP", start_top):
        out = ops.projection_attention(q, k, v, kind, block_q=block_q, block_k=block_k, alpha=ALPHA, **masks)
    scale = 4 ** -0.5
    expected = dense_attention(q, k, v, kind, scale, **masks)
    torch.testing.assert_close(out, expected, rtol=0, atol=output_tolerance(q, k, v, scale, torch.float64))


@pytest.mark.parametrize("kind", KINDS)
def test_not_there_keys_get_no_weight_and_empty_rows_are_zero(kind, score_cache):
    q, k, v = qkv(B=2, Hq=2, Hk=2, L=6, S=9)
    keep = torch.ones(2, 2, 6, 9, dtype=torch.bool)
    keep[0, 1, 4] = False
    keep[1, 0, :, 5] = False
    out = ops.projection_attention(q, k, v, kind, keep=keep, key_lengths=torch.tensor([9, 7]), block_q=4,
                                   block_k=4, alpha=ALPHA)
    assert torch.equal(out[0, 1, 4], torch.zeros(5, dtype=q.dtype))
    # Changing a not-there key's value changes nothing, bit for bit.
    v2 = v.clone()
    v2[1, 0, 5] = 1e6
    v2[1, :, 7:] = -1e6
    out2 = ops.projection_attention(q, k, v2, kind, keep=keep, key_lengths=torch.tensor([9, 7]), block_q=4,
                                    block_k=4, alpha=ALPHA)
    assert torch.equal(out[1, 0], out2[1, 0]) and torch.equal(out[1, 1], out2[1, 1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ["none", "causal", "bool key padding + causal + lengths"])
def test_gradients_equal_dense_autograd(kind, case, score_cache):
    q, k, v = (t.requires_grad_() for t in qkv(L=21, S=30))
    masks = with_empty_rows(MASK_CASES[case](2, 4, 21, 30), 21)
    g = torch.randn(2, 4, 21, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    out = ops.projection_attention(q, k, v, kind, scale=0.4, **SMALL_BLOCKS, **masks)
    grads = torch.autograd.grad(out, (q, k, v), g)
    expected = torch.autograd.grad(dense_attention(q, k, v, kind, 0.4, **masks), (q, k, v), g)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ["none", "bool key padding + causal + lengths"])
def test_gradcheck(kind, case, score_cache):
    q, k, v = (t.requires_grad_() for t in qkv(B=2, Hq=2, Hk=1, L=5, S=7, E=3, Ev=2, seed=7))
    masks = with_empty_rows(MASK_CASES[case](2, 2, 5, 7), 5) if case == "none" else {
        "keep": torch.tensor([True] * 6 + [False]), "is_causal": True, "key_lengths": torch.tensor([7, 4])}

    def f(q, k, v):
        return ops.projection_attention(q, k, v, kind, block_q=2, block_k=3, alpha=ALPHA, **masks)

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", ["none", "bool key padding + causal + lengths"])
def test_kept_scores_give_the_recomputed_results_bit_for_bit_from_one_product_per_tile(kind, case, monkeypatch):
    """Keeping a query block's scores between passes changes no operation on them (the same tile
    products, the same element-wise steps per key block), so outputs and gradients are equal to the
    bit; and the kept path computes each (query block, key block) score tile once per forward and
    once per backward, where the recomputing one does it on every pass."""
    q, k, v = (t.requires_grad_() for t in qkv(L=21, S=30))
    masks = with_empty_rows(MASK_CASES[case](2, 4, 21, 30), 21)
    g = torch.randn(2, 4, 21, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    tiles = []
    score_tile = ref._Grouped.scores
    monkeypatch.setattr(ref._Grouped, "scores", lambda self, *a: tiles.append(a[1:]) or score_tile(self, *a))
    results, products = {}, {}
    for cache, blocks in SCORE_CACHE.items():
        monkeypatch.setattr(ref, "CACHE_KEY_BLOCKS", blocks)
        tiles.clear()
        with disabled():  # the search on the kept scores (the C++ row solver is tested below)
            out = ops.projection_attention(q, k, v, kind, scale=0.4, **SMALL_BLOCKS, **masks)
            forward_tiles = list(tiles)
            results[cache] = (out, *torch.autograd.grad(out, (q, k, v), g))
        products[cache] = (forward_tiles, tiles[len(forward_tiles):])
    for kept, recomputed in zip(results["kept"], results["recomputed"]):
        assert torch.equal(kept, recomputed)
    forward_kept, backward_kept = products["kept"]
    assert len(set(forward_kept)) == len(forward_kept) == len(backward_kept) == len(set(backward_kept))
    assert set(forward_kept) == set(products["recomputed"][0])  # the same tiles, once each
    assert len(products["recomputed"][0]) >= 3 * len(forward_kept)  # max, >= 1 search step, output


@pytest.mark.parametrize("score_cache", list(SCORE_CACHE), indirect=True)
def test_sparsemax_start_is_exact_for_supports_within_its_top_keys(score_cache, monkeypatch):
    """sparsemax's search starts at max_{k <= K} (sum of the k largest scores - 1) / k, the threshold
    itself when the support has at most K keys: then every query block is done after one step."""
    q, k, v = qkv(spread=10.0, seed=4)
    masks = with_empty_rows(MASK_CASES["bool key padding + causal + lengths"](2, 4, 37, 53), 37)
    support = (dense_weights(q, k, "sparsemax", 0.4, **masks) > 0).sum(-1)
    assert support.max() <= ref.SPARSEMAX_START_TOP and support.max() >= 2  # the premise, not trivially 1
    steps = []
    step = ref.threshold_step
    monkeypatch.setattr(ref, "threshold_step", lambda *a: steps.append(1) or step(*a))
    with disabled():  # the search (with the C++ kernel, kept blocks are solved row by row, no step)
        out = ops.projection_attention(q, k, v, "sparsemax", scale=0.4, **SMALL_BLOCKS, **masks)
    assert len(steps) == -(-37 // SMALL_BLOCKS["block_q"])  # one step per query block
    expected = dense_attention(q, k, v, "sparsemax", 0.4, **masks)
    torch.testing.assert_close(out, expected, rtol=0, atol=output_tolerance(q, k, v, 0.4, torch.float64))


@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
def test_search_fallback_by_sorting_is_exact(kind, monkeypatch, score_cache):
    """Rows still iterating after MAX_STEPS passes are solved by the sort: force it with one step
    (and sparsemax's start at -1, exact only for rows with one key above it)."""
    monkeypatch.setattr(ref, "MAX_STEPS", 1)
    monkeypatch.setattr(ref, "SPARSEMAX_START_TOP", 1)
    q, k, v = qkv()
    masks = with_empty_rows(MASK_CASES["bool key padding + causal + lengths"](2, 4, 37, 53), 37)
    with disabled():  # the search (with the C++ kernel, kept blocks are solved row by row)
        out = ops.projection_attention(q, k, v, kind, scale=0.4, **SMALL_BLOCKS, **masks)
    torch.testing.assert_close(out, dense_attention(q, k, v, kind, 0.4, **masks), rtol=0, atol=1e-12)


@pytest.mark.skipif(not available().get("projection"), reason="the C++ CPU kernels are not built")
@pytest.mark.parametrize("kind", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_row_solver_on_kept_blocks_equals_the_search(kind, dtype, monkeypatch):
    """On CPU a query block whose scores are kept is solved by the C++ row solver (no search
    step runs; each row in cache); outputs and gradients equal the search's (the reference, under
    ``disabled()``) to rounding: both give the closed form on the same support, whose sums differ
    only in their order (error model of ``output_tolerance``), and the weights' gradient likewise."""
    monkeypatch.setattr(ref, "CACHE_KEY_BLOCKS", 10**9)
    q, k, v = (t.to(dtype).requires_grad_() for t in qkv(L=40, S=70))
    masks = with_empty_rows(MASK_CASES["bool key padding + causal + lengths"](2, 4, 40, 70), 40)
    g = torch.randn(2, 4, 40, 5, generator=torch.Generator().manual_seed(3)).to(dtype)
    steps = []
    step = ref.threshold_step
    monkeypatch.setattr(ref, "threshold_step", lambda *a: steps.append(1) or step(*a))
    results = {}
    for path in ("kernel", "search"):
        steps.clear()
        with (disabled() if path == "search" else nullcontext()):
            out = ops.projection_attention(q, k, v, kind, scale=0.4, **SMALL_BLOCKS, **masks)
            results[path] = (out, *torch.autograd.grad(out, (q, k, v), g))
        assert (len(steps) == 0) == (path == "kernel"), path
    tol = output_tolerance(q.detach().double(), k.detach().double(), v.detach().double(), 0.4, dtype)
    torch.testing.assert_close(results["kernel"][0], results["search"][0], rtol=0, atol=tol)
    for a, b in zip(results["kernel"][1:], results["search"][1:]):  # the same support: same closed form
        torch.testing.assert_close(a, b, rtol=0, atol=tol * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_computes_in_float32(kind):
    q, k, v = qkv(dtype=torch.bfloat16, L=9, S=12)
    out = ops.projection_attention(q, k, v, kind, is_causal=True)
    assert out.dtype == torch.bfloat16
    expected = ops.projection_attention(q.float(), k.float(), v.float(), kind, is_causal=True)
    torch.testing.assert_close(out, expected.to(torch.bfloat16), rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_compiles_fullgraph_as_one_opaque_op(kind):
    q, k, v = (t.requires_grad_() for t in qkv(L=10, S=13, dtype=torch.float32))
    lens = torch.tensor([13, 6])

    def f(q, k, v):
        return ops.projection_attention(q, k, v, kind, key_lengths=lens, is_causal=True, **SMALL_BLOCKS)

    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True, backend="eager")(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    g = torch.ones_like(eager)
    for a, b in zip(torch.autograd.grad(compiled, (q, k, v), g), torch.autograd.grad(eager, (q, k, v), g)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_opcheck_fake_and_autograd_registrations():
    q, k, v = (t.requires_grad_() for t in qkv(L=6, S=7, dtype=torch.float32))
    for kind in KINDS:
        args = (q, k, v, None, torch.tensor([7, 3]), True, 0.5, kind, 4, 4, ALPHA, 50)
        torch.library.opcheck(ops.projection_attention_op, args)


@pytest.mark.parametrize("bad, error, match", [
    (dict(kind="softmax"), ValueError, "kind"),
    (dict(key_lengths=torch.tensor([3])), ValueError, "key_lengths"),
    (dict(key_lengths=torch.tensor([3.0, 4.0])), TypeError, "key_lengths"),
    (dict(keep=torch.ones(5, 7)), TypeError, "keep"),
    (dict(keep=torch.ones(3, 6, 7, dtype=torch.bool)), ValueError, "keep"),
    (dict(block_q=0), ValueError, "block_q"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(kind="entmax_bisect", alpha=1.0), ValueError, "alpha"),
    (dict(kind="entmax_bisect", alpha=torch.tensor(1.5)), TypeError, "alpha"),
    (dict(kind="entmax_bisect", n_iter=0), ValueError, "n_iter"),
])
def test_bad_arguments_raise_naming_them(bad, error, match):
    q, k, v = qkv(L=6, S=7)
    kwargs = {"kind": "sparsemax", **bad}
    with pytest.raises(error, match=match):
        ops.projection_attention(q, k, v, **kwargs)


def test_bad_shapes_raise():
    q, k, v = qkv(Hq=3, Hk=2, L=6, S=7)
    with pytest.raises(ValueError, match="heads"):
        ops.projection_attention(q, k, v)
    with pytest.raises(ValueError, match="query"):
        ops.projection_attention(q[0], k[0], v[0])


# ------------------------------------------------------------------------------------------- memory
def _check_memory(L):
    """Peak extra memory of one forward + backward (one head, D = 64) under a quarter of one float32
    L x L score matrix, measured by ``benchmarks.bench_attention`` (peak RSS in a fresh process)."""
    # The measurement sees the dense path's score matrix (at a length where that fits comfortably):
    # without that, the bound below would prove nothing.
    L_dense = min(L, 4096)
    theirs = bench_attention.measure_peak("sparsemax (dense)", 1, L_dense, 64)
    assert theirs is not None and theirs >= L_dense * L_dense * 4, theirs
    for label in bench_attention.PROJECTION:
        ours = bench_attention.measure_peak(label, 1, L, 64)
        assert ours is not None and ours < L * L * 4 / 4, (label, ours)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory reads /proc (Linux only)")
def test_extra_memory_under_a_quarter_of_the_score_matrix_at_moderate_length():
    _check_memory(4096)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory reads /proc (Linux only)")
def test_extra_memory_under_a_quarter_of_the_score_matrix_at_16k():
    _check_memory(16384)
