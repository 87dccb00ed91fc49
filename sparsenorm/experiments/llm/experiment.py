"""``sparsenorm reproduce llm``: post-hoc sparse attention and sparse next-token distributions in SmolLM2-135M.

sparsenorm's own experiment (issue 37), not a paper's. No weight is trained: the softmax-trained
model's attention is swapped for each normalizer (every layer; and one layer at a time), and its
next-token logits are normalized sparsely, on chunks of English text not used for calibration (the paired units).

Jobs (one seed: nothing here is random): ``attention-<variant>`` (NLL per chunk, attention kept per layer
and head, greedy continuations), ``sweep-<variant>`` (one layer sparse at a time) and ``next-token``
(output normalizers beside calibrated top-k / top-p / min-p).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from ..._text import UserFacingError, positive_int
from .._shared.timing import progress
from .._shared.runner import Experiment, Job, Report, RunConfig, RunOptions
from .paper import (
    ALPHA_BRACKET, ALPHA_STEPS, ATTENTION, DECISIVE, FULL, GATE, LAYER_SWEEP, MATCHED_RIVALS, MODEL_NAME, OUTPUT, PAPER,
    QUICK, SECOND_TEXT,
)


@dataclass
class Settings:
    attention: List[str]
    sweep: List[str]
    output: List[str]
    chunks: int
    calibration_chunks: int
    chunk_tokens: int
    prompt_tokens: int
    new_tokens: int
    sweep_chunks: int
    sweep_tokens: int
    model: str
    data: str
    matched: List[str] = None
    """The sparsity-matched rivals of post-hoc ev-softmax (:data:`.paper.MATCHED_RIVALS`) run beside it."""
    seeds: int = 1
    """Nothing is random (no training, greedy decoding): one run; the paired units are the chunks."""

    @property
    def paired_units(self) -> int:
        """What every claim pairs: the evaluation chunks."""
        return self.chunks


class LLMExperiment(Experiment):
    name = "llm"
    regime_gate = GATE  # the regime (paper.py): checked on every run, see _shared/regime.py
    description = ("Post-hoc sparse attention and sparse next-token distributions in a pretrained LM (sparsenorm's own "
                   f"experiment): {MODEL_NAME} without training, on chunks of Jane Austen's novels not used for "
                   "calibration")
    paper = PAPER
    default_normalizers = ["softmax", "posthoc_evidential", "entmax_bisect", "entmax15", "sparsemax", "ev_softmax"]
    full_runtime = ("Full mode (48 chunks of 512 tokens, 32-token greedy continuations, the per-layer sweep on 8 "
                    "chunks of "
                    "512 tokens) is estimated at about 7,000 CPU-s, 1 h on 2 idle cores (decisive mode's measured 1160 "
                    "CPU-s scaled by chunks and tokens); not run.")
    decisive_note = ("Decisive mode: 16 evaluation chunks of 384 tokens (the paired units; 6 are the fewest with which "
                     "the rule can decide) and 4 calibration chunks, 24-token greedy continuations after 192 tokens, "
                     "the "
                     "per-layer sweep on 3 chunks of 256 tokens: 1160 CPU-s in its jobs (measured), about 10 min on "
                     "2 cores "
                     "(estimated from that; it took 38 min on the 2 shared cores under a load of about 6). Leaves "
                     "out: longer contexts (the model was trained to "
                     "8k tokens), other models, sampling quality judged by people.")
    quick_note = ("Quick mode scores 5 chunks of 192 tokens (2 calibration chunks), 12-token greedy continuations, and "
                  "the per-layer sweep on 1 chunk of 128 tokens: fewer chunks than the 6 with which the rule can "
                  "decide, "
                  "and short contexts.")
    fingerprint_exclude = ("attention", "sweep", "output", "matched")  # each job carries its variant

    def add_arguments(self, parser) -> None:
        parser.add_argument("--model-dir", type=Path,
                            help=f"a Hugging Face causal LM folder (config, weights, tokenizer) instead of "
                                 f"{MODEL_NAME}")
        parser.add_argument("--chunks", type=positive_int("--chunks"),
                            help="evaluation chunks of the text (the paired units; never used for calibration)")
        parser.add_argument("--text", choices=("austen", SECOND_TEXT[0]),
                            help="the evaluation text: Jane Austen's novels (default) or the Debian Policy Manual "
                                 "(technical prose); --data-dir gives your own")
        parser.add_argument("--chunk-tokens", type=positive_int("--chunk-tokens"), help="tokens per chunk")

    def settings(self, config: RunConfig) -> Settings:
        base = {"quick": QUICK, "decisive": DECISIVE, "full": FULL}[config.mode]
        extra = config.extra
        if config.seeds not in (None, 1):
            raise UserFacingError(f"llm has no seeds (no training, greedy decoding: nothing is random), got --seeds "
                                  f"{config.seeds}; its paired units are chunks of text: ask for more with --chunks")
        attention, output = list(ATTENTION), list(OUTPUT)
        if config.normalizers:
            wanted = set(config.normalizers) | {"softmax"}
            attention = [a for a in attention if ATTENTION[a][0] in wanted]
            output = [o for o in output
                      if OUTPUT[o][0] in wanted or (o == "ev_softmax" and "posthoc_evidential" in wanted)]
        chunk_tokens = extra.get("chunk_tokens") or base["chunk_tokens"]
        prompt = min(base["prompt_tokens"], chunk_tokens // 2)
        if chunk_tokens < 8:
            raise UserFacingError(f"--chunk-tokens must be at least 8, got {chunk_tokens}")
        model_dir = extra.get("model_dir")
        return Settings(
            attention=attention, sweep=[s for s in LAYER_SWEEP if s in attention], output=output,
            chunks=extra.get("chunks") or base["chunks"], calibration_chunks=base["calibration_chunks"],
            chunk_tokens=chunk_tokens, prompt_tokens=prompt, new_tokens=base["new_tokens"],
            sweep_chunks=min(base["sweep_chunks"], extra.get("chunks") or base["chunks"]),
            sweep_tokens=min(base["sweep_tokens"], chunk_tokens),
            model=str(model_dir) if model_dir else MODEL_NAME,
            data=str(config.data_dir) if config.data_dir else (
                "debian_policy" if extra.get("text") == SECOND_TEXT[0] else "jane_austen"),
            matched=list(MATCHED_RIVALS) if "posthoc_evidential" in attention else [],
        )

    def run_options(self, settings: Settings, device: torch.device) -> RunOptions:
        # Two single-threaded jobs at once use 2 cores better than one job on two threads (a small model, batch 1).
        return RunOptions(threads=1, workers=min(2, os.cpu_count() or 1))

    def prepare(self, settings: Settings, config: RunConfig, device: torch.device) -> Dict[str, Any]:
        from transformers import AutoTokenizer

        from .data import load_texts, make_chunks
        from .model import weights_dir

        weights = weights_dir(Path(settings.model) if settings.model != MODEL_NAME else None)
        texts, description = load_texts(config.data_dir, "debian-policy" if settings.data == "debian_policy"
                                        else "austen")
        try:
            tokenizer = AutoTokenizer.from_pretrained(weights)
        except (OSError, ValueError) as exc:
            raise UserFacingError(f"cannot load the tokenizer of {weights}: {exc}") from None
        chunks = make_chunks(texts, tokenizer, settings.chunks, settings.calibration_chunks, settings.chunk_tokens)
        return {"weights": str(weights), "text": description,
                "eval": [c for c in chunks if not c.calibration], "calibration": [c for c in chunks if c.calibration]}

    def jobs(self, settings: Settings, config: RunConfig) -> List[Job]:
        jobs = [Job("next-token", 0, {"kind": "next_token"})] if settings.output else []
        jobs += [Job(f"sweep-{s}", 0, {"kind": "sweep", "label": s}) for s in settings.sweep]
        jobs += [Job(f"attention-{a}", 0, {"kind": "attention", "label": a}) for a in settings.attention]
        jobs += [Job(f"attention-{m}", 0, {"kind": "matched", "label": m}) for m in (settings.matched or [])]
        return jobs

    def run_job(self, job: Job, context: Dict[str, Any], settings: Settings, device: torch.device) -> Dict[str, Any]:
        from . import evaluate
        from .model import attention_name, load_model

        start, cpu = time.perf_counter(), time.process_time()
        _, model = load_model(Path(context["weights"]))
        model.to(device)
        kind, label = job.params["kind"], job.params.get("label")
        bar = lambda desc: (lambda xs: progress(xs, desc=f"{job.key} {desc}"))  # noqa: E731
        if kind == "attention":
            name, params = ATTENTION[label]
            record = evaluate.attention_run(model, context["eval"], attention_name(label, name, params),
                                            settings.prompt_tokens, settings.new_tokens, progress=bar("chunks"))
        elif kind == "matched":
            record = evaluate.matched_run(model, context["calibration"], context["eval"], label, settings.prompt_tokens,
                                          settings.new_tokens, ALPHA_BRACKET, ALPHA_STEPS, progress=bar("calibration"))
            kind = "attention"  # scored as every attention variant; its calibration is in record["match"]
        elif kind == "sweep":
            name, params = ATTENTION[label]
            record = evaluate.layer_sweep(model, context["eval"][:settings.sweep_chunks], label, name, params,
                                          settings.sweep_tokens, progress=bar("layers"))
        else:
            record = evaluate.next_token_run(model, context["calibration"], context["eval"],
                                             {o: OUTPUT[o] for o in settings.output}, progress=bar("chunks"))
        record.update({"key": job.key, "kind": kind, "label": label,
                       "job_seconds": round(time.perf_counter() - start, 1),
                       "job_cpu_seconds": round(time.process_time() - cpu, 1)})
        return record

    def report(self, out: Path, summary: Dict[str, Any], records: List[Dict[str, Any]], settings: Settings,
               context: Optional[Dict[str, Any]]) -> Report:
        from .report import write_report

        return write_report(out, summary, records, settings, context)


EXPERIMENT = LLMExperiment()
