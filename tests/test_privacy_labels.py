"""Outputs that depend on values a run's ε does not cover say so (docs/privacy.md, "What is not accounted")."""

from __future__ import annotations

import json

import pytest

from _run_helpers import cfg, read_record
from privopt.errors import ConfigError
from privopt.experiments import privacy_notes
from privopt.training import train

NOTE = "tuned on a validation split of the training data: not accounted"


def test_a_run_with_tuned_hyperparameters_says_so_in_its_record_also_after_a_resume(tmp_path):
    part = train(cfg(hyperparameter_tuning=NOTE), out_dir=tmp_path / "r", progress=False, max_steps=3)
    assert part["privacy"]["not_accounted"] == {"hyperparameter_tuning": NOTE}
    done = train(None, out_dir=tmp_path / "r", resume=True, progress=False)
    assert done["status"] == "finished"
    assert read_record(tmp_path / "r")["privacy"]["not_accounted"] == {"hyperparameter_tuning": NOTE}
    plain = train(cfg(), out_dir=tmp_path / "p", progress=False)
    assert "not_accounted" not in plain["privacy"]


def test_a_tuning_note_must_be_text():
    with pytest.raises(ConfigError, match="hyperparameter_tuning must be a note"):
        cfg(hyperparameter_tuning=3)


def test_worst_group_rows_and_summary_say_how_their_hyperparameters_were_chosen(tmp_path, monkeypatch):
    """Tuned on the training data's validation split (adult, celeba): every row, summary.json and
    summary.md carry the note; tuned on an independent synthetic draw: no private record was read."""
    import privopt.experiments.worst_group as wg
    from privopt.experiments import worst_group_protocol as protocol

    options = {"num_groups": 2, "dim": 3, "n_train": 200, "n_test_per_group": 50}
    tiny = protocol.Schedule(epochs=1, batch=50, group_batch=50, oco_batch=10, options=options)
    monkeypatch.setitem(protocol.DATASETS, "synthetic", ("synthetic-groups", tiny))
    monkeypatch.setattr(wg, "_hyperparameters", lambda methods, spec, **kw: ({"dp-sgd": {"lr": 0.5}}, {"tuned": True}))
    res = wg.run_worst_group(
        dataset="synthetic", epsilons=[2.0], seeds=1, out_dir=tmp_path / "a", methods=["dp-sgd"], rates=False,
        log=lambda s: None,
    )  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "a" / "results.jsonl").read_text().splitlines()]
    assert rows and all(r["hyperparameter_tuning"] == privacy_notes.TUNED_ON_TRAINING for r in rows)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["hyperparameter_tuning"] == privacy_notes.TUNED_ON_TRAINING
    assert "**Not accounted:** hyper-parameters tuned by grid search" in res["markdown"]
    monkeypatch.undo()
    monkeypatch.setitem(protocol.DATASETS, "synthetic", ("synthetic-groups", tiny))
    res = wg.run_worst_group(
        dataset="synthetic", epsilons=[2.0], seeds=1, out_dir=tmp_path / "b", methods=["dp-sgd"], rates=False,
        log=lambda s: None,
    )  # fmt: skip
    tuning = json.loads((tmp_path / "b" / "tuning.json").read_text())
    assert tuning["tuned"] is True and tuning["selection"] is None  # an independent draw: nothing to disclose
    assert res["hyperparameter_tuning"] is None and "Not accounted" not in res["markdown"]
