"""Budget defaults chosen by the developers on a dataset's validation split read that dataset's
records: a reproduction on it with ``--no-tune`` says so, as a tuned one does."""

from __future__ import annotations

import pytest

from privopt.experiments import dro_runner
from privopt.experiments.privacy_notes import DRO_BUDGET_DEFAULTS, TUNED_ON_TRAINING, hyperparameter_note


def test_the_note_names_where_budget_defaults_were_chosen_only_when_asked():
    defaults = {"tuned": False, "hyperparameters": "budget defaults"}
    assert hyperparameter_note(defaults) is None  # chosen on other data: nothing read here
    assert hyperparameter_note(defaults, defaults_note=DRO_BUDGET_DEFAULTS) == DRO_BUDGET_DEFAULTS
    assert hyperparameter_note({"tuned": True}, defaults_note=DRO_BUDGET_DEFAULTS) == TUNED_ON_TRAINING
    given = {"tuned": False, "hyperparameters": {"dp-sgd": {"lr": 1.0}}}
    assert hyperparameter_note(given, defaults_note=DRO_BUDGET_DEFAULTS) is None


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("dataset", "expected"), [("mnist-st", DRO_BUDGET_DEFAULTS), ("digits-st", None)])
def test_an_untuned_reproduction_carries_the_note_of_its_dataset(monkeypatch, tmp_path, dataset, expected):
    seen = {}

    def final_runs(kind, spec, **kw):  # stop before any training: only the note is under test
        seen["note"] = spec.tuning_note
        raise _Stop

    monkeypatch.setattr(dro_runner, "_final_runs", final_runs)
    from privopt.experiments.dro_report import run_dro_table3

    with pytest.raises(_Stop):
        run_dro_table3(dataset=dataset, epsilons=[1.0], seeds=1, tune=False, methods=["dp-sgd"], out_dir=tmp_path / "o")
    assert seen["note"] == expected
