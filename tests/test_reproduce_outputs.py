"""`privopt reproduce ... --out DIR` when the reproduction cannot start: a user error (exit 2, one
line naming the problem) that leaves nothing behind, so the corrected command runs into the same DIR."""

from __future__ import annotations

import pytest

from privopt.cli import main


def run(capsys, argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse usage errors
        code = e.code
    return code, capsys.readouterr().err


MISSING_DATA = [
    ["sosp", "--workers", "1", "--clients", "1", "--epsilons", "1", "--seeds", "1"],
    ["sosp", "--tune", "--workers", "1"],
    ["dro-table3", "--dataset", "mnist-st", "--methods", "dp-sgd", "--epsilons", "1", "--seeds", "1"],
    ["dro-mia", "--methods", "dp-sgd", "--epsilons", "1", "--seeds", "1"],
]


@pytest.mark.parametrize("argv", MISSING_DATA, ids=[" ".join(a[:2]) for a in MISSING_DATA])
def test_missing_data_leaves_no_output_folder(argv, capsys, tmp_path):
    """A mistyped --data-dir used to leave the output folder (sosp: with an empty results.jsonl, so the
    corrected command was refused with "output directory ... is not empty")."""
    (tmp_path / "data").mkdir()
    out = tmp_path / "out"
    code, err = run(capsys, ["reproduce", *argv, "--data-dir", tmp_path / "data", "--out", out, "--quiet"])
    assert code == 2 and "no folder for it under" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


def test_an_existing_output_folder_is_kept(capsys, tmp_path):
    """Only a folder the failed reproduction created is removed; the user's own stays, as it was."""
    (tmp_path / "data").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    argv = ["reproduce", *MISSING_DATA[0], "--data-dir", tmp_path / "data", "--out", out, "--quiet"]
    assert run(capsys, argv)[0] == 2
    assert out.is_dir() and list(out.iterdir()) == []


OUT_IS_A_FILE = [
    ["sosp"],
    ["dro-table3", "--dataset", "digits-st"],
    ["dro-mia", "--dataset", "digits-st"],
    ["erm-covertype", "--data-dir", "DATA"],
    ["worst-group", "--dataset", "synthetic"],
]


@pytest.mark.parametrize("argv", OUT_IS_A_FILE, ids=[a[0] for a in OUT_IS_A_FILE])
@pytest.mark.parametrize("below", [False, True], ids=["file", "below-a-file"])
def test_an_output_path_that_is_a_file_is_named(argv, below, capsys, tmp_path):
    """It was "privopt: error: File exists: out" (or "Not a directory"), sometimes after loading the data."""
    (tmp_path / "data").mkdir()
    (tmp_path / "out").write_text("mine\n")
    out = tmp_path / "out" / "sub" if below else tmp_path / "out"
    argv = [str(tmp_path / "data") if a == "DATA" else a for a in argv]
    code, err = run(capsys, ["reproduce", *argv, "--out", out, "--quiet"])
    assert code == 2 and err.strip() == (
        f"privopt: error: cannot create output directory {out}: {tmp_path / 'out'} is a file"
        if below
        else f"privopt: error: output path {out} is a file, not a directory; choose a new directory"
    )
    assert (tmp_path / "out").read_text() == "mine\n"


def test_a_result_written_before_the_error_is_kept(capsys, tmp_path, monkeypatch):
    """Only what holds no data is removed: rows already written stay (a reproduction keeps a valid prefix)."""
    import privopt.experiments.sosp as sosp
    from privopt.errors import DataError

    def fails_after_one_row(*, out_dir, **kw):
        out = tmp_path / "out"
        (out / "runs" / "gauss-psgd" / "m1").mkdir(parents=True)
        (out / "results.jsonl").write_text('{"method": "gauss-psgd"}\n')
        (out / "empty.md").write_text("")
        (out / "plots").mkdir()
        raise DataError("the second dataset is missing")

    monkeypatch.setattr(sosp, "run_sosp", fails_after_one_row)
    code, err = run(capsys, ["reproduce", "sosp", "--out", tmp_path / "out", "--quiet"])
    assert code == 2 and err.strip() == "privopt: error: the second dataset is missing"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.jsonl"]
