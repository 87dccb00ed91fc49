"""The catalogue of every claim of the papers and the index built from committed results alone."""
import gzip
import json
import re
import shutil
from pathlib import Path

from sparsenorm import cli
from sparsenorm.experiments import EXPERIMENTS
from sparsenorm.experiments import catalogue, committed
from sparsenorm.experiments._shared import paper_index, verdict

ROOT = Path(__file__).resolve().parents[2]
KEY = re.compile(r'"((?:ev|r|sm|own)\.[a-z0-9_]+\.[a-z0-9_]+)"')


def _keys_emitted(package: str) -> set:
    """The claim keys an experiment's code emits (its ``paper.py`` holds its rows of the catalogue, so is not read)."""
    folder = ROOT / package.replace(".", "/")
    return {k for path in folder.glob("*.py") if path.name != "paper.py" for k in KEY.findall(path.read_text())}


def test_every_experiment_claim_is_catalogued_and_every_catalogued_run_claim_is_emitted():
    emitted = set().union(*(_keys_emitted(p) for p in EXPERIMENTS.values()))
    run_claims = {c.key for c in catalogue.CLAIMS + catalogue.OWN_CLAIMS if c.experiment}
    assert emitted == run_claims
    # each claim is run by an experiment, checked by tests, or says why not
    for c in catalogue.CLAIMS + catalogue.OWN_CLAIMS:
        assert sum(map(bool, (c.experiment, c.tests, c.measured, c.not_run))) == 1, c.key
        assert c.experiment is None or c.experiment in EXPERIMENTS


