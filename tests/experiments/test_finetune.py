"""The fine-tuning experiment (r-softmax Sec. 4.2) on a tiny configuration: a 2-layer BertConfig model with
random weights and a tiny tokenizer saved to a temporary folder, tiny injected data; no downloads."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")

from sparsenorm import registry  # noqa: E402
from sparsenorm.experiments._shared import regime, runner  # noqa: E402
from sparsenorm._text import UserFacingError  # noqa: E402
from sparsenorm.experiments._shared.checkpoints import save_atomically  # noqa: E402
from sparsenorm.experiments._shared.runner import RunConfig  # noqa: E402
from sparsenorm.experiments.rsoftmax_finetune import data as ft_data  # noqa: E402
from sparsenorm.experiments.rsoftmax_finetune import model as ft_model  # noqa: E402
from sparsenorm.experiments.rsoftmax_finetune.claims import claims as judge_claims, match_margin  # noqa: E402
from sparsenorm.experiments.rsoftmax_finetune.experiment import FinetuneExperiment  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GOOD = ["good", "great", "fun", "moving", "superb", "warm"]
BAD = ["bad", "dull", "awful", "boring", "weak", "flat"]
FILLER = ["the", "film", "is", "a", "story", "and", "very", "plot", "cast", "quite"]


def _sentence(rng, words, n):
    return " ".join(rng.choice(FILLER + words, size=n))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def tiny_tsv(tmp_path_factory):
    return write_tiny_tsv(tmp_path_factory.mktemp("tiny-sst"))


def write_tiny_bert(folder: Path) -> Path:
    """A 2-layer, 16-wide BERT classifier with random weights and a word-level vocabulary, saved in ``folder``."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + GOOD + BAD + FILLER
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def write_tiny_tsv(folder: Path) -> Path:
    """GLUE SST-2-style train.tsv / dev.tsv in ``folder``."""
    rng = np.random.default_rng(0)
    for name, n in (("train.tsv", 60), ("dev.tsv", 20)):
        rows = ["sentence\tlabel"]
        for i in range(n):
            label = i % 2
            rows.append(f"{_sentence(rng, GOOD if label else BAD, 4 + i % 7)}\t{label}")
        (folder / name).write_text("\n".join(rows) + "\n")
    return folder


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setenv("SPARSENORM_NO_PROGRESS", "1")


# ---------------------------------------------------------------- data

def test_rotten_tomatoes_file_gives_binary_labels_and_a_stratified_partition(tmp_path):
    rng = np.random.default_rng(1)
    lines = []
    for i in range(200):
        score = [-2.5, -0.4, 0.0, 0.7, 3.1][i % 5]
        lines.append(f"{i + 1}\t{score}\t{_sentence(rng, GOOD if score > 0 else BAD, 6)} {i}")
    (tmp_path / ft_data.SENTENCES_FILE).write_text("\r\n".join(lines) + "\r\n")
    data = ft_data.load_data(tmp_path)
    assert data.label_names == ["negative", "positive"]
    parts = [data.train, data.validation, data.test]
    assert [len(p) for p in parts] == [128, 16, 16]  # 160 non-zero scores, 80/10/10
    texts = [t for p in parts for t in p.texts]
    assert len(set(texts)) == 160  # disjoint, and the 40 zero-score sentences are gone
    for part in parts:
        assert part.labels.mean() == pytest.approx(0.5)  # stratified (the scores are balanced)
        for (text,), label in zip(part.texts, part.labels):
            index = int(text.rsplit(" ", 1)[1])
            assert label == ([-2.5, -0.4, 0.0, 0.7, 3.1][index % 5] > 0)
    again = ft_data.load_data(tmp_path)
    assert again.test.texts == data.test.texts  # the split does not depend on anything but SPLIT_SEED


def test_malformed_sentence_line_names_the_file_and_line(tmp_path):
    (tmp_path / ft_data.SENTENCES_FILE).write_text("1\t0.5\tfine\n2\tnot-a-number\toops\n")
    with pytest.raises(UserFacingError, match="line 2"):
        ft_data.load_data(tmp_path)


