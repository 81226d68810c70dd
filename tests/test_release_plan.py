"""Release plans (one declaration → inventory and runtime) and the reusable estimators."""

import pytest
import torch
from torch import nn

from privopt.algorithms import available_algorithms, get_algorithm
from privopt.algorithms.base import RunContext
from privopt.algorithms.estimators import SpiderEstimator, StormEstimator
from privopt.algorithms.releases import (
    BatchPlan,
    Fixed,
    Phase,
    PlanRun,
    PoissonBatch,
    Query,
    ReleasePlan,
    ReleasePlanExceeded,
    StepProportional,
)
from privopt.errors import ConfigError, PrivacyBudgetExceeded
from privopt.grads import get_engine
from privopt.grads.sums import BoundedSum
from privopt.privacy import FullBatch, Poisson, PrivacyLedger
from privopt.rng import TorchSource

N = 100


def ctx_for(ledger=None, noise=None, n=N):
    torch.manual_seed(0)
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    return RunContext(
        model=nn.Linear(3, 2),
        loss_fn=lambda out, y: nn.functional.cross_entropy(out, y, reduction="none"),
        x_train=x,
        y_train=(x[:, 0] > 0).long(),
        engine=get_engine("vmap"),
        ledger=ledger,
        noise=noise or {},
        noise_rng=TorchSource(seed=1),
        sampler_rng=TorchSource(seed=2),
    )


def two_phase_plan(share=True):
    return ReleasePlan(
        share=share,
        phases=(
            Phase(
                "refresh",
                2,
                (
                    Query("a", Fixed(1.0), batch=BatchPlan(50, N)),
                    Query("b", Fixed(2.0), batch=BatchPlan(50, N)),
                    Query("rider", Fixed(0.5), on="b"),
                ),
            ),
            Phase("diff", 3, (Query("a-diff", StepProportional(4.0, 1.0), batch=BatchPlan(10, N)),)),
        ),
    )


def ones(idx, clip, k=2):
    return BoundedSum(torch.ones(k), bound=clip)


# ----------------------------------------------------------------------------- declaration
def test_sharing_groups_equal_batches_and_riders_follow_their_host():
    shared, separate = two_phase_plan(True), two_phase_plan(False)
    assert [(s.mechanisms, s.count) for s in shared.inventory().steps] == [
        ((("a", 1.0), ("b", 1.0), ("rider", 1.0)), 2),
        ((("a-diff", 1.0),), 3),
    ]
    assert [(s.mechanisms, s.count) for s in separate.inventory().steps] == [
        ((("a", 1.0),), 2),
        ((("b", 1.0), ("rider", 1.0)), 2),
        ((("a-diff", 1.0),), 3),
    ]
    assert shared.family_counts() == {"a": 2, "b": 2, "rider": 2, "a-diff": 3}
    assert separate.inventory().steps[0].sampling == Poisson(0.5)


def test_full_batches_and_zero_counts():
    plan = ReleasePlan(
        phases=(
            Phase("p", 4, (Query("g", Fixed(1.0), batch=BatchPlan(10**6, N)),)),
            Phase("q", 0, (Query("never", Fixed(1.0), batch=BatchPlan(5, N)),)),
        )
    )
    steps = plan.inventory().steps
    assert len(steps) == 1 and steps[0].sampling == FullBatch() and plan.inventory().names == ("g",)


def test_bad_declarations_fail_clearly():
    with pytest.raises(ConfigError, match="exactly one of batch= and on="):
        Query("x", Fixed(1.0))
    with pytest.raises(ConfigError, match="not declared before"):
        ReleasePlan(phases=(Phase("p", 1, (Query("r", Fixed(1.0), on="host"),)),)).inventory()
    with pytest.raises(ConfigError, match="unique"):
        ReleasePlan(phases=(Phase("p", 1, ()), Phase("p", 1, ())))
    with pytest.raises(ConfigError, match="exceeds the training set"):
        PoissonBatch(200, N)
    with pytest.raises(ConfigError, match="gamma or a cap"):
        StepProportional(None, None)


