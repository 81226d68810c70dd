"""Release plans of the worst-group algorithms (ReleasePlans with the kinds of release_kinds):
inventories, calibrated Laplace / noisy-max families, disjoint (parallel) families, the runtime's
ledger records and bound checks, and the tree of noisy prefix sums."""

import math

import dp_accounting as dpa
import pytest
import torch
from dp_accounting.rdp import rdp_privacy_accountant

from privopt.algorithms.release_kinds import mechanism_of
from privopt.algorithms.releases import (
    DrawnBatch,
    Fixed,
    Phase,
    PlanRun,
    PublicBound,
    Query,
    ReleasePlan,
    ReleasePlanExceeded,
)
from privopt.algorithms.worst_group_plan import GroupReleaseRun, TreeAggregator
from privopt.errors import ConfigError
from privopt.grads.release import observe_releases
from privopt.grads.sums import BoundedSum
from privopt.privacy import (
    FullBatch,
    Inventory,
    Laplace,
    PlannedStep,
    Poisson,
    PrivacyLedger,
    PureDP,
    calibrate,
    epsilon_of,
    laplace_family,
    noisy_max_family,
)
from privopt.rng import TorchSource


class Ctx:
    """The parts of a RunContext the release runtime reads."""

    def __init__(self, ledger=None, noise=None, n=100):
        self.ledger, self.noise, self.n = ledger, noise or {}, n
        self.noise_rng = TorchSource(seed=0)


def plan_of(*queries, count=1, n=100):
    """One phase per query, each run ``count`` times (queries default to FullBatch drawn batches)."""
    return ReleasePlan(phases=tuple(Phase(f"p{i}", count, (q,)) for i, q in enumerate(queries)))


def drawn(n=100, sampling=None):
    return DrawnBatch(n) if sampling is None else DrawnBatch(n, sampling)


def test_calibrated_laplace_family_matches_dp_accounting():
    inv = Inventory((PlannedStep(FullBatch(), (laplace_family("losses"),), 50),))
    cal = calibrate(inv, epsilon=2.0, delta=1e-6, accountant="rdp")
    b = cal.noise["losses"]
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(b), 50))
    assert acc.get_epsilon(1e-6) == pytest.approx(2.0, rel=1e-4)
    assert next(iter(inv.steps_for({"losses": b}))).mechanisms == (Laplace(b, name="losses"),)


def test_calibrated_noisy_max_family_is_charged_as_pure_dp():
    inv = Inventory((PlannedStep(FullBatch(), (noisy_max_family("pick"),), 20),))
    cal = calibrate(inv, epsilon=1.0, delta=1e-6)
    b = cal.noise["pick"]
    assert epsilon_of({next(iter(inv.steps_for({"pick": b}))): 20}, delta=1e-6).epsilon <= 1.0 + 1e-9
    assert next(iter(inv.steps_for({"pick": 4.0}))).mechanisms == (PureDP(0.25, name="pick"),)
    round_trip = Inventory.from_dict(inv.to_dict())
    assert round_trip == inv


def test_disjoint_family_is_accounted_once_and_recorded_once():
    plan = plan_of(Query("phase", PublicBound(), batch=drawn(8), disjoint=True), count=4)
    assert [(s.count) for s in plan.inventory().steps] == [1]
    assert plan.family_counts() == {"phase": 4}
    cal = calibrate(plan.inventory(), epsilon=1.0, delta=1e-5)
    ledger = PrivacyLedger(delta=1e-5, target_epsilon=1.0, planned=plan.inventory().steps_for(cal.noise))
    run = GroupReleaseRun(plan, Ctx(ledger, cal.noise, n=8), private=True)
    for k in range(4):
        run.gaussian("phase", BoundedSum(torch.zeros(3), bound=0.5), indices=torch.tensor([2 * k, 2 * k + 1]))
    assert ledger.num_steps == 1 and ledger.epsilon() <= 1.0
    with pytest.raises(ReleasePlanExceeded):
        run.gaussian("phase", BoundedSum(torch.zeros(3), bound=0.5), indices=torch.tensor([0]))


