"""The per-run log line of the DRO reproductions."""

from privopt.experiments.dro_rows import log_row

ROW = {
    "method": "dp-double-spider",
    "epsilon": 1.0,
    "epsilon_spent": 1.0,
    "seed": 0,
    "test_accuracy": 0.5,
    "mia_auc": 0.51,
    "mia_bound": 0.73,
    "model": "logreg",
    "wall_s": 1.0,
}


def _line(**changes):
    lines = []
    log_row(lines.append, "mia", {**ROW, **changes})
    return lines[0]


def test_a_metric_that_was_not_asked_for_is_not_printed_as_nan():
    line = _line(grad_norm=None)
    assert "grad norm" not in line and "nan" not in line
    assert "MIA AUC 0.510 (cap 0.730)" in line


def test_a_measured_gradient_norm_is_printed_and_a_nan_one_says_so():
    assert "grad norm 0.123" in _line(grad_norm=0.123)
    assert "grad norm nan" in _line(grad_norm=float("nan"))


def test_a_failed_runs_row_keeps_the_type_of_a_foreign_error_not_its_text(tmp_path, monkeypatch):
    import privopt.experiments.dro_runner as runner
    from privopt.experiments.dro_protocol import BUDGETS
    from privopt.experiments.dro_runner import RunSpec

    def failing(*args, **kwargs):
        raise ValueError("label 7.25 of record 12 is odd")  # as torch or a user's loss might word it

    monkeypatch.setattr(runner, "run_one", failing)
    spec = RunSpec("digits-st", BUDGETS["quick"], insecure_seed=0)
    row = runner._final_run(
        "dp-sgd",
        spec,
        data=None,
        private=True,
        hp={"lr": 1.0, "clip": 0.1},
        eps=1.0,
        seed=0,
        run_dir=tmp_path,
        metrics=[],
    )
    assert row["error"].startswith("ValueError") and "7.25" not in row["error"]
    lines = []
    log_row(lines.append, "final", {**row, "epsilon": 1.0})
    assert "FAILED (ValueError" in lines[0] and "7.25" not in lines[0]
