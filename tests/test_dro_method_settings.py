"""Per-method settings of a DRO reproduction budget (own model, lr grid, config fields) and the
report of a reproduction that runs only the non-private reference."""

import dataclasses
import json

import pytest

from privopt.errors import ConfigError
from privopt.experiments.dro import BUDGETS, format_table, method_params, run_dro_table3
from privopt.experiments.dro_protocol import MethodSetting

SCDRO_OWN = MethodSetting(
    model="mlp",
    model_params={"hidden": 8},
    lrs=(0.05,),
    batch_size=64,
    algorithm_params={"lr_norm": None},
    reason="non-private reference",
)
TINY = dataclasses.replace(
    BUDGETS["quick"],
    epochs=0.5,
    tune_epochs=0.25,
    eval_points=2,
    lrs=(10.0, 40.0),
    batch_size=128,
    refresh=128,
    method_settings={"scdro": SCDRO_OWN},
)


@pytest.fixture(scope="module")
def scdro_only(tmp_path_factory):
    out = tmp_path_factory.mktemp("scdro") / "out"
    res = run_dro_table3(
        dataset="digits-st",
        epsilons=[1.0, 5.0],
        seeds=1,
        budget=TINY,
        methods=["scdro"],
        out_dir=out,
        log=lambda s: None,
        insecure_seed=0,
    )
    return res, out


def test_method_setting_reaches_the_run_config_and_the_records(scdro_only):
    _res, out = scdro_only
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # A non-private method runs once per seed, not once per ε.
    assert [(r["method"], r["epsilon"]) for r in rows] == [("scdro", None)]
    assert rows[0]["model"] == "mlp" and rows[0]["model_params"] == {"hidden": 8}
    config = json.loads((out / "runs/final/scdro/epsNone/seed0/record.json").read_text())["config"]
    assert config["model"] == "mlp" and config["model_params"] == {"hidden": 8}
    params = config["algorithm_params"]
    assert params["lr_norm"] is None and params["lr"] == 0.05
    assert params["b1"] == params["b3"] == params["s_batch"] == 64  # the method's batch, not the budget's 128
    tuning = json.loads((out / "tuning.json").read_text())
    assert [t["lr"] for t in tuning["trials"]] == [0.05]  # the method's own grid, not the shared one
    assert tuning["method_lr_grids"] == {"scdro": [0.05]}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget"]["method_settings"]["scdro"]["model"] == "mlp"


def test_scdro_alone_fills_the_tables(scdro_only):
    res, out = scdro_only
    text = (out / "table3.md").read_text()
    value = f"{100 * res['rows'][0]['test_accuracy']:.2f}"
    assert f"| non-private (SCDRO) | {value} |" in text
    assert "| SCDRO (non-private) | mlp (hidden=8) | 64 | 0.05 | non-private reference |" in text
    assert "| ε = 1 |" not in text  # no private column: no rows of dashes


def test_format_table_with_only_a_nonprivate_method():
    rows = [{"method": "scdro", "epsilon": None, "private": False, "test_accuracy": a} for a in (0.96, 0.98)]
    lines = format_table(rows, methods=[], epsilons=[1.0]).splitlines()
    assert lines == ["| setting | SCDRO (non-private) |", "|---|---|", "| non-private (SCDRO) | 97.00 ± 1.41 |"]


def test_explicit_model_beats_the_method_setting(tmp_path):
    res = run_dro_table3(
        dataset="digits-st",
        epsilons=[1.0],
        seeds=1,
        budget=TINY,
        methods=["dp-sgd"],
        model="logreg",
        out_dir=tmp_path / "out",
        tune=False,
        log=lambda s: None,
        hyperparameters={"dp-sgd": {"lr": 10.0, "clip": 0.1}, "scdro": {"lr": 0.05, "clip": 0.1}},
        insecure_seed=0,
    )
    assert {r["method"]: r["model"] for r in res["rows"]} == {"dp-sgd": "logreg", "scdro": "logreg"}