def test_disjoint_family_refuses_a_reused_record_before_recording():
    plan = plan_of(Query("phase", PublicBound(), batch=drawn(10), disjoint=True, fixed=2.0), count=3)
    ledger = PrivacyLedger(delta=1e-5)
    run = GroupReleaseRun(plan, Ctx(ledger, n=10), private=True)
    run.gaussian("phase", BoundedSum(torch.zeros(2), bound=1.0), indices=torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="reuse a record"):
        run.gaussian("phase", BoundedSum(torch.zeros(2), bound=1.0), indices=torch.tensor([2, 3]))
    with pytest.raises(ConfigError, match="indices"):
        run.gaussian("phase", BoundedSum(torch.zeros(2), bound=1.0))
    assert ledger.num_steps == 1


def test_runtime_records_before_noise_and_scales_noise_by_the_bound():
    plan = plan_of(
        Query("grad", Fixed(0.5), batch=drawn(sampling=Poisson(0.5)), fixed=3.0),
        Query("losses", Fixed(0.25), batch=drawn(), mechanism="laplace", fixed=2.0),
        count=2,
    )
    ledger = PrivacyLedger(delta=1e-5)
    run = GroupReleaseRun(plan, Ctx(ledger), private=True)
    seen = []
    with observe_releases(seen.append):
        run.gaussian("grad", BoundedSum(torch.zeros(20000), bound=0.5), normalizer=1.0)
        lap = run.laplace("losses", BoundedSum(torch.zeros(20000, dtype=torch.float64), bound=0.25))
    assert [e.noise_std for e in seen] == [1.5, 0.5]
    assert float(seen[0].value.std()) == pytest.approx(1.5, rel=0.05)
    assert float(lap.abs().mean()) == pytest.approx(0.5, rel=0.05)  # E|Laplace(b)| = b
    assert ledger.num_steps == 2


def test_non_private_runtime_releases_the_exact_statistic_without_recording():
    plan = plan_of(Query("losses", Fixed(1.0), batch=drawn(), mechanism="noisy-max", fixed=0.01))
    run = GroupReleaseRun(plan, Ctx(None), private=False)
    assert run.noisy_max("losses", BoundedSum(torch.tensor([0.1, 0.9, 0.5]), bound=1.0)) == 1


def test_noisy_max_with_large_scale_is_nearly_uniform_and_small_scale_exact():
    plan = plan_of(Query("pick", Fixed(1.0), batch=drawn(), mechanism="noisy-max", fixed=1e4), count=1000)
    run = GroupReleaseRun(plan, Ctx(PrivacyLedger(delta=1e-5)), private=True)
    picks = [run.noisy_max("pick", BoundedSum(torch.tensor([0.0, 1.0]), bound=1.0)) for _ in range(1000)]
    assert 400 < sum(picks) < 600
    exact = plan_of(Query("pick", Fixed(1.0), batch=drawn(), mechanism="noisy-max", fixed=1e-4), count=10)
    run2 = GroupReleaseRun(exact, Ctx(PrivacyLedger(delta=1e-5)), private=True)
    assert all(run2.noisy_max("pick", BoundedSum(torch.tensor([0.0, 1.0]), bound=1.0)) == 1 for _ in range(10))


def test_tree_prefix_sums_are_exact_without_noise_and_each_prefix_has_popcount_noises():
    leaves = [torch.randn(3, dtype=torch.float64) for _ in range(13)]
    agg = TreeAggregator(leaves=13, dim=3, bound=10.0, std=0.0, rng=TorchSource(seed=0))
    for t, leaf in enumerate(leaves, 1):
        out = agg.add(BoundedSum(leaf, bound=1.0))
        assert torch.allclose(out, torch.stack(leaves[:t]).sum(0))
    # With zero leaves and unit noise, prefix t has variance = number of nodes in t's decomposition.
    var = torch.zeros(7)
    for s in range(400):
        noisy = TreeAggregator(leaves=7, dim=1, bound=1.0, std=1.0, rng=TorchSource(seed=s))
        var += torch.stack([noisy.add(BoundedSum(torch.zeros(1), bound=1.0))[0] ** 2 for _ in range(7)]).float()
    popcount = torch.tensor([bin(t).count("1") for t in range(1, 8)], dtype=torch.float32)
    assert torch.allclose(var / 400, popcount, rtol=0.25)
    with pytest.raises(ReleasePlanExceeded):
        agg.add(BoundedSum(torch.zeros(3), bound=1.0))


