"""The shared experiment runner: seeding, per-job caching and resume, results.json, report skeleton, index."""
import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from sparsenorm import cli
from sparsenorm.experiments._shared import runner, verdict
from sparsenorm._text import UserFacingError
from sparsenorm.experiments._shared.runner import RunConfig
from sparsenorm.experiments._shared.index import write_index

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class ToySettings:
    seeds: int = 2
    scale: float = 1.0


class ToyExperiment:
    """Draws one random number per seed: the record depends only on the seed and the settings."""

    name = "toy"
    description = "A toy experiment for the runner's tests"
    paper = "Nobody et al. (2026), Sec. 0"
    default_normalizers = ["softmax"]
    full_runtime = "instant"
    quick_note = "Quick mode leaves out nothing."

    def __init__(self, workers: int = 1):
        self.calls = []
        self.workers = workers

    def add_arguments(self, parser):
        parser.add_argument("--scale", type=float)

    def settings(self, config):
        s = ToySettings(seeds=config.seeds or 2)
        return replace(s, scale=config.extra["scale"]) if config.extra.get("scale") else s

    def run_options(self, settings, device):
        return runner.RunOptions(threads=1, workers=self.workers)

    def prepare(self, settings, config, device):
        return {"offset": 10.0}

    def jobs(self, settings, config):
        return [runner.Job(key=f"seed{s}", seed=s) for s in range(settings.seeds)]

    def run_job(self, job, context, settings, device):
        self.calls.append(job.key)
        return {"seed": job.seed, "value": context["offset"] + settings.scale * torch.rand(()).item(),
                "threads": torch.get_num_threads()}

    def aggregate(self, records, settings):
        return {"mean": sum(r["value"] for r in records) / len(records)}

    def claims(self, summary, records, settings):
        test = verdict.direction([r["value"] - 10 for r in records], "value minus 10, per seed")
        return [verdict.claim("the mean exceeds 10", [test], "Eq. 1"),
                runner.Claim("something we cannot test", runner.NOT_TESTABLE, "not run")]

    def report(self, out, summary, records, settings, context):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.plot([r["value"] for r in records])
        fig.savefig(out / "values.png")
        plt.close(fig)
        return runner.Report(body=f"Mean value: {summary['mean']:.3f}.", figures={"values": out / "values.png"},
                             headline="values")


def config_for(out: Path, **kw) -> RunConfig:
    return RunConfig(out=out, quick=True, device="cpu", **kw)


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setenv("SPARSENORM_NO_PROGRESS", "1")


def test_toy_satisfies_the_protocol():
    assert isinstance(ToyExperiment(), runner.Experiment)


def test_run_writes_results_report_and_seeded_records(tmp_path):
    exp = ToyExperiment()
    out = runner.run_experiment(exp, config_for(tmp_path / "toy"))
    payload = json.loads((out / "results.json").read_text())
    assert payload["experiment"] == "toy"
    results = payload["results"]
    assert results["mode"] == "quick" and results["paper"] == exp.paper
    assert [r["seed"] for r in results["records"]] == [0, 1]
    torch.manual_seed(0)
    assert results["records"][0]["value"] == pytest.approx(10.0 + torch.rand(()).item())  # seeded by the runner
    assert results["records"][0]["threads"] == 1
    # Every seed's value exceeds 10, but two seeds cannot reach the rule's level: inconclusive, labelled indicative.
    assert [c["verdict"] for c in results["claims"]] == [runner.INCONCLUSIVE, runner.NOT_TESTABLE]
    assert results["headline_figure"] == "values.png"
    assert (out / "values.png").read_bytes()[:8] == PNG_MAGIC
    report = (out / "report.md").read_text()
    assert "indicative only" in report and "Mean value" in report and "the mean exceeds 10 (Eq. 1)" in report
    assert "**inconclusive (indicative)**" in report and "How claims are judged" in report
    assert "2 run now, 0 reused" in report


def test_finished_jobs_are_reused_and_changed_settings_rerun(tmp_path):
    out = tmp_path / "toy"
    first = ToyExperiment()
    runner.run_experiment(first, config_for(out))
    before = json.loads((out / "results.json").read_text())["results"]["records"]

    again = ToyExperiment()
    runner.run_experiment(again, config_for(out, seeds=3))  # one new seed: only it runs
    assert again.calls == ["seed2"]
    results = json.loads((out / "results.json").read_text())["results"]
    assert results["records"][:2] == before
    assert results["jobs"]["reused_from_cache"] == ["seed0", "seed1"]

    changed = ToyExperiment()
    runner.run_experiment(changed, config_for(out, seeds=3, extra={"scale": 2.0}))
    assert changed.calls == ["seed0", "seed1", "seed2"]


def test_a_truncated_cache_file_is_redone(tmp_path):
    out = tmp_path / "toy"
    runner.run_experiment(ToyExperiment(), config_for(out))
    (out / "runs" / "seed1.json").write_text('{"fingerprint": "abc", "rec')
    exp = ToyExperiment()
    runner.run_experiment(exp, config_for(out))
    assert exp.calls == ["seed1"]


