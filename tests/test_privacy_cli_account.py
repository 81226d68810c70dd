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