def test_step_proportional_thresholds():
    assert StepProportional(4.0, 1.0).threshold(0.1) == pytest.approx(0.4)
    assert StepProportional(4.0, 1.0).threshold(10.0) == 1.0
    assert StepProportional(None, 0.7).threshold(10.0) == 0.7
    assert StepProportional(4.0, None).threshold(3.0) == 12.0
    with pytest.raises(ConfigError, match="distance"):
        StepProportional(4.0, None).threshold()


# ----------------------------------------------------------------------------- runtime
def run_for(plan, *, private=True, z=1.5):
    ledger = PrivacyLedger(delta=1e-5) if private else None
    noise = dict.fromkeys(plan.family_counts(), z)
    return PlanRun(plan, ctx_for(ledger, noise), private=private), ledger


def test_runtime_opens_each_batch_once_and_records_what_it_declares():
    plan = two_phase_plan(True)
    run, ledger = run_for(plan)
    for _ in range(2):
        ph = run.phase("refresh")
        ph.release("a", ones)
        ph.release("b", ones)
        ph.release("rider", ones)
    for d in (0.1, 0.0, 0.2):
        ph = run.phase("diff")
        if d == 0:
            ph.skip("a-diff")  # nothing sampled or recorded
        else:
            ph.release("a-diff", ones, distance=d)
            assert ph.thresholds["a-diff"] == pytest.approx(4.0 * d)
    noise = dict.fromkeys(plan.family_counts(), 1.5)
    (refresh,), (diff,) = plan.steps("refresh", noise), plan.steps("diff", noise)
    assert refresh.names == ("a", "b", "rider")
    assert ledger.counts == {refresh: 2, diff: 2}  # the zero-distance correction cost nothing
    assert set(run.last_indices) == {"a", "b", "rider", "a-diff"}


@pytest.mark.parametrize("cap", [1.0, None])
@pytest.mark.parametrize("distance", [float("inf"), float("nan")])
def test_a_correction_at_a_non_finite_distance_is_a_divergence_and_costs_nothing(cap, distance):
    """Diverged iterates (NaN/inf) stop the run as diverged (exit code 4, a failed record), not as a
    configuration error about an infinite per-record bound, and no batch is charged for it."""
    from privopt.training import RunDiverged

    plan = ReleasePlan(
        phases=(Phase("diff", 3, (Query("a-diff", StepProportional(4.0, cap), batch=BatchPlan(10, N)),)),)
    )
    run, ledger = run_for(plan)
    with pytest.raises(RunDiverged, match="non-finite distance") as info:
        run.phase("diff").release("a-diff", ones, distance=distance)
    assert info.value.exit_code == 4 and ledger.num_steps == 0


def test_an_undeclared_release_fails():
    run, ledger = run_for(two_phase_plan(True))
    with pytest.raises(ConfigError, match="not declared in phase 'refresh'"):
        run.phase("refresh").release("a-diff", ones, distance=1.0)
    with pytest.raises(ConfigError, match="not in the release plan"):
        run.phase("other")
    ph = run.phase("refresh")
    ph.release("a", ones)
    with pytest.raises(ConfigError, match="already made"):
        ph.release("a", ones)
    assert ledger.num_steps == 1


def test_a_phase_beyond_its_planned_count_is_refused_before_recording():
    run, ledger = run_for(two_phase_plan(False))
    for _ in range(2):
        run.phase("refresh").release("a", ones)
    with pytest.raises(ReleasePlanExceeded, match="at most 2") as err:
        run.phase("refresh").release("a", ones)
    assert isinstance(err.value, PrivacyBudgetExceeded)  # loops treat it as an exhausted budget
    assert ledger.num_steps == 2
    for _ in range(3):  # a phase runs at most its planned count, even when it releases nothing
        run.phase("diff").skip("a-diff")
    with pytest.raises(ReleasePlanExceeded, match="phase 'diff' would run 4 times"):
        run.phase("diff")


def test_a_family_beyond_its_planned_count_is_refused():
    # The family count is the second line of defence (e.g. for vectorised loops that record
    # phases in bulk): the plan allows 2 releases of "a".
    run, ledger = run_for(two_phase_plan(False))
    run.record_phase("refresh", 2)
    with pytest.raises(ReleasePlanExceeded):
        run.count(["a"])
    assert ledger.num_steps == 4  # two batches per refresh without sharing


