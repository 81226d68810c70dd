"""``privopt demo``: the DRO methods on digits-st, table with epsilon spent, gradient-norm plot."""

from privopt.experiments.demo import DEMO_HYPERPARAMETERS, run_demo
from privopt.experiments.dro import TABLE3_METHODS


def test_quick_demo_runs_every_method(tmp_path, capsys):
    rows = run_demo(out_dir=tmp_path, progress=False, quick=True)
    assert {r["method"] for r in rows} == set(TABLE3_METHODS) | {"scdro"} == set(DEMO_HYPERPARAMETERS)
    for r in rows:
        if r["private"]:
            assert 0 < r["epsilon_spent"] <= 1.0 + 1e-6 and r["mia_within_bound"] is True
        else:
            assert r["epsilon_spent"] is None
    text = capsys.readouterr().out
    assert "ε spent" in text and "DP Recursive-SPIDER" in text and "| ε = 1 |" in text
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (run_dir / "fig1_gradnorm_eps1.png").stat().st_size > 1000
    assert (run_dir / "results.jsonl").read_text().count("\n") == len(rows)
