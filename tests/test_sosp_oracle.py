"""The Ada-DP-SPIDER oracle: sensitivity of O1/O2, disjoint single-pass batches, privacy for a
data-dependent number of refreshes, exactness without noise, local and central noise."""

import pytest
import torch
from tests.sosp_helpers import build, config, make_dataset, run_to_end

from privopt.algorithms.federation import Client
from privopt.algorithms.releases import PlanRun
from privopt.errors import ConfigError
from privopt.eval.sosp import full_gradient
from privopt.grads.flat import flat_params
from privopt.grads.release import observe_releases
from privopt.privacy import ParallelLedger
from privopt.training import train

SPIDER = {"b1": 60, "b2": 12, "lr": 0.3, "epochs": 1, "gamma": 5.0, "clip": 1.0}


def _client(x, y):
    return Client(0, x, y, noise_rng=None, sampler_rng=None)


def _neighbours(x, y, kind):
    """(D, D', idx, idx') differing in record 0: replaced by an adversarial record, or that record removed."""
    n = x.shape[0]
    x2, y2 = x.clone(), y.clone()
    x2[0], y2[0] = 50.0 * torch.ones_like(x[0]), (y[0] + 1) % 3
    if kind == "replace":
        return (x, y), (x2, y2), torch.arange(n), torch.arange(n)
    return (x2, y2), (x2[1:], y2[1:]), torch.arange(n), torch.arange(n - 1)


@pytest.mark.parametrize("kind", ["replace", "remove"])
def test_o1_and_o2_move_by_at_most_their_declared_bound_on_neighbouring_datasets(kind):
    run = build("ada-dp-spider", SPIDER)
    oracle, ds = run.algo.oracle, make_dataset()
    x0 = flat_params(run.model).clone()
    oracle.prev = x0
    x1 = x0 + 0.05 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    (xa, ya), (xb, yb), ia, ib = _neighbours(ds.x_train[:80], ds.y_train[:80], kind)
    factor = 2.0 if kind == "replace" else 1.0  # a replaced record removes one term and adds one
    for name, point, threshold in [("o1", x1, 1.0), ("o2", x1, 5.0 * float((x1 - x0).norm()))]:
        sa = oracle._statistic(_client(xa, ya), name, ia, point, threshold)
        sb = oracle._statistic(_client(xb, yb), name, ib, point, threshold)
        assert sa.bound == sb.bound == pytest.approx(threshold)
        moved = float((sa.value - sb.value).norm())
        assert moved <= factor * threshold * (1 + 1e-5)
        assert moved > 0.5 * threshold  # the adversarial record saturates its clip: the bound is tight


def test_single_pass_uses_every_record_at_most_once_and_costs_one_release():
    run = build("gauss-psgd", {**SPIDER, "kappa": 0.2, "chi": "auto"})
    oracle, seen = run.algo.oracle, []
    original = oracle._batch

    def spy(client, kind, window):
        idx = original(client, kind, window)
        seen.append(idx)
        return idx

    oracle._batch = spy
    run_to_end(run)
    used = torch.cat(seen)
    assert oracle.counts["o1"] >= 2 and oracle.counts["o2"] >= 2  # several windows of both kinds
    assert len(set(used.tolist())) == used.numel()  # disjoint: no record twice
    assert isinstance(run.ledger, ParallelLedger) and run.ledger.passes == 1
    assert run.ledger.num_steps == oracle.counts["o1"] + oracle.counts["o2"]
    assert run.ledger.epsilon() <= 2.0


def _pass_batches(oracle, arrivals, kinds):
    """The batches of one disjoint pass whose queries are ``kinds``, for the given arrival times."""
    client = oracle.fed.clients[0]
    oracle.cursor, oracle.arrivals = 0.0, {client.index: arrivals}
    return [set(oracle._batch(client, kind, oracle._advance(kind)).tolist()) for kind in kinds]


