"""Options are taken only as spelt in full, and a misspelt one is named with the close option of its
own sub-command."""

import pytest

from privopt.cli import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bench", "--batch-size", "8", "--models", "tiny"], "--batch-size 8 (did you mean '--batch-sizes'?)"),
        (["reproduce", "dro-table3", "--datase", "mnist-st", "--out", "x"],
         "--datase mnist-st (did you mean '--dataset'?)"),
        (["train", "--confg", "x.yaml", "--out", "y"], "--confg x.yaml (did you mean '--config'?)"),
        (["account", "--dataset-size", "1000", "--batch-size", "10", "--steps", "5", "--delta", "1e-5",
          "--epsilon", "1", "--eps", "2"], "--eps 2"),  # an abbreviation of --epsilon is not taken as it
    ],
)  # fmt: skip
def test_an_abbreviated_or_misspelt_option_is_refused_with_the_close_name(argv, said, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ex:
        main(argv)
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {said}" in err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_a_suggestion_comes_from_the_sub_command_it_was_given_to(capsys):
    # --dataset exists for reproduce's experiments, not for list: not suggested there
    with pytest.raises(SystemExit):
        main(["list", "--datase", "x"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --datase x" in err and "did you mean" not in err


@pytest.mark.parametrize("given", [["--run", "runs/x"], ["--run=runs/x"]])
def test_audit_given_a_run_folder_says_it_takes_the_runs_config(given, capsys):
    """Not "did you mean '--runs'": that is a count of trainings, and audit takes a config, not a run."""
    with pytest.raises(SystemExit) as ex:
        main(["audit", *given])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ex.value.code == 2 and f"unrecognized arguments: {' '.join(given)} (privopt audit takes no run" in err
    assert "the config the run was trained with, --config FILE" in err and "did you mean" not in err
    with pytest.raises(SystemExit):  # the close name of audit's other options, and of --run elsewhere, as before
        main(["audit", "--canary", "5"])
    assert "(did you mean '--canaries'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["predict", "--run", "r", "--input", "i.csv", "--out", "o.csv", "--runs", "2"])
    assert "(did you mean '--run'?)" in capsys.readouterr().err


ACCOUNT = ["account", "--dataset-size", "1000", "--batch-size", "10", "--steps", "5", "--delta", "1e-5"]
NEGATIVE = [  # a value that starts with '-' (a negative number, a list led by one) is the option's value, not an option
    ([*ACCOUNT, "--epsilon", "-1,2"], "--epsilon: '-1' is not > 0"),
    ([*ACCOUNT, "--epsilon", "-1e3"], "--epsilon: '-1e3' is not > 0"),
    ([*ACCOUNT, "--epsilon", "-inf"], "--epsilon: '-inf' is not finite"),
    ([*ACCOUNT, "--noise-multiplier", "-.5,1"], "--noise-multiplier: '-.5' is not > 0"),
    ([*ACCOUNT[:5], "--epochs", "-1,2", *ACCOUNT[7:], "--epsilon", "1"], "--epochs: '-1' is not > 0"),
    ([*ACCOUNT[:5], "--steps", "-5,10", *ACCOUNT[7:], "--epsilon", "1"], "--steps: '-5' is not >= 1"),
    ([*ACCOUNT[:3], "--batch-size", "-10,20", *ACCOUNT[5:], "--epsilon", "1"], "--batch-size: '-10' is not >= 1"),
    ([*ACCOUNT[:-1], "-1e-5", "--epsilon", "1"], "--delta: '-1e-05' is not in (0, 1)"),
    ([*ACCOUNT, "--epsilon", "1", "--time-limit", "-1e3"], "--time-limit: '-1000' is not > 0"),
    (["bench", "--batch-sizes", "-128,512"], "argument --batch-sizes: expected an integer >= 1, got '-128'"),
    (["reproduce", "sosp", "--clients", "-1,2", "--out", "o"], "--clients: expected an integer >= 1, got '-1'"),
    (["reproduce", "sosp", "--epsilons", "-0.5,1", "--out", "o"], "expected a finite number > 0, got '-0.5'"),
    (["reproduce", "dro-table3", "--epsilons", "-.5", "--out", "o"], "argument --epsilons: expected a finite number"),
]


def _case(argv):
    value = next(a for a in argv if a.startswith("-") and not a.startswith("--"))
    return f"{argv[0]} {argv[argv.index(value) - 1]} {value}"


@pytest.mark.parametrize(("argv", "said"), NEGATIVE, ids=[_case(a) for a, _ in NEGATIVE])
def test_a_negative_value_is_refused_by_its_option_not_read_as_an_option(argv, said, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ex:
        code = main(argv)
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert ex.value.code == 2, err
    assert said in err.strip().splitlines()[-1] and "expected one argument" not in err
    assert list(tmp_path.iterdir()) == []
