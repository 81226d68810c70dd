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


def test_celeba_attribute_file_refuses_a_duplicate_image_row(tmp_path, monkeypatch):
    from privopt.data import formats

    path = tmp_path / "list_attr_celeba.txt"
    path.write_text("3\nSmiling Male\na.jpg 1 -1\nb.jpg -1 1\na.jpg 1 1\n")
    monkeypatch.delenv("PRIVOPT_DEBUG", raising=False)
    with pytest.raises(DataError) as info:
        formats.read_celeba_attributes(path)
    assert str(info.value) == f"{path}: an image has more than one row; each image must appear once"  # no id
    monkeypatch.setenv("PRIVOPT_DEBUG", "1")  # debugging one's own file: the id is named
    with pytest.raises(DataError, match="image 'a.jpg' has more than one row"):
        formats.read_celeba_attributes(path)


def test_celeba_partition_file_refuses_a_duplicate_image(tmp_path):
    from privopt.data import formats

    path = tmp_path / "list_eval_partition.txt"
    path.write_text("a.jpg 0\nb.jpg 0\na.jpg 2\n")
    with pytest.raises(DataError) as info:
        formats.read_celeba_partition(path)
    assert str(info.value) == f"{path}: image 'a.jpg' is listed more than once (line 3)"


def test_celeba_loader_refuses_duplicate_rows(tmp_path):
    from privopt.data import load_dataset

    d = tmp_path / "celeba"
    d.mkdir()
    rows = [f"{i:06d}.jpg " + " ".join(["1", "-1", "1"] if i % 2 else ["-1", "1", "-1"]) for i in range(6)]
    rows.append(rows[2])  # the same person twice
    (d / "list_attr_celeba.txt").write_text(f"{len(rows)}\nSmiling Male Young\n" + "\n".join(rows) + "\n")
    (d / "list_eval_partition.txt").write_text("".join(f"{i:06d}.jpg {i % 2}\n" for i in range(6)))
    with pytest.raises(DataError, match=r"list_attr_celeba\.txt: an image has more than one row"):
        load_dataset("celeba", data_dir=tmp_path, target="Smiling", group="Male")


ACCOUNT = ["account", "--dataset-size", "60000", "--batch-size", "256", "--steps", "1237", "--epsilon", "1"]
# (a schedule no other test calibrates: a result cached in this process reports no progress)


def test_account_json_log_ends_on_the_answer(capsys):
    """`privopt account --json` logged only "calibrating (rdp): 1 evaluations ...; best so far none yet"
    when the search took under 2 s: the first evaluation, then nothing."""
    import json

    from privopt.cli import main

    assert main([*ACCOUNT, "--delta", "1e-5", "--json"]) == 0
    out, err = capsys.readouterr()
    z = json.loads(out)["noise_multiplier"]  # stdout holds the JSON alone; the log is on stderr
    lines = err.splitlines()
    assert lines and all(line.startswith("calibrating (") for line in lines)
    assert "none yet" not in lines[-1] and lines[-1].endswith(f"best so far {z:.6g}")


def test_progress_line_ends_a_log_on_the_last_state(monkeypatch):
    import io

    from privopt.privacy import search
    from privopt.privacy.search import CalibrationProgress, ProgressLine

    now = [100.0]
    monkeypatch.setattr(search.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    line = ProgressLine(stream, quiet=False)
    for t, best in ((100.1, None), (100.5, 1.4), (101.0, 1.35), (102.5, 1.32), (102.9, 1.31)):
        now[0] = t
        line(CalibrationProgress("pld", 1, 1.0, 1.1, best, t - 100.0))
    assert [ln.rsplit("; ", 1)[1] for ln in stream.getvalue().splitlines()] == [
        "best so far none yet",  # the first evaluation at once, then one line per 2 s
        "best so far 1.32",
    ]
    line.finish()
    assert stream.getvalue().splitlines()[-1].endswith("best so far 1.31")  # the last state closes the log
    line.finish()
    assert len(stream.getvalue().splitlines()) == 3  # once
    quiet = io.StringIO()
    silent = ProgressLine(quiet, quiet=True)
    silent(CalibrationProgress("pld", 1, 1.0, 1.1, None, 0.0))
    silent.finish()
    assert quiet.getvalue() == ""


# ----------------------------------------------------------------------------- reproductions called from Python


@pytest.mark.parametrize("entry", ["run_dro_table3", "run_dro_mia"])
def test_a_dro_reproduction_that_fails_before_any_result_leaves_no_folder(tmp_path, entry):
    import privopt.experiments.dro_report as report

    out = tmp_path / "out"
    with pytest.raises(DataError, match="does not exist"):
        getattr(report, entry)(dataset="mnist-st", data_dir=tmp_path / "missing", out_dir=out, log=lambda s: None)
    assert not out.exists()


def test_sosp_tuning_names_an_unknown_budget(tmp_path):
    from privopt.experiments.sosp_tuning import run_tuning

    with pytest.raises(ConfigError, match="unknown budget 'nope'"):
        run_tuning(data_dir=tmp_path, budget="nope", out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
