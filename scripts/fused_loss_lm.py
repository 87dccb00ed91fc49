"""A worked use of ``sparsenorm.fused_linear_loss``: a small word-level LM trained from scratch with
the fused softmax, ev-softmax (Eq. 10) and 1.5-entmax losses, side by side.

    python scripts/fused_loss_lm.py [--steps 300] [--out docs/guide/fused_loss_lm]

Data: the English side of the LibreOffice help pages the translation experiment already fetches
(``sparsenorm.experiments.evsoftmax_translation.data``; ~485k word and punctuation tokens), lower-cased words and
punctuation, the 8,000 most frequent plus ``<unk>``, padded to a multiple of 64 (8,064 entries) whose
padding rows are "not there" (``vocab_mask``). Model: embeddings (d = 128), two causal transformer
layers (4 heads), an output layer of its own; sequences of 64 tokens, batches of 16, AdamW 3e-3,
the same initialisation and batches for every loss. Every 25 steps: the training loss (each map's
own loss, not comparable across maps), and on held-out text the next-token accuracy of the argmax
(the same ranking for every map) and, for the sparse map, the mean support size. One step's peak
memory growth of the loss (fused against materialised, forward + backward) is measured at the end.
Writes ``OUT.json`` and ``OUT.png``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import sparsenorm
from sparsenorm import registry
from sparsenorm.experiments.evsoftmax_translation import data as translation_data

LOSSES = ["softmax", "ev_softmax", "entmax15"]
VOCAB, PAD_TO, DIM, SEQ, BATCH = 8000, 64, 128, 64, 16


def tokens_and_vocab():
    lines = [en for en, _ in translation_data.load_parallel().train]
    words = [w for line in lines for w in re.findall(r"\w+|[^\w\s]", line.lower())]
    common = [w for w, _ in collections.Counter(words).most_common(VOCAB)]
    index = {w: i + 1 for i, w in enumerate(common)}  # 0 = <unk>
    ids = torch.tensor([index.get(w, 0) for w in words])
    size = -(-(len(common) + 1) // PAD_TO) * PAD_TO
    mask = torch.zeros(size, dtype=torch.bool)
    mask[:len(common) + 1] = True
    return ids, mask


class TinyLM(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, DIM)
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        layer = nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, vocab, bias=False)

    def hidden(self, x):
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.norm(self.body(self.embed(x) + self.pos[:x.shape[1]], mask=causal, is_causal=True))


def batches(ids: torch.Tensor, seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        starts = torch.randint(0, ids.numel() - SEQ - 1, (BATCH,), generator=g)
        chunk = torch.stack([ids[s:s + SEQ + 1] for s in starts.tolist()])
        yield chunk[:, :-1], chunk[:, 1:]


def evaluate(model, name, ids, mask):
    with torch.no_grad():
        correct = total = 0
        support = []
        for x, y in batches(ids, 99, 8):
            logits = model.head(model.hidden(x)).masked_fill(~mask, float("-inf"))
            correct += int((logits.argmax(-1) == y).sum())
            total += y.numel()
            if name != "softmax":
                p = registry.get(name).forward(logits, dim=-1)
                support.append(float((p > 0).sum(-1).float().mean()))  # ev-softmax: Eq. 7, its evaluation form
        return correct / total, (sum(support) / len(support) if support else None)


def peak_growth(fn) -> int:
    def status(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    fn()
    return status("VmHWM") - before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", default="docs/guide/fused_loss_lm")
    args = p.parse_args()
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":  # freed blocks back to the OS: peak RSS = live memory
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    torch.set_num_threads(1)
    ids, mask = tokens_and_vocab()
    split = int(0.95 * ids.numel())
    train_ids, held_out = ids[:split], ids[split:]
    results = {"steps": args.steps, "vocab": int(mask.numel()), "vocab_there": int(mask.sum()), "dim": DIM,
               "seq": SEQ, "batch": BATCH, "train_tokens": int(train_ids.numel()), "curves": {}, "memory": {}}
    for name in LOSSES:
        torch.manual_seed(0)
        model = TinyLM(mask.numel())
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        curve = []
        t0 = time.perf_counter()
        for step, (x, y) in enumerate(batches(train_ids, 1, args.steps), 1):
            h = model.hidden(x)
            loss = sparsenorm.fused_linear_loss(h.reshape(-1, DIM), model.head.weight, y.reshape(-1),
                                                normalizer=name, vocab_mask=mask)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 25 == 0 or step == 1:
                acc, support = evaluate(model, name, held_out, mask)
                curve.append({"step": step, "loss": loss.item(), "held_out_accuracy": acc, "support": support})
                print(name, curve[-1], flush=True)
        results["curves"][name] = {"points": curve, "seconds": time.perf_counter() - t0}
        h = model.hidden(next(batches(train_ids, 2, 1))[0]).detach().reshape(-1, DIM).requires_grad_()
        y = next(batches(train_ids, 2, 1))[1].reshape(-1)
        w = model.head.weight.detach().requires_grad_()
        single = registry.get(name).single_label_loss
        results["memory"][name] = {
            "fused": peak_growth(
                lambda: sparsenorm.fused_linear_loss(h, w, y, normalizer=name, vocab_mask=mask).backward()),
            "materialised": peak_growth(lambda: single(F.linear(h, w).masked_fill(~mask, float("-inf")), y).backward()),
        }
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, curve in results["curves"].items():
        steps = [c["step"] for c in curve["points"]]
        axes[0].plot(steps, [c["loss"] for c in curve["points"]], label=name)
        axes[1].plot(steps, [c["held_out_accuracy"] for c in curve["points"]], label=name)
    axes[0].set(xlabel="step", ylabel="training loss (each map's own)", title="fused losses")
    axes[1].set(xlabel="step", ylabel="held-out next-token accuracy", title="argmax accuracy")
    axes[0].legend()
    fig.savefig(args.out + ".png", dpi=100, bbox_inches="tight")


if __name__ == "__main__":
    main()
