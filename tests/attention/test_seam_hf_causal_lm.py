"""The seam with Hugging Face causal LMs (issue 50, item 4), on a tiny random Llama built from a
config and saved to ``tmp_path`` with a word-level tokenizer (no network, no model cache):

* the Hugging Face guide's causal-LM example (``docs/guide/huggingface.md``, the block after
  ``<!-- causal-lm-example -->``) runs as written, with only its folder replaced; its left-padded
  greedy batch gives each prompt's own greedy tokens;
* a misspelled ``sparsenorm_*`` ``attn_implementation`` gets sparsenorm's error, listing the
  registered names (other names keep transformers' error);
* ``sparsenorm fetch-model smollm2 --dir`` copies the converted model folder (the conversion itself
  is replaced by a tiny folder: the real one downloads 93 MB).
"""
import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import sparsenorm.hf as snhf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORDS = ["The", "capital", "of", "France", "is", "Water", "boils", "at", "a", "temperature", "Paris", "the", "city",
         "and", "hot", "100", "degrees", "."]


def save_tiny_llama(folder: Path) -> Path:
    """A 2-layer random Llama and a word-level tokenizer (no pad token, padding on the right by
    default, as SmolLM2's), saved as a Hugging Face folder."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece()  # joins the words with spaces
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=None)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def guide_example() -> str:
    text = (REPO / "docs" / "guide" / "huggingface.md").read_text()
    block = text.split("<!-- causal-lm-example -->", 1)[1]
    return re.search(r"```python\n(.*?)```", block, re.S).group(1)


def test_the_guides_causal_lm_example_runs_on_a_tiny_local_llama(tmp_path, monkeypatch, capsys):
    folder = save_tiny_llama(tmp_path / "tiny-llama")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = guide_example()
    folder_line = re.search(r'^folder = "SmolLM2-135M-Instruct".*$', code, re.M)
    assert folder_line, "the example names its folder on one line"
    code = code.replace(folder_line.group(0), f"folder = {str(folder)!r}")
    namespace: dict = {}
    exec(compile(code, "docs/guide/huggingface.md", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "mean attended keys per query" in printed
    tokenizer, model, batch, greedy = (namespace[k] for k in ("tokenizer", "model", "batch", "greedy"))
    assert tokenizer.padding_side == "left"
    assert bool((batch["attention_mask"][:, 0] == 0).any()), "the prompts differ in length: one row is padded"
    assert namespace["sampled"].shape == greedy.shape
    assert namespace["stats"].layers, "record() saw the sparsenorm attention"
    # left padding is right: each row's greedy tokens are those of its prompt alone
    start = batch["input_ids"].shape[1]
    for i, prompt in enumerate(namespace["prompts"]):
        alone = tokenizer([prompt], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**alone, max_new_tokens=8, do_sample=False)
        assert torch.equal(out[0, alone["input_ids"].shape[1]:], greedy[i, start:])


def test_a_misspelled_sparsenorm_name_lists_the_registered_ones(tmp_path):
    folder = save_tiny_llama(tmp_path / "tiny-llama")
    expected = (r"'sparsenorm_evsoftmax' is not a registered sparsenorm attention "
                r"\(did you mean 'sparsenorm_ev_softmax'\?\); registered: .*sparsenorm_sparsemax")
    with pytest.raises(ValueError, match=expected):
        transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sparsenorm_evsoftmax")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sparsenorm_ev_softmax")
    with pytest.raises(ValueError, match="registered: .*sparsenorm_entmax15"):
        model.set_attn_implementation("sparsenorm_entmax_15")
    with pytest.raises(ValueError, match="is not supported"):  # not ours: transformers' own error
        model.set_attn_implementation("sdpaa")
    name = snhf.register("entmax_bisect", name="sparsenorm_entmax13_test", alpha=1.3)
    model.set_attn_implementation(name)  # a name registered later is known too


def test_fetch_model_cli_copies_the_converted_folder(tmp_path, monkeypatch, capsys):
    from sparsenorm import cli
    from sparsenorm.experiments.llm import model as llm_model

    cached = save_tiny_llama(tmp_path / "cache" / "SmolLM2-135M-Instruct")
    monkeypatch.setattr(llm_model, "weights_dir", lambda model_dir=None: cached)
    target = tmp_path / "out" / "smollm2"
    assert cli.main(["fetch-model", "smollm2", "--dir", str(target)]) == 0
    assert str(target) in capsys.readouterr().out
    loaded = transformers.AutoModelForCausalLM.from_pretrained(target, attn_implementation="sparsenorm_softmax")
    assert loaded.config.vocab_size == len(WORDS) + 3
    assert cli.main(["fetch-model", "smollm2"]) == 0  # no --dir: the cached folder
    assert str(cached) in capsys.readouterr().out
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert cli.main(["fetch-model", "smollm2", "--dir", str(busy)]) == 2
    assert "--dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["fetch-model", "gpt2"])
