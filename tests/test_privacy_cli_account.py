"""`privopt account`: delta checks, hard cases, progress line, help text."""

import json

import pytest

from privopt.cli import build_parser, main

BASE = ["account", "--dataset-size", "60000", "--batch-size", "256"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_delta_at_or_above_one_over_n_is_refused_unless_allowed(capsys):
    code, out, err = run(capsys, *BASE, "--steps", "100", "--epsilon", "1", "--delta", "0.5", "--json")
    assert code == 2 and "1/n" in err and "--allow-large-delta" in err and out == ""
    code, out, _ = run(
        capsys, *BASE, "--steps", "100", "--epsilon", "1", "--delta", "0.5", "--allow-large-delta", "--json"
    )
    assert code == 0 and json.loads(out)["delta"] == 0.5


def test_tiny_delta_answers_with_rdp_and_shows_progress(capsys):
    # 4691 steps: a schedule no other test calibrated (a cached result reports no progress)
    code, out, err = run(capsys, *BASE, "--steps", "4691", "--epsilon", "1", "--delta", "1e-30", "--json")
    res = json.loads(out)
    assert code == 0 and res["accountant"] == "rdp" and res["epsilon"] <= 1.0 and res["search_complete"]
    assert res["noise_multiplier"] == pytest.approx(3.455, abs=0.001)
    assert "calibrating (rdp)" in err  # the progress line (not a terminal: plain lines on stderr)
    _, _, quiet_err = run(capsys, *BASE, "--steps", "4692", "--epsilon", "1", "--delta", "1e-30", "--quiet", "--json")
    assert quiet_err == ""


def test_huge_epsilon_answers(capsys):
    code, out, _ = run(capsys, *BASE, "--steps", "4690", "--epsilon", "1000000", "--delta", "1e-5")
    assert code == 0 and "noise multiplier z = " in out and "achieves epsilon" in out


def test_every_account_option_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["account"]
    options = [a for a in sub._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options} >= {"dataset_size", "batch_size", "steps", "epsilon", "delta", "time_limit"}
    assert all(a.help and len(a.help) > 10 for a in options), [a.dest for a in options if not a.help]


def test_pld_progress_is_labelled_pld(capsys, monkeypatch):
    # The fast RDP search only starts a PLD calibration: every progress line must say pld.
    code, out, err = run(capsys, *BASE, "--steps", "1701", "--epsilon", "1", "--delta", "1e-5", "--accountant", "pld")
    lines = [line for line in err.splitlines() if line.startswith("calibrating")]
    assert code == 0 and "(PLD" in out and lines
    assert all(line.startswith("calibrating (pld") for line in lines), lines
    # The CLI prints a line every 2 s in logs, so which stages show depends on speed: check the stages
    # of a calibration nothing has cached (on disk or in this process).
    from privopt.privacy import dp_sgd_noise

    monkeypatch.setenv("PRIVOPT_ACCOUNTING_CACHE", "off")  # a cached calibration reports no progress
    stages = []
    dp_sgd_noise(
        dataset_size=60001, batch_size=257, steps=1703, epsilon=1.0, delta=1e-5, accountant="pld",
        progress=lambda p: stages.append(p.stage),
    )  # fmt: skip
    assert stages[0] == "pld, rdp start" and stages[-1] == "pld" and all(s.startswith("pld") for s in stages)


# ---- the inverse question (--noise-multiplier) and sweeps. Small n and steps, rdp where speed matters.

SMALL = ["account", "--dataset-size", "10000", "--delta", "1e-6"]
TODAY_KEYS = [
    "noise_multiplier", "epsilon", "epsilon_target", "delta", "accountant", "sampling", "neighbouring",
    "sampling_rate", "steps", "search_complete",
]  # fmt: skip


@pytest.mark.parametrize("accountant", ["rdp", "auto"])
def test_the_epsilon_of_the_calibrated_noise_is_the_target_within_the_calibration_tolerance(capsys, accountant):
    from privopt.privacy.search import EPSILON_TOL

    argv = [*SMALL, "--batch-size", "100", "--steps", "60", "--accountant", accountant, "--quiet", "--json"]
    code, out, _ = run(capsys, *argv, "--epsilon", "1.5")
    cal = json.loads(out)
    assert code == 0 and cal["search_complete"]
    code, out, err = run(capsys, *argv, "--noise-multiplier", repr(cal["noise_multiplier"]))
    inv = json.loads(out)
    assert code == 0 and err == ""
    assert 1.5 * (1 - EPSILON_TOL) <= inv["epsilon"] <= 1.5
    assert inv["epsilon"] == cal["epsilon"] and inv["accountant"] == cal["accountant"]
    assert inv["noise_multiplier"] == cal["noise_multiplier"]
    # the same plan: a noise a little smaller than the calibrated one misses the target
    code, out, _ = run(capsys, *argv, "--noise-multiplier", repr(cal["noise_multiplier"] * 0.99))
    assert json.loads(out)["epsilon"] > 1.5


def test_the_json_of_one_combination_keeps_its_shape(capsys):
    code, out, _ = run(capsys, *SMALL, "--batch-size", "100", "--steps", "60", "--epsilon", "1", "--json", "--quiet")
    assert code == 0 and list(json.loads(out)) == TODAY_KEYS
    code, out, _ = run(capsys, *SMALL, "--batch-size", "100", "--epochs", "2", "--noise-multiplier", "1", "--json")
    res = json.loads(out)
    assert code == 0 and res["steps"] == 200 and res["epochs"] == 2.0 and res["noise_multiplier"] == 1.0
    assert set(res) == {*TODAY_KEYS, "epochs"} - {"epsilon_target", "search_complete"}
    code, out, _ = run(capsys, *SMALL, "--batch-size", "100", "--steps", "60", "--noise-multiplier", "1")
    assert code == 0 and out.startswith("noise multiplier z = 1 gives epsilon = ") and "60 steps" in out


def test_a_calibration_sweep_gives_a_row_per_combination_and_z_falls_as_epsilon_grows(capsys):
    argv = [*SMALL, "--batch-size", "50,100", "--steps", "40", "--epsilon", "0.5,1,2", "--accountant", "rdp"]
    code, out, err = run(capsys, *argv, "--json")
    rows = json.loads(out)
    assert code == 0 and isinstance(rows, list) and len(rows) == 6
    assert [(r["batch_size"], r["epsilon_target"]) for r in rows] == [
        (b, e) for b in (50, 100) for e in (0.5, 1.0, 2.0)
    ]
    assert all(list(r) == ["dataset_size", "batch_size", *TODAY_KEYS] for r in rows)
    for b in (50, 100):
        zs = [r["noise_multiplier"] for r in rows if r["batch_size"] == b]
        assert zs == sorted(zs, reverse=True) and len(set(zs)) == 3
    assert all(r["epsilon"] <= r["epsilon_target"] and r["sampling_rate"] == r["batch_size"] / 10000 for r in rows)
    progress = [line for line in err.splitlines() if line.startswith("row ")]
    assert len(progress) == 6 and progress[-1].startswith("row 6/6: B=100, 40 steps, target epsilon 2 -> z = ")
    code, out, err = run(capsys, *argv, "--quiet")
    lines = out.splitlines()
    assert code == 0 and err == ""
    assert lines[0].split() == ["n", "B", "steps", "q", "target", "eps", "z", "epsilon", "delta", "accountant"]
    assert len([line for line in lines if line.lstrip().startswith("10000 ")]) == 6


def test_an_epsilon_sweep_grows_with_the_epochs_at_fixed_noise(capsys):
    argv = [*SMALL, "--batch-size", "100", "--epochs", "1,2,4", "--noise-multiplier", "1,2", "--accountant", "rdp"]
    code, out, _ = run(capsys, *argv, "--json", "--quiet")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 6
    assert [(r["noise_multiplier"], r["epochs"], r["steps"]) for r in rows] == [
        (z, e, 100 * int(e)) for z in (1.0, 2.0) for e in (1.0, 2.0, 4.0)
    ]
    for z in (1.0, 2.0):
        eps = [r["epsilon"] for r in rows if r["noise_multiplier"] == z]
        assert eps == sorted(eps) and len(set(eps)) == 3
    assert rows[0]["epsilon"] > rows[3]["epsilon"]  # more noise, less epsilon
    code, out, _ = run(capsys, *argv, "--quiet")
    assert code == 0 and out.splitlines()[0].split() == ["n", "B", "epochs", "steps", "q", "z", "epsilon", "delta",
                                                          "accountant"]  # fmt: skip


@pytest.mark.parametrize("target", ["--epsilon", "--noise-multiplier"])
def test_plot_writes_a_png(capsys, tmp_path, target):
    png = tmp_path / "sweep.png"
    argv = [*SMALL, "--batch-size", "50,100", "--steps", "10,100", target, "1,4", "--accountant", "rdp", "--quiet"]
    code, out, _ = run(capsys, *argv, "--plot", str(png))
    assert code == 0 and "accountant" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in tmp_path.iterdir()] == ["sweep.png"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--batch-size", "100", "--steps", "10", "--epsilon", "1,0"], "--epsilon: '0' is not > 0"),
        (["--batch-size", "100", "--steps", "10", "--noise-multiplier", "1,-2"], "--noise-multiplier: '-2' is not > 0"),
        (["--batch-size", "100,x", "--steps", "10", "--epsilon", "1"], "--batch-size: 'x' is not an integer"),
        (["--batch-size", "100,20000", "--steps", "10", "--epsilon", "1"], "--batch-size: '20000' exceeds"),
        (["--batch-size", "100", "--steps", "10,2.5", "--epsilon", "1"], "--steps: '2.5' is not an integer"),
        (["--batch-size", "100", "--steps", "10,0", "--epsilon", "1"], "--steps: '0' is not >= 1"),
        (["--batch-size", "100", "--epochs", "1,nan", "--epsilon", "1"], "--epochs: 'nan' is not finite"),
        (["--batch-size", "100", "--epochs", "1", "--epsilon", "1,,2"], "--epsilon: empty item in '1,,2'"),
        (["--batch-size", "100", "--steps", "10", "--epsilon", "1", "--delta", "1e-3"], "1/n"),
        (["--batch-size", "100", "--steps", "10", "--epsilon", "1", "--plot", "TMP/x.jpg"], "is not a .png file"),
        (["--batch-size", "100", "--steps", "10", "--epsilon", "1", "--plot", "TMP/no/x.png"], "does not exist"),
        (["--batch-size", ",".join(map(str, range(1, 21))), "--steps", "1,2,3,4,5", "--epsilon", "1,2,3"],
         "give 20 x 5 x 3 = 300 combinations; at most 200"),
    ],
)  # fmt: skip
def test_a_bad_value_is_named_before_anything_is_accounted(capsys, tmp_path, monkeypatch, args, said):
    import privopt.privacy.sweep as sweep

    def started(*a, **kw):
        raise AssertionError("accounting started despite a bad value")

    monkeypatch.setattr(sweep, "_row", started)
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    plot = [] if "--plot" in args else ["--plot", str(tmp_path / "p.png")]
    code, out, err = run(capsys, *SMALL, *args, *plot)
    assert code == 2 and said in err and out == "", err
    assert list(tmp_path.iterdir()) == []