def test_parallel_workers_give_the_same_records(tmp_path):
    serial = runner.run_experiment(ToyExperiment(), config_for(tmp_path / "a", seeds=3))
    parallel = runner.run_experiment(ToyExperiment(workers=2), config_for(tmp_path / "b", seeds=3))
    load = lambda out: json.loads((out / "results.json").read_text())["results"]["records"]  # noqa: E731
    assert load(serial) == load(parallel)


def test_unknown_normalizer_is_a_user_error(tmp_path):
    with pytest.raises(UserFacingError, match="softmaxx"):
        runner.run_experiment(ToyExperiment(), config_for(tmp_path, normalizers=["softmaxx"]))


def test_duplicate_job_keys_are_rejected(tmp_path):
    exp = ToyExperiment()
    exp.jobs = lambda settings, config: [runner.Job("same", 0), runner.Job("same", 1)]
    with pytest.raises(ValueError, match="unique"):
        runner.run_experiment(exp, config_for(tmp_path))


def test_index_lists_every_claim_of_every_experiment(tmp_path):
    runner.run_experiment(ToyExperiment(), config_for(tmp_path / "toy"))
    other = ToyExperiment()
    other.name, other.paper = "other", "Somebody (2025), Table 2"
    runner.run_experiment(other, RunConfig(out=tmp_path / "other", device="cpu"))
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "results.json").write_text("not json")
    index = write_index(tmp_path).read_text()
    assert index.count("the mean exceeds 10") == 2
    assert "[toy](toy/report.md)" in index and "[other](other/report.md)" in index
    assert "Somebody (2025), Table 2" in index
    assert "Quick mode for toy" in index  # only the quick one is flagged
    assert "![toy](toy/values.png)" in index and "![other](other/values.png)" in index


def test_cli_passes_experiment_options_and_writes_the_index(tmp_path, monkeypatch):
    import sparsenorm.experiments as experiments

    module = type("M", (), {"EXPERIMENT": ToyExperiment()})
    monkeypatch.setitem(experiments.EXPERIMENTS, "toy", "toy-module")
    monkeypatch.setattr(experiments, "load", lambda name: module if name == "toy" else experiments.import_module(
        experiments.EXPERIMENTS[name]))
    monkeypatch.setattr(cli, "load", experiments.load)
    monkeypatch.setattr(cli, "EXPERIMENTS", {"toy": "toy-module"})
    assert cli.main(["reproduce", "toy", "--quick", "--device", "cpu", "--scale", "3", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "toy" / "results.json").read_text())["results"]
    assert results["settings"]["scale"] == 3.0
    assert "the mean exceeds 10" in (tmp_path / "README.md").read_text()


def test_report_only_reports_the_cached_jobs_and_lists_the_missing(tmp_path):
    out = tmp_path / "toy"
    runner.run_experiment(ToyExperiment(), RunConfig(out=out, device="cpu", seeds=2))
    exp = ToyExperiment()
    runner.run_experiment(exp, RunConfig(out=out, device="cpu", seeds=3, report_only=True))
    assert exp.calls == []  # nothing trained
    results = json.loads((out / "results.json").read_text())["results"]
    assert results["jobs"]["jobs"] == ["seed0", "seed1"] and results["jobs"]["missing"] == ["seed2"]
    assert results["mode"] == "full (partial)" and len(results["records"]) == 2
    report = (out / "report.md").read_text()
    assert "Partial report: 2 of 3 jobs" in report and "`seed2`" in report
    assert "Partial results for toy" in write_index(tmp_path).read_text()
    with pytest.raises(UserFacingError, match="no finished job"):
        runner.run_experiment(ToyExperiment(), RunConfig(out=tmp_path / "empty", device="cpu", report_only=True))


class StackingToy(ToyExperiment):
    """The toy with two settings ("a", "b") whose seeds may run as stacks; ``run_stack`` seeds each job itself."""

    def __init__(self, stack: int, workers: int = 1):
        super().__init__(workers)
        self.stack, self.units = stack, []

    def run_options(self, settings, device):
        return runner.RunOptions(threads=1, workers=self.workers, stack=self.stack)

    def jobs(self, settings, config):
        return [runner.Job(key=f"{g}-seed{s}", seed=s, params={"group": g})
                for s in range(settings.seeds) for g in ("a", "b")]

    def stack_key(self, job):
        return job.params["group"]

    def run_stack(self, jobs, context, settings, device):
        self.units.append([j.key for j in jobs])
        records = []
        for job in jobs:
            torch.manual_seed(job.seed)
            records.append(self.run_job(job, context, settings, device))
        return records

    def run_job(self, job, context, settings, device):
        return {**super().run_job(job, context, settings, device), "group": job.params["group"]}


