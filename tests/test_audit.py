"""`privopt audit` end to end on tiny data: DP-SGD and DP Double-SPIDER (difference queries) audited
through the real pipeline, and a broken mechanism (a tenth of the noise, a test-only switch) caught."""

import json
import math

import pytest
import torch
from torch import nn

from privopt.audit import AuditModel, run_audit
from privopt.audit.canaries import draw_inclusion, with_id_column
from privopt.audit.runner import load_base, white_box_run
from privopt.audit.scores import WhiteBoxScorer
from privopt.cli import main
from privopt.config import RunConfig
from privopt.grads import get_engine
from privopt.grads.release import ReleaseEvent, insecure_scale_noise_for_testing
from privopt.privacy import FullBatch, Poisson
from privopt.rng import TorchSource

pytestmark = pytest.mark.filterwarnings("ignore:privacy noise scaled")

TINY = {"dataset": "digits", "dataset_params": {"max_train": 200}, "model": "logreg", "insecure_seed": 1}
DP_SGD = {"algorithm": "dp-sgd", "algorithm_params": {"epochs": 2, "batch_size": 32, "lr": 0.5}}
SPIDER = {
    "algorithm": "dp-double-spider",  # full-batch refreshes, Poisson difference queries at rate ~1/2
    "algorithm_params": {"steps": 40, "q": 8, "N1": 1000, "N2": 150, "N3": 1000, "N4": 150},
}


def _cfg(algo: dict, epsilon: float = 1.0) -> RunConfig:
    return RunConfig.from_dict({**TINY, **algo, "privacy": {"epsilon": epsilon, "delta": 1e-5}})


def _white_box(cfg, *, noise_scale=None):
    kw = dict(mode="white-box", canaries=200, inclusion_rng=TorchSource(3))
    if noise_scale is None:
        return run_audit(cfg, **kw)
    with insecure_scale_noise_for_testing(noise_scale):
        return run_audit(cfg, **kw)


# ----------------------------------------------------------------------------- canaries
@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_a_gradient_canary_adds_exactly_its_bound_in_its_own_coordinate(engine):
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    model = AuditModel(inner, input_shape=(4,), canaries=5)
    ids = torch.tensor([0, 2, 0, 5, 0], dtype=torch.float32)  # canaries 2 and 5 among three records
    x, y = with_id_column(torch.rand(5, 4), ids), torch.tensor([1, 0, 2, 0, 1])
    ce = lambda out, t: nn.functional.cross_entropy(out, t, reduction="none")
    eng, off = get_engine(engine), model.head_offset()
    res = eng.clipped_sum(model, ce, x, y, clip=0.5)
    h = float(model.head.sign(model.head.clock()))
    expected = torch.zeros(5)
    expected[[1, 4]] = 0.5 * h
    assert torch.allclose(res.total[off : off + 5], expected)
    real = eng.clipped_sum(inner, ce, x[ids == 0, :4], y[ids == 0], clip=0.5)
    assert torch.allclose(res.total[: off - 1], real.total, atol=1e-6)  # canaries do not touch the real model
    # A difference query: exactly +-bound when the clock's sign flipped between the points, else 0.
    for step in (1e-5, 2e-5, 3e-5):
        prev = {k: v.detach().clone() for k, v in model.named_parameters()}
        prev["head.table.weight"][-1] += step
        flipped = float(model.head.sign(prev["head.table.weight"][-1])) != h
        diff = eng.clipped_sum(model, ce, x, y, clip=0.25, params_prev=prev).total[off : off + 5]
        assert torch.allclose(diff, expected / 2 if flipped else torch.zeros(5))


def test_inclusion_is_drawn_secretly_by_default():
    a, b = draw_inclusion(256), draw_inclusion(256)
    assert not torch.equal(a, b)  # fresh OS entropy each time, no seed anywhere
    seeded = [draw_inclusion(64, rng=TorchSource(7)) for _ in range(2)]
    assert torch.equal(*seeded)


