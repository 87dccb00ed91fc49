"""Whole-model generation speed: sparsenorm attention implementations against ``attn_implementation="sdpa"``.

    python -m benchmarks.bench_generate [--model PATH] [--layers N] [--prompt 512] [--new-tokens 16]
        [--rounds 5] [--impls sdpa,sparsenorm_softmax,sparsenorm_ev_softmax] [--json FILE] [--profile DIR]
    python -m benchmarks.bench_generate --report FILE.json

The model is a local Hugging Face causal LM folder (``--model``), else SmolLM2-135M's
architecture (transformers ``LlamaConfig``: 30 layers, hidden 576, 9 query / 3 key-value heads,
vocabulary 49,152) with random weights, float32. Two cases: batch 1 with a ``--prompt``-token
prompt, and a left-padded batch of 4 (prompts of ``prompt``, ``7/8``, ``3/4`` and ``5/8`` of it,
padded on the left to ``prompt``), as batched ``generate()`` pads. Per case and implementation:
the prefill (one forward over the prompt into a ``DynamicCache``) and the mean time of one
decoded token over ``--new-tokens`` greedy steps (one query per sequence over the cache, the
attention mask and position ids extended as ``generate`` does). Medians over ``--rounds``
interleaved rounds (each round runs every implementation once, in a fresh random order), wall
clock (or, ``--clock thread`` with ``--threads 1``, the process's one thread's CPU time, which
other processes' load does not inflate), ``torch.inference_mode``. Ratios are to sdpa's medians. Targets (issue 37):
``sparsenorm_ev_softmax`` <= 1.1x, ``sparsenorm_softmax`` <= 1.05x.

``--profile DIR`` writes, per case and implementation, torch.profiler's table of one prefill and of
one decoded token (operators by self CPU time) to ``DIR/generate_<impl>_<case>_<phase>.txt``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from typing import Dict

import torch

from benchmarks.bench import cpu_model, machine_load

SCHEMA = "sparsenorm.bench_generate/1"
TARGET = {"sparsenorm_softmax": 1.05, "sparsenorm_ev_softmax": 1.1}
DEFAULT_IMPLS = "sdpa,sparsenorm_softmax,sparsenorm_ev_softmax"


def build_model(path, layers):
    import transformers

    import sparsenorm.hf  # noqa: F401  registers the sparsenorm implementations

    if path:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        name = path
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
            tie_word_embeddings=True, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg)
        name = f"SmolLM2-135M architecture, random weights, {layers} layers"
    return model.float().eval(), name


def make_case(batch: int, prompt: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, prompt), generator=g)
    mask = torch.ones(batch, prompt, dtype=torch.long)
    if batch > 1:
        for b, frac in enumerate((1.0, 7 / 8, 3 / 4, 5 / 8)[:batch]):
            pad = prompt - int(prompt * frac)
            ids[b, :pad] = 0
            mask[b, :pad] = 0
    return ids, mask


def positions(mask):
    return (mask.cumsum(-1) - 1).clamp_min(0)


def prefill(model, ids, mask):
    import transformers

    cache = transformers.DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), past_key_values=cache,
                use_cache=True, logits_to_keep=1)  # as generate(): the last position's logits only
    return out.logits[:, -1].argmax(-1, keepdim=True), out.past_key_values


def decode_step(model, token, mask, cache):
    mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
    out = model(input_ids=token, attention_mask=mask, position_ids=positions(mask)[:, -1:], past_key_values=cache,
                use_cache=True)
    return out.logits[:, -1].argmax(-1, keepdim=True), mask


def run(model, impl, ids, mask, new_tokens, clock=time.perf_counter):
    """(prefill seconds, mean seconds per decoded token, the generated tokens)."""
    model.set_attn_implementation(impl)
    t0 = clock()
    token, cache = prefill(model, ids, mask)
    t1 = clock()
    tokens = [token]
    for _ in range(new_tokens):
        token, mask = decode_step(model, token, mask, cache)
        tokens.append(token)
    t2 = clock()
    return t1 - t0, (t2 - t1) / max(new_tokens, 1), torch.cat(tokens, 1)


def paired_decode(model, impls, ids, mask, steps, clock):
    """Per decoded token, every implementation in turn (alternating the order), each on its own
    cache prefilled by itself: ``{impl: [seconds per step]}``. Adjacent steps share the machine's
    load of the moment, so the per-step ratios are steadier than whole-round medians."""
    state = {}
    for impl in impls:
        model.set_attn_implementation(impl)
        token, cache = prefill(model, ids, mask)
        state[impl] = (token, mask, cache)
    times = {impl: [] for impl in impls}
    for step in range(steps):
        for impl in (impls if step % 2 == 0 else impls[::-1]):
            model.set_attn_implementation(impl)
            token, m, cache = state[impl]
            t0 = clock()
            token, m = decode_step(model, token, m, cache)
            times[impl].append(clock() - t0)
            state[impl] = (token, m, cache)
    return times


def profile(model, impl, ids, mask, out_dir, case):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model.set_attn_implementation(impl)
    os.makedirs(out_dir, exist_ok=True)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        token, cache = prefill(model, ids, mask)
    with open(os.path.join(out_dir, f"generate_{impl}_{case}_prefill.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    token, mask = decode_step(model, token, mask, cache)  # warm
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        decode_step(model, token, mask, cache)
    with open(os.path.join(out_dir, f"generate_{impl}_{case}_decode.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def paired_ratio(r: Dict, base: Dict, phase: str) -> float:
    """The median over rounds of this implementation's time over sdpa's in the same round (the
    rounds are interleaved, so a pair shares the machine's load of the moment)."""
    return statistics.median(a / b for a, b in zip(r[f"{phase}_all_s"], base[f"{phase}_all_s"]))


def report(results: Dict) -> str:
    lines = [f"{results['model']}; prompt {results['prompt']}, {results['new_tokens']} decoded tokens; "
             f"{results['threads']} thread(s), {results.get('clock', 'wall')} clock, {results['cpu']}; "
             f"median of {results['rounds']} interleaved rounds "
             f"({results['label']}). x sdpa: ratio of the medians; paired: median of the per-round ratios", "",
             "| case | implementation | prefill (s) | x sdpa | paired | per token (ms) | x sdpa | paired | target "
             "| tokens = sdpa's |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case, rows in results["cases"].items():
        base = rows["sdpa"]
        for impl, r in rows.items():
            if impl == "paired_decode_steps_s":
                continue
            target = TARGET.get(impl)
            lines.append(f"| {case} | {impl} | {r['prefill_s']:.3f} | {r['prefill_s'] / base['prefill_s']:.2f} | "
                         f"{paired_ratio(r, base, 'prefill'):.2f} | {1000 * r['decode_s']:.1f} | "
                         f"{r['decode_s'] / base['decode_s']:.2f} | {paired_ratio(r, base, 'decode'):.2f} | "
                         f"{'' if target is None else f'<= {target}'} | {r.get('same_tokens_as_sdpa', '')} |")
    steps = {case: rows["paired_decode_steps_s"] for case, rows in results["cases"].items()
             if "paired_decode_steps_s" in rows}
    if steps:
        lines += ["", "Decoded tokens timed step by step, the implementations interleaved (each on its own cache):", "",
                  "| case | implementation | per token (ms) | paired x sdpa | target |",
                  "| --- | --- | --- | --- | --- |"]
        for case, times in steps.items():
            base = times["sdpa"]
            for impl, t in times.items():
                ratio = statistics.median(a / b for a, b in zip(t, base))
                target = TARGET.get(impl)
                lines.append(f"| {case} | {impl} | {1000 * statistics.median(t):.1f} | {ratio:.3f} | "
                             f"{'' if target is None else f'<= {target}'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a local Hugging Face causal LM folder (default: random SmolLM2)")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--impls", default=DEFAULT_IMPLS)
    p.add_argument("--cases", default="batch1,padded4")
    p.add_argument("--label", default="loaded cores")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="wall clock, or this thread's CPU time (with --threads 1: robust to other load)")
    p.add_argument("--json")
    p.add_argument("--profile", default=None, help="write torch.profiler tables to this folder")
    p.add_argument("--paired-decode-steps", type=int, default=0,
                   help="also time this many decoded tokens with the implementations interleaved step by step")
    p.add_argument("--report")
    args = p.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    impls = args.impls.split(",")
    if "sdpa" not in impls:
        impls = ["sdpa"] + impls
    model, name = build_model(args.model, args.layers)
    vocab = model.config.vocab_size
    cases = {c: make_case(1 if c == "batch1" else 4, args.prompt, vocab) for c in args.cases.split(",")}
    load_start = machine_load()
    times = {c: {i: {"prefill": [], "decode": []} for i in impls} for c in cases}
    tokens = {c: {} for c in cases}
    with torch.inference_mode():
        for c, (ids, mask) in cases.items():  # warm-up: one short run of each
            for impl in impls:
                run(model, impl, ids[:, -64:], mask[:, -64:], 2)
        for r in range(args.rounds):
            for c, (ids, mask) in cases.items():
                order = list(impls)
                random.shuffle(order)
                for impl in order:
                    pre, dec, toks = run(model, impl, ids, mask, args.new_tokens, clock)
                    times[c][impl]["prefill"].append(pre)
                    times[c][impl]["decode"].append(dec)
                    tokens[c][impl] = toks
                    print(f"round {r} {c} {impl}: prefill {pre:.3f} s, {1000 * dec:.1f} ms/token", flush=True)
        paired = {}
        if args.paired_decode_steps:
            for c, (ids, mask) in cases.items():
                paired[c] = paired_decode(model, impls, ids, mask, args.paired_decode_steps, clock)
        if args.profile:
            for c, (ids, mask) in cases.items():
                for impl in impls:
                    profile(model, impl, ids, mask, args.profile, c)
    results = {"schema": SCHEMA, "model": name, "prompt": args.prompt, "new_tokens": args.new_tokens,
               "rounds": args.rounds, "threads": torch.get_num_threads(), "clock": args.clock, "cpu": cpu_model(),
               "label": args.label,
               "torch": torch.__version__, "load_at_start": load_start, "load_at_end": machine_load(),
               "cases": {}}
    for c in cases:
        results["cases"][c] = {}
        for impl in impls:
            t = times[c][impl]
            results["cases"][c][impl] = {
                "prefill_s": statistics.median(t["prefill"]), "decode_s": statistics.median(t["decode"]),
                "prefill_all_s": t["prefill"], "decode_all_s": t["decode"],
                "same_tokens_as_sdpa": bool(torch.equal(tokens[c][impl], tokens[c]["sdpa"])),
            }
    for c, times in paired.items():
        results["cases"][c]["paired_decode_steps_s"] = times
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
