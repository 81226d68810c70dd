"""The SPIDER methods against DP-SGD: the better method per metric, Welch intervals, verdicts."""

import math

import pytest
from scipy import stats

from privopt.experiments.dro_compare import compare_to_baseline, comparison_markdown

BAL, WORST = "test_balanced_accuracy", "test_worst_class_accuracy"


def _rows(method, eps, balanced, worst=None):
    worst = worst if worst is not None else [b - 0.2 for b in balanced]
    return [{"method": method, "epsilon": eps, BAL: b, WORST: w} for b, w in zip(balanced, worst, strict=True)]


def _welch(a, b):
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return ci.low, ci.high


def test_the_better_method_is_chosen_per_metric_and_the_interval_is_welchs():
    sgd = [0.80, 0.82, 0.81, 0.83]
    ds, rs = [0.84, 0.83, 0.85], [0.79, 0.80, 0.81]
    rows = (
        _rows("dp-sgd", 1.0, sgd, [0.60, 0.62, 0.61, 0.60])
        + _rows("dp-double-spider", 1.0, ds, [0.50, 0.52, 0.51])
        + _rows("dp-recursive-spider", 1.0, rs, [0.64, 0.66, 0.65])
    )
    bal, worst = compare_to_baseline(rows, epsilons=[1.0])
    assert (bal.metric, bal.method, worst.metric, worst.method) == (
        "balanced",
        "dp-double-spider",
        "worst class",
        "dp-recursive-spider",
    )
    assert bal.difference == pytest.approx(0.84 - 0.815) and (bal.runs, bal.baseline_runs) == (3, 4)
    assert (bal.low, bal.high) == pytest.approx(_welch(ds, sgd))
    assert (worst.low, worst.high) == pytest.approx(_welch([0.64, 0.66, 0.65], [0.60, 0.62, 0.61, 0.60]))
    assert bal.verdict == worst.verdict == "ahead"


@pytest.mark.parametrize(
    ("spider", "verdict"),
    [
        ([0.79, 0.83, 0.80], "behind within noise"),  # behind on average, the interval reaches 0
        ([0.70, 0.71, 0.70], "behind"),  # the whole interval below 0
        ([0.81, 0.815, 0.805], "ahead within noise"),  # level on average: meets a ">=" bar, proves nothing
        ([0.90, 0.91, 0.90], "ahead"),  # the whole interval above 0
    ],
)
def test_a_side_is_claimed_only_when_the_whole_interval_is_on_it(spider, verdict):
    rows = _rows("dp-sgd", 5.0, [0.80, 0.82, 0.81]) + _rows("dp-recursive-spider", 5.0, spider)
    c = compare_to_baseline(rows, epsilons=[5.0])[0]
    assert c.verdict == verdict
    assert (c.verdict == "behind") == (c.high < 0) and (c.verdict == "ahead") == (c.low > 0)
    if verdict.endswith("within noise"):
        assert c.low <= 0 <= c.high and (c.difference >= 0) == verdict.startswith("ahead")


def test_diverged_runs_are_left_out_and_missing_methods_skip_the_cell():
    rows = _rows("dp-sgd", 1.0, [0.80, 0.82]) + _rows("dp-double-spider", 1.0, [0.70, 0.90])
    rows.append({"method": "dp-double-spider", "epsilon": 1.0, BAL: math.nan, WORST: None, "error": "diverged"})
    rows += _rows("dp-double-spider", 5.0, [0.9, 0.9])  # no DP-SGD at ε = 5
    out = compare_to_baseline(rows, epsilons=[1.0, 5.0, 10.0])
    assert [(c.epsilon, c.runs) for c in out] == [(1.0, 2), (1.0, 2)]
    assert out[0].difference == pytest.approx(-0.01)


def test_one_run_has_no_interval_and_a_flat_sample_gives_a_point():
    behind = compare_to_baseline(_rows("dp-sgd", 1.0, [0.8]) + _rows("dp-double-spider", 1.0, [0.7]), epsilons=[1])
    assert behind[0].verdict == "no interval" and math.isnan(behind[0].low)
    flat = compare_to_baseline(
        _rows("dp-sgd", 1.0, [0.8, 0.8]) + _rows("dp-double-spider", 1.0, [0.7, 0.7]), epsilons=[1]
    )
    assert (flat[0].low, flat[0].high, flat[0].verdict) == (pytest.approx(-0.1), pytest.approx(-0.1), "behind")
    level = compare_to_baseline(
        _rows("dp-sgd", 1.0, [0.0, 0.0]) + _rows("dp-double-spider", 1.0, [0.0, 0.0]), epsilons=[1]
    )
    assert level[0].verdict == "level"  # e.g. a worst class at 0 % on every seed of both


def test_the_markdown_states_each_cell_and_the_counts():
    rows = _rows("dp-sgd", 0.5, [0.80, 0.82, 0.81]) + _rows("dp-recursive-spider", 0.5, [0.70, 0.71, 0.70])
    text = comparison_markdown(compare_to_baseline(rows, epsilons=[0.5]))
    assert "| 0.5 | balanced | DP Recursive-SPIDER | -10.67 |" in text and text.count("| behind |") == 2
    assert text.endswith(
        "0 of 2 cells at or above DP-SGD (0 with the whole interval above zero), 0 behind within the seeds' "
        "noise, 2 behind with the whole interval below zero."
    )
    assert comparison_markdown([]) == ""
