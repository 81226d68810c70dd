"""Findings of a researcher's trial: extension points, fit options and the reproductions' reports."""

from __future__ import annotations

import pytest
from torch import nn

import privopt
from privopt.algorithms import base as algorithms_base
from privopt.algorithms import get_algorithm, register_algorithm
from privopt.algorithms.dpsgd import DPSGD
from privopt.errors import ConfigError
from privopt.models import registry as model_registry
from privopt.models.registry import build_model, register_model
from privopt.objectives import divergences, register_divergence
from privopt.objectives.divergences import KL, get_divergence


@pytest.fixture(autouse=True)
def _forget_registrations():
    """Other test files in this process list the registries: drop what a test here registered."""
    model_registry.available_models(), algorithms_base.available_algorithms()  # built-ins register lazily
    registries = (model_registry._MODELS, divergences.DIVERGENCES, algorithms_base._ALGORITHMS)
    before = [dict(r._entries) for r in registries]
    yield
    for registry, entries in zip(registries, before):
        registry._entries.clear()
        registry._entries.update(entries)


def test_a_divergence_named_with_a_hyphen_or_capitals_is_found_by_that_name():
    @register_divergence
    class TrialKL(KL):
        name = "Trial-KL"

    assert isinstance(get_divergence("Trial-KL"), TrialKL)
    assert isinstance(get_divergence("trial_kl"), TrialKL)


def test_a_divergence_subclass_without_its_own_name_is_refused_at_registration():
    class Unnamed(KL):
        pass

    with pytest.raises(ConfigError, match="Unnamed needs its own class attribute `name`"):
        register_divergence(Unnamed)


def test_an_algorithm_subclass_without_its_own_name_is_refused_not_reported_as_a_duplicate():
    class MyDPSGD(DPSGD):  # forgot `name`: would inherit "dp-sgd"
        pass

    with pytest.raises(ConfigError, match="MyDPSGD needs its own class attribute `name`"):
        register_algorithm(MyDPSGD)


def test_a_registered_algorithm_subclass_with_a_name_is_built_by_it():
    @register_algorithm
    class TrialDPSGD(DPSGD):
        name = "trial-dp-sgd"

    assert isinstance(get_algorithm("trial-dp-sgd", epochs=1), TrialDPSGD)


def test_a_model_factory_with_positional_options_is_refused_when_registered():
    def positional(input_shape, num_classes, hidden=8):  # `hidden` could never be set by model_params
        return nn.Linear(4, num_classes)

    with pytest.raises(ConfigError, match=r"\['hidden'\] not keyword-only"):
        register_model("trial-positional")(positional)

    def no_shape(*, num_classes):
        return nn.Linear(4, num_classes)

    with pytest.raises(ConfigError, match=r"missing \['input_shape'\]"):
        register_model("trial-no-shape")(no_shape)


def test_a_keyword_only_model_factory_still_registers_and_builds():
    @register_model("trial-keyword")
    def keyword(*, input_shape, num_classes, hidden=3):
        return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], hidden), nn.Linear(hidden, num_classes))

    assert build_model("trial-keyword", input_shape=(4,), num_classes=2, hidden=5)[1].out_features == 5


def test_fit_passes_model_params_to_a_registered_model():
    # The linear ERM algorithms need logreg with one logit and no bias: only model_params can say so.
    record = privopt.fit(
        model="logreg",
        model_params={"bias": False, "single_logit": True},
        loss="logistic",
        algorithm="dp-gd-erm",
        dataset="breast-cancer",
        epsilon=1.0,
        delta=1e-4,
        allow_large_delta=True,
        iterations=5,
        insecure_seed=0,
    )
    assert record["status"] == "finished"
    assert record["config"]["model_params"] == {"bias": False, "single_logit": True}


def test_fit_refuses_model_params_with_a_module_and_names_a_close_algorithm():
    with pytest.raises(ConfigError, match="model_params configure a registered model"):
        privopt.fit(model=nn.Linear(30, 2), model_params={"bias": False}, dataset="digits", epsilon=1, delta=1e-5)
    with pytest.raises(ConfigError, match="did you mean 'dp-sgd'"):
        privopt.fit(model="mlp", dataset="digits", algorithm="dp-sgdd", epsilon=1.0, delta=1e-5)


def _erm_rows(method: str, gaps: list[float]) -> list[dict]:
    curve = [{"wall_s": 0.1, "passes": 1.0, "gap": 0.5}]
    return [
        {"phase": "final", "setting": "regularized", "method": method, "epsilon": 1.0, "schedule": {"iterations": 10},
         "gap": g, "wall_s": 0.1, "cpu_s": 0.1, "passes": 10.0, "epsilon_spent": 1.0,
         "noise_multipliers": {"grad": 1.0}, "curve": curve}
        for g in gaps
    ]  # fmt: skip


