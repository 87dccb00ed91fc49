"""A pip user without the optional extras: the CLI imports only the experiment it runs, and an
experiment whose extra is missing exits with one line naming it (issue 25 item 2).

Each case runs in a fresh interpreter in which the named modules cannot be imported.
"""
import subprocess
import sys
import textwrap

import pytest

# makes the given distributions look uninstalled (no metadata, their modules not importable), then
# runs the CLI
RUN_WITHOUT = textwrap.dedent("""\
    import importlib.metadata as metadata
    import sys

    BLOCKED = set(sys.argv[1].split(","))
    MODULES = {{"scikit-learn": "sklearn", "rouge-score": "rouge_score"}.get(d, d) for d in BLOCKED}

    real_version = metadata.version

    def version(distribution):
        if distribution in BLOCKED:
            raise metadata.PackageNotFoundError(distribution)
        return real_version(distribution)

    sys.modules.update(dict.fromkeys(MODULES))  # None there: `import` raises ModuleNotFoundError
    metadata.version = version
    from sparsenorm import cli
    sys.exit(cli.main(sys.argv[2:]))
""")

EXPERIMENT_EXTRAS = ("scipy,scikit-learn,matplotlib,tqdm,rdata,sentencepiece,sacrebleu,rouge-score,"
                     "transformers")


def run_cli_without(blocked, *argv):
    return subprocess.run([sys.executable, "-c", RUN_WITHOUT, blocked, *argv], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("argv", [["--help"], ["demo"], ["reproduce", "--list"]])
def test_commands_that_need_no_extra_work_without_them(argv):
    done = run_cli_without(EXPERIMENT_EXTRAS, *argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_the_claims_index_without_the_experiments_extra_exits_with_one_line_naming_it(tmp_path):
    done = run_cli_without(EXPERIMENT_EXTRAS, "reproduce", "--index", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == "sparsenorm: error: reproduce needs scipy: pip install 'sparsenorm[experiments]'"


@pytest.mark.parametrize("experiment,blocked,extra", [
    ("cvae", EXPERIMENT_EXTRAS, "experiments"),
    ("mt", EXPERIMENT_EXTRAS, "experiments,mt"),
    ("finetune", EXPERIMENT_EXTRAS, "experiments,hf"),
    ("multilabel", "scikit-learn", "experiments"),
    ("finetune", "transformers", "hf"),
    ("llm", "transformers", "hf"),
    ("mt", "sacrebleu", "mt"),
])
def test_an_experiment_without_its_extra_exits_with_one_line_naming_it(experiment, blocked, extra):
    done = run_cli_without(blocked, "reproduce", experiment, "--quick")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"pip install 'sparsenorm[{extra}]'" in lines[0]


def test_every_experiment_states_its_extras():
    from sparsenorm import experiments

    assert set(experiments.EXTRAS) == set(experiments.EXPERIMENTS)
