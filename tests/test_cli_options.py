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
