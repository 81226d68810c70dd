"""DP feature centring (privopt.data.centering): sensitivity, the release, its accounting and resume."""

from __future__ import annotations

import pytest
import torch

from _run_helpers import cfg, cfg_dict, gaussian_epsilon, ledger_epsilon, read_record
from privopt.config import RunConfig
from privopt.data.centering import FAMILY, FeatureCentering
from privopt.errors import ConfigError
from privopt.privacy import FullBatch, Gaussian, PrivacyLedger, Step
from privopt.rng import TorchSource
from privopt.training import build_run, load_diagnostics, train

CENTRE = {"feature_centering": {"norm_bound": 16.0, "noise_ratio": 4.0}}


@pytest.mark.parametrize("bound", [0.5, 3.0, 40.0])
def test_sum_sensitivity_on_neighbouring_datasets_is_the_declared_bound(bound):
    """Adding/removing one record moves the clipped sum by at most R; replacing one by at most 2R."""
    g = torch.Generator().manual_seed(0)
    fc = FeatureCentering(norm_bound=bound, noise_ratio=1.0)
    x = torch.randn(50, 12, generator=g) * torch.logspace(-2, 2, 50)[:, None]  # rows of norm 0.03-350
    worst_add = worst_replace = 0.0
    for i in range(x.shape[0]):
        without = torch.cat([x[:i], x[i + 1 :]])
        worst_add = max(worst_add, float((fc.clipped_sum(x) - fc.clipped_sum(without)).norm()))
        replaced = torch.cat([without, -x[i : i + 1]])
        worst_replace = max(worst_replace, float((fc.clipped_sum(x) - fc.clipped_sum(replaced)).norm()))
    assert worst_add <= bound * (1 + 1e-12)
    assert worst_replace <= 2 * bound * (1 + 1e-12)
    assert worst_add >= 0.99 * bound  # the bound is attained by the large rows: it is not loose


@pytest.mark.parametrize("neighbouring, true_sensitivity", [("add_remove", 2.0), ("replace_one", 4.0)])
def test_release_is_the_gaussian_mechanism_charged_exactly(neighbouring, true_sensitivity):
    x = torch.randn(40, 5, generator=torch.Generator().manual_seed(1))
    fc = FeatureCentering(norm_bound=2.0, noise_ratio=1.0)
    ledger = PrivacyLedger(delta=1e-5, neighbouring=neighbouring, accountant="rdp")
    mean = fc.release(x, noise_multiplier=3.0, ledger=ledger, rng=TorchSource(7))
    noise = TorchSource(7).normal((5,), dtype=torch.float64)
    std = 3.0 * 2.0  # z · R under either relation
    torch.testing.assert_close(mean, ((fc.clipped_sum(x) + std * noise) / 40).float())
    assert ledger.counts == {Step(FullBatch(), (Gaussian(3.0, name=FAMILY),)): 1}
    # What the ledger charges is the Gaussian mechanism's epsilon at the noise's ratio to the true
    # sensitivity (R, or 2R under replace-one): neither under- nor over-charged.
    assert ledger.epsilon() == pytest.approx(gaussian_epsilon(std / true_sensitivity, 1e-5), rel=1e-9)


def test_a_run_spends_exactly_its_epsilon_and_publishes_the_released_mean(tmp_path):
    rec = train(cfg(insecure_seed=0, **CENTRE), out_dir=tmp_path / "r", progress=False)
    priv = rec["privacy"]
    assert priv["epsilon_spent"] == pytest.approx(2.0, rel=1e-3) and priv["epsilon_spent"] <= 2.0
    assert priv["epsilon_spent"] == ledger_epsilon(rec)
    noise = rec["calibration"]["noise_multipliers"]
    assert noise[FAMILY] == pytest.approx(4.0 * noise["grad"], rel=1e-12)  # one scale, the declared ratio
    assert {"name": FAMILY, "ratio": 4.0} in rec["privacy_inventory"]["steps"][-1]["mechanisms"]
    assert len(rec["released"]["feature_mean"]) == 64
    # the main noise is larger than without the release (the budget is shared, not exceeded)
    plain = build_run(cfg(insecure_seed=0))
    assert noise["grad"] > plain.calibration.noise["grad"]


