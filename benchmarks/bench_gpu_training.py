"""GPU benchmark of whole training workloads (``python -m benchmarks.bench_gpu --only loss|train``).

* ``loss``: the fused vocabulary loss (``sparsenorm.fused_linear_loss``: the (N, V) logits never
  materialised) against the materialised loss (``F.linear`` then the registry's loss; for softmax
  ``F.cross_entropy``), forward+backward, time and peak memory beyond the inputs, bfloat16 hidden
  states and classifier, float32 loss.
* ``train``: one optimiser step (forward, backward, AdamW) of a MiniLM-sized BERT encoder
  (masked-LM head) and of a SmolLM2-135M-sized Llama decoder (causal-LM loss), each with
  ``attn_implementation="sparsenorm_ev_softmax"`` against ``"sdpa"``: time per step and peak
  memory. The weights are a random initialisation of the published configurations (the lent
  machine has no network and the pretrained weights are larger than what travels to it); the
  time and memory of a step do not depend on the weights' values, except through ev-softmax's
  block skipping, which a random model's near-uniform scores understate. Attention dropout is 0
  for both implementations (the flash kernels take none).
"""
from __future__ import annotations

from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from .gpu_timing import time_interleaved

DEVICE = "cuda"


def _peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes ``fn`` allocates beyond what existed before its call, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    return peak


def _interleaved(fns: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, object]:
    """Median ms per call over interleaved rounds, and each function's peak memory (bytes beyond
    what was allocated before its call); a function that fails gives its error's name."""
    out: Dict[str, object] = {}
    peaks: Dict[str, object] = {}
    for name, fn in fns.items():
        try:
            peaks[name] = _peak_bytes(fn)
        except Exception as e:  # noqa: BLE001 -- reported in the table, the others still run
            error = f"error: {type(e).__name__}: {e}"[:200]
            peaks[name] = "OOM" if isinstance(e, torch.cuda.OutOfMemoryError) else error
            torch.cuda.empty_cache()
    # The timing loop is bench_gpu's (its warm-up call, then interleaved rounds), one call per round.
    timed = time_interleaved({n: fns[n] for n in fns if not isinstance(peaks[n], str)}, rounds, reps=1)
    for name in fns:
        out[name] = (timed[name], peaks[name]) if name in timed else (peaks[name], peaks[name])
    return out


LOSS_SHAPES = [(4096, 576, 49152), (8192, 2048, 128256)]  # tokens, hidden, vocabulary (SmolLM2, Llama-3)
LOSS_NORMALIZERS = ("softmax", "ev_softmax", "sparsemax", "entmax15")


def _loss_rows(n: int, d: int, vocab: int, gen: torch.Generator, rounds: int) -> List[dict]:
    import sparsenorm
    from sparsenorm import registry

    h = (torch.randn(n, d, device=DEVICE, generator=gen) * d ** -0.5).to(torch.bfloat16).requires_grad_()
    w = torch.randn(vocab, d, device=DEVICE, generator=gen).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, vocab, (n,), device=DEVICE, generator=gen)

    def fused(name):
        return lambda: torch.autograd.grad(sparsenorm.fused_linear_loss(h, w, y, normalizer=name), (h, w))

    def materialised(name):
        if name == "softmax":
            return lambda: torch.autograd.grad(F.cross_entropy(F.linear(h, w).float(), y), (h, w))
        loss = registry.get(name).single_label_loss
        return lambda: torch.autograd.grad(loss(F.linear(h, w).float(), y), (h, w))

    fns = {"materialised softmax CE": materialised("softmax")}
    for name in LOSS_NORMALIZERS:
        fns[f"fused {name}"] = fused(name)
    for name in LOSS_NORMALIZERS[1:]:
        fns[f"materialised {name}"] = materialised(name)
    timed = _interleaved(fns, rounds)
    base_ms, base_peak = timed["materialised softmax CE"]
    rows = []
    for name, (ms, peak) in timed.items():
        ok = not isinstance(ms, str)
        rows.append(dict(tokens=n, hidden=d, vocab=vocab, method=name, ms=ms, peak_bytes=peak,
                         vs_materialised_softmax=(ms / base_ms if ok and not isinstance(base_ms, str) else None),
                         memory_vs_materialised_softmax=(peak / base_peak if ok and not isinstance(base_peak, str)
                                                         else None)))
    return rows


def bench_loss(rounds: int, quick: bool) -> List[dict]:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    rows = []
    for n, d, vocab in LOSS_SHAPES[:1] if quick else LOSS_SHAPES:
        rows += _loss_rows(n, d, vocab, gen, min(rounds, 3) if quick else rounds)
        torch.cuda.empty_cache()
    return rows


def _minilm(attn: str):
    from transformers import AutoModelForMaskedLM, BertConfig

    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, attention_probs_dropout_prob=0.0)
    return AutoModelForMaskedLM.from_config(config, attn_implementation=attn)


def _smollm2(attn: str):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True, attention_dropout=0.0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn)


TRAIN_MODELS = {  # name: (builder, batch, length, vocabulary)
    "MiniLM-L6 (BERT, 22M) masked LM": (_minilm, 32, 512, 30522),
    "SmolLM2-135M (Llama) causal LM": (_smollm2, 4, 2048, 49152),
}
IMPLEMENTATIONS = ("sdpa", "sparsenorm_ev_softmax")


def bench_train(rounds: int, quick: bool) -> List[dict]:
    import sparsenorm.hf  # noqa: F401 -- registers the sparsenorm_* attention implementations

    rows = []
    for label, (build, batch, length, vocab) in TRAIN_MODELS.items():
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        ids = torch.randint(0, vocab, (batch, length), device=DEVICE, generator=gen)
        torch.manual_seed(0)
        first = build(IMPLEMENTATIONS[0]).to(DEVICE, torch.bfloat16)
        models = {IMPLEMENTATIONS[0]: first}
        for attn in IMPLEMENTATIONS[1:]:
            other = build(attn).to(DEVICE, torch.bfloat16)
            other.load_state_dict(first.state_dict())  # the same weights for every implementation
            models[attn] = other
        fns = {}
        for attn, model in models.items():
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)

            def step(model=model, opt=opt):
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss
            fns[attn] = step
        timed = _interleaved(fns, rounds)
        base_ms, base_peak = timed["sdpa"]
        for attn, (ms, peak) in timed.items():
            ok = not isinstance(ms, str)
            rows.append(dict(model=label, batch=batch, length=length, attn_implementation=attn, ms_per_step=ms,
                             peak_bytes=peak, vs_sdpa=(ms / base_ms if ok and not isinstance(base_ms, str) else None),
                             memory_vs_sdpa=(peak / base_peak if ok and not isinstance(base_peak, str) else None)))
        del models, fns, first
        torch.cuda.empty_cache()
    return rows