def _results(folder: Path, mode: str, claims, gz: bool = False):
    folder.mkdir(parents=True)
    payload = {"experiment": "cvae", "config": {"quick": mode == "quick", "seeds": None},
               "results": {"mode": mode, "paper": "p", "settings": {"seeds": 10}, "claims": claims}}
    text = json.dumps(payload)
    if gz:
        (folder / "results.json.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (folder / "results.json").write_text(text)


def _row(root: Path, key: str) -> str:
    """The index row of claim ``key`` in ``root/README.md``."""
    return next(line for line in (root / "README.md").read_text().splitlines() if line.startswith(f"| {key} "))


def test_index_prefers_the_most_decisive_run_and_lists_unrun_claims(tmp_path):
    claim = lambda v, seeds: {"claim": "c", "verdict": v, "evidence": "e", "source": "", "key": "ev.cvae.five_modes",
                              "seeds": seeds}
    _results(tmp_path / "quick" / "cvae", "quick", [claim(verdict.REPRODUCED, 3)])
    _results(tmp_path / "full" / "cvae", "full", [claim(verdict.NOT_REPRODUCED, 10),
                                                  {"claim": "extra", "verdict": verdict.NEW, "evidence": "x",
                                                   "source": "", "key": "", "seeds": None}], gz=True)
    (tmp_path / paper_index.CLOSING_NOTE).write_text("## Verdicts that changed\n\n| a | b |\n")
    assert cli.main(["reproduce", "--index", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert text.rstrip().endswith("## Verdicts that changed\n\n| a | b |")  # the closing note, last
    row = next(line for line in text.splitlines() if line.startswith("| ev.cvae.five_modes "))
    assert "**not reproduced**" in row and "| full |" in row and "full/cvae/report.md" in row
    assert f"**{len(catalogue.CLAIMS)} claims**" in text and "How claims are judged" in text
    unrun = next(line for line in text.splitlines() if line.startswith("| ev.ssvae.paper_scale "))
    assert "**not run**" in unrun and "85 CPU-hours" in unrun
    tested = next(line for line in text.splitlines() if line.startswith("| r.zero_is_softmax "))
    assert "**checked by tests**" in tested and "false as written" in tested
    measured = next(line for line in text.splitlines() if line.startswith("| sm.cost "))
    assert "**measured by the benchmark**" in measured and "cpu_normalizers.json" in measured
    waiting = next(line for line in text.splitlines() if line.startswith("| ev.ssvae.beats_monte_carlo "))
    assert "**no committed run**" in waiting and "reproduce ssvae --decisive" in waiting
    assert "| extra |" in text  # a new comparison, in its own table
    # sparsenorm's own experiments: their claims under their own heading, after the papers' table
    own = text.index("## sparsenorm's own experiments")
    assert text.index("| ev.cvae.five_modes ") < own < text.index("| own.llm.posthoc_on_par ")
    assert f"**{len(catalogue.OWN_CLAIMS)} claims** of experiments no paper ran" in text
    # A decisive run resting on more paired units than the full run is the stronger evidence; on equal units
    # the full run is kept, and a quick run never outranks either, whatever its count.
    _results(tmp_path / "decisive" / "cvae", "decisive", [claim(verdict.REPRODUCED, 10)])
    catalogue.write_paper_index(tmp_path)
    row = _row(tmp_path, "ev.cvae.five_modes")
    assert "| full |" in row
    shutil.rmtree(tmp_path / "decisive")
    _results(tmp_path / "decisive" / "cvae", "decisive", [claim(verdict.REPRODUCED, 12)])
    shutil.rmtree(tmp_path / "quick")
    _results(tmp_path / "quick" / "cvae", "quick", [claim(verdict.NOT_REPRODUCED, 100)])
    catalogue.write_paper_index(tmp_path)
    row = _row(tmp_path, "ev.cvae.five_modes")
    assert "**reproduced**" in row and "| decisive |" in row and "decisive/cvae/report.md" in row
    # equal units and mode: the judgement with more parts (more of the claim tested) is kept
    shutil.rmtree(tmp_path / "decisive")
    _results(tmp_path / "decisive" / "a", "decisive", [dict(claim(verdict.REPRODUCED, 12), evidence="primary: a")])
    _results(tmp_path / "decisive" / "b", "decisive", [dict(claim(verdict.INCONCLUSIVE, 12),
                                                            evidence="primary: a; secondary: b")])
    catalogue.write_paper_index(tmp_path)
    row = _row(tmp_path, "ev.cvae.five_modes")
    assert "**inconclusive**" in row and "decisive/b/report.md" in row
    assert "Another run of equal standing" not in row  # run a tested less of the claim: not its equal
    # equal standing (the same experiment on a second data set, say) and another verdict: the row names it
    _results(tmp_path / "decisive" / "c", "decisive", [dict(claim(verdict.NOT_REPRODUCED, 12),
                                                            evidence="primary: a; secondary: b")])
    catalogue.write_paper_index(tmp_path)
    row = _row(tmp_path, "ev.cvae.five_modes")
    assert "**inconclusive**" in row and "decisive/b/report.md" in row
    assert "Another run of equal standing, [decisive/c](decisive/c/report.md), reads **not reproduced**" in row
    _results(tmp_path / "decisive" / "d", "decisive", [dict(claim(verdict.INCONCLUSIVE, 12),
                                                            evidence="primary: a; secondary: b")])
    catalogue.write_paper_index(tmp_path)
    assert "decisive/d/report.md" not in _row(tmp_path, "ev.cvae.five_modes")  # agreeing peers are not listed
    quick_only = tmp_path / "q"
    _results(quick_only / "quick" / "cvae", "quick", [claim(verdict.REPRODUCED, 3)])
    catalogue.write_paper_index(quick_only)
    assert "**reproduced (indicative)**" in (quick_only / "README.md").read_text()


def test_rejudge_a_committed_run_from_its_records(tmp_path):
    shutil.copytree(ROOT / "results" / "full" / "multilabel", tmp_path / "multilabel")
    changes = committed.rejudge(tmp_path / "multilabel")
    assert len(changes) >= 5 and all(after for _, _, after in changes)
    report = (tmp_path / "multilabel" / "report.md").read_text()
    assert "Re-judged under the current rule" in report and "How claims are judged" in report


def test_reuse_committed_records_as_a_new_runs_job_cache(tmp_path):
    """The committed mt run's records, put into a new --out's job cache under the current code's fingerprints,
    are what the runner loads for those jobs (and only the keys asked for are written)."""
    import pytest

    from sparsenorm.experiments import load
    from sparsenorm.experiments._shared.runner import RunConfig
    from sparsenorm.experiments._shared.runner import JobCache, fingerprint

    written = committed.reuse_records(ROOT / "results" / "decisive" / "mt", tmp_path, ["sparsemax-seed1"])
    assert written == ["sparsemax-seed1"] and [p.name for p in (tmp_path / "mt" / "runs").iterdir()] == [
        "sparsemax-seed1.json"]
    experiment = load("mt").EXPERIMENT
    config = RunConfig(out=tmp_path / "mt", decisive=True)
    settings = experiment.settings(config)
    job = next(j for j in experiment.jobs(settings, config) if j.key == "sparsemax-seed1")
    stamp = fingerprint(settings, job, config, ("seeds", *experiment.fingerprint_exclude))
    record = JobCache(tmp_path / "mt").load(job, stamp)
    assert record["train"] == "sparsemax" and record["seed"] == 1
    assert committed.reuse_records(ROOT / "results" / "decisive" / "mt", tmp_path, ["sparsemax-seed1"]) == []
    with pytest.raises(KeyError, match="not a job"):
        committed.reuse_records(ROOT / "results" / "decisive" / "mt", tmp_path, ["r_softmax-seed0"])