def test_stacks_group_pending_seeds_of_one_setting_and_cache_one_record_per_job(tmp_path):
    load = lambda out: json.loads((out / "results.json").read_text())["results"]  # noqa: E731
    alone = StackingToy(stack=1)
    runner.run_experiment(alone, config_for(tmp_path / "alone", seeds=3))
    assert alone.units == []  # stack 1: every job by run_job
    stacked = StackingToy(stack=2)
    runner.run_experiment(stacked, config_for(tmp_path / "stacked", seeds=3))
    # at most 2 per stack, same group only, in the order of each stack's first job
    assert stacked.units == [["a-seed0", "a-seed1"], ["b-seed0", "b-seed1"]]
    assert sorted(stacked.calls) == sorted(f"{g}-seed{s}" for g in "ab" for s in range(3))
    assert load(tmp_path / "stacked")["records"] == load(tmp_path / "alone")["records"]  # same records, same order
    assert len(list((tmp_path / "stacked" / "runs").glob("*.json"))) == 6  # one cache file per job

    # Two more seeds: only the new ones run, stacked among themselves; the cached ones are reused.
    more = StackingToy(stack=4)
    runner.run_experiment(more, config_for(tmp_path / "stacked", seeds=5))
    assert more.units == [["a-seed3", "a-seed4"], ["b-seed3", "b-seed4"]]
    assert load(tmp_path / "stacked")["jobs"]["run_now"] == ["a-seed3", "b-seed3", "a-seed4", "b-seed4"]

    parallel = StackingToy(stack=2, workers=2)
    runner.run_experiment(parallel, config_for(tmp_path / "parallel", seeds=3))
    assert load(tmp_path / "parallel")["records"] == load(tmp_path / "alone")["records"]


def test_a_stack_must_return_one_record_per_job(tmp_path):
    exp = StackingToy(stack=2)
    exp.run_stack = lambda jobs, context, settings, device: [{"seed": 0, "value": 1.0}]
    with pytest.raises(ValueError, match="1 records for 2 jobs"):
        runner.run_experiment(exp, config_for(tmp_path))


def test_a_cached_model_round_trips_and_a_bad_cache_is_retrained(tmp_path, capsys):
    """``checkpoints.cache_model`` / ``load_cached_model`` (the digit and image classifiers' cache): the weights and the
    info come back bit for bit; an unreadable file or an unwritable folder is a warning, not an error."""
    from sparsenorm.experiments._shared.checkpoints import cache_model, load_cached_model

    def linear():  # uninitialised (no global RNG), then seeded by its own generator
        layer = torch.nn.utils.skip_init(torch.nn.Linear, 3, 2)
        gen = torch.Generator().manual_seed(len(made))
        made.append(layer)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        return layer

    made = []
    model = linear()
    path = tmp_path / "cache" / "m.pt"
    assert load_cached_model(path, linear(), ("acc",), "toy") is None  # nothing cached yet
    assert cache_model(path, model, {"acc": 0.5, "epochs": 2}, "toy") == str(path)
    assert not path.with_name("m.pt.part").exists()
    fresh = linear()
    assert not torch.equal(fresh.weight, model.weight)
    assert load_cached_model(path, fresh, ("acc",), "toy") == {"acc": 0.5}
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    path.write_bytes(b"not a checkpoint")
    assert load_cached_model(path, fresh, ("acc",), "toy") is None
    assert "retraining the toy" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert cache_model(blocked / "m.pt", model, {}, "toy") is None  # its folder is a file
    assert "could not cache the toy" in capsys.readouterr().err


def test_a_decisive_report_names_a_seed_count_that_overrides_the_default(tmp_path):
    """The decisive note states the mode's default seeds; a run with --seeds says how many it had."""
    out = runner.run_experiment(ToyExperiment(), RunConfig(out=tmp_path / "ten", decisive=True, device="cpu", seeds=3))
    assert "**This run: 3 seeds** (`--seeds 3`), not the default." in (out / "report.md").read_text()
    out = runner.run_experiment(ToyExperiment(), RunConfig(out=tmp_path / "default", decisive=True, device="cpu"))
    assert "This run:" not in (out / "report.md").read_text()
    out = runner.run_experiment(ToyExperiment(), RunConfig(out=tmp_path / "full", device="cpu", seeds=3))
    assert "Full mode. instant **This run: 3 seeds** (`--seeds 3`)" in (out / "report.md").read_text()


def test_an_experiments_run_note_follows_the_mode_note(tmp_path):
    """An experiment's ``run_note(settings)`` names this run's departures from the mode's defaults."""
    class Noted(ToyExperiment):
        def run_note(self, settings):
            return f"**This run:** {settings.seeds} seeds, noted."
    out = runner.run_experiment(Noted(), RunConfig(out=tmp_path / "noted", device="cpu", seeds=2))
    assert "**This run:** 2 seeds, noted." in (out / "report.md").read_text()