def test_an_added_record_changes_one_window_of_a_pass_by_itself_alone():
    """sosp.md, "Batches and accounting": with the arrival times of the shared records coupled (and
    the public window widths fixed), adding a record adds it to the one window its own time falls in
    and changes no other window; the windows of a pass are disjoint."""
    oracle = build("ada-dp-spider", SPIDER).algo.oracle
    f1, f2 = oracle.f["o1"], oracle.f["o2"]
    kinds = ["o1", "o2", "o2", "o1", "o2"]
    while sum(oracle.f[k] for k in kinds) + f2 <= 1.0:
        kinds.append("o2")
    used = sum(oracle.f[k] for k in kinds)  # the share of the pass the windows cover
    times = torch.rand(oracle.fed.clients[0].n, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    base = _pass_batches(oracle, times, kinds)
    assert sum(len(b) for b in base) == len(set().union(*base))  # disjoint
    r = 17  # the added record's position
    for t_new in (0.5 * f1, f1 + 0.5 * f2, 0.999 * used, 0.9999):
        new = torch.tensor([t_new], dtype=torch.float64)
        added = _pass_batches(oracle, torch.cat([times[:r], new, times[r:]]), kinds)
        back = [{i if i < r else i - 1 for i in b if i != r} for b in added]  # the shared records' ids in D
        assert back == base
        holding = [j for j, b in enumerate(added) if r in b]
        assert len(holding) == (1 if t_new < used else 0)  # beyond the last window: in none


@pytest.mark.parametrize("sampling", ["disjoint", "poisson"])
def test_epsilon_never_exceeds_the_target_whatever_the_number_of_refreshes(sampling):
    eps, spent, refreshes = 1.0, [], []
    for kappa in (1e-4, 0.05, 100.0):  # refresh (almost) every query ... almost never
        params = {**SPIDER, "epochs": 2, "kappa": kappa, "sampling": sampling, "b2": 20}
        run = build("ada-dp-spider", params, epsilon=eps)
        run_to_end(run)
        assert run.algo.oracle.exhausted
        spent.append(run.ledger.epsilon())
        refreshes.append(run.algo.oracle.counts["o1"])
    assert max(spent) <= eps
    assert len(set(refreshes)) == 3  # the refresh count really depends on the released values
    if sampling == "disjoint":  # parallel composition: the guarantee does not depend on it at all
        assert spent[0] == spent[1] == spent[2]
    else:  # the RDP filter certifies its budget's epsilon, and stops the run when it would exceed it
        assert all(run_eps == spent[0] for run_eps in spent)


@pytest.mark.parametrize("sampling", ["disjoint", "poisson"])
def test_every_release_is_made_as_the_release_plan_declares_it(sampling):
    run = build("ada-dp-spider", {**SPIDER, "epochs": 2, "kappa": 0.05, "sampling": sampling, "b2": 20})
    plan = run.algo.release_plan(run.algo._ctx.n)
    assert run.algo.inventory(n=run.algo._ctx.n) == plan.inventory()
    assert plan.composition == {"disjoint": "parallel", "poisson": "filter"}[sampling]
    declared = {q.name: q.batch.sampling for p in plan.phases for q in p.queries}
    events = []
    with observe_releases(events.append):
        run_to_end(run)
    assert {e.name for e in events} == {"o1", "o2"}
    assert all(e.sampling == declared["pass" if sampling == "disjoint" else e.name] for e in events)
    with pytest.raises(ConfigError, match="fixed schedules"):  # adaptive / pass-wise: the oracle's own runtime
        PlanRun(plan, run.algo._ctx, private=True)


def test_filter_stops_a_refresh_heavy_run_before_its_data_budget():
    run = build("ada-dp-spider", {**SPIDER, "epochs": 3, "kappa": 1e-6, "sampling": "poisson"}, epsilon=1.0)
    run_to_end(run)
    oracle, filt = run.algo.oracle, run.ledger.filter
    assert oracle.exhausted and oracle.epochs_used < 3 - oracle.f["o1"]  # stopped by privacy, not data
    assert not filt.fits(oracle._step("o1")) and filt.spent <= filt.budget
    assert run.ledger.epsilon() <= 1.0


def test_without_noise_or_clipping_on_full_batches_the_estimate_is_the_exact_gradient():
    ds = make_dataset(n=120)
    params = {"b1": 120, "b2": 120, "lr": 0.5, "epochs": 6, "kappa": 10.0, "clip": 1e9, "gamma": 1e9}
    run = build("ada-dp-spider", {**params, "sampling": "poisson", "private": False}, dataset=ds)
    algo = run.algo
    for t in range(5):
        exact = full_gradient(run.model, run.loss_fn, ds.x_train, ds.y_train)  # at the point queried now
        algo.step(t)
        assert torch.allclose(algo.oracle.estimate, exact, atol=1e-5)
    assert algo.oracle.counts["o2"] >= 3  # the exact recursion, not only refreshes


@pytest.mark.parametrize("trust", ["local", "central"])
def test_local_noise_per_client_central_noise_once(trust):
    run = build("ada-dp-spider", {**SPIDER, "clients": 3, "trust": trust, "b1": 30, "b2": 10})
    events = []
    with observe_releases(events.append):
        run.algo.step(0)  # one O1 query
    oracle = run.algo.oracle
    z = oracle.z["o1"]
    if trust == "local":
        assert len(events) == 3 and all(e.noise_std == pytest.approx(z * 1.0) for e in events)
        assert all(c.ledger.num_steps == 1 for c in run.algo.fed.clients)
        assert oracle.noise_std() == pytest.approx(z / 30 / 3**0.5)
    else:
        assert len(events) == 1 and events[0].noise_std == pytest.approx(z * 1.0)
        assert run.ledger.num_steps == 1 and all(c.ledger is None for c in run.algo.fed.clients)
        assert oracle.noise_std() == pytest.approx(z / 30 / 3)


def test_label_split_gives_clients_few_classes():
    run = build("ada-dp-spider", {**SPIDER, "clients": 3, "b1": 30, "b2": 10, "split": "label"})
    classes = [len(set(c.y.tolist())) for c in run.algo.fed.clients]
    assert max(classes) <= 2
    iid = build("ada-dp-spider", {**SPIDER, "clients": 3, "b1": 30, "b2": 10, "split": "iid"})
    assert all(len(set(c.y.tolist())) == 3 for c in iid.algo.fed.clients)


def test_a_simulated_federated_run_resumes_to_the_same_model(tmp_path):
    cfg = config("gauss-psgd", {**SPIDER, "clients": 3, "b1": 30, "b2": 10, "kappa": 0.2, "epochs": 2}, plots=False)
    straight = train(cfg, out_dir=tmp_path / "a", progress=False, dataset=make_dataset())
    paused = train(cfg, out_dir=tmp_path / "b", progress=False, dataset=make_dataset(), max_steps=7)
    assert paused["status"] == "paused"
    resumed = train(None, out_dir=tmp_path / "b", resume=True, progress=False, dataset=make_dataset())
    a, b = torch.load(tmp_path / "a" / "model.pt"), torch.load(tmp_path / "b" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)  # every client's randomness and ledger came back
    assert resumed["privacy"]["epsilon_spent"] == straight["privacy"]["epsilon_spent"]
