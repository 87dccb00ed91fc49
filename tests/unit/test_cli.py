"""`sparsenorm reproduce` rejects bad input with exit status 2 and one line naming the valid values."""
import pytest
import torch

from sparsenorm import cli, registry


def run_cli(capsys, *argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse errors exit from inside parse_args
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.err


def assert_one_line_error(err: str):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sparsenorm: error:")
    assert "Traceback" not in err


def test_unknown_experiment_lists_the_valid_ones(capsys):
    code, err = run_cli(capsys, "reproduce", "nosuch")
    assert code == 2
    assert_one_line_error(err)
    assert "nosuch" in err and "cvae" in err and "all" in err


def test_unknown_normalizer_lists_the_registry(capsys):
    code, err = run_cli(capsys, "reproduce", "cvae", "--normalizers", "softmax,softmaxx", "--quick")
    assert code == 2
    assert_one_line_error(err)
    assert "softmaxx" in err
    assert all(name in err for name in registry.names())


@pytest.mark.parametrize("value", ["0", "-3", "three", "1.5"])
def test_bad_seeds(capsys, value):
    code, err = run_cli(capsys, "reproduce", "cvae", "--seeds", value)
    assert code == 2
    assert_one_line_error(err)
    assert "--seeds must be a positive integer" in err


def test_bad_epochs(capsys):
    code, err = run_cli(capsys, "reproduce", "cvae", "--epochs", "0")
    assert code == 2
    assert_one_line_error(err)
    assert "--epochs must be a positive integer" in err


def test_bad_device(capsys):
    code, err = run_cli(capsys, "reproduce", "cvae", "--device", "tpu")
    assert code == 2
    assert_one_line_error(err)
    assert "tpu" in err and "auto" in err and "cpu" in err and "cuda" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(capsys):
    code, err = run_cli(capsys, "reproduce", "cvae", "--device", "cuda")
    assert code == 2
    assert_one_line_error(err)
    assert "CUDA is not available" in err and "cpu" in err


def test_missing_experiment_name(capsys):
    code, err = run_cli(capsys, "reproduce")
    assert code == 2
    assert_one_line_error(err)
    assert "cvae" in err


def test_data_problem_is_one_line(capsys, tmp_path):
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03")  # an incomplete IDX set
    code, err = run_cli(capsys, "reproduce", "cvae", "--quick", "--data-dir", str(tmp_path),
                        "--out", str(tmp_path / "out"), "--normalizers", "softmax")
    assert code == 2
    assert_one_line_error(err)
    assert "train-labels-idx1-ubyte" in err


def test_build_kernels_reports_what_was_built(capsys):
    from sparsenorm import kernels

    code = cli.main(["build-kernels"])
    out = capsys.readouterr().out
    built = [name for name, ok in kernels.available().items() if ok]
    assert code == (0 if len(built) == len(kernels.available()) else 1)
    assert all(name in out for name in built)


@pytest.mark.parametrize("argv", [["reproduce", "--help"], ["reproduce", "ssvae", "--help"]])
def test_help_prints_descriptions_with_percent_signs(capsys, argv):
    """ssvae's description says "10% labels": argparse's help strings are %-templates, so it must be escaped."""
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 0
    assert "10% labels" in capsys.readouterr().out