def test_white_box_score_is_the_likelihood_ratio_with_the_measured_noise():
    model = AuditModel(nn.Sequential(nn.Linear(2, 2)), input_shape=(2,), canaries=2)
    scorer = WhiteBoxScorer(model, {"grad": "gradient"})
    off, h = model.head_offset(), float(model.head.sign(model.head.clock()))
    value = torch.zeros(scorer.dim)
    value[off : off + 2] = torch.tensor([2.0 * h, 0.0])  # canary 1 at +2 noise stds, canary 2 at 0
    value[off + 2] = 1.0  # the clock coordinate: noise alone, one declared std
    scorer(ReleaseEvent("grad", value, noise_std=4.0, bound=2.0, sampling=Poisson(0.25), normalizer=4.0))
    scorer(ReleaseEvent("other", torch.zeros(1), noise_std=1.0, bound=1.0, sampling=FullBatch(), normalizer=1.0))
    mu, q = 0.5, 0.25
    expect = [math.log(1 - q + q * math.exp(mu * y - mu * mu / 2)) for y in (2.0, 0.0)]
    assert scorer.noise_ratio == pytest.approx(1.0)
    assert scorer.scores.tolist() == pytest.approx(expect)
    assert scorer.summary()["scored"] == {"grad": 1} and scorer.summary()["not_scored"] == {"other": 1}


# ----------------------------------------------------------------------------- audits
def test_dp_sgd_white_box_audit_within_the_claim_and_broken_noise_caught():
    report = _white_box(_cfg(DP_SGD))
    (r,) = report.results
    run = r.runs[0]
    assert report.passed and 0 <= r.epsilon_lower_bound <= r.epsilon_accounted <= 1.0
    assert run["releases"]["scored"] == {"grad": run["steps"]} and 0.5 < run["releases"]["noise_ratio"] < 1.5
    assert r.bound["canaries"] == 200 and run["n_train"] == 200 + r.bound["included"]
    broken = _white_box(_cfg(DP_SGD), noise_scale=0.1)
    (b,) = broken.results
    assert not broken.passed and b.epsilon_lower_bound > b.epsilon_accounted
    assert b.runs[0]["releases"]["noise_ratio"] < 0.2  # the audit measured the missing noise


def test_spider_white_box_audit_scores_the_difference_queries():
    report = _white_box(_cfg(SPIDER))
    (r,) = report.results
    releases = r.runs[0]["releases"]
    assert report.passed and r.epsilon_lower_bound <= r.epsilon_accounted
    assert releases["scored"]["x-diff"] >= 5  # differences scored when the clock's sign flipped
    # The refresh releases Σ a_i·Clip(∇ℓ_i, C) with DRO weights a_i ∈ [0, A] (bound A·C): a canary's
    # contribution there depends on its weight, so the scorer reports it as seen but unscored, as it
    # does the scalar η queries.
    assert set(releases["scored"]) == {"x-diff"}
    assert {"x-refresh", "eta-refresh", "eta-diff"} <= set(releases["not_scored"])
    broken = _white_box(_cfg(SPIDER), noise_scale=0.1)
    assert not broken.passed and broken.results[0].epsilon_lower_bound > broken.results[0].epsilon_accounted


def test_difference_queries_alone_leak_the_canaries_when_their_noise_is_cut():
    cfg = _cfg(SPIDER)
    base, included = load_base(cfg), draw_inclusion(200, rng=TorchSource(3))
    from privopt.audit import one_run_bound

    honest = white_box_run(cfg, base, included, families={"x-diff"})
    assert one_run_bound(honest.scores, included.numpy(), delta=1e-5).epsilon <= honest.epsilon
    with insecure_scale_noise_for_testing(0.1):
        broken = white_box_run(cfg, base, included, families={"x-diff"})
    assert broken.releases["scored"] == {"x-diff": broken.releases["scored"]["x-diff"]}
    assert one_run_bound(broken.scores, included.numpy(), delta=1e-5).epsilon > 0.5


def test_black_box_audit_scores_the_released_model():
    report = run_audit(_cfg(DP_SGD), mode="black-box", canaries=150, inclusion_rng=TorchSource(5))
    (r,) = report.results
    assert report.passed and r.mode == "black-box" and r.epsilon_lower_bound <= r.epsilon_accounted
    assert r.bound["canaries"] == 150 and r.scores.shape == (150,)
    assert 0.0 <= r.runs[0]["test_accuracy"] <= 1.0


