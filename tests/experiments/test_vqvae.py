"""VQ-VAE experiment (ev-softmax Sec. 4.3): models, loaders, sampling, and a tiny end-to-end run."""
import gzip
import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from sparsenorm import cli, evidential, registry
from sparsenorm.experiments._shared import regime
from sparsenorm._text import UserFacingError
from sparsenorm.experiments._shared.fashion_mnist import load_fashion_mnist
from sparsenorm.experiments._shared.runner import RunOptions
from sparsenorm.experiments.evsoftmax_vqvae import EXPERIMENT
from sparsenorm.experiments.evsoftmax_vqvae import experiment as vq_experiment
from sparsenorm.experiments.evsoftmax_vqvae.data import load_images
from sparsenorm.experiments.evsoftmax_vqvae.evaluate import eval_probs, sample_codes
from sparsenorm.experiments.evsoftmax_vqvae.pixelcnn import GatedPixelCNN
from sparsenorm.experiments.evsoftmax_vqvae.vqvae import VectorQuantizer, VQVAE, VQVAEConfig, codebook_stats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def write_fake_idx(folder: Path, n_train: int = 120, n_test: int = 40, gz: bool = True) -> None:
    """Ten classes of 28x28 images: class c is a bright bar at rows 2c..2c+3, plus noise."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        y = (np.arange(n) % 10).astype(np.uint8)
        x = rng.integers(0, 30, (n, 28, 28)).astype(np.uint8)
        for i, c in enumerate(y):
            x[i, 2 * c:2 * c + 4, 4:24] = 255
        for name, arr in ((f"{split}-images-idx3-ubyte", x), (f"{split}-labels-idx1-ubyte", y)):
            raw = bytes([0, 0, 8, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()
            if gz:
                with gzip.open(folder / (name + ".gz"), "wb") as fh:
                    fh.write(raw)
            else:
                (folder / name).write_bytes(raw)


# ---------------------------------------------------------------- models

def test_pixelcnn_output_depends_only_on_earlier_codes_in_raster_order():
    torch.manual_seed(0)
    prior = GatedPixelCNN(n_codes=11, n_classes=3, dim=8, layers=3).eval()
    codes = torch.randint(11, (2, 5, 5))
    y = torch.tensor([0, 2])
    base = prior(codes, y)
    for pos in (0, 7, 12, 24):
        i, j = divmod(pos, 5)
        changed = codes.clone()
        changed[:, i, j] = (changed[:, i, j] + 1) % 11
        diff = (prior(changed, y) - base).abs().amax(dim=(0, 3)).flatten()  # per position
        assert torch.all(diff[:pos + 1] == 0), f"position {pos} leaks into an earlier or its own output"
        if pos < 24:
            assert diff[pos + 1:].max() > 0  # and the later outputs do see it
    for i in range(5):  # row-cropped input gives the same rows: what the sampler relies on
        torch.testing.assert_close(prior(codes[:, :i + 1], y), base[:, :i + 1])


def test_pixelcnn_is_class_conditional():
    torch.manual_seed(0)
    prior = GatedPixelCNN(n_codes=7, n_classes=4, dim=8, layers=2).eval()
    codes = torch.randint(7, (1, 3, 3))
    assert not torch.allclose(prior(codes, torch.tensor([0])), prior(codes, torch.tensor([3])))


def test_quantizer_picks_the_nearest_code_and_passes_gradients_straight_through():
    torch.manual_seed(0)
    vq = VectorQuantizer(codes=6, dim=3, ema=False, decay=0.99).eval()
    z = torch.randn(2, 3, 4, 4, requires_grad=True)
    z_q, codes, _, _ = vq(z)
    flat = z.detach().permute(0, 2, 3, 1).reshape(-1, 3)
    distances = torch.cdist(flat, vq.codebook.detach())
    expected = distances.argmin(1)
    # the quantizer computes distances its own way: points whose two nearest codes are within
    # rounding of each other may pick either (none here with this seed, but that is not a contract)
    two = distances.topk(2, dim=1, largest=False).values
    clear = two[:, 1] - two[:, 0] > 1e-4
    assert clear.float().mean() > 0.9 and torch.equal(codes.flatten()[clear], expected[clear])
    torch.testing.assert_close(z_q.detach().permute(0, 2, 3, 1).reshape(-1, 3), vq.codebook.detach()[codes.flatten()])
    (z_q * torch.arange(3.0)[None, :, None, None]).sum().backward()
    torch.testing.assert_close(z.grad, torch.arange(3.0)[None, :, None, None].expand_as(z))


def test_ema_codebook_moves_towards_its_inputs_and_dead_codes_restart():
    torch.manual_seed(0)
    vq = VectorQuantizer(codes=4, dim=2, ema=True, decay=0.5).train()
    z = torch.full((1, 2, 2, 2), 3.0)  # every position the same vector: one code wins all
    before = vq.codebook.clone()
    for _ in range(20):
        _, codes, codebook_loss, _ = vq(z)
    winner = int(codes.flatten()[0])
    assert float(codebook_loss) == 0.0  # EMA updates replace the codebook loss
    assert torch.allclose(vq.codebook[winner], torch.tensor([3.0, 3.0]), atol=1e-3)
    recent = torch.tensor([[10.0, 10.0]])
    restarted = vq.restart_dead(recent, 1.0, torch.Generator().manual_seed(0))
    assert restarted == 3
    dead = [k for k in range(4) if k != winner]
    assert torch.equal(vq.codebook[dead], recent.expand(3, 2)) and not torch.equal(vq.codebook[dead], before[dead])


def test_vqvae_gives_a_quarter_side_code_grid_and_decodes_back():
    model = VQVAE(VQVAEConfig(channels=1, hidden=8, codes=16)).eval()
    x = torch.rand(3, 1, 28, 28) * 2 - 1
    codes = model.encode(x)
    assert codes.shape == (3, 7, 7) and codes.dtype == torch.long and int(codes.max()) < 16
    assert model.decode(codes).shape == x.shape


def test_codebook_stats():
    stats = codebook_stats(np.array([[0, 0, 1, 1]]), 8)
    assert stats["codes_used"] == 2 and stats["perplexity"] == pytest.approx(2.0)


def test_posthoc_probabilities_from_the_last_layer_match_ev_softmax_of_its_scores():
    torch.manual_seed(0)
    prior = GatedPixelCNN(n_codes=13, n_classes=2, dim=8, layers=2).eval()
    feats = prior.feature_map(torch.randint(13, (4, 3, 3)), torch.tensor([0, 1, 0, 1])).reshape(-1, 8)
    posthoc = eval_probs(registry.get("posthoc_evidential"), prior, feats)
    torch.testing.assert_close(posthoc, evidential.ev_softmax(prior.out(feats)))  # Theorem 3.1
    assert (posthoc == 0).any()


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "ev_softmax", "posthoc_evidential", "r_softmax"])
def test_sampled_codes_always_lie_on_the_support_and_k_is_counted(name):
    torch.manual_seed(0)
    normalizer = registry.get(name)
    prior = GatedPixelCNN(n_codes=20, n_classes=3, dim=8, layers=2).eval()
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    codes, nonzero = sample_codes(normalizer, prior, labels, (3, 4), torch.Generator().manual_seed(0),
                                  torch.device("cpu"))
    with torch.no_grad():  # teacher-forced probabilities of the finished grid = those used at each step
        feats = prior.feature_map(codes, labels).reshape(-1, 8)
        probs = eval_probs(normalizer, prior, feats)
    assert torch.all(probs.gather(1, codes.reshape(-1, 1)) > 0)
    assert torch.equal(nonzero.flatten(), (probs > 0).sum(1))
    if name == "softmax":
        assert torch.all(nonzero == 20)
    elif name == "r_softmax":
        assert torch.all(nonzero == 10)  # r = 0.5 of 20 codes are zero
    else:
        assert nonzero.float().mean() < 20


# ---------------------------------------------------------------- data

def test_fashion_mnist_reads_idx_files_from_data_dir(tmp_path):
    write_fake_idx(tmp_path, gz=False)
    data = load_fashion_mnist(tmp_path, fetch=False)
    assert data.sizes() == {"train": 100, "val": 20, "test": 40}
    assert "Fashion-MNIST" in data.source
    images = load_images("fashion-mnist", tmp_path)
    assert images.train_x.shape == (100, 1, 28, 28) and images.train_x.min() >= -1 and images.train_x.max() <= 1
    assert images.class_names[0] == "T-shirt/top"


def test_fashion_mnist_without_data_and_without_fetching_says_what_to_do(tmp_path, monkeypatch):
    # an empty default cache too, so that a package fetched there earlier is not found (machine state)
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(UserFacingError, match="dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path, fetch=False)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_fashion_mnist_unpacks_a_local_debian_package_into_the_cache(tmp_path):
    root = tmp_path / "pkg"
    write_fake_idx(root / "usr/share/datasets/fashion-mnist")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text("Package: dataset-fashion-mnist\nVersion: 0.0-1\nArchitecture: all\n"
                                         "Maintainer: test <t@example.org>\nDescription: fake\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    deb = cache / "dataset-fashion-mnist_0.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--build", str(root), str(deb)], check=True, capture_output=True)
    data = load_fashion_mnist(cache)  # finds the .deb: no download
    assert data.sizes()["test"] == 40
    assert all((cache / "fashion-mnist" / f"{name}.gz").is_file() for name in IDX_NAMES)


def test_image_folder_with_a_test_split(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 10), ("val", 3)):
        for cls in ("cat", "dog"):
            folder = tmp_path / split / cls / "images"
            folder.mkdir(parents=True)
            for k in range(n):
                Image.fromarray(rng.integers(0, 255, (10, 10, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    data = load_images("fashion-mnist", tmp_path, image_size=8)
    assert data.class_names == ("cat", "dog")
    assert data.sizes() == {"train": 18, "val": 2, "test": 6}
    assert data.train_x.shape[1:] == (3, 8, 8)
    with pytest.raises(UserFacingError, match="multiple of 4"):
        load_images("fashion-mnist", tmp_path, image_size=10)


# ---------------------------------------------------------------- end to end

TINY = dict(seeds=1, codes=16, vq_hidden=8, vq_epochs=1, vq_lr=1e-3, vq_train_images=None, prior_dim=8,
            prior_layers=2, prior_epochs=1, prior_batch=32, prior_train_grids=None, eval_grids=None,
            samples_per_class=4, classifier_width=4, classifier_epochs=1, classifier_train_images=None)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setenv("SPARSENORM_NO_PROGRESS", "1")
    monkeypatch.setattr(vq_experiment, "QUICK", TINY)
    monkeypatch.setattr(EXPERIMENT, "run_options", lambda settings, device: RunOptions(threads=1, workers=1))


def test_quick_run_on_tiny_data_writes_results_report_and_figures(tmp_path, tiny):
    data = tmp_path / "data"
    write_fake_idx(data)
    argv = ["reproduce", "vqvae", "--quick", "--device", "cpu", "--data-dir", str(data), "--max-steps", "3",
            "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    out = tmp_path / "out" / "vqvae"
    results = json.loads((out / "results.json").read_text())["results"]
    norms = results["summary"]["normalizers"]
    assert list(norms) == list(vq_experiment.DEFAULT_NORMALIZERS)
    for name, m in norms.items():
        assert 0 <= m["top1"] <= m["top3"] <= 1
        assert 1 <= m["nonzero_codes"] <= 16
        assert "nll_bits" in m
    assert norms["softmax"]["nonzero_codes"] == 16 and norms["softmax"]["off_support"] == 0
    assert norms["softmax"]["nll_bits"] > 0 and norms["ev_softmax"]["nll_bits"] > 0
    assert norms["r_softmax"]["nonzero_codes"] == 8
    assert norms["sparsemax"]["nonzero_codes"] < 16
    # post-hoc shares the softmax prior: same trained-form NLL, one job for both
    assert norms["posthoc_evidential"]["nll_bits"] == pytest.approx(norms["softmax"]["nll_bits"])
    assert sorted(results["jobs"]["jobs"]) == sorted(
        f"seed0-{n}" for n in ("softmax", "sparsemax", "entmax15", "ev_softmax", "r_softmax"))
    assert results["regime"]["met"] is False and "of 16 codes used" in results["regime"]["measured"]
    assert {c["verdict"] for c in results["claims"] if not regime.is_out_of_regime(c["verdict"])} <= {"new comparison"}
    assert len(results["claims"]) == 4
    vq = results["summary"]["vqvae_per_seed"]["0"]
    assert vq["code_grid"] == [7, 7] and 1 <= vq["test_codes_used"] <= 16
    for fig in ("k_vs_accuracy.png", "sample_grids.png"):
        assert (out / fig).read_bytes()[:8] == PNG_MAGIC
    report = (out / "report.md").read_text()
    assert "not the paper's tinyImageNet" in report and "Table 3" in report and "paper Acc-5" in report

    # a second run reuses the VQ-VAE and every job
    assert cli.main(argv) == 0
    again = json.loads((out / "results.json").read_text())["results"]
    assert again["jobs"]["run_now"] == [] and again["summary"]["normalizers"] == norms


def test_every_encoding_runs_before_the_vqvae_leaves_the_device(tmp_path, tiny, monkeypatch):
    """``Module.cpu()`` moves the model in place while the encodings send their images to ``--device``: an
    encoding after it is a device mismatch on CUDA (the vqvae step failed on the GPU so, issue 39). On CPU
    both are the CPU, so the order itself is checked: no encoding once the model was moved off."""
    moved = []
    to_cpu, encode = vq_experiment.VQVAE.cpu, vq_experiment.encode_all

    def cpu(model):
        moved.append(model)
        return to_cpu(model)

    def encode_all(model, images, device, **kw):
        assert model not in moved, "encoded with the model moved off the device"
        return encode(model, images, device, **kw)

    monkeypatch.setattr(vq_experiment.VQVAE, "cpu", cpu)
    monkeypatch.setattr(vq_experiment, "encode_all", encode_all)
    data = tmp_path / "data"
    write_fake_idx(data)
    assert cli.main(["reproduce", "vqvae", "--quick", "--device", "cpu", "--data-dir", str(data), "--max-steps", "2",
                     "--normalizers", "softmax", "--out", str(tmp_path / "out")]) == 0
    assert moved  # the model did leave the device (the SeedModels keep it on CPU)


def test_posthoc_alone_still_trains_the_softmax_prior(tmp_path, tiny):
    data = tmp_path / "data"
    write_fake_idx(data)
    assert cli.main(["reproduce", "vqvae", "--quick", "--device", "cpu", "--data-dir", str(data), "--max-steps", "2",
                     "--normalizers", "posthoc_evidential", "--out", str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out" / "vqvae" / "results.json").read_text())["results"]
    assert results["jobs"]["jobs"] == ["seed0-softmax"]
    assert list(results["summary"]["normalizers"]) == ["posthoc_evidential"]
    assert [c["verdict"] for c in results["claims"][:1]] == ["not testable in this run"]


def test_kmeans_init_finds_the_clusters_and_restarts_run_every_n_steps():
    """The codebook fixes of the regime gate: k-means of the encoder outputs, dead-code restarts every n steps."""
    from sparsenorm.experiments.evsoftmax_vqvae.vqvae import VectorQuantizer, VQVAEConfig

    gen = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    points = centres.repeat_interleave(50, 0) + 0.01 * torch.randn(200, 2, generator=gen)
    vq = VectorQuantizer(4, 2, ema=False, decay=0.99)
    vq.kmeans_init(points, gen, iterations=20)
    # k-means++ seeding puts one start in each well-separated cluster (a second start in a taken cluster has
    # probability ~ noise^2 / 100); Lloyd then lands each code on its cluster's mean, within the noise of 0.01
    nearest = torch.cdist(centres, vq.codebook.detach()).min(1).values
    assert nearest.max() < 0.05
    assert len(set(vq.nearest(points).tolist())) == 4
    with pytest.raises(ValueError, match="init must be"):
        VQVAEConfig(init="random")
    with pytest.raises(ValueError, match="restart_every"):
        VQVAEConfig(restart_every=-1)