def test_the_training_data_is_centred_on_the_released_mean():
    run = build_run(cfg(insecure_seed=3, **CENTRE))
    raw = build_run(cfg(insecure_seed=3)).data
    mean = torch.tensor(run.released["feature_mean"])
    fc = FeatureCentering(norm_bound=16.0, noise_ratio=4.0)
    torch.testing.assert_close(run.data.x_train, fc.centre(raw.x_train, mean))
    torch.testing.assert_close(run.data.x_test, fc.centre(raw.x_test, mean))
    torch.testing.assert_close(run.data.x_train.flatten(1).norm(dim=1), raw.x_train.flatten(1).norm(dim=1))
    assert run.ctx.x_train is run.data.x_train


def test_resume_reuses_the_released_mean_and_spends_nothing_twice(tmp_path):
    full = train(cfg(insecure_seed=0, **CENTRE), out_dir=tmp_path / "full", progress=False)
    part = train(cfg(insecure_seed=0, **CENTRE), out_dir=tmp_path / "part", progress=False, max_steps=7)
    assert part["released"] == full["released"]
    resumed = train(None, out_dir=tmp_path / "part", resume=True, progress=False)
    assert resumed["released"] == full["released"]
    assert resumed["privacy"]["ledger"] == full["privacy"]["ledger"]
    assert resumed["metrics"] == full["metrics"]


SGD = dict(algorithm="sgd", privacy={"epsilon": None}, algorithm_params={"epochs": 1, "batch_size": 100, "lr": 0.5})


def test_a_non_private_run_centres_on_the_exact_mean_and_keeps_it_out_of_the_released_values():
    run, raw = build_run(RunConfig.from_dict({**SGD, **CENTRE})), build_run(RunConfig.from_dict(SGD)).data
    fc = FeatureCentering(norm_bound=16.0, noise_ratio=4.0)
    exact = fc.clipped_sum(raw.x_train).float() / run.n
    torch.testing.assert_close(run.data.x_train, fc.centre(raw.x_train, exact))
    assert run.ledger is None and run.released == {}  # an exact statistic is never "released"
    torch.testing.assert_close(torch.tensor(run.data.private_stats["feature_mean_exact"]), exact)


def test_a_non_private_run_publishes_no_exact_training_mean(tmp_path):
    """The exact mean gives a record away to anyone who knows the others (docs/privacy.md, attack 1):
    it goes to the non-private diagnostics, never to record.json."""
    rec = train(RunConfig.from_dict({**SGD, **CENTRE}), out_dir=tmp_path / "r", progress=False)
    assert "released" not in rec and "released" not in read_record(tmp_path / "r")
    diag = RunConfig.from_dict({**SGD, **CENTRE, "non_private_diagnostics": True})
    train(diag, out_dir=tmp_path / "d", progress=False)
    meta = load_diagnostics(tmp_path / "d")["dataset_meta"]["private"]
    assert len(meta["feature_mean_exact"]) == 64
    resumed = train(None, out_dir=tmp_path / "r", resume=True, progress=False)
    assert "released" not in resumed


@pytest.mark.parametrize(
    "value,match",
    [
        ({"norm_bound": 1.0}, r"renormalise; missing \['noise_ratio'\]$"),  # no empty "unknown []"
        ({"norm_bound": 1.0, "noise_ratio": 2.0, "scale": 1}, r"renormalise; unknown \['scale'\]$"),
        ({"norm_bound": 0.0, "noise_ratio": 2.0}, "norm_bound must be a finite number > 0"),
        ({"norm_bound": 1.0, "noise_ratio": float("nan")}, "noise_ratio must be"),
        ({"norm_bound": 1.0, "noise_ratio": 2.0, "renormalise": "yes"}, "renormalise must be true or false"),
        ([1.0], "must be a mapping"),
    ],
)
def test_bad_settings_fail_before_anything_runs(value, match):
    with pytest.raises(ConfigError, match=match):
        build_run(cfg(feature_centering=value))


def test_parallel_composition_cannot_hold_the_release():
    spider = {"b1": 60, "b2": 12, "lr": 0.3, "epochs": 1, "gamma": 5.0, "clip": 1.0}
    with pytest.raises(ConfigError, match="parallel composition"):
        build_run(RunConfig.from_dict({**cfg_dict(algorithm="ada-dp-spider", **CENTRE), "algorithm_params": spider}))


def test_torchrun_clients_cannot_each_draw_a_mean():
    from privopt.training.pretraining import plan_pretraining

    with pytest.raises(ConfigError, match="torchrun"):
        plan_pretraining(cfg(**CENTRE), comm=object())
    assert plan_pretraining(cfg(), comm=object()).centering is None