def test_the_library_sweep_names_a_bad_element_and_caps_the_combinations():
    from privopt.errors import ConfigError
    from privopt.privacy import dp_sgd_sweep

    kw = dict(dataset_size=1000, delta=1e-5, steps=[10], accountant="rdp")
    with pytest.raises(ConfigError, match=r"epsilons\[1\] must be a finite number > 0"):
        dp_sgd_sweep(batch_sizes=[10], epsilons=[1.0, 0.0], **kw)
    with pytest.raises(ConfigError, match="make 3 combinations; at most 2"):
        dp_sgd_sweep(batch_sizes=[10, 20, 30], noise_multipliers=[1.0], max_rows=2, **kw)
    with pytest.raises(ConfigError, match="exactly one of epsilons= and noise_multipliers="):
        dp_sgd_sweep(batch_sizes=[10], **kw)
    rows = dp_sgd_sweep(batch_sizes=[10], noise_multipliers=[1.0, 2.0], **kw)
    assert [r["noise_multiplier"] for r in rows] == [1.0, 2.0] and rows[0]["epsilon"] > rows[1]["epsilon"]


def test_a_sweep_says_how_long_it_has_run_and_about_how_long_is_left(capsys, monkeypatch):
    """A 200-row PLD calibration sweep ran 3.8 min (1.1 s a row) on the shared machine: each row line
    tells the time so far and, from the mean row so far, the time left; the last the total."""
    import privopt.cli_account as cli_account

    ticks = iter(range(0, 1000, 30))  # every clock reading 30 s after the previous one
    monkeypatch.setattr(cli_account, "_now", lambda: float(next(ticks)))
    argv = [*SMALL, "--batch-size", "100", "--steps", "40", "--noise-multiplier", "1,2,3", "--accountant", "rdp"]
    code, _, err = run(capsys, *argv)
    rows = [line for line in err.splitlines() if line.startswith("row ")]
    assert code == 0 and len(rows) == 3
    assert rows[0].endswith(", 30.0 s (30 s so far, about 1.0 min left)"), rows[0]
    assert rows[1].endswith(", 30.0 s (1.0 min so far, about 30 s left)"), rows[1]
    assert rows[2].endswith(", 30.0 s (1.5 min in all)"), rows[2]
