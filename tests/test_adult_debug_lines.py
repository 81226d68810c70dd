"""Adult's column errors (a value outside the adult.names vocabulary, a group that cannot be formed)
name the file line of the record under ``--debug`` only, like the other loaders' errors."""

import pytest

from privopt.data import load_dataset
from privopt.errors import DEBUG_ENV, DataError

ROW = (
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, {race}, Male, "
    "2174, 0, 40, {country}, <=50K\n"
)
GOOD = ROW.format(race="White", country="United-States")
MISSING = ROW.format(race="White", country="?")  # dropped under missing="drop"


def _adult(tmp_path, bad_row: str):
    d = tmp_path / "adult"
    d.mkdir()
    # line 1: a '|' comment, line 2: blank, lines 3-4: records (one with '?'), line 5: the bad record
    (d / "adult.data").write_text("|1x3 Cross validator\n\n" + GOOD + MISSING + bad_row)
    return tmp_path


CASES = [
    ({"race": "Martian", "country": "United-States"}, {"group": "sex"}, "race of {} cannot be grouped"),
    ({"race": "White", "country": "Atlantis"}, {}, "native-country of {} is not in the adult.names vocabulary"),
    (
        {"race": "White", "country": "Atlantis"},
        {"missing": "drop"},  # the '?' row is dropped first: the line is still the file's
        "native-country of {} is not in the adult.names vocabulary",
    ),
]


@pytest.mark.parametrize("fields, options, problem", CASES)
def test_without_debug_the_error_names_the_column_only(tmp_path, monkeypatch, fields, options, problem):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    root = _adult(tmp_path, ROW.format(**fields))
    with pytest.raises(DataError) as err:
        load_dataset("adult", data_dir=root, **options)
    said = str(err.value).split("adult.data: ", 1)[1]
    assert said.startswith(problem.format("some record"))
    assert "line" not in said and "5" not in said
    assert "Martian" not in said and "Atlantis" not in said  # never the value


@pytest.mark.parametrize("fields, options, problem", CASES)
def test_under_debug_the_error_names_the_file_line(tmp_path, monkeypatch, fields, options, problem):
    monkeypatch.setenv(DEBUG_ENV, "1")
    root = _adult(tmp_path, ROW.format(**fields))
    with pytest.raises(DataError) as err:
        load_dataset("adult", data_dir=root, **options)
    said = str(err.value).split("adult.data: ", 1)[1]
    assert said.startswith(problem.format("line 5"))


def test_read_adult_returns_file_lines_on_request(tmp_path):
    from privopt.data import formats

    root = _adult(tmp_path, GOOD)
    cols, label, lines = formats.read_adult(root / "adult" / "adult.data", lines=True)
    assert lines.tolist() == [3, 4, 5] and len(label) == 3 and len(cols["race"]) == 3
    assert len(formats.read_adult(root / "adult" / "adult.data")) == 2  # the default is unchanged
