"""Every private algorithm is accounted exactly as its documented privacy inventory says.

The inventory tables of docs/algorithms/*.md (dpsgd.md, erm.md, dro.md, sosp.md, worst_group.md) state,
per algorithm, which releases a run makes, how often, on which sampling, with which noise ratio
between families, and how they compose (shared batches, disjoint phases, one tree, a fixed Laplace
histogram). Here each table row is rewritten independently as dp_accounting events, from the
formulas on the page (``ceil(epochs·n/b)`` steps, ``R = ceil(T/q)`` refreshes, the ``1/(2q)`` and
``1/√depth`` default ratios, ...) and the calibrated multiplier of ONE base family; dp_accounting's
own RDP accountant then composes them. privopt's calibration of the algorithm's plan must give the
same ε (RDP on both sides, so the comparison is exact): a plan that declares another count,
sampling rate, ratio or composition than the page fails here, whatever the runtime does with it
(``tests/test_release_accounting.py`` checks the runtime against the plan).
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from privopt.algorithms import available_algorithms, get_algorithm
from privopt.privacy import PrivacyLedger, calibrate, epsilon_of
from wg_helpers import make_ctx, tiny_groups

N, DELTA, EPS = 1000, 1e-5, 2.0
REPLACE = dpa.NeighboringRelation.REPLACE_ONE
ADD = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
ZERO_OUT = dpa.NeighboringRelation.REPLACE_SPECIAL  # the relation tree aggregation's bound is stated for
BASE = ("grad", "x-refresh", "v-refresh", "x-grad", "diff", "ftrl-tree", "phase-output", "pass", "o1")


def _gauss(z):
    return dpa.GaussianDpEvent(z)


def _poisson(q, *zs):
    inner = [_gauss(z) for z in zs]
    return dpa.PoissonSampledDpEvent(q, inner[0] if len(inner) == 1 else dpa.ComposedDpEvent(inner))


def _times(event, count):
    return dpa.SelfComposedDpEvent(event, count)


def _pure_rdp(eps0: float, count: int) -> np.ndarray:
    """RDP of ``count`` ε0-DP releases charged as binary randomized response (the worst ε0-DP
    mechanism), in closed form: ``log(p^a (1−p)^(1−a) + (1−p)^a p^(1−a)) / (a − 1)``, p = e^ε0/(1+e^ε0)."""
    a = np.array(rdp_lib.DEFAULT_RDP_ORDERS, dtype=float)
    lp, lq = -np.log1p(math.exp(-eps0)), -np.log1p(math.exp(eps0))
    return count * np.logaddexp(a * lp + (1 - a) * lq, a * lq + (1 - a) * lp) / (a - 1)


def reference_epsilon(events, *, replace_one=False) -> float:
    """dp_accounting's RDP ε of ``events``: ("tree", event) under the zero-out relation, ("pure",
    ε0, count) in closed form, everything else under add/remove (or replace-one)."""
    main = dpa.rdp.RdpAccountant(neighboring_relation=REPLACE if replace_one else ADD)
    extra = np.zeros(len(rdp_lib.DEFAULT_RDP_ORDERS))
    for e in events:
        if isinstance(e, tuple) and e[0] == "pure":
            extra += _pure_rdp(e[1], e[2])
        elif isinstance(e, tuple) and e[0] == "tree":
            tree = dpa.rdp.RdpAccountant(neighboring_relation=ZERO_OUT)
            tree.compose(e[1])
            extra += tree._rdp  # the curve: dp_accounting composes across relations nowhere else
        else:
            main.compose(e)
    return rdp_lib.compute_epsilon(rdp_lib.DEFAULT_RDP_ORDERS, main._rdp + extra, DELTA)[0]


def _spider(c, refresh: int, correction: int) -> tuple[int, int]:
    """(T, R) of a SPIDER schedule: ``steps``, or the equal-compute rule of dro.md; R = ceil(T/q)."""
    if c.steps is not None:
        T = c.steps
    else:
        T = max(1, round(c.epochs * N * c.q / (min(refresh, N) + 2 * (c.q - 1) * min(correction, N))))
    return T, math.ceil(T / c.q)


def _dro_events(name, c, z):
    r = getattr(c, "scalar_noise_ratio", None)
    if name == "dp-double-spider":  # refresh: eta-refresh (×r) and x-refresh shared; diff likewise
        T, R = _spider(c, c.N3, c.N4)
        return [_times(_poisson(c.N1 / N, r * z, z), R), _times(_poisson(c.N2 / N, r * z, z), T - R)]
    if name == "dp-recursive-spider":  # v, u (×r), s-init (×r) | v-diff, u-diff (×r) | STORM s (×r)
        T, R = _spider(c, c.b1, c.b2)
        s_batch = c.b2 if c.s_batch is None else c.s_batch
        return [
            _times(_poisson(c.b1 / N, z, r * z, r * z), R),
            _times(_poisson(c.b2 / N, z, r * z), T - R),
            _times(_poisson(s_batch / N, r * z), T - R),
        ]
    lz = c.loss_noise_ratio * z  # the loss vector p-grad rides on the x-query's batch
    if name == "dp-sgda":
        T = c.steps if c.steps is not None else math.ceil(c.epochs * N / c.batch_size)
        return [_times(_poisson(c.batch_size / N, z, lz), T)]
    T, R = _spider(c, c.refresh_batch, c.batch_size)  # private-diff
    return [_times(_poisson(c.refresh_batch / N, z, lz), R), _times(_poisson(c.batch_size / N, z, lz), T - R)]


def _worst_group_events(name, c, z, n=N):
    counts = dpa.LaplaceDpEvent(c.count_noise)  # the group-size histogram, once, fixed scale
    if name == "minimax-phased-erm":  # disjoint phases: ONE Gaussian release
        return [counts, _gauss(z)]
    if name == "dp-oco-exp3":  # one tree over T leaves, and ONE Laplace event (disjoint bandit batches)
        T = c.rounds if c.rounds is not None else n // (2 * c.batch_size)
        tree = dpa.SingleEpochTreeAggregationDpEvent(z, [T])
        return [counts, ("tree", tree), dpa.LaplaceDpEvent(z / math.sqrt(math.ceil(math.log2(T + 1))))]
    q = c.batch_size / n
    T, b = math.ceil(c.epochs / q), z / (2 * q)  # loss multiplier 1/(2q) times the gradient's
    losses = ("pure", 1 / b, T) if getattr(c, "choice", None) == "noisy-max" else _times(dpa.LaplaceDpEvent(b), T)
    return [counts, _times(_poisson(q, z), T), losses]


def documented_events(name, c, z):
    """The documented inventory of ``name`` (config ``c``) on N records, base multiplier ``z``."""
    if name == "dp-sgd":
        return [_times(_poisson(c.batch_size / N, z), math.ceil(c.epochs * N / c.batch_size))]
    if name == "dp-sgd-joint":
        return [_times(_poisson(c.batch_size / N, z), math.ceil(c.epochs * N / c.batch_size))]
    if name == "dp-gd":
        return [_times(_gauss(z), round(c.epochs))]
    if name in ("dp-gd-erm", "dp-amd"):
        return [_times(_gauss(z), c.iterations)]
    if name in ("dp-svrg", "dp-svrg-pp"):  # one record at rate 1/n (bound 2C) + the snapshot mean (ratio 2n·r)
        T = c.epochs * c.inner if name == "dp-svrg" else sum(c.inner * 2**s for s in range(1, c.epochs + 1))
        return [_times(_poisson(1 / N, z), T), _times(_gauss(2 * N * c.snapshot_noise_ratio * z), T)]
    if name in ("dp-double-spider", "dp-recursive-spider", "dp-sgda", "private-diff"):
        return _dro_events(name, c, z)
    if name in ("gauss-psgd", "ada-dp-spider", "dp-spider-sosp"):  # disjoint passes: one Gaussian per pass
        return [_times(_gauss(z), int(c.epochs))]
    if name == "fed-dp-sgd":
        return [_times(_poisson(c.batch_size / N, z), math.floor(c.epochs * N / c.batch_size))]
    return _worst_group_events(name, c, z)


CASES = [
    ("dp-sgd", {}),
    ("dp-sgd-joint", {}),
    ("dp-gd", {}),
    ("dp-gd-erm", {}),
    ("dp-amd", {}),
    ("dp-svrg", {"epochs": 3, "inner": 200}),
    ("dp-svrg-pp", {"epochs": 3, "inner": 20, "snapshot_noise_ratio": 0.5}),
    ("dp-double-spider", {"steps": 40, "q": 4, "N1": 300, "N3": 300, "N2": 50, "N4": 50}),
    ("dp-double-spider", {"epochs": 3, "q": 5, "N1": 200, "N3": 200, "N2": 40, "N4": 40}),
    ("dp-recursive-spider", {"steps": 40, "q": 4, "b1": 300, "b3": 300, "b2": 50, "b4": 50, "s_batch": 40}),
    ("dp-recursive-spider", {"epochs": 3, "q": 5, "b1": 200, "b3": 200, "b2": 40, "b4": 40}),
    ("dp-sgda", {"steps": 30, "batch_size": 100}),
    ("dp-sgda", {"epochs": 2, "batch_size": 100, "loss_noise_ratio": 1.5}),
    ("private-diff", {"steps": 40, "q": 4, "refresh_batch": 300, "batch_size": 50}),
    ("noisy-sgd-mgr", {}),
    ("noisy-sgd-ags", {}),
    ("noisy-sgd-ags", {"choice": "noisy-losses"}),
    ("dp-oco-exp3", {}),
    ("minimax-phased-erm", {"phases": 3}),
    ("gauss-psgd", {}),
    ("ada-dp-spider", {}),
    ("dp-spider-sosp", {}),
    ("fed-dp-sgd", {}),
]


def _base(noise) -> str:
    (name,) = set(BASE) & set(noise)
    return name


@pytest.mark.parametrize(("name", "params"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_the_calibrated_plan_is_the_documented_inventory(name, params):
    algo = get_algorithm(name, **params)
    inv = algo.inventory(n=N)
    cal = calibrate(inv, epsilon=EPS, delta=DELTA, accountant="rdp")
    z = cal.noise[_base(cal.noise)]
    ours = epsilon_of(inv.steps_for(cal.noise), delta=DELTA, accountant="rdp").epsilon
    assert ours <= EPS
    assert ours == pytest.approx(reference_epsilon(documented_events(name, algo.config, z)), rel=1e-9)


def test_every_private_algorithm_has_a_documented_reference():
    algos = available_algorithms().items()
    builtin = {n for n, cls in algos if cls.__module__.startswith("privopt.") and cls().private}
    assert builtin == {name for name, _ in CASES}


def test_the_reference_has_teeth():
    """A count, a rate or a ratio off the page changes the reference ε."""
    algo = get_algorithm("noisy-sgd-mgr")
    z = calibrate(algo.inventory(n=N), epsilon=EPS, delta=DELTA, accountant="rdp").noise["grad"]
    right = reference_epsilon(documented_events("noisy-sgd-mgr", algo.config, z))
    for wrong in (
        get_algorithm("noisy-sgd-mgr", epochs=algo.config.epochs * 1.1).config,
        get_algorithm("noisy-sgd-mgr", batch_size=algo.config.batch_size + 8).config,
        get_algorithm("noisy-sgd-mgr", count_noise=10.0).config,
    ):
        assert abs(reference_epsilon(documented_events("noisy-sgd-mgr", wrong, z)) - right) > 1e-3 * right


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("dp-gd", {}),
        ("dp-svrg", {"epochs": 3, "inner": 200}),
        ("minimax-phased-erm", {"phases": 3}),
        ("dp-oco-exp3", {}),
    ],
)
def test_replace_one_charges_twice_the_bound_and_draws_one_record_without_replacement(name, params):
    """Under replace-one every Gaussian, Laplace and tree release is charged at twice its bound
    (multiplier z/2, Laplace scale b/2) and DP-SVRG's one record is a fixed-size draw of 1 of n."""
    algo = get_algorithm(name, **params)
    inv = algo.inventory(n=N)
    cal = calibrate(inv, epsilon=EPS, delta=DELTA, accountant="rdp", neighbouring="replace_one")
    z, c = cal.noise[_base(cal.noise)], algo.config
    ours = epsilon_of(inv.steps_for(cal.noise), delta=DELTA, accountant="rdp", neighbouring="replace_one").epsilon
    if name == "dp-gd":
        events = [_times(_gauss(z / 2), round(c.epochs))]
    elif name == "dp-svrg":
        T = c.epochs * c.inner
        wor = dpa.SampledWithoutReplacementDpEvent(N, 1, _gauss(z / 2))
        events = [_times(wor, T), _times(_gauss(N * c.snapshot_noise_ratio * z), T)]
    else:
        halved = []
        for e in _worst_group_events(name, c, z):
            if isinstance(e, dpa.LaplaceDpEvent):
                halved.append(dpa.LaplaceDpEvent(e.noise_multiplier / 2))
            elif isinstance(e, tuple):  # the tree: one leaf replaced moves it by 2C
                halved.append(("tree", dpa.SingleEpochTreeAggregationDpEvent(z / 2, e[1].step_counts)))
            else:
                halved.append(_gauss(z / 2))
        events = halved
    assert ours == pytest.approx(reference_epsilon(events, replace_one=True), rel=1e-9)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("noisy-sgd-mgr", {"batch_size": 64, "epochs": 2.0}),
        ("noisy-sgd-ags", {"batch_size": 64, "epochs": 2.0}),
        ("dp-oco-exp3", {"batch_size": 16}),
        ("minimax-phased-erm", {"phases": 3, "eta": 0.01, "radius": 2.0}),
    ],
)
def test_a_complete_worst_group_run_spends_exactly_its_documented_inventory(name, params):
    """The ledger of a whole run (not its plan) ends at the reference ε: every planned release was
    made and charged once (disjoint families and the tree once), and nothing else was charged."""
    data = tiny_groups(n=500, seed=6)
    ctx, _ = make_ctx(data, model="logreg")
    algo = get_algorithm(name, **params)
    inv = algo.inventory(n=ctx.n)
    cal = calibrate(inv, epsilon=1.5, delta=DELTA, accountant="rdp")
    ctx.noise = dict(cal.noise)
    ctx.ledger = PrivacyLedger(delta=DELTA, target_epsilon=1.5, accountant="rdp", planned=inv.steps_for(cal.noise))
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    z = cal.noise[_base(cal.noise)]
    want = reference_epsilon(_worst_group_events(name, algo.config, z, n=ctx.n))
    assert ctx.ledger.epsilon() == pytest.approx(want, rel=1e-9)
    assert want <= 1.5
