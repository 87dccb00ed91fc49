"""The training loop, single-process or under ``torch.distributed`` (DDP; gloo on CPU, nccl on GPU).

Every rank walks the same seeded stream of *global* batches (token-bucketed, shuffled per epoch)
and takes the examples ``rank, rank + world, ...`` of each. The loss of a rank is its summed token
loss divided by the global batch's token count, times ``world`` (DDP averages gradients over ranks),
so the gradient equals a single process's on the same global batch. Dropout is reseeded from
(seed, step, rank) every step, so a run resumed from a checkpoint continues exactly as if it had
not stopped.

Launched by :func:`launch` as ``torchrun --standalone --nproc_per_node N -m
sparsenorm.experiments.evsoftmax_translation.train SPEC.json``; the spec names the encoded data,
the settings, the attention normalizers, the seed and the checkpoint path. Rank 0 writes the
checkpoint (every ``checkpoint_every`` steps and at the end); the evaluation then runs in the
parent process.
"""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ... import registry
from .._shared.checkpoints import save_atomically
from .._shared.devices import mixed_precision, to_device
from .._shared.timing import progress
from .model import EOS, PAD, ModelConfig, Seq2Seq

Example = Tuple[List[int], List[int]]  # source ids, target ids (with BOS ... EOS)


def global_batches(examples: List[Example], max_tokens: int, seed: int, min_size: int = 1) -> Iterator[List[int]]:
    """An endless seeded stream of batches of example indices, each at most ``max_tokens`` padded
    source+target tokens (at least ``min_size`` examples: one per rank). Examples of similar length
    are batched together; the order of batches is shuffled anew each epoch."""
    epoch = 0
    while True:
        rng = random.Random(seed * 1_000_003 + epoch)
        order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]) + rng.random(), len(examples[i][1])))
        batches, current, longest = [], [], 0
        for i in order:
            n = len(examples[i][0]) + len(examples[i][1])
            if current and max(longest, n) * (len(current) + 1) > max_tokens and len(current) >= min_size:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, n)
        if current:
            batches.append(current)
        rng.shuffle(batches)
        yield from batches
        epoch += 1


def collate(examples: List[Example], device: torch.device) -> Tuple[Tensor, Tensor, Tensor]:
    """Padded source (B, S), decoder input (B, T) and decoder target (B, T), padding = PAD."""
    src_len = max(len(s) for s, _ in examples)
    tgt_len = max(len(t) for _, t in examples) - 1
    src = torch.full((len(examples), src_len), PAD, dtype=torch.long)
    tgt = torch.full((len(examples), tgt_len + 1), PAD, dtype=torch.long)
    for i, (s, t) in enumerate(examples):
        src[i, :len(s)] = torch.tensor(s)
        tgt[i, :len(t)] = torch.tensor(t)
    tgt_in = tgt[:, :-1].masked_fill(tgt[:, :-1] == EOS, PAD)  # EOS is never an input: shorter rows end here
    return to_device(src, device), to_device(tgt_in, device), to_device(tgt[:, 1:], device)


def target_positions(examples: List[Example], device: torch.device) -> Tensor:
    """The row-major flat positions of the non-padding decoder targets of ``collate(examples)``
    (``(tgt_out != PAD).flatten().nonzero()``), from the lengths on the host: selecting them with
    a boolean mask on the device would read its count back, a host sync every step."""
    width = max(len(t) for _, t in examples) - 1
    positions = [i * width + j for i, (_, t) in enumerate(examples) for j in range(len(t) - 1)]
    return to_device(torch.tensor(positions, dtype=torch.long), device)


# Loss families whose floating target is a class distribution q (loss gradient p - q): cross-entropy,
# ev-softmax's NLL and the Fenchel-Young losses. Label smoothing means q = (1 - e) one-hot + e / V there.
# The r-/t-softmax and sparsehourglass losses read a floating target as multi-hot labels instead.
_DISTRIBUTION_LOSSES = ("torch.nn.functional", "sparsenorm.losses.evidential", "sparsenorm.losses.fenchel_young")


def output_loss(name: str, label_smoothing: float) -> Tuple[Callable[[Tensor, Tensor], Tensor], bool]:
    """``(loss(logits (N, V), target (N,)) -> summed loss, smoothed?)`` for the output normalizer:
    the registry's single-label loss, with label smoothing where that loss takes a class distribution."""
    loss = registry.get(name).single_label_loss
    module = getattr(getattr(loss, "func", loss), "__module__", "")
    if label_smoothing <= 0 or module not in _DISTRIBUTION_LOSSES:
        return (lambda z, y: loss(z, y, reduction="sum")), False

    def smoothed(z: Tensor, y: Tensor) -> Tensor:
        q = torch.full_like(z, label_smoothing / z.shape[-1])
        q.scatter_add_(1, y[:, None], torch.full_like(q[:, :1], 1 - label_smoothing))
        return loss(z, q, reduction="sum")

    return smoothed, True


def noam_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then ``peak * sqrt(warmup / step)`` (Vaswani et al.)."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def _rank_world() -> Tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_model(spec: Dict[str, Any]) -> Seq2Seq:
    return Seq2Seq(ModelConfig(**spec["model"]), {k: (v[0], dict(v[1])) for k, v in spec["attention"].items()})


