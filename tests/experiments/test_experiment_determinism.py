"""Same seed, same parameters (issue 25, item 5): one training step of each experiment, twice from
the same seed, gives bitwise-identical parameters, with and without
``torch.use_deterministic_algorithms(True)`` (the ``deterministic_mode`` fixture, ``tests/conftest.py``).

Each experiment's own model and loss at the tiny sizes its tests use; one step of Adam (the
fine-tuning experiment: its own ``fine_tune`` for one step). The normalizers with fused CPU kernels
(from the registry) are the ones whose threading could break this, so each step runs with each of
them where the experiment takes a normalizer.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sparsenorm import registry
from sparsenorm.experiments.evsoftmax_cvae import model as cvae_model
from sparsenorm.experiments.evsoftmax_ssvae import model as ssvae_model
from sparsenorm.experiments.evsoftmax_ssvae import train as ssvae_train
from sparsenorm.experiments.evsoftmax_vqvae.train import code_rows, prior_loss
from sparsenorm.experiments.evsoftmax_vqvae.pixelcnn import GatedPixelCNN
from sparsenorm.experiments.rsoftmax_multilabel import methods as ml

KERNEL_NORMALIZERS = [n for n in registry.names() if registry.get(n).cpu_kernel]


def normalizers(headline: str):
    """The experiment's headline normalizer in the default suite, the other kernel ones under ``-m slow``."""
    return pytest.mark.parametrize("name", [n if n == headline else pytest.param(n, marks=pytest.mark.slow)
                                            for n in KERNEL_NORMALIZERS])


def one_adam_step(build, loss_of, seed=0):
    """Parameters after one Adam step of ``loss_of(model)`` from ``build()``, all seeded by ``seed``."""
    torch.manual_seed(seed)
    model = build()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = loss_of(model)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_parameters(first, second):
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), f"parameter {key} differs between two seeded runs"


def run_twice(step):
    first, second, other_seed = step(0), step(0), step(1)
    assert_same_parameters(first, second)
    assert any(not torch.equal(first[k], other_seed[k]) for k in first), "the seed must matter"


def _cvae_step(name, seed):
    norm = registry.get(name)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(16, 784, generator=gen)
    queries = len(cvae_model.QUERIES)
    y = torch.nn.functional.one_hot(torch.arange(16) % queries, queries).float()
    return one_adam_step(cvae_model.CVAE, lambda m: cvae_model.negative_elbo(
        m, norm, x, y, kl_weight=1.0, temperature=0.67, smoothing=1e-6,
        generator=torch.Generator().manual_seed(seed))[0],
        seed)


@normalizers("ev_softmax")
def test_cvae_step(name, deterministic_mode):
    run_twice(lambda seed: _cvae_step(name, seed))


@normalizers("ev_softmax")
def test_ssvae_step(name, deterministic_mode):
    norm = registry.get(name)

    def step(seed):
        gen = torch.Generator().manual_seed(seed)
        x = torch.bernoulli(torch.rand(8, 784, generator=gen), generator=gen)
        y = torch.arange(8) % 10

        def loss(model):
            labelled = ssvae_train.supervised_loss(model, norm, x, y, torch.Generator().manual_seed(seed))
            unlabelled = ssvae_train.unsupervised_loss(model, norm, x, torch.Generator().manual_seed(seed), 1.0)[0]
            return labelled + unlabelled

        return one_adam_step(ssvae_model.M2, loss, seed)

    run_twice(step)


@normalizers("ev_softmax")
def test_vqvae_prior_step(name, deterministic_mode):
    norm = registry.get(name)

    def step(seed):
        gen = torch.Generator().manual_seed(seed)
        codes, y = torch.randint(11, (4, 5, 5), generator=gen), torch.tensor([0, 2, 1, 0])

        def loss(prior):
            feats, target = code_rows(prior, codes, y)
            return prior_loss(norm, prior.out(feats), target)

        return one_adam_step(lambda: GatedPixelCNN(n_codes=11, n_classes=3, dim=8, layers=3), loss, seed)

    run_twice(step)


@normalizers("r_softmax")
def test_multilabel_step(name, deterministic_mode):
    method = ml.methods_for([name])[0]

    def step(seed):
        rng = np.random.default_rng(seed)
        x = torch.from_numpy(rng.normal(size=(32, 8)).astype(np.float32))
        y = torch.from_numpy((rng.normal(size=(32, 5)) > 0.3).astype(np.float32))
        y[y.sum(1) == 0, 0] = 1
        return one_adam_step(lambda: ml.MultilabelNet(8, 5, hidden=16, count_head=method.count_head),
                             lambda model: ml.training_loss(method, model, x, y), seed)

    run_twice(step)


@normalizers("ev_softmax")
def test_translation_step(name, deterministic_mode):
    from sparsenorm.experiments.evsoftmax_translation.model import BOS, EOS, SITES
    from sparsenorm.experiments.evsoftmax_translation.train import train

    def step(seed):
        rng = random.Random(seed)
        examples = []
        for _ in range(24):
            src = [rng.randrange(4, 30) for _ in range(rng.randint(2, 9))]
            examples.append((src + [EOS], [BOS] + src[::-1] + [EOS]))
        spec = {"model": dict(vocab=30, d_model=16, heads=2, ffn=32, enc_layers=1, dec_layers=1, dropout=0.1,
                              max_len=64),
                "attention": {s: [name, {}] for s in SITES}, "output": "softmax", "seed": seed, "steps": 1,
                "max_tokens": 120, "lr": 3e-3, "warmup": 2, "label_smoothing": 0.1, "clip": 1.0,
                "checkpoint": None, "checkpoint_every": 2, "resume": False}
        model = train(spec, examples, torch.device("cpu"))["model"]
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    run_twice(step)


@normalizers("r_softmax")
def test_finetune_step(name, deterministic_mode, tmp_path_factory):
    pytest.importorskip("transformers", reason="the [hf] extra is not installed")
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from sparsenorm.experiments.rsoftmax_finetune import data as ft_data
    from sparsenorm.experiments.rsoftmax_finetune import model as ft_model

    folder = tmp_path_factory.mktemp("tiny-bert-determinism")
    words = ["good", "bad", "film", "the", "a", "plot"]
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=11, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(folder)
    split = ft_data.Split([("the good film",), ("a bad plot",), ("good plot",), ("the bad film a",)],
                          np.array([1, 0, 1, 0]))

    def step(seed):
        tokenizer, model = ft_model.load_classifier(folder, 2, ft_model.attention_name(name, r=0.3)
                                                    if name == "r_softmax" else ft_model.attention_name(name),
                                                    seed=seed)
        torch.manual_seed(seed)  # dropout
        ft_model.fine_tune(model, tokenizer, split, epochs=1, batch_size=4, lr=1e-2, max_length=16, seed=seed,
                           max_steps=1)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    run_twice(step)