def test_many_run_audit_trains_one_run_per_coin():
    report = run_audit(_cfg(DP_SGD), mode="white-box", method="many-run", runs=8, inclusion_rng=TorchSource(2))
    (r,) = report.results
    assert len(r.runs) == 8 and {s["n_train"] for s in r.runs} <= {200, 201}
    assert r.method == "many-run" and r.epsilon_lower_bound <= r.epsilon_accounted and report.passed
    assert r.bound["negatives"] == r.bound["positives"] == 2  # the held-out half: two runs of each kind
    assert r.included.sum() == 4


def test_non_private_algorithms_and_bad_arguments_are_refused():
    from privopt.errors import ConfigError

    with pytest.raises(ConfigError, match="mode"):
        run_audit(_cfg(DP_SGD), mode="grey-box")
    with pytest.raises(ConfigError, match="canaries"):
        run_audit(_cfg(DP_SGD), canaries=1)
    with pytest.raises(ConfigError, match="runs"):
        run_audit(_cfg(DP_SGD), method="many-run", runs=2)
    with pytest.raises(ConfigError, match="not private"):
        run_audit(RunConfig.from_dict({**TINY, "algorithm": "sgd"}), mode="white-box", canaries=10)
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        run_audit(RunConfig.from_dict({**TINY, **DP_SGD, "privacy": {"epsilon": None}}), mode="white-box")


# ----------------------------------------------------------------------------- command line
def _cli(tmp_path, *extra):
    args = ["audit", "--algorithm", "dp-sgd", "--epsilon", "1", "--mode", "white-box", "--canaries", "200"]
    args += ["--set", "dataset_params.max_train=200", "--set", "model=logreg", "--set", "algorithm_params.epochs=2"]
    args += ["--set", "algorithm_params.batch_size=32", "--out", str(tmp_path), "--json", *extra]
    return main(args)


def test_cli_audit_reports_json_and_a_plot(tmp_path, capsys, monkeypatch):
    from privopt import plots

    figures = []
    real_save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: (figures.append(fig), real_save(fig, path)))
    assert _cli(tmp_path) == 0
    # every panel says what its y axis measures (the bar panel's x axis is its named bars)
    assert figures and all(ax.get_ylabel() for fig in figures for ax in fig.axes)
    out = json.loads(capsys.readouterr().out)
    (audit,) = out["audits"]
    assert out["passed"] and out["algorithm"] == "dp-sgd" and out["epsilon_target"] == 1.0
    assert audit["epsilon_lower_bound"] <= audit["epsilon_accounted"] and not audit["exceeds"]
    assert json.loads((tmp_path / "audit.json").read_text())["audits"][0]["bound"] == audit["bound"]
    assert (tmp_path / "audit.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_audit_exits_non_zero_when_the_bound_exceeds_the_accounted_epsilon(tmp_path, capsys):
    # Secret randomness here (no insecure seed): a tenth of the noise is caught whatever the draw.
    with insecure_scale_noise_for_testing(0.1):
        assert _cli(tmp_path) == 5
    audit = json.loads(capsys.readouterr().out)["audits"][0]
    assert audit["exceeds"] and audit["epsilon_lower_bound"] > audit["epsilon_accounted"]


def test_cli_audit_refuses_an_out_that_would_overwrite_an_audit_or_is_a_file_before_training(
    tmp_path, capsys, monkeypatch
):
    import privopt.audit as audit_pkg

    def no_training(*a, **kw):
        raise AssertionError("the audit trained before its --out was checked")

    monkeypatch.setattr(audit_pkg, "run_audit", no_training)
    (tmp_path / "audit.json").write_text("{}")  # an earlier audit's results
    assert _cli(tmp_path) == 2
    err = capsys.readouterr().err
    assert "already holds an audit (audit.json)" in err and "Traceback" not in err
    assert (tmp_path / "audit.json").read_text() == "{}"
    (tmp_path / "file").write_text("")
    assert _cli(tmp_path / "file") == 2
    assert "is a file" in capsys.readouterr().err