def test_other_methods_keep_the_shared_setting():
    quick = BUDGETS["quick"]
    assert quick.lrs_for("dp-recursive-spider") == quick.lrs
    assert set(quick.method_settings) == {"scdro"}
    shared = dataclasses.replace(quick, method_settings={})
    for method in ("dp-sgd", "dp-double-spider", "dp-recursive-spider"):
        assert method_params(method, budget=quick, lr=10.0, clip=0.1, epochs=2) == method_params(
            method, budget=shared, lr=10.0, clip=0.1, epochs=2
        )
    own = method_params("scdro", budget=TINY, lr=0.05, clip=0.1, epochs=2)
    assert own["lr_norm"] is None and own["lr_schedule"] == "cosine"


def test_bad_method_settings_are_refused():
    bad = dataclasses.replace(TINY, method_settings={"scdro": MethodSetting(algorithm_params={"no_such": 1})})
    with pytest.raises(ConfigError, match="no_such"):
        method_params("scdro", budget=bad, lr=0.1, clip=1.0, epochs=1)
    with pytest.raises(ConfigError, match="lr grid"):
        MethodSetting(lrs=())
    with pytest.raises(ConfigError, match="need its model"):
        MethodSetting(model_params={"hidden": 8})


def test_quick_scdro_trains_its_own_head_on_the_features():
    import torch

    from privopt.data import Dataset
    from privopt.data.features import apply_features
    from privopt.experiments.dro_runner import _model_for

    images = Dataset.from_tensors(torch.rand(6, 1, 8, 8), torch.tensor([0, 1] * 3), num_classes=2)
    feats = apply_features(images, "scattering", J=1, cache=False)
    quick = BUDGETS["quick"]
    assert _model_for(None, quick, feats, method="scdro") == ("mlp", None, {"hidden": 64})
    assert _model_for(None, quick, feats, method="dp-recursive-spider") == ("logreg", None, {})
    assert quick.for_method("scdro").batch_size == 256 and quick.for_method("dp-sgd") is quick
    params = method_params("scdro", budget=quick.for_method("scdro"), lr=0.016, clip=0.1, epochs=20)
    assert (params["b1"], params["s_batch"], params["lr_norm"], params["q"]) == (256, 256, None, 1)


def test_feature_model_params_and_centring_reach_runs_on_features_only():
    import torch

    from privopt.data import Dataset
    from privopt.data.features import apply_features
    from privopt.experiments.dro_runner import _centering, _model_for

    images = Dataset.from_tensors(torch.rand(6, 1, 8, 8), torch.tensor([0, 1] * 3), num_classes=2)
    feats = apply_features(images, "scattering", J=1, cache=False)
    centring = {"norm_bound": 1.0, "noise_ratio": 3.0}
    b = dataclasses.replace(BUDGETS["quick"], feature_model_params={"bias_scale": 8.0}, feature_centering=centring)
    assert _model_for(None, b, feats, method="dp-sgd") == ("logreg", None, {"bias_scale": 8.0})
    assert _centering(b, feats) == centring and _centering(b, images) == {}  # raw images: never
    assert BUDGETS["quick"].feature_centering == {} and BUDGETS["quick"].feature_model_params == {}


def test_a_budget_picks_its_weight_cap_by_the_runs_epsilon(tmp_path):
    from privopt.data import load_dataset
    from privopt.experiments.dro_runner import RunSpec, run_one

    budget = dataclasses.replace(TINY, weight_cap=2.0, weight_caps=((0.5, 1.1), (1.0, 1.25)))
    assert [budget.at_epsilon(e).weight_cap for e in (0.25, 0.5, 0.75, 1.0, 5.0, None)] == [
        1.1,
        1.1,
        1.25,
        1.25,
        2.0,
        2.0,
    ]
    data = load_dataset("digits-st", seed=0)
    caps = {}
    for eps in (0.75, 5.0):
        out = tmp_path / f"eps{eps}"
        run_one(
            "dp-double-spider",
            RunSpec("digits-st", budget, insecure_seed=0),
            data=data,
            hp={"lr": 10.0, "clip": 0.1},
            epochs=0.25,
            epsilon=eps,
            seed=0,
            out_dir=out,
            eval_split="test",
            metrics=[],
        )
        record = json.loads((out / "record.json").read_text())
        caps[eps] = record["config"]["algorithm_params"]["weight_cap"]
    assert caps == {0.75: 1.25, 5.0: 2.0}  # what ran is what the record states