def test_tree_leaf_bound_and_leaf_disjointness_are_enforced():
    plan = plan_of(Query("ftrl", Fixed(1.0), batch=drawn(20), mechanism="tree", tree_steps=5, fixed=2.0))
    ledger = PrivacyLedger(delta=1e-5)
    run = GroupReleaseRun(plan, Ctx(ledger, n=20), private=True)
    tree = run.tree("ftrl", bound=1.0, dim=2)
    assert ledger.num_steps == 1
    tree.add(BoundedSum(torch.zeros(2), bound=1.0), indices=torch.tensor([0, 1]))
    with pytest.raises(ConfigError, match="exceeds"):
        tree.add(BoundedSum(torch.zeros(2), bound=2.0), indices=torch.tensor([2]))
    with pytest.raises(ConfigError, match="reuse"):
        tree.add(BoundedSum(torch.zeros(2), bound=1.0), indices=torch.tensor([1]))
    reopened = run.tree("ftrl", bound=1.0, dim=2, state=tree.state_dict())
    assert reopened.t == tree.t and ledger.num_steps == 1
    with pytest.raises(ReleasePlanExceeded):
        run.tree("ftrl", bound=1.0, dim=2)


def test_declarations_are_checked():
    with pytest.raises(ConfigError, match="mechanism"):
        Query("x", Fixed(1.0), batch=drawn(), mechanism="exponential")
    with pytest.raises(ConfigError, match="tree_steps"):
        Query("x", Fixed(1.0), batch=drawn(), mechanism="tree")
    with pytest.raises(ConfigError, match="fixed multiplier"):
        Query("x", Fixed(1.0), batch=drawn(), fixed=0.0)
    with pytest.raises(ConfigError, match="threshold"):
        PublicBound().threshold()
    with pytest.raises(ConfigError, match="sampled by the algorithm"):
        drawn().sampler(None)
    q = Query("x", Fixed(1.0), batch=drawn(), mechanism="noisy-max", fixed=4.0)
    assert math.isclose(mechanism_of(q, 4.0).epsilon, 0.25)
    with pytest.raises(ConfigError, match="not declared"):
        plan_of(q).query("y")


def test_a_statistic_above_the_declared_fixed_bound_is_refused_before_recording():
    ledger = PrivacyLedger(delta=1e-5)
    run = GroupReleaseRun(plan_of(Query("losses", Fixed(1.0), batch=drawn(), mechanism="laplace", fixed=2.0)),
                          Ctx(ledger), private=True)  # fmt: skip
    with pytest.raises(ConfigError, match="exceeds the plan"):
        run.laplace("losses", BoundedSum(torch.zeros(3), bound=1.5))
    assert ledger.num_steps == 0
    run.laplace("losses", BoundedSum(torch.zeros(3), bound=1.0))
    assert ledger.num_steps == 1


def test_plan_run_refuses_kinds_it_cannot_make():
    plan = plan_of(Query("losses", Fixed(1.0), batch=drawn(), mechanism="laplace"))
    with pytest.raises(ConfigError, match="Gaussian releases only"):
        PlanRun(plan, Ctx(None), private=False)


def test_noisy_max_is_refused_under_replace_one_before_anything_is_recorded():
    # Its PureDP(1/b) charge holds when one record moves one coordinate one way (add/remove); a
    # replaced record can lower one coordinate and raise another, which costs 2/b.
    plan = plan_of(Query("pick", Fixed(1.0), batch=drawn(), mechanism="noisy-max", fixed=1.0))
    ledger = PrivacyLedger(delta=1e-5, neighbouring="replace_one")
    run = GroupReleaseRun(plan, Ctx(ledger), private=True)
    with pytest.raises(ConfigError, match="add/remove neighbours only"):
        run.noisy_max("pick", BoundedSum(torch.tensor([0.0, 1.0]), bound=1.0))
    assert ledger.num_steps == 0
