"""Decisive mode: every experiment's smallest setting in which each seed-comparing claim can reach a verdict."""
import re

import pytest

from sparsenorm.experiments import EXPERIMENTS, load
from sparsenorm.experiments._shared import verdict
from sparsenorm._text import UserFacingError
from sparsenorm.experiments._shared.runner import RunConfig


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_decisive_mode_has_enough_seeds_and_states_what_it_leaves_out(name, tmp_path):
    experiment = load(name).EXPERIMENT
    decisive = experiment.settings(RunConfig(out=tmp_path, decisive=True))
    quick = experiment.settings(RunConfig(out=tmp_path, quick=True))
    # the paired units are seeds, or for an experiment without randomness (llm) its ``paired_units`` (chunks of text)
    units = lambda settings: getattr(settings, "paired_units", settings.seeds)  # noqa: E731
    assert units(decisive) >= verdict.min_pairs() > units(quick)  # quick cannot decide; decisive can
    # what it leaves out, and its cost on 2 cores (minutes or hours)
    note = experiment.decisive_note
    assert "Leaves out" in note and re.search(r"(min|h) on 2 (idle )?cores", note)
    # the note names the mode itself (the report prints it as is: no "Decisive mode. Decisive mode:")
    assert experiment.decisive_note.startswith("Decisive mode: ")
    if hasattr(decisive, "paired_units"):  # no seeds to set: asking for more than one is refused, naming the option
        with pytest.raises(UserFacingError, match="--seeds"):
            experiment.settings(RunConfig(out=tmp_path, decisive=True, seeds=7))
        return
    # Seeds are a setting of every mode.
    assert experiment.settings(RunConfig(out=tmp_path, decisive=True, seeds=7)).seeds == 7
    assert experiment.settings(RunConfig(out=tmp_path, seeds=7)).seeds == 7


def test_quick_and_decisive_exclude_each_other(tmp_path):
    with pytest.raises(UserFacingError, match="--quick and --decisive"):
        RunConfig(out=tmp_path, quick=True, decisive=True).mode


def test_cli_takes_decisive_and_rejects_it_with_quick(tmp_path):
    from sparsenorm import cli

    args = cli.build_parser().parse_args(["reproduce", "cvae", "--decisive", "--seeds", "8"])
    assert args.decisive and args.seeds == 8 and not args.quick
    assert cli.main(["reproduce", "cvae", "--quick", "--decisive", "--out", str(tmp_path)]) == 2