@pytest.mark.parametrize("runs", [1, 3])
def test_the_erm_summary_gives_no_verdict_and_no_spread_from_one_run(runs):
    from privopt.experiments.erm_covertype_report import summarize, summary_markdown

    rows = _erm_rows("dp-svrg", [0.03 + 0.001 * r for r in range(runs)]) + _erm_rows("dp-gd", [0.001] * runs)
    sel = {"setting": "regularized", "epsilon": 1.0, "tuning_gap": 0.1, "interior": True, "last_gain": 0.0}
    selections = [{**sel, "method": m, "profile": []} for m in ("dp-svrg", "dp-gd")]
    summary = summarize(rows, selections, {"regularized": "dp-svrg"})
    (comparison,) = summary["comparisons"]
    text = summary_markdown(summary)
    if runs == 1:  # one run has no standard error: "larger beyond 2 standard errors" would be unfounded
        assert comparison["gap_verdict"] == "n/a (1 run)" and comparison["claim_holds"] is None
        assert "not tested (1 run)" in text and "(1 run)" in text and "± 0 " not in text
    else:
        assert comparison["gap_verdict"] == "larger" and comparison["claim_holds"] is False
        assert "does not hold" in text


def test_the_erm_gap_verdict_is_the_shared_welch_rule_not_two_standard_errors():
    from scipy import stats

    from privopt.experiments.erm_covertype_report import summarize, summary_markdown

    sel = {"setting": "regularized", "epsilon": 1.0, "tuning_gap": 0.1, "interior": True, "last_gain": 0.0}
    selections = [{**sel, "method": m, "profile": []} for m in ("dp-svrg", "dp-gd")]
    verdicts = {}
    # 0.005 apart: beyond 2 standard errors (0.0035), inside Welch's interval (t = 4.3 at 2 degrees of freedom)
    for name, svrg, gd in (
        ("noise", [0.017, 0.020, 0.023], [0.0149, 0.015, 0.0151]),
        ("clear", [0.010, 0.011], [0.02, 0.021]),
    ):
        summary = summarize(_erm_rows("dp-svrg", svrg) + _erm_rows("dp-gd", gd), selections, {"regularized": "dp-svrg"})
        (c,) = summary["comparisons"]
        verdicts[name] = c["gap_verdict"]
        ci = stats.ttest_ind(svrg, gd, equal_var=False).confidence_interval(0.95)
        assert c["gap_ci95"] == pytest.approx([ci.low, ci.high]) and c["gap_difference"] == pytest.approx(
            sum(svrg) / len(svrg) - sum(gd) / len(gd)
        )
    assert verdicts == {"noise": "tie", "clear": "smaller"}
    assert f"| {c['gap_difference']:+.3g} [{c['gap_ci95'][0]:+.3g}, {c['gap_ci95'][1]:+.3g}] | smaller |" in (
        summary_markdown(summary)
    )


def _sosp_row(method: str, clients: int, acc: float, seed: int = 0) -> dict:
    certified = False if method == "gauss-psgd" else None
    return {"method": method, "clients": clients, "epsilon": 1.0, "seed": seed, "test_accuracy": acc,
            "test_loss": 0.5961 + 0.001 * seed, "grad_norm": 1.25, "hessian_min_eig": -0.5,
            "lanczos_converged": seed == 0, "certified": certified}  # fmt: skip


def test_the_sosp_report_tests_no_trend_in_m_from_one_m_and_shows_losses_to_three_decimals():
    from privopt.experiments.sosp_report import check_claims, format_claims, format_diagnostics, format_table

    one_m = [_sosp_row("gauss-psgd", 1, 0.85), _sosp_row("dp-spider-sosp", 1, 0.86)]
    claims = check_claims(one_m)
    assert claims["gap_widens_with_m"] is None
    assert "The gap widens with m: not tested" in format_claims(claims)
    two_m = one_m + [_sosp_row("gauss-psgd", 2, 0.80), _sosp_row("dp-spider-sosp", 2, 0.70)]
    assert check_claims(two_m)["gap_widens_with_m"] is False  # behind at m = 1
    assert "| 1 | 1 | 0.596 | 0.596 |" in format_table(one_m, key="test_loss", scale=1.0, digits=3)
    assert "± 0.0" not in format_table(one_m)  # one run: no spread to show
    seeds = [_sosp_row("gauss-psgd", 1, 0.85, seed=s) for s in (0, 1)]
    assert "| 1 | 1 | Gauss-PSGD | 1.25 | -0.5 | 1 of 2 | 0 of 2 |" in format_diagnostics(seeds)


def test_the_worst_group_summary_says_it_was_not_tuned_and_shows_no_spread_from_one_seed(tmp_path):
    from privopt.experiments.worst_group import run_worst_group

    result = run_worst_group(
        dataset="synthetic", epsilons=[1.0], seeds=1, out_dir=tmp_path / "wg", methods=["noisy-sgd-mgr", "dp-sgd"],
        tune_grid=False, rates=False, insecure_seed=0, log=lambda *a: None,
    )  # fmt: skip
    text = (tmp_path / "wg" / "summary.md").read_text()
    assert result["tuned"] is False and "NOT tuned (--no-tune)" in text
    assert "± 0.000" not in text


def test_the_logistic_loss_on_a_two_logit_logreg_names_the_model_params_that_fix_it():
    from privopt.errors import ModelError

    with pytest.raises(ModelError, match="model_params {single_logit: true"):
        privopt.fit(model="logreg", loss="logistic", algorithm="dp-gd-erm", dataset="breast-cancer",
                    epsilon=1.0, delta=1e-4, allow_large_delta=True, iterations=2)  # fmt: skip
