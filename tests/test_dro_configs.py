"""The shipped DRO configs train the reproductions' recipe through ``privopt train``, and the
``features`` config key applies a fixed feature map (clear errors for bad requests)."""

import json
from pathlib import Path

import pytest

from privopt.algorithms import get_algorithm
from privopt.config import RunConfig, load_config
from privopt.errors import ConfigError
from privopt.experiments.demo import DEMO_HYPERPARAMETERS, _demo_budget
from privopt.experiments.dro_protocol import BUDGETS, method_params, paper_delta
from privopt.training import train

REPO = Path(__file__).resolve().parents[1]


def _recipe(budget, n, *, lr, clip, epsilon):
    """The algorithm settings and feature request a reproduction's final run would use."""
    b = budget.for_method("dp-double-spider").fitted(n).at_epsilon(epsilon)
    params = method_params("dp-double-spider", budget=b, lr=lr, clip=clip, epochs=budget.epochs)
    features = {"name": b.features, **b.feature_params}
    return params, features, b.feature_model, b


@pytest.mark.parametrize(
    ("name", "budget", "n", "hp"),
    [
        ("dro_digits_st.yaml", _demo_budget(False), 810, DEMO_HYPERPARAMETERS["dp-double-spider"]),
        ("dro_mnist_st.yaml", BUDGETS["quick"].for_dataset("mnist-st"), 33996, {"lr": 16.0, "clip": 0.1}),
    ],
)
def test_shipped_dro_configs_are_the_reproductions_recipe(name, budget, n, hp):
    cfg = load_config(REPO / "configs" / name)
    params, features, model, b = _recipe(budget, n, lr=hp["lr"], clip=hp["clip"], epsilon=cfg.privacy.epsilon)
    assert cfg.algorithm_params == params
    assert (cfg.features, cfg.model) == (features, model)
    assert cfg.model_params == b.feature_model_params
    assert (cfg.feature_centering, cfg.logit_adjustment) == (b.feature_centering, b.logit_adjustment)
    assert cfg.privacy.delta == pytest.approx(paper_delta(n), rel=0.05)
    get_algorithm(cfg.algorithm, **cfg.algorithm_params)  # valid settings


def test_digits_config_trains_on_scattering_features(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVOPT_CACHE", str(tmp_path / "cache"))
    cfg = load_config(REPO / "configs" / "dro_digits_st.yaml")
    cfg.algorithm_params["epochs"] = 2
    record = train(cfg, out_dir=tmp_path / "run", progress=False)
    assert record["status"] == "finished"
    assert record["dataset"]["input_shape"] == [324]  # 81 scattering channels x 2 x 2, not 8 x 8 pixels
    saved = json.loads((tmp_path / "run" / "record.json").read_text())
    assert saved["config"]["features"] == {"name": "scattering"}
    assert record["privacy"]["epsilon_spent"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize(
    ("features", "match"),
    [
        ({"J": 1}, "name of a feature map"),
        ({"name": 3}, "name of a feature map"),
        ("scattering", "features must be a mapping"),
    ],
)
def test_bad_feature_requests_are_refused_by_the_config(features, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_dict({"dataset": "digits-st", "features": features})


def test_unknown_feature_map_fails_before_any_output(tmp_path):
    cfg = RunConfig.from_dict({"dataset": "digits-st", "model": "logreg", "features": {"name": "wavelets"}})
    with pytest.raises(ConfigError, match="unknown feature map 'wavelets'"):
        train(cfg, out_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "record.json").exists()