def test_a_statistic_with_a_larger_bound_than_declared_is_refused():
    run, _ = run_for(two_phase_plan(True))
    with pytest.raises(ConfigError, match="exceeds the plan's"):
        run.phase("refresh").release("a", lambda idx, clip: BoundedSum(torch.ones(2), bound=2 * clip))
    with pytest.raises(ConfigError, match="not > 0"):
        run.phase("diff").release("a-diff", ones, distance=0.0)


def test_non_private_runs_release_without_noise_or_records():
    run, _ = run_for(two_phase_plan(True), private=False)
    out = run.phase("refresh").release("a", lambda idx, clip: BoundedSum(torch.full((2,), 50.0), bound=clip))
    torch.testing.assert_close(out, torch.full((2,), 1.0))  # 50 / expected batch size 50, no noise


PRIVATE = sorted(name for name, cls in available_algorithms().items() if cls.private)


@pytest.mark.parametrize("name", PRIVATE)
def test_every_private_algorithm_declares_its_inventory_through_a_plan(name):
    algo = get_algorithm(name)
    plan = algo.release_plan(1000)
    assert isinstance(plan, ReleasePlan)
    assert algo.inventory(n=1000) == plan.inventory()


def test_an_algorithm_that_releases_outside_its_plan_fails():
    from privopt.algorithms.dpsgd import DPSGD

    class Leaky(DPSGD):
        def step(self, t):
            super().step(t)
            self.releases.phase("step").release("extra", ones)

    algo = Leaky(epochs=1, batch_size=20)
    algo.setup(ctx_for(PrivacyLedger(delta=1e-5), {"grad": 1.0}))
    with pytest.raises(ConfigError, match="'extra' is not declared"):
        algo.step(0)


# ----------------------------------------------------------------------------- estimators
class FakePhase:
    """Records what an estimator asks for; releases a fixed value per name."""

    def __init__(self, values):
        self.values, self.calls = values, []

    def release(self, name, stat, *, distance=None):
        self.calls.append((name, distance))
        return self.values[name]

    def skip(self, name):
        self.calls.append((name, "skip"))


def test_spider_refreshes_every_period_and_accumulates_corrections():
    est = SpiderEstimator(refresh="r", correction="d", period=3)
    seen = []
    for t in range(7):
        ph = FakePhase({"r": torch.tensor([10.0]), "d": torch.tensor([1.0])})
        value = est.update(ph, t=t, distance=0.0 if t == 4 else 0.5, full=None, diff=None)
        seen.append((ph.calls, float(value)))
    assert [c for c, _ in seen] == [
        [("r", None)],
        [("d", 0.5)],
        [("d", 0.5)],
        [("r", None)],
        [("d", "skip")],
        [("d", 0.5)],
        [("r", None)],
    ]
    assert [v for _, v in seen] == [10.0, 11.0, 12.0, 10.0, 10.0, 11.0, 10.0]


def test_spider_drift_trigger_resets_on_refresh_and_state_round_trips():
    est = SpiderEstimator(refresh="r", correction="d", drift_threshold=1.0, scalar=True)
    kinds = []
    for step_sq in (0.0, 0.4, 0.4, 0.4, 0.1):
        est.observe_drift(step_sq)
        ph = FakePhase({"r": torch.tensor([2.0]), "d": torch.tensor([0.5])})
        est.update(ph, t=0, distance=1.0, full=None, diff=None)
        kinds.append(ph.calls[0][0])
    assert kinds == ["r", "d", "d", "r", "d"] and isinstance(est.value, float)
    copy = SpiderEstimator(refresh="r", correction="d", drift_threshold=1.0, scalar=True)
    copy.load_state_dict(est.state_dict())
    assert (copy.value, copy.drift) == (est.value, est.drift)
    with pytest.raises(ConfigError):
        SpiderEstimator(refresh="r", correction="d", period=3, drift_threshold=1.0)


def test_storm_momentum():
    storm = StormEstimator(name="s", beta=0.25)
    with pytest.raises(ConfigError, match="initialised"):
        storm.update(FakePhase({"s": torch.tensor([1.0])}), None)
    storm.value = 4.0
    assert storm.update(FakePhase({"s": torch.tensor([1.0])}), None) == pytest.approx(1.0 + 0.75 * 4.0)
    with pytest.raises(ConfigError):
        StormEstimator(name="s", beta=0.0)