def test_glue_pair_task_with_string_labels(tmp_path):
    header = "index\tsentence1\tsentence2\tlabel"
    rows = [f"{i}\tpremise {i}\thypothesis {i}\t{'entailment' if i % 2 else 'not_entailment'}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join([header] + rows + ["40\tbroken row"]) + "\n")
    (tmp_path / "dev.tsv").write_text("\n".join([header] + rows[:6]) + "\n")
    data = ft_data.load_data(tmp_path)
    assert data.label_names == ["entailment", "not_entailment"]
    assert len(data.train) + len(data.validation) == 40 and len(data.test) == 6  # the broken row is skipped
    assert data.test.texts[1] == ("premise 1", "hypothesis 1") and data.test.labels[1] == 0


def test_glue_folder_without_dev_file_is_a_clear_error(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\na\t0\nb\t1\n")
    with pytest.raises(UserFacingError, match="dev.tsv"):
        ft_data.load_data(tmp_path)


def test_model_dir_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(UserFacingError, match="config.json"):
        ft_model.weights_dir(tmp_path)


# ---------------------------------------------------------------- r schedule and measurement

def test_rate_schedule_rises_linearly_to_r_final_and_is_r_softmax():
    schedule = ft_model.RateSchedule(0.2, total_steps=5)
    assert [schedule.step(i) for i in range(5)] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    scores = torch.randn(3, 10)
    schedule.step(2)
    assert torch.equal(schedule(scores, dim=-1), registry.get("r_softmax", r=0.1).forward(scores, dim=-1))
    with pytest.raises(ValueError, match="r"):
        ft_model.RateSchedule(1.5, 3)


def _oracle_sparsity(model, batch):
    """Zero fraction and attended keys per query straight from the returned weights (no padding)."""
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    weights = torch.stack(attentions)  # layers, batch, heads, L, L
    return float((weights == 0).float().mean()), float((weights != 0).sum(-1).float().mean())


@pytest.mark.parametrize("normalizer", ["ev_softmax", "sparsemax", "r_softmax"])
def test_measured_sparsity_matches_the_attention_weights(tiny_model, normalizer):
    tokenizer, model = ft_model.load_classifier(tiny_model, 2, ft_model.attention_name(normalizer, r=0.3)
                                                if normalizer == "r_softmax" else ft_model.attention_name(normalizer),
                                                seed=0)
    with torch.no_grad():  # random init gives near-uniform scores; sharpen them so sparsemax has zeros too
        for layer in model.encoder.encoder.layer:
            layer.attention.self.query.weight.mul_(50.0)
    rng = np.random.default_rng(2)
    texts = [(_sentence(rng, GOOD, 7),) for _ in range(5)]  # one token length: no padding
    split = ft_data.Split(texts, np.array([1, 0, 1, 0, 1]))
    result = ft_model.evaluate(model, tokenizer, split, max_length=32)
    zero, attended = _oracle_sparsity(model, ft_model.encode(tokenizer, texts, 32))
    assert result["zero_fraction"] == pytest.approx(zero, abs=1e-6)
    assert result["attended"] == pytest.approx(attended, abs=1e-6)
    assert result["keys"] == 9 and len(result["layers"]) == 2
    assert 0 < result["zero_fraction"] < 1
    if normalizer == "r_softmax":
        assert result["zero_fraction"] >= 0.3 - 1e-6  # at least a fraction r of each row is zero


def test_padding_does_not_change_the_fine_tuned_prediction(tiny_model):
    """Training batches are padded: the mask must make a padded sentence score as the sentence alone."""
    tokenizer, model = ft_model.load_classifier(tiny_model, 2, ft_model.attention_name("ev_softmax"), seed=0)
    model.eval()
    short, long = ("good film",), ("the film is a very dull and flat story",)
    with torch.no_grad():
        alone = model(**ft_model.encode(tokenizer, [short], 32)).logits
        padded = model(**ft_model.encode(tokenizer, [short, long], 32)).logits[:1]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the experiment end to end

def _config(out, model_dir, data_dir, **kw):
    return RunConfig(out=out, quick=True, device="cpu", data_dir=data_dir, max_steps=3,
                     extra={"model_dir": model_dir, "r_finals": [0.1, 0.5], "max_length": 24}, **kw)


def test_tiny_run_writes_results_report_and_figures(tmp_path, tiny_model, tiny_tsv, monkeypatch):
    exp = FinetuneExperiment()
    monkeypatch.setattr(exp, "run_options", lambda settings, device: runner.RunOptions(threads=1, workers=1))
    names = ["softmax", "r_softmax", "ev_softmax", "sparsemax", "posthoc_evidential"]
    out = runner.run_experiment(exp, _config(tmp_path / "ft", tiny_model, tiny_tsv, normalizers=names))
    results = json.loads((out / "results.json").read_text())["results"]
    rows = results["summary"]["normalizers"]
    assert set(rows) == set(names)
    for name, row in rows.items():
        assert 0 <= row["accuracy"] <= 1 and 0 <= row["zero_fraction"] < 1 and row["attended"] > 0, name
    assert rows["softmax"]["zero_fraction"] == 0  # dense
    assert rows["r_softmax"]["zero_fraction"] > 0.1  # final r is one of 0.1, 0.5
    assert rows["posthoc_evidential"]["zero_fraction"] > 0  # ev-softmax at test time
    swapped = results["summary"]["swapped"]
    assert set(swapped) == {"sparsemax", "sparsehourglass", "entmax15", "r_softmax (r=0.1)", "r_softmax (r=0.5)",
                            "posthoc_evidential"}
    assert swapped["posthoc_evidential"] == {k: v for k, v in rows["posthoc_evidential"].items()
                                             if k in swapped["posthoc_evidential"]}
    assert [c["r_final"] for c in results["summary"]["r_curve"]] == [0.1, 0.5]
    by_key = {r["key"]: r for r in results["records"]}
    assert by_key["r_softmax-lr0.0001-r0.5-seed0"]["train"]["r_at_end"] == 0.5
    assert by_key["softmax-lr0.0001-seed0"]["train"]["steps"] == 3  # max_steps caps the run
    claims = {c["claim"]: c["verdict"] for c in results["claims"]}
    evidence = {c["claim"]: c["evidence"] for c in results["claims"]}
    # one seed: the rule cannot reach its level, whatever the accuracies; and 3 steps miss the paper's regime
    assert results["regime"]["met"] is False and "softmax" in results["regime"]["measured"]
    assert regime.is_out_of_regime(claims["r-softmax attention matches or beats softmax after fine-tuning"])
    assert "would read *inconclusive*" in evidence["r-softmax attention matches or beats softmax after fine-tuning"]
    assert claims["sparsehourglass attention breaks the pretrained model"] == runner.NOT_TESTABLE  # not fine-tuned
    for figure in ("accuracy_vs_r.png", "attention_maps.png", "sparsity_per_layer.png"):
        assert (out / figure).read_bytes()[:8] == PNG_MAGIC
    report = (out / "report.md").read_text()
    assert "paper SST-2 (BERT)" in report and "92.32" in report and "Swapped in without fine-tuning" in report


def test_a_resumed_job_counts_the_training_time_before_its_resume(tmp_path, tiny_model, tiny_tsv, monkeypatch):
    """The process that finishes a resumed fine-tuning measures only itself; the job's wall and CPU time add what the
    saved state carried, so a whole job never reads shorter than its training (it did in the decisive run's three
    resumed jobs)."""
    exp = FinetuneExperiment()
    monkeypatch.setattr(exp, "run_options", lambda settings, device: runner.RunOptions(threads=1, workers=1))
    fine_tune = ft_model.fine_tune

    def resumed_at_step_2(*args, **kwargs):  # as if steps 0-1 had taken 1000 s (900 CPU-s) in an earlier process
        result = fine_tune(*args, **kwargs)
        return dataclasses.replace(result, resumed_at_step=2, seconds=result.seconds + 1000.0,
                                   cpu_seconds=result.cpu_seconds + 900.0, carried_seconds=1000.0,
                                   carried_cpu_seconds=900.0)

    monkeypatch.setattr(ft_model, "fine_tune", resumed_at_step_2)
    out = runner.run_experiment(exp, _config(tmp_path / "ft", tiny_model, tiny_tsv, normalizers=["ev_softmax"]))
    results = json.loads((out / "results.json").read_text())["results"]
    (record,) = results["records"]
    assert record["train"]["resumed_at_step"] == 2
    assert results["summary"]["cost"]["resumed"] == {record["key"]: 2}
    assert f"{record['key']} at step 2" in (out / "report.md").read_text()
    assert record["job_seconds"] >= record["train"]["seconds"] + record["validation"]["seconds"] >= 1000.0
    assert record["job_cpu_seconds"] >= record["train"]["cpu_seconds"] >= 900.0


def test_decisive_grid_runs_on_the_grid_seeds_and_the_chosen_rate_on_the_others(tmp_path, tiny_model, tiny_tsv,
                                                                                  monkeypatch):
    """Decisive mode: every learning rate on the grid seed, then the other seeds at the rate chosen per (normalizer,
    final r) on that seed's validation accuracy only; --report-only finds the same jobs in the cache."""
    exp = FinetuneExperiment()
    monkeypatch.setattr(exp, "run_options", lambda settings, device: runner.RunOptions(threads=1, workers=1))
    lrs = [1e-4, 3e-2]

    def config(**kw):
        return RunConfig(out=tmp_path / "ft", decisive=True, seeds=3, device="cpu", data_dir=tiny_tsv, max_steps=2,
                         normalizers=["softmax", "r_softmax"],
                         extra={"model_dir": tiny_model, "r_finals": [0.1, 0.5], "max_length": 24,
                                "learning_rates": lrs}, **kw)

    out = runner.run_experiment(exp, config())
    results = json.loads((out / "results.json").read_text())["results"]
    records = results["records"]
    assert results["settings"]["grid_seeds"] == 1 and not results["jobs"]["missing"]
    for name, r in (("softmax", None), ("r_softmax", 0.1), ("r_softmax", 0.5)):
        mine = [rec for rec in records if rec["normalizer"] == name and rec["r_final"] == r]
        grid = {rec["lr"]: rec["validation"]["accuracy"] for rec in mine if rec["seed"] == 0}
        assert set(grid) == set(lrs)
        chosen = max(lrs, key=lambda lr: (grid[lr], -lrs.index(lr)))  # the first of equals
        assert sorted((rec["seed"], rec["lr"]) for rec in mine if rec["seed"] > 0) == [(1, chosen), (2, chosen)]
        if name == "softmax":
            row = results["summary"]["normalizers"]["softmax"]
            assert row["lr"] == chosen and sorted(row["accuracy_by_seed"]) == ["0", "1", "2"]
    assert len(records) == 3 * 2 + 3 * 2  # the grid on seed 0, two more seeds per setting
    again = runner.run_experiment(exp, config(report_only=True))
    rerun = json.loads((again / "results.json").read_text())["results"]
    assert not rerun["jobs"]["run_now"] and sorted(rerun["jobs"]["jobs"]) == sorted(results["jobs"]["jobs"])


def test_claims_follow_the_paired_tests():
    def row(acc, seeds=8, **kw):  # per-seed accuracies scattered around ``acc`` (the same pattern for every row)
        by_seed = {s: acc + 0.002 * (s - seeds / 2) for s in range(seeds)}
        return {"accuracy": acc, "accuracy_by_seed": by_seed, "test_examples": 872, "zero_fraction": 0.2,
                "attended": 8.0, "keys": 10.0, "lr": 1e-4, "r_final": None, **kw}

    def curve(r_final, acc, seeds=8):
        return {**row(acc, seeds), "r_final": r_final, "validation_accuracy": acc}

    summary = {"normalizers": {"softmax": row(0.90), "r_softmax": row(0.895, r_final=0.2), "sparsemax": row(0.80),
                               "sparsehourglass": row(0.88)},
               "r_curve": [curve(0.2, 0.895), curve(0.5, 0.85)], "swapped": {}}
    verdicts = [c.verdict for c in judge_claims(summary)]
    assert verdicts[:4] == [runner.REPRODUCED, runner.REPRODUCED, runner.NOT_REPRODUCED, runner.REPRODUCED]
    assert 0.017 < match_margin(872) < 0.019  # two standard errors of ~92 % accuracy on 872 sentences
    summary["normalizers"]["r_softmax"] = row(0.87, r_final=0.2)  # 3 points below: beyond the margin
    assert judge_claims(summary)[0].verdict == runner.NOT_REPRODUCED
    # One seed (the old full mode) decides nothing.
    one = {"normalizers": {"softmax": row(0.90, 1), "r_softmax": row(0.95, 1, r_final=0.2)}, "r_curve": [],
           "swapped": {}}
    assert judge_claims(one)[0].verdict == runner.INCONCLUSIVE


def test_cli_lists_finetune_without_importing_transformers():
    code = ("import sys; from sparsenorm import cli; "
            "argv = ['reproduce', 'finetune', '--quick', '--model-dir', 'x', '--r-finals', '0.1,0.2']; "
            "cli.build_parser(argv).parse_args(argv); "
            "print('transformers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_the_head_reads_the_mean_of_the_real_tokens_and_its_seed(tiny_model):
    """The classifier sees the mean of the last hidden states over the unpadded tokens (an oracle from the encoder's
    own output), and its initialisation depends on ``seed`` alone, not on torch's global generator."""
    tokenizer, model = ft_model.load_classifier(tiny_model, 2, ft_model.attention_name("softmax"), seed=3)
    model.eval()
    batch = ft_model.encode(tokenizer, [("good film",), ("the film is a very dull and flat story",)], 32)
    with torch.no_grad():
        hidden = model.encoder(**batch).last_hidden_state
        logits = model(**batch).logits
    n = int(batch["attention_mask"][0].sum())
    first = model.classifier(hidden[0, :n].mean(0))
    torch.testing.assert_close(logits[0], first, atol=1e-6, rtol=1e-5)
    torch.manual_seed(123)
    _, again = ft_model.load_classifier(tiny_model, 2, ft_model.attention_name("softmax"), seed=3)
    _, other = ft_model.load_classifier(tiny_model, 2, ft_model.attention_name("softmax"), seed=4)
    assert torch.equal(again.classifier.weight, model.classifier.weight)
    assert not torch.equal(other.classifier.weight, model.classifier.weight)


@pytest.mark.parametrize("normalizer", ["ev_softmax", "r_softmax"])
def test_an_interrupted_fine_tuning_resumes_to_the_same_weights(tiny_model, tmp_path, monkeypatch, normalizer):
    """A fine-tuning cut after its checkpoint (mid-epoch, dropout on, r-softmax's rate moving) and started again on
    the same file ends with the weights, loss and step count of one that ran through; the file is then gone."""
    rng = np.random.default_rng(5)
    texts = [(_sentence(rng, GOOD if i % 2 else BAD, 3 + i % 5),) for i in range(20)]
    split = ft_data.Split(texts, np.array([i % 2 for i in range(20)]))
    common = dict(epochs=2, batch_size=4, lr=1e-3, max_length=16, seed=7, checkpoint_every=3)

    def run(checkpoint):
        schedule = ft_model.RateSchedule(0.5, 1) if normalizer == "r_softmax" else None
        name = schedule.register() if schedule else ft_model.attention_name(normalizer)
        tokenizer, model = ft_model.load_classifier(tiny_model, 2, name, seed=7)
        torch.manual_seed(7)  # dropout, as the runner seeds a job
        result = ft_model.fine_tune(model, tokenizer, split, schedule=schedule, checkpoint=checkpoint, **common)
        return result, model.state_dict()

    whole, whole_state = run(None)
    state_file = tmp_path / "job.pt"
    calls, encode = [0], ft_model.encode

    def cut_at_step_8(*args, **kwargs):  # steps 0-7 run, a checkpoint is written after step 6
        calls[0] += 1
        if calls[0] > 8:
            raise KeyboardInterrupt("cut")
        return encode(*args, **kwargs)

    monkeypatch.setattr(ft_model, "encode", cut_at_step_8)
    with pytest.raises(KeyboardInterrupt):
        run(state_file)
    saved = torch.load(state_file, weights_only=True)
    assert saved["step"] == 6
    calls[0] = 0

    def counted(*args, **kwargs):
        calls[0] += 1
        return encode(*args, **kwargs)

    monkeypatch.setattr(ft_model, "encode", counted)
    resumed, resumed_state = run(state_file)
    assert calls[0] == 4  # steps 6-9 only: it resumed (a restart from step 0 would give the same weights)
    assert resumed.steps == whole.steps == 10 and resumed.final_loss == pytest.approx(whole.final_loss, rel=1e-6)
    for k, v in whole_state.items():
        assert torch.equal(v, resumed_state[k]), k
    assert not state_file.exists()
    # the time of steps 0-5, spent in the cut process, is carried: a whole job's time adds it (run_job)
    assert (whole.resumed_at_step, whole.carried_seconds, whole.carried_cpu_seconds) == (0, 0.0, 0.0)
    assert resumed.resumed_at_step == 6
    assert (resumed.carried_seconds, resumed.carried_cpu_seconds) == (saved["seconds"], saved["cpu_seconds"])
    assert resumed.seconds >= resumed.carried_seconds > 0


def test_a_checkpoint_of_another_setting_is_not_resumed(tiny_model, tmp_path):
    """A state saved under another learning rate (or any other part of the setting) is ignored: training starts
    from step 0 and gives what it gives without the file."""
    rng = np.random.default_rng(6)
    texts = [(_sentence(rng, GOOD if i % 2 else BAD, 4),) for i in range(8)]
    split = ft_data.Split(texts, np.array([i % 2 for i in range(8)]))
    state_file = tmp_path / "job.pt"
    save_atomically({"key": ("another setting",), "step": 1}, state_file)

    def run(checkpoint):
        tokenizer, model = ft_model.load_classifier(tiny_model, 2, ft_model.attention_name("softmax"), seed=1)
        torch.manual_seed(1)
        result = ft_model.fine_tune(model, tokenizer, split, epochs=1, batch_size=4, lr=1e-3, max_length=16, seed=1,
                                    checkpoint=checkpoint)
        return result, model.state_dict()

    with_file, state = run(state_file)
    without, reference = run(None)
    assert with_file.steps == without.steps == 2
    assert all(torch.equal(v, state[k]) for k, v in reference.items())
