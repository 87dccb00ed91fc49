"""On the GPU: ``torch.compile(fullgraph=True)`` of every normalizer, loss and ev-softmax attention;
a CUDA-graph capture of whole training steps (forward, backward, optimizer) through ev-softmax and
through the flash attention, which can only be captured if nothing on the way synchronizes with
the host; and sparsenorm's softmax attention equal to SDPA in a Hugging Face BERT built from a
config. Bounds: float32 roundings x operation counts (``cuda_helpers``)."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import sparsenorm
from cuda_helpers import ULP32, assert_within

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
import test_compile  # noqa: E402  (tests/kernels/test_compile.py: the normalizer and loss tables)

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

EAGER_VS_COMPILED = 64 * ULP32  # the same ops, possibly fused in another order: a few dozen roundings


def needs_cuda(device):
    if device != "cuda":
        pytest.skip("CUDA only (compiled Triton code / CUDA graphs)")


@pytest.fixture
def targets_on(device, monkeypatch):
    monkeypatch.setattr(test_compile, "TARGET", test_compile.TARGET.to(device))
    monkeypatch.setattr(test_compile, "MULTI_HOT", test_compile.MULTI_HOT.to(device))


def compiled_equals_eager(fn, device, backend):
    x, mask = (t.to(device) for t in test_compile.inputs())
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    eager, got = fn(xe, mask), compiled(xc, mask)
    assert_within(got, eager, EAGER_VS_COMPILED * (1 + eager.detach().abs().nan_to_num(posinf=0)), "value")
    g = torch.randn(eager.shape, generator=torch.Generator().manual_seed(1)).to(device)
    (ge,) = torch.autograd.grad(eager, xe, g)
    (gc,) = torch.autograd.grad(got, xc, g)
    assert_within(gc, ge, EAGER_VS_COMPILED * (1 + ge.abs()), "gradient")


@pytest.mark.parametrize("name", list(test_compile.NORMALIZERS) + list(test_compile.LOSSES))
def test_every_function_compiles_fullgraph(device, targets_on, name):
    """Traced through dynamo and AOT autograd (what a host sync or data-dependent branch breaks)."""
    fn = {**test_compile.NORMALIZERS, **test_compile.LOSSES}[name]
    compiled_equals_eager(fn, device, "aot_eager")


@pytest.mark.parametrize("name", list(test_compile.NORMALIZERS) + list(test_compile.LOSSES))
def test_every_function_on_the_device_equals_cpu(device, name, monkeypatch):
    """Each normalizer and loss on the device (its kernel or the reference ops there) against the
    CPU (its C++ kernel or the reference), values and input gradients, float32. Both sides: float32
    roundings over rows of 6 entries of magnitude < 8 and the few operations of a closed form
    (iterative ones: 30 bisection steps, each a rounding of the threshold), counted as 64."""
    fn = {**test_compile.NORMALIZERS, **test_compile.LOSSES}[name]
    results = []
    for where in ("cpu", device):
        monkeypatch.setattr(test_compile, "TARGET", test_compile.TARGET.to(where))
        monkeypatch.setattr(test_compile, "MULTI_HOT", test_compile.MULTI_HOT.to(where))
        x, mask = (t.to(where) for t in test_compile.inputs())
        x.requires_grad_(True)
        y = fn(x, mask)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(where)
        (dx,) = torch.autograd.grad(y, x, g.masked_fill(torch.isinf(y), 0.0))
        results.append((y.detach(), dx))
    (y_cpu, dx_cpu), (y_dev, dx_dev) = results
    bound = lambda ref: 2 * 64 * 8 * ULP32 * (1 + ref.double().abs().nan_to_num(posinf=0.0))  # noqa: E731
    assert_within(y_dev, y_cpu, bound(y_cpu), f"{name} value")
    assert_within(dx_dev, dx_cpu, bound(dx_cpu), f"{name} gradient")


@pytest.mark.parametrize("name", ["ev_softmax", "log_ev_softmax_train", "sparsemax"])  # (inductor compiles slowly)
def test_inductor_on_the_kernel_backed_functions(device, targets_on, name):
    needs_cuda(device)
    compiled_equals_eager(test_compile.NORMALIZERS[name], device, "inductor")


def test_sparse_attention_compiles_fullgraph(device):
    """ev-softmax attention on CUDA (the flash kernel) under ``torch.compile(fullgraph=True)``:
    values and gradients against the float64 oracle, as the eager path is checked
    (``test_attention_cuda.compare_with_reference_path``), on one case (compiling is slow)."""
    needs_cuda(device)
    from sparsenorm.attention import sparse_attention
    from test_attention_cuda import compare_with_reference_path

    torch._dynamo.reset()
    compare_with_reference_path(device, attend=torch.compile(sparse_attention, fullgraph=True),
                                dtypes=(torch.bfloat16,), causals=(True,), masks=("per_sequence",))


# ------------------------------------------------------------------------------- CUDA graphs
def capture_and_compare(model: nn.Module, loss_fn, make_batch, steps: int = 3):
    """Capture one SGD training step as a CUDA graph, replay it on fresh batches, and compare the
    parameters with an eager copy trained on the same batches (same kernels: roundings only)."""
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    static = make_batch(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compiles the kernels, allocates
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            loss_fn(model, *static).backward()
    torch.cuda.current_stream().wait_stream(side)
    # The warm-up steps took no optimizer step; both copies start equal.
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model, *static)
        static_loss.backward()
        opt.step()
    for step in range(1, steps + 1):
        batch = make_batch(step)
        for dst, src in zip(static, batch):
            dst.copy_(src)
        graph.replay()
        eager_opt.zero_grad(set_to_none=True)
        eager_loss = loss_fn(eager, *batch)
        eager_loss.backward()
        eager_opt.step()
        torch.cuda.synchronize()
        assert_within(static_loss, eager_loss, 256 * ULP32 * (1 + eager_loss.abs()), f"loss at step {step}")
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert_within(p, q, 256 * ULP32 * (1 + q.abs()), f"{name} after step {step}")


def test_cuda_graph_training_step_through_ev_softmax(device):
    needs_cuda(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 1000)).to(device)
    weights = torch.randn(1000, device=device)

    def loss_fn(m, x, y):
        z = m(x)
        return sparsenorm.losses.ev_softmax_nll_loss(z, y) + (sparsenorm.ev_softmax(z) * weights).sum(-1).mean()

    def make_batch(i):
        g = torch.Generator().manual_seed(100 + i)
        return torch.randn(32, 64, generator=g).to(device), torch.randint(0, 1000, (32,), generator=g).to(device)

    capture_and_compare(model, loss_fn, make_batch)


class TinyAttention(nn.Module):
    def __init__(self, width=128, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * kv_heads * self.d)
        self.out = nn.Linear(width, width)

    def forward(self, x, key_mask):
        B, L, _ = x.shape
        from sparsenorm.kernels.ops.evidential_attention import ev_softmax_attention_flash

        q = self.q(x).view(B, L, self.heads, self.d).transpose(1, 2).to(torch.bfloat16)
        k, v = self.kv(x).view(B, L, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4).to(torch.bfloat16)
        a = ev_softmax_attention_flash(q, k, v, is_causal=True, key_mask=key_mask)
        return self.out(a.float().transpose(1, 2).reshape(B, L, -1))


def test_cuda_graph_training_step_through_flash_attention(device):
    needs_cuda(device)
    torch.manual_seed(0)
    model = TinyAttention().to(device)

    def loss_fn(m, x, key_mask):
        return m(x, key_mask).square().mean()

    def make_batch(i):
        g = torch.Generator().manual_seed(200 + i)
        key_mask = torch.rand(4, 96, generator=g) < 0.9
        return torch.randn(4, 96, 128, generator=g).to(device), key_mask.to(device)

    capture_and_compare(model, loss_fn, make_batch)


# ------------------------------------------------------------------------------ Hugging Face
def test_hf_bert_sparsenorm_softmax_equals_sdpa(device):
    """A BERT built from a config (no hub): ``attn_implementation="sparsenorm_softmax"`` against
    ``"sdpa"`` on a padded batch, float32; and ``"sparsenorm_ev_softmax"`` (the flash route on CUDA)
    against the same model inside ``kernels.disabled()``."""
    transformers = pytest.importorskip("transformers")
    import sparsenorm.hf  # noqa: F401  (registers the implementations)

    layers, hidden, inner, length = 2, 32, 64, 7
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                                  intermediate_size=inner, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg, add_pooling_layer=False).to(device).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 40, (3, length), generator=g).to(device)
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    mask = mask.to(device)
    valid = mask.bool()

    def hidden_states(impl):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).last_hidden_state

    # Each layer: dot products over hidden/inner/length terms; LayerNorm scales errors by up to
    # ~1/std of its input (counted as 16); two implementations' errors add.
    bound_per_unit = 2 * 16 * layers * (hidden + inner + length) * ULP32
    sdpa, ours = hidden_states("sdpa"), hidden_states("sparsenorm_softmax")
    assert_within(ours[valid], sdpa[valid], bound_per_unit * (1 + sdpa[valid].abs()), "softmax vs SDPA")
    flash = hidden_states("sparsenorm_ev_softmax")
    with sparsenorm.kernels.disabled():
        dense = hidden_states("sparsenorm_ev_softmax")
    assert_within(flash[valid], dense[valid], bound_per_unit * (1 + dense[valid].abs()), "ev-softmax flash vs dense")
