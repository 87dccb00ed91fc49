"""Flash ev-softmax attention (Triton) against a dense float64 oracle: ev-softmax (Eq. 7) of the
masked scores, values and gradients, with causal masks, key lengths (a zero length included),
GQA, head dims that are not powers of two, L != S, float32/float16/bfloat16. On a machine without
CUDA the kernels run under Triton's interpreter on CPU tensors (L <= 64)."""
import os
import sys

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is first imported: set it before anything imports it.
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed (pip install 'sparsenorm[gpu]')")

import sparsenorm  # noqa: E402
from sparsenorm.kernels.ops.evidential_attention import ev_softmax_attention_flash  # noqa: E402
from sparsenorm.kernels.triton import _common  # noqa: E402
from sparsenorm.kernels.triton.attention import flash_ev_softmax_attention_forward  # noqa: E402

DEVICE = "cpu" if _common.INTERPRET else "cuda"
IN_PROCESS = _common.INTERPRET or torch.cuda.is_available()
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy inf arithmetic in the interpreter
in_process = pytest.mark.skipif(not IN_PROCESS, reason="run in a subprocess with TRITON_INTERPRET=1")

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 4e-2}


def keep_mask(B, L, S, key_lengths, causal, key_mask=None, causal_offset=0):
    keep = torch.ones(B, 1, L, S, dtype=torch.bool)
    if key_lengths is not None:
        keep &= torch.arange(S) < key_lengths.cpu().view(B, 1, 1, 1)
    if key_mask is not None:
        keep &= key_mask.cpu().view(B, 1, 1, S)
    if causal:
        keep &= torch.arange(S) <= torch.arange(L).view(L, 1) + causal_offset
    return keep


