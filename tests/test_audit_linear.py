"""White-box audits of the closed-form linear ERM algorithms (dp-svrg, dp-svrg-pp, dp-gd-erm,
dp-amd): they read the features and one linear weight, so their canaries are linear records
(:class:`privopt.audit.LinearAuditModel`) rather than a head on the model."""

import numpy as np
import pytest
import torch
from torch import nn

from privopt.audit import run_audit
from privopt.audit.canaries import LinearAuditModel
from privopt.config import RunConfig
from privopt.grads.release import insecure_scale_noise_for_testing
from privopt.objectives.erm import LogisticERM
from privopt.rng import TorchSource

pytestmark = pytest.mark.filterwarnings("ignore:privacy noise scaled")

LINEAR = {"dataset": "breast-cancer", "model": "logreg", "loss": "logistic", "insecure_seed": 1}
LINEAR["model_params"] = {"bias": False, "single_logit": True}
SHORT = {
    "dp-gd-erm": {"iterations": 60},
    "dp-amd": {"iterations": 40},
    "dp-svrg": {"epochs": 2, "inner": 100},
    "dp-svrg-pp": {"epochs": 2, "inner": 25},
}


def _audit(algorithm: str, *, noise_scale: float = 1.0):
    algo = {"algorithm": algorithm, "algorithm_params": SHORT[algorithm]}
    cfg = RunConfig.from_dict({**LINEAR, **algo, "privacy": {"epsilon": 1.0, "delta": 1e-5}})
    with insecure_scale_noise_for_testing(noise_scale):
        report = run_audit(cfg, mode="white-box", canaries=200, inclusion_rng=TorchSource(3))
    return report, report.results[0]


def test_a_linear_canary_adds_exactly_the_clip_in_its_own_coordinate():
    torch.manual_seed(0)
    model = LinearAuditModel(nn.Linear(3, 1, bias=False), canaries=4, clip=0.5)
    ordinary = model.extend(torch.randn(5, 3))
    x = torch.cat([ordinary, model.canary_records(torch.tensor([2, 4]))]).double().numpy()
    labels = np.array([0, 1, 0, 1, 1, 0, 0], dtype=np.float64)  # canaries carry label 0
    w = model.linear.weight.detach().double().reshape(-1).numpy()
    w[3:7] = [0.05, -0.05, 0.0, 0.02]  # canary weights near 0 (where the run keeps them)
    grads = LogisticERM(features=x, labels=labels).per_sample_grads(w, clip=0.5)
    expected = np.zeros((2, 8))
    expected[0, 3 + 1], expected[1, 3 + 3] = 0.5, 0.5  # canaries 2 and 4: +clip in their own coordinate
    assert np.allclose(grads[5:], expected)
    assert np.all(grads[:5, 3:] == 0.0)  # ordinary records: nothing in the canaries' or clock's columns
    assert np.all(grads[5:, :3] == 0.0)  # canaries: nothing in the real weight


def test_a_linear_audit_needs_a_single_linear_weight():
    from privopt.errors import ConfigError

    with pytest.raises(ConfigError, match="one trainable weight"):
        LinearAuditModel(nn.Linear(3, 2), canaries=2, clip=1.0)


@pytest.mark.parametrize("algorithm", sorted(SHORT))
def test_white_box_audit_of_linear_erm_scores_its_full_gradient_releases(algorithm):
    report, r = _audit(algorithm)
    run = r.runs[0]
    assert report.passed and 0 <= r.epsilon_lower_bound <= r.epsilon_accounted <= 1.0
    (family,) = run["releases"]["scored"]
    assert run["releases"]["scored"][family] >= 40 and 0.8 < run["releases"]["noise_ratio"] < 1.2
    assert 0.0 <= run["test_accuracy"] <= 1.0


def test_dp_gd_erm_audit_catches_a_tenth_of_the_noise_and_reports_one_logit_accuracy():
    _, r = _audit("dp-gd-erm")
    # One logit: the class is its sign (an argmax over one column would always say class 0).
    assert r.runs[0]["test_accuracy"] > 0.6
    broken, b = _audit("dp-gd-erm", noise_scale=0.1)
    assert not broken.passed and b.epsilon_lower_bound > b.epsilon_accounted
    assert b.runs[0]["releases"]["noise_ratio"] < 0.2