def train(spec: Dict[str, Any], train_examples: List[Example], device: torch.device,
          log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Train the model of ``spec`` (see :func:`launch`); returns ``{"model", "history", "world_size"}``.

    ``spec``: ``model`` (ModelConfig fields), ``attention`` (site -> [normalizer, params]),
    ``output`` (output normalizer), ``seed``, ``steps``, ``max_tokens``, ``lr``, ``warmup``,
    ``label_smoothing``, ``clip``, ``checkpoint`` (path or None), ``checkpoint_every``, ``resume``.
    """
    rank, world = _rank_world()
    seed = spec["seed"]
    torch.manual_seed(seed)  # the same initial parameters on every rank
    model = build_model(spec).to(device)
    ddp = model
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(model,
                                                        device_ids=[device.index] if device.type == "cuda" else None)
    optim = torch.optim.Adam(model.parameters(), lr=spec["lr"], betas=(0.9, 0.98), eps=1e-9)
    loss_fn, _ = output_loss(spec["output"], spec["label_smoothing"])
    history: List[List[float]] = []  # [step, mean token loss of the global batch]
    pending: List[Tuple[int, Tensor, int]] = []  # steps whose loss is still on the device
    start = 0
    ckpt = Path(spec["checkpoint"]) if spec.get("checkpoint") else None
    if ckpt is not None and spec.get("resume") and ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start, history = state["step"], state["history"]
    stream = global_batches(train_examples, spec["max_tokens"], seed, min_size=world)
    for _ in range(start):  # the batches already trained on (index lists only)
        next(stream)
    model.train()
    steps = spec["steps"]
    bar = progress(range(start, steps), total=steps - start, desc=f"train {spec['attention']['cross'][0]} seed {seed}")
    for step in bar if rank == 0 else range(start, steps):
        batch = next(stream)
        examples = [train_examples[i] for i in batch[rank::world]]
        src, tgt_in, tgt_out = collate(examples, device)
        targets = target_positions(examples, device)
        global_tokens = sum(len(train_examples[i][1]) - 1 for i in batch)
        torch.manual_seed(seed * 1_000_003 + step * 1009 + rank)  # dropout: exact on resume
        for group in optim.param_groups:
            group["lr"] = noam_lr(step + 1, spec["lr"], spec["warmup"])
        with mixed_precision(device):
            feats = ddp(src, tgt_in)
            loss_sum = loss_fn(model.out(feats.flatten(0, 1)[targets]), tgt_out.flatten()[targets])
        optim.zero_grad(set_to_none=True)
        (loss_sum * (world / global_tokens)).backward()
        if spec["clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        optim.step()
        total = loss_sum.detach().to(torch.float32, copy=True)  # (a copy: all_reduce works in place)
        if world > 1:
            dist.all_reduce(total)
        pending.append((step + 1, total, global_tokens))
        saving = ckpt is not None and rank == 0 and ((step + 1) % spec["checkpoint_every"] == 0 or step + 1 == steps)
        if saving or len(pending) == LOSS_READ_EVERY or step + 1 == steps:
            _record_losses(pending, history)
        if saving:
            _save(ckpt, model, optim, step + 1, history)
    return {"model": model, "history": history, "world_size": world}


LOSS_READ_EVERY = 50
"""Training steps whose losses are read from the device together (one host sync per that many)."""


def _record_losses(pending: List[Tuple[int, Tensor, int]], history: List[List[float]]) -> None:
    """Append ``[step, mean token loss]`` for the pending steps to ``history``; fail on a non-finite one."""
    values = torch.stack([t for _, t, _ in pending]).tolist()
    for (step, _, tokens), value in zip(pending, values):
        history.append([step, value / tokens])
        if not math.isfinite(history[-1][1]):
            raise FloatingPointError(f"training loss is {history[-1][1]} at step {step}")
    pending.clear()


def _save(path: Path, model, optim, step: int, history) -> None:
    save_atomically({"model": model.state_dict(), "optim": optim.state_dict(), "step": step, "history": history}, path)


def launch(spec: Dict[str, Any], data_path: Path, nproc: int, spec_path: Path) -> Dict[str, Any]:
    """Run :func:`main` under ``torchrun`` with ``nproc`` processes; return the final checkpoint."""
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps({**spec, "data": str(data_path)}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "sparsenorm.experiments.evsoftmax_translation.train", str(spec_path)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"distributed training failed (exit {result.returncode}):\n{tail}")
    return torch.load(spec["checkpoint"], map_location="cpu", weights_only=True)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of each torchrun process: ``python -m ...train SPEC.json``."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available() and spec.get("device", "cpu") != "cpu":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(spec.get("threads", 1))
    dist.init_process_group(backend)
    try:
        data = torch.load(spec["data"], weights_only=True)
        result = train(spec, data["train"], device)
        if spec.get("dump_params"):  # the DDP test: every rank's final parameters
            flat = torch.cat([p.detach().reshape(-1).cpu() for p in result["model"].parameters()])
            torch.save({"params": flat, "history": result["history"]}, f"{spec['dump_params']}.rank{dist.get_rank()}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
