"""Small fixes: a failed reproduction writes nothing, CelebA refuses duplicate image rows, and
``privopt account`` logs its search correctly."""

from __future__ import annotations

import pytest

from privopt.errors import ConfigError, DataError
from privopt.experiments.sosp import run_sosp


def _sosp(out, **over):
    kwargs = dict(dataset="mnist", clients=[1], epsilons=[1.0], seeds=1, budget="quick", out_dir=out, workers=1)
    kwargs.update(over)
    return run_sosp(log=lambda s: None, **kwargs)


@pytest.mark.parametrize(
    "over, error, says",
    [
        ({"budget": "nope"}, ConfigError, "budget must be one of"),
        ({"methods": ["nope"]}, ConfigError, "no parameters for 'nope'"),
        ({"seeds": 0}, ConfigError, "seeds must be an integer >= 1"),
        ({"epsilons": [-1.0]}, ConfigError, "epsilons must be a finite number > 0"),
        ({"clients": []}, ConfigError, "clients must be a non-empty list"),
        ({"split": "zigzag"}, ConfigError, "split must be one of"),
        ({"workers": 0}, ConfigError, "workers must be an integer >= 1"),
    ],
)
def test_run_sosp_refuses_bad_arguments_before_creating_its_folder(tmp_path, over, error, says):
    out = tmp_path / "new" / "out"
    with pytest.raises(error, match=says):
        _sosp(out, **over)
    assert not (tmp_path / "new").exists()


def test_run_sosp_that_fails_at_its_first_run_leaves_no_empty_results(tmp_path):
    empty = tmp_path / "no-data"
    empty.mkdir()
    out = tmp_path / "out"
    with pytest.raises(DataError):  # the data folder has no mnist: found when the first run loads it
        _sosp(out, data_dir=str(empty))
    assert not out.exists()  # not an empty results.jsonl that makes the corrected call refuse the folder
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(DataError):
        _sosp(existing, data_dir=str(empty))
    assert existing.is_dir() and list(existing.iterdir()) == []  # the user's empty folder is kept, emptied
