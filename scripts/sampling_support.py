"""What temperature does to each sparse sampler's support on SmolLM2-135M-Instruct (the Hugging Face
guide's table), and what swapping the attention does to one greedy answer.

    python scripts/sampling_support.py [--model-dir DIR] [--chunks 4] [--tokens 384] [--json FILE]

The model: ``sparsenorm fetch-model smollm2`` (or ``--model-dir``). The text: the llm experiment's 4
calibration chunks of Jane Austen (``sparsenorm.experiments.llm.data``: the same chunks as its
report's calibration; 384 tokens each), the unmodified model's next-token logits at every position.
For each normalizer and temperature T: the mean support of ``normalizer(logits / T)`` (tokens with
nonzero probability) and the fraction of positions whose true next token is in it (coverage).
Then greedy 8 tokens after "The capital of France is" with sdpa and with each ``sparsenorm_*``
attention. Writes the figures as JSON (default ``docs/guide/sampling_support.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

TEMPERATURES = [0.5, 0.7, 1.0, 1.5, 2.0]
NORMALIZERS = {"ev_softmax": ("ev_softmax", {}), "entmax_bisect alpha=1.25": ("entmax_bisect", {"alpha": 1.25}),
               "entmax15": ("entmax15", {}), "sparsemax": ("sparsemax", {})}
PROMPT = "The capital of France is"
ATTENTION = ["sdpa", "sparsenorm_softmax", "sparsenorm_posthoc_evidential", "sparsenorm_entmax15",
             "sparsenorm_sparsemax"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--tokens", type=int, default=384)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=str(Path(__file__).resolve().parents[1] / "docs/guide/sampling_support.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    import sparsenorm.hf  # noqa: F401  (registers the sparsenorm_* attention implementations)
    from sparsenorm import registry
    from sparsenorm.experiments.llm.data import load_texts, make_chunks
    from sparsenorm.experiments.llm.model import fetch_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = args.model_dir or fetch_model()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa", dtype=torch.float32).eval()
    texts, source = load_texts()
    # the experiment's chunking (16 evaluation + 4 calibration chunks); its calibration chunks here
    chunks = [c for c in make_chunks(texts, tokenizer, 16, args.chunks, args.tokens) if c.calibration]
    t0 = time.perf_counter()
    with torch.no_grad():
        logits, targets = [], []
        for c in chunks:
            ids = torch.tensor([c.ids])
            logits.append(model(ids).logits[0, :-1].float())
            targets.append(ids[0, 1:])
    logits, targets = torch.cat(logits), torch.cat(targets)
    table = {}
    for label, (name, params) in NORMALIZERS.items():
        form = registry.get(name, **params).for_mode(training=False)
        table[label] = {}
        for t in TEMPERATURES:
            kept = form.forward(logits / t, dim=-1) > 0
            table[label][str(t)] = {"mean_support": float(kept.sum(-1).double().mean()),
                                    "coverage": float(kept.gather(-1, targets[:, None]).double().mean())}
            print(f"{label:26s} T={t}: support {table[label][str(t)]['mean_support']:9.1f}, "
                  f"coverage {table[label][str(t)]['coverage']:.3f}", flush=True)
    scale = {"logit_std_per_position": float(logits.std(-1).mean()),
             "mean_logit": float(logits.mean()), "max_minus_mean": float((logits.max(-1).values
                                                                           - logits.mean(-1)).mean())}
    greedy = {}
    batch = tokenizer([PROMPT], return_tensors="pt")
    for impl in ATTENTION:
        model.set_attn_implementation(impl)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=8, do_sample=False)
        greedy[impl] = tokenizer.decode(out[0, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        print(f"{impl}: {greedy[impl]!r}", flush=True)
    result = {"model": str(folder), "text": source, "chunks": [c.source for c in chunks], "positions": len(targets),
              "temperatures": TEMPERATURES, "support": table, "logits": scale, "greedy_prompt": PROMPT,
              "greedy_8_tokens": greedy, "torch": torch.__version__, "seconds": time.perf_counter() - t0}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
