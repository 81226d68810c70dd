"""Post-hoc logit adjustment (privopt.data.class_prior): the release, its accounting, the predictor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _run_helpers import cfg, gaussian_epsilon, ledger_epsilon, read_record
from privopt.config import RunConfig
from privopt.data.class_prior import FAMILY, AdjustedLogits, LogitAdjustment, histogram_sensitivity
from privopt.errors import ConfigError
from privopt.eval.metrics import classification_metrics
from privopt.privacy import FullBatch, Gaussian, PrivacyLedger, Step
from privopt.rng import TorchSource
from privopt.training import build_run, load_diagnostics, train

RELEASE = {"logit_adjustment": {"noise_ratio": 5.0}}


@pytest.mark.parametrize("neighbouring", ["add_remove", "replace_one"])
def test_histogram_sensitivity_on_neighbouring_datasets_is_the_declared_bound(neighbouring):
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (60,), generator=g)
    counts = LogitAdjustment.counts
    bound = histogram_sensitivity(neighbouring)
    worst = 0.0
    for i in range(y.shape[0]):
        without = torch.cat([y[:i], y[i + 1 :]])
        if neighbouring == "add_remove":
            worst = max(worst, float((counts(y, 4) - counts(without, 4)).norm()))
        else:
            for other in range(4):  # every label the replacing record could have
                moved = counts(y, 4) - counts(torch.cat([without, torch.tensor([other])]), 4)
                worst = max(worst, float(moved.norm()))
    assert worst == pytest.approx(bound)  # attained, and never exceeded


@pytest.mark.parametrize("neighbouring", ["add_remove", "replace_one"])
def test_release_is_the_gaussian_mechanism_and_never_under_charged(neighbouring):
    y = torch.tensor([0, 0, 1, 2, 2, 2])
    la = LogitAdjustment(noise_ratio=1.0)
    ledger = PrivacyLedger(delta=1e-5, neighbouring=neighbouring, accountant="rdp")
    counts = la.release(y, num_classes=3, noise_multiplier=3.0, ledger=ledger, rng=TorchSource(7))
    noise = TorchSource(7).normal((3,), dtype=torch.float64)
    torch.testing.assert_close(counts, torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64) + 3.0 * noise)
    assert ledger.counts == {Step(FullBatch(), (Gaussian(3.0, name=FAMILY),)): 1}
    # The noise's ratio to the histogram's true sensitivity (1, or sqrt(2) under replace-one) gives
    # at most the epsilon charged: exact under add/remove; under replace-one the accountant's
    # generic factor 2 is a safe bound for sqrt(2).
    true = gaussian_epsilon(3.0 / histogram_sensitivity(neighbouring), 1e-5)
    if neighbouring == "add_remove":
        assert ledger.epsilon() == pytest.approx(true, rel=1e-9)
    else:
        assert true < ledger.epsilon() <= gaussian_epsilon(3.0 / 2.0, 1e-5) * (1 + 1e-9)


def test_prior_and_offsets():
    la = LogitAdjustment(tau=0.5, prior=(9.0, 1.0))
    p = la.prior_from([-3.0, 0.5, 8.0])  # noisy counts below 1 count as 1
    torch.testing.assert_close(p, torch.tensor([0.1, 0.1, 0.8], dtype=torch.float64))
    torch.testing.assert_close(
        la.offsets((9.0, 1.0), num_classes=2), 0.5 * torch.log(torch.tensor([0.9, 0.1])).double()
    )
    with pytest.raises(ConfigError, match="2 class shares for a dataset of 10 classes"):
        la.offsets((9.0, 1.0), num_classes=10)


def test_adjusted_logits_move_the_threshold_towards_the_minority():
    net = AdjustedLogits(nn.Identity(), LogitAdjustment().offsets((0.9, 0.1), num_classes=2))
    # a margin of 1 for the majority class is below log 9: the adjusted prediction is the minority
    assert net(torch.tensor([[1.0, 0.0]])).argmax(1).item() == 1
    assert net(torch.tensor([[3.0, 0.0]])).argmax(1).item() == 0
    one_logit = net(torch.tensor([-1.0, -3.0]))  # the logistic loss's model: class 1 iff the logit > 0
    assert (one_logit > 0).tolist() == [True, False]


def test_a_run_spends_exactly_its_epsilon_and_evaluates_the_adjusted_predictor(tmp_path):
    rec = train(cfg(insecure_seed=0, **RELEASE), out_dir=tmp_path / "r", progress=False)
    priv = rec["privacy"]
    assert priv["epsilon_spent"] == pytest.approx(2.0, rel=1e-3) and priv["epsilon_spent"] <= 2.0
    assert priv["epsilon_spent"] == ledger_epsilon(rec)
    noise = rec["calibration"]["noise_multipliers"]
    assert noise[FAMILY] == pytest.approx(5.0 * noise["grad"], rel=1e-12)
    counts = rec["released"]["class_counts"]
    assert len(counts) == 10 and rec["prediction"]["logit_offsets"] == pytest.approx(
        LogitAdjustment().offsets(LogitAdjustment.prior_from(counts), num_classes=10).tolist()
    )
    # the test metrics are the released predictor's: model.pt's logits minus the offsets
    run = build_run(cfg(insecure_seed=0, **RELEASE))
    run.model.load_state_dict(torch.load(tmp_path / "r" / "model.pt", weights_only=True))
    logits = run.model(run.data.x_test) - torch.tensor(rec["prediction"]["logit_offsets"])
    expected = classification_metrics(logits.detach(), run.data.y_test, num_classes=10)
    assert rec["metrics"]["test_balanced_accuracy"] == pytest.approx(expected["balanced_accuracy"])
    assert read_record(tmp_path / "r")["prediction"] == rec["prediction"]


def test_a_public_prior_costs_nothing():
    run = build_run(cfg(insecure_seed=0, logit_adjustment={"prior": [1.0] * 9 + [9.0], "tau": 2.0}))
    plain = build_run(cfg(insecure_seed=0))
    assert run.calibration.noise == plain.calibration.noise and run.released == {}
    torch.testing.assert_close(
        run.logit_offsets, 2.0 * torch.log(torch.tensor([1 / 18] * 9 + [0.5], dtype=torch.float64))
    )


def test_resume_reuses_the_released_counts_and_spends_nothing_twice(tmp_path):
    full = train(cfg(insecure_seed=0, **RELEASE), out_dir=tmp_path / "full", progress=False)
    train(cfg(insecure_seed=0, **RELEASE), out_dir=tmp_path / "part", progress=False, max_steps=7)
    resumed = train(None, out_dir=tmp_path / "part", resume=True, progress=False)
    assert resumed["released"] == full["released"] and resumed["prediction"] == full["prediction"]
    assert resumed["privacy"]["ledger"] == full["privacy"]["ledger"]
    assert resumed["metrics"] == full["metrics"]


SGD = dict(algorithm="sgd", privacy={"epsilon": None}, algorithm_params={"epochs": 1, "batch_size": 100, "lr": 0.5})


def test_a_non_private_run_uses_the_exact_counts_and_publishes_them_only_in_the_diagnostics(tmp_path):
    rec = train(
        RunConfig.from_dict({**SGD, **RELEASE, "non_private_diagnostics": True}), out_dir=tmp_path / "r", progress=False
    )
    assert "released" not in rec
    exact = load_diagnostics(tmp_path / "r")["dataset_meta"]["private"]["class_counts_exact"]
    assert sum(exact) == rec["dataset"]["n_train"]
    offsets = LogitAdjustment().offsets(LogitAdjustment.prior_from(exact), num_classes=10)
    assert rec["prediction"]["logit_offsets"] == pytest.approx(offsets.tolist())


@pytest.mark.parametrize(
    "value,match",
    [
        ({}, None),
        ({"tau": 1.0}, "exactly one of prior"),
        ({"prior": [0.5, 0.5], "noise_ratio": 2.0}, "exactly one of prior"),
        ({"prior": [0.5], "tau": 1.0}, "list of class shares"),
        ({"prior": [0.5, -1.0]}, "prior must be a finite number > 0"),
        ({"noise_ratio": 2.0, "tau": 0}, "tau must be a finite number > 0"),
        ({"noise_ratio": 2.0, "scale": 1}, r"unknown \['scale'\]"),
        ([1.0], "must be a mapping"),
    ],
)
def test_bad_settings_fail_before_anything_runs(value, match):
    if match is None:
        assert build_run(cfg(logit_adjustment=value)).logit_offsets is None
        return
    with pytest.raises(ConfigError, match=match):
        build_run(cfg(logit_adjustment=value))


def test_a_prior_for_another_number_of_classes_is_refused():
    with pytest.raises(ConfigError, match="2 class shares for a dataset of 10 classes"):
        build_run(cfg(logit_adjustment={"prior": [0.9, 0.1]}))


def test_fit_takes_a_logit_adjustment():
    import privopt
    from privopt.data import Dataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(700, 3, generator=g)
    y = (x[:, 0] > 1.0).long()  # about 16 % positives
    data = Dataset.from_tensors(x[:600], y[:600], x_test=x[600:], y_test=y[600:], num_classes=2)
    common = dict(model=nn.Linear(3, 2), dataset=data, epsilon=1.0, delta=1e-4, insecure_seed=0, epochs=1)
    rec = privopt.fit(**common, logit_adjustment={"noise_ratio": 10.0})
    assert rec["privacy"]["epsilon_spent"] <= 1.0 and len(rec["released"]["class_counts"]) == 2
    offsets = rec["prediction"]["logit_offsets"]
    assert offsets[1] < offsets[0]  # the minority's logit is raised
    with pytest.raises(ConfigError, match="exactly one of prior"):
        privopt.fit(**{**common, "model": nn.Linear(3, 2)}, logit_adjustment={"tau": 2.0})