def oracle(q, k, v, key_lengths, causal, scale, key_mask=None, causal_offset=0):
    """Dense float64 ev-softmax attention through sparsenorm.ev_softmax (mean over valid keys)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    keep = keep_mask(q.shape[0], q.shape[2], k.shape[2], key_lengths, causal, key_mask, causal_offset)
    empty = ~keep.any(-1, keepdim=True)
    w = sparsenorm.ev_softmax(s.masked_fill(empty, 0.0), dim=-1, mask=keep | empty).masked_fill(empty, 0.0)
    return w @ v


def run_case(dtype, causal, key_lengths, B=1, Hq=2, Hk=1, L=40, S=40, D=32, scale=None, seed=0, inputs=None,
             left_pad=None, causal_offset=0):
    """``left_pad``: per batch element, how many leading keys a boolean key mask drops."""
    g = torch.Generator().manual_seed(seed)
    if inputs is None:
        inputs = (torch.randn(B, Hq, L, D, generator=g), torch.randn(B, Hk, S, D, generator=g),
                  torch.randn(B, Hk, S, D, generator=g))
    q, k, v = (t.to(dtype).to(DEVICE).requires_grad_() for t in inputs)
    lens = None if key_lengths is None else torch.tensor(key_lengths, device=DEVICE)
    key_mask = None
    if left_pad is not None:
        key_mask = (torch.arange(S) >= torch.tensor(left_pad).view(-1, 1)).to(DEVICE)
    out = ev_softmax_attention_flash(q, k, v, key_lengths=lens, is_causal=causal, scale=scale, key_mask=key_mask,
                                     causal_offset=causal_offset)
    grad = torch.randn(out.shape, generator=g)
    out.backward(grad.to(dtype).to(DEVICE))
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    ref = oracle(q64, k64, v64, lens, causal, D ** -0.5 if scale is None else scale, key_mask, causal_offset)
    ref.backward(grad.to(dtype).double())
    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == ref.shape
    for got, want in ((out, ref), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.detach().cpu().double(), want.detach(), atol=tol, rtol=tol)
    return out, (q, k, v)


@in_process
@pytest.mark.parametrize(
    "dtype,causal,key_lengths,shape",
    [
        (torch.float32, False, None, dict(D=32)),
        (torch.float32, True, [33, 0], dict(B=2, Hq=4, Hk=2, L=36, S=29, D=24)),  # GQA, L > S, empty batch
        (torch.float16, True, None, dict(Hq=4, Hk=2, L=48, S=48, D=64)),
        (torch.float16, False, [17], dict(L=24, S=40, D=40)),
        (torch.bfloat16, True, [30], dict(Hq=2, Hk=2, L=40, S=40, D=32)),
    ],
)
def test_matches_dense_oracle(dtype, causal, key_lengths, shape):
    out, (q, k, v) = run_case(dtype, causal, key_lengths, **shape)
    if key_lengths is not None and 0 in key_lengths:  # no valid key: zero output and gradient
        b = key_lengths.index(0)
        assert (out[b] == 0).all() and (q.grad[b] == 0).all() and (k.grad[b] == 0).all()


@in_process
@pytest.mark.parametrize("causal", [False, True])
def test_key_mask_left_padding_and_lengths(causal):
    """A boolean key mask (left padding, as in batched generation) combined with key lengths; a
    batch element whose mask drops every key it may see gives zeros."""
    run_case(torch.float16, causal, [28, 40], B=2, Hq=2, Hk=1, L=32, S=40, D=32, left_pad=[5, 17])


@in_process
@pytest.mark.parametrize("L,S", [(20, 56), (1, 40), (1, 7), (40, 25)])
def test_bottom_right_causal_alignment(L, S):
    """``causal_offset = S - L`` (bottom-right, FlashAttention >= 2.1): chunked prefill (L < S, the
    queries' key range starting mid-block), cached decode (L = 1) and L > S (the first L - S queries
    see no key: zeros), with left padding, key lengths and GQA; values and gradients against the
    float64 oracle with the same mask written out."""
    out, (q, k, v) = run_case(torch.float32, True, [S, S - 2], B=2, Hq=4, Hk=2, L=L, S=S, D=32, left_pad=[0, 3],
                              causal_offset=S - L, seed=L + S)
    if L > S:
        assert (out[:, :, :L - S] == 0).all() and (q.grad[:, :, :L - S] == 0).all()


@in_process
def test_blocks_off_the_support_are_skipped_exactly():
    """Keys in later blocks point away from every query: whole key blocks fall below every
    threshold (the block-skip path), and the result is still the exact ev-softmax attention."""
    g = torch.Generator().manual_seed(3)
    L, S, D = 32, 64, 32
    direction = torch.randn(D, generator=g)
    q = (torch.randn(1, 1, L, D, generator=g) * 0.1 + direction)
    k = torch.randn(1, 1, S, D, generator=g) * 0.1
    k[..., :16, :] += 2 * direction
    k[..., 16:, :] -= 2 * direction
    v = torch.randn(1, 1, S, D, generator=g)
    out, _ = run_case(torch.float32, False, None, L=L, S=S, D=D, inputs=(q, k, v))
    scores = q @ k.transpose(-1, -2) * D ** -0.5
    assert (scores[..., 16:] < scores.mean(-1, keepdim=True)).all()  # the premise of the test


@in_process
def test_saved_statistics_and_scale():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=g).to(DEVICE) for _ in range(3))
    out, lse2, thr2 = flash_ev_softmax_attention_forward(q, k, v, scale=0.3)
    s = (q @ k.transpose(-1, -2)).double().cpu() * 0.3
    thr = s.mean(-1)
    torch.testing.assert_close(thr2.double().cpu() * torch.log(torch.tensor(2.0, dtype=torch.float64)),
                               thr, atol=1e-5, rtol=1e-5)
    lse = torch.logsumexp(s.masked_fill(s < thr.unsqueeze(-1), float("-inf")), -1)
    torch.testing.assert_close(lse2.double().cpu() * torch.log(torch.tensor(2.0, dtype=torch.float64)),
                               lse, atol=1e-5, rtol=1e-5)
    run_case(torch.float32, False, None, L=20, S=20, D=16, scale=0.3)


@in_process
def test_bad_input_is_named():
    q = torch.randn(1, 3, 8, 16).to(DEVICE)
    k = torch.randn(1, 2, 8, 16).to(DEVICE)
    with pytest.raises(ValueError, match="heads"):
        ev_softmax_attention_flash(q, k, k)
    with pytest.raises(ValueError, match="4-D"):
        ev_softmax_attention_flash(q[0], k[0], k[0])
    with pytest.raises(ValueError, match="head_dim"):
        big = torch.randn(1, 1, 8, 256).to(DEVICE)
        ev_softmax_attention_flash(big, big, big)
    with pytest.raises(TypeError, match="key_lengths"):
        ev_softmax_attention_flash(q, q, q, key_lengths=torch.ones(1).to(DEVICE))


@pytest.mark.skipif(IN_PROCESS, reason="ran in this process")
def test_in_subprocess(run_under_interpreter):
    run_under_interpreter(__file__)


@in_process
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_attention_flash_route_equals_the_pytorch_path(causal):
    """``sparse_attention(backend="triton")`` (the flash op, run here on interpreter tensors): a padding
    mask of any broadcast form becomes the kernel's key mask, ``key_lengths`` pass through, GQA
    passes through; output and gradients equal the dense path's; masks the kernel cannot take are
    refused with an error naming ``backend`` (and ``"auto"`` takes another kernel for them)."""
    from sparsenorm.attention import sparse_attention

    g = torch.Generator().manual_seed(0)
    B, Hq, Hk, L, S, E = 2, 4, 2, 12, 16, 32
    q, k, v = (torch.randn(B, h, n, E, generator=g) for h, n in ((Hq, L), (Hk, S), (Hk, S)))
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
    keep[1, ..., 11:] = False  # the second sequence is padded
    lengths = torch.tensor([S, 11])
    grad = torch.randn(B, Hq, L, E, generator=g)
    for kwargs in ({"attn_mask": keep}, {"attn_mask": keep[1, 0, 0]}, {"key_lengths": lengths}):
        args = [t.to(DEVICE).requires_grad_() for t in (q, k, v)]
        device_kwargs = {n: t.to(DEVICE) for n, t in kwargs.items()}
        out = sparse_attention(*args, is_causal=causal, backend="triton", **device_kwargs)
        assert "flash" in type(out.grad_fn).__name__
        got = torch.autograd.grad(out, args, grad.to(DEVICE))
        ref_args = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = sparse_attention(*ref_args, is_causal=causal, backend="dense", **kwargs)
        want = torch.autograd.grad(ref, ref_args, grad)
        torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=2e-5)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b, atol=2e-5, rtol=2e-5)
        auto = sparse_attention(*args, is_causal=causal, **device_kwargs)
        assert "flash" in type(auto.grad_fn).__name__  # "auto" takes the flash kernel where it applies
    for other in (torch.ones(B, 1, L, S, dtype=torch.bool), torch.ones(1, Hq, 1, S, dtype=torch.bool)):
        # per query, or per head: not a key mask
        with pytest.raises(ValueError, match="backend='triton' does not apply"):
            sparse_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), attn_mask=other.to(DEVICE), backend="triton")


@in_process
def test_sparse_attention_flash_route_bottom_right():
    """``sparse_attention(backend="triton", causal_alignment="bottom_right")`` with a left-padding key
    mask (what sparsenorm.hf hands it in chunked prefill) equals the dense path, gradients too."""
    from sparsenorm.attention import sparse_attention

    g = torch.Generator().manual_seed(5)
    B, Hq, Hk, L, S, E = 2, 4, 2, 6, 21, 16
    q, k, v = (torch.randn(B, h, n, E, generator=g) for h, n in ((Hq, L), (Hk, S), (Hk, S)))
    keep = (torch.arange(S) >= torch.tensor([0, 4]).view(B, 1)).view(B, 1, 1, S)
    grad = torch.randn(B, Hq, L, E, generator=g)
    args = [t.to(DEVICE).requires_grad_() for t in (q, k, v)]
    out = sparse_attention(*args, attn_mask=keep.to(DEVICE), is_causal=True, causal_alignment="bottom_right",
                           backend="triton")
    got = torch.autograd.grad(out, args, grad.to(DEVICE))
    ref_args = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = sparse_attention(*ref_args, attn_mask=keep, is_causal=True, causal_alignment="bottom_right",
                           backend="dense")
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=2e-5)
    for a, b in zip(got, torch.autograd.grad(ref, ref_args, grad)):
        torch.testing.assert_close(a.cpu(), b, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kernel", ["_attn_fwd_kernel", "_attn_bwd_dkdv_kernel", "_attn_bwd_dq_kernel", "_fwd_pass"])
def test_flash_kernels_have_no_data_dependent_skip(kernel):
    """Regression guard for a GPU-only miscompile the interpreter cannot show: on an H200 (triton
    3.6) the products under the kernels' ``if tl.sum(on) > 0`` block skip gave wrong float16/bfloat16
    dK (results/gpu/h200-2026-11-28-window1 and -window2). The kernels compute every block they
    visit; this fails if a data-dependent skip comes back."""
    import inspect

    from sparsenorm.kernels.triton import attention

    fn = getattr(attention, kernel)
    while not inspect.isfunction(fn):  # Autotuner -> JITFunction (or the interpreter's) -> the Python function
        fn = fn.fn
    source = inspect.getsource(fn)
    assert "tl.dot" in source or "_fwd_pass" in source
    assert "if tl.sum(on" not in source, f"{kernel} skips blocks by a data-dependent if again"


@in_process
@pytest.mark.parametrize("S", [1, 15, 16, 17, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_key_prefix_sums_kernel(S, dtype):
    """The Triton prefix-sum scan (tiles of 16 under the interpreter: lengths below, at and across
    tile boundaries, head dims across the 16-wide dim blocks) against float64 cumsum: each sum of
    up to S float32 additions, so within S * eps32 * sum |k|."""
    from sparsenorm.kernels.triton.prefix import key_prefix_sums

    g = torch.Generator().manual_seed(S)
    k = torch.randn(2, 3, S, 20, generator=g).to(dtype)
    got = key_prefix_sums(k.to(DEVICE))
    want = torch.cumsum(k.double(), -2)
    bound = S * torch.finfo(torch.float32).eps * torch.cumsum(k.double().abs(), -2)
    assert got.dtype == torch.float32
    assert ((got.cpu().double() - want).abs() <= bound).all()
