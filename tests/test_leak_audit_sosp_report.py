"""Paper C's reproduction reports SOSP diagnostics measured on TRAINING records without noise
(grad_norm, hessian_min_eig): every summary output says they are not private, as the DRO
reproductions do for their training-set measurements (docs/privacy.md, 'Diagnostics')."""

import json

from privopt.experiments import sosp
from privopt.experiments.sosp_protocol import BUDGETS


def test_the_sosp_summary_and_table_say_the_training_diagnostics_are_not_private(tmp_path):
    rows = [
        {"method": m, "clients": 1, "epsilon": 1.0, "seed": 0, "test_accuracy": 0.8, "test_loss": 0.5,
         "grad_norm": 0.1, "hessian_min_eig": -0.01, "curve": [[0.0, 0.1, 2.3], [1.0, 0.8, 0.5]]}
        for m in ("gauss-psgd", "dp-spider-sosp", "fed-dp-sgd")
    ]  # fmt: skip
    timing = {"wall_s": 1.0, "cpu_s": 1.0, "load_avg_mean": 0.0, "load_avg_max": 0.0, "workers": 1}
    res = sosp._report(rows, out=tmp_path, dataset="mnist", plan=BUDGETS["quick"], timing=timing, launcher="simulate")
    summary = json.loads((tmp_path / "summary.json").read_text())
    for text in (summary["not_private"], res["markdown"], (tmp_path / "table.md").read_text()):
        assert "NOT private" in text and "grad_norm" in text and "hessian_min_eig" in text


def _rows(seeds):
    return [
        {"method": m, "clients": 1, "epsilon": 1.0, "seed": s, "test_accuracy": 0.8, "test_loss": 0.5,
         "grad_norm": 0.1, "hessian_min_eig": -0.01, "curve": [[0.0, 0.1, 2.3], [1.0, 0.8, 0.5]]}
        for m in ("gauss-psgd", "dp-spider-sosp", "fed-dp-sgd") for s in seeds
    ]  # fmt: skip


def test_seeds_beyond_the_tuning_exclusion_are_said_to_read_the_tuning_records(tmp_path):
    timing = {"wall_s": 1.0, "cpu_s": 1.0, "load_avg_mean": 0.0, "load_avg_max": 0.0, "workers": 1}
    quick = BUDGETS["quick"]
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    three = sosp._report(_rows(range(3)), out=tmp_path / "a", dataset="mnist", plan=quick, timing=timing,
                         launcher="simulate")  # fmt: skip
    assert "hyperparameter_tuning" not in three["summary"]  # seeds 0-2: tuned on records outside them
    five = sosp._report(_rows(range(5)), out=tmp_path / "b", dataset="mnist", plan=quick, timing=timing,
                        launcher="simulate")  # fmt: skip
    note = json.loads((tmp_path / "b" / "summary.json").read_text())["hyperparameter_tuning"]
    assert "seeds [3, 4]" in note and "NOT accounted" in note
    assert f"**Not accounted:** hyper-parameters {note}" in (tmp_path / "b" / "table.md").read_text()
    assert five["summary"]["hyperparameter_tuning"] == note
