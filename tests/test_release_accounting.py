"""Every private algorithm's ledger says what it actually does, step by step.

A short run of each registered private algorithm (built from a config, insecure seed) under spies
(``tests/release_spies.py``) on the two noise primitives, both ledgers' ``record`` and the
release observers. For every release: its family was recorded before its noise was drawn, the
noise drawn is the one it reports, its std (scale) is the CALIBRATED multiplier times the
statistic's bound, the recorded sampling is the one it was made on, and each family is recorded
as often as it is released (once for families on disjoint records). No noise is drawn that no
release or tree accounts for, and the Poisson batches are drawn at the recorded rate.
"""

from __future__ import annotations

import math

import pytest

from privopt.algorithms import available_algorithms
from privopt.config import RunConfig
from privopt.data import load_dataset
from privopt.errors import PrivacyBudgetExceeded
from privopt.privacy import FullBatch, Gaussian, Laplace, Poisson, PureDP, TreeAggregation
from privopt.training import build_run
from release_spies import spy_run

LINEAR = {"dataset": "breast-cancer", "model": "logreg", "loss": "logistic"}
LINEAR["model_params"] = {"bias": False, "single_logit": True}
PARAMS = {  # small runs; anything not named runs with its defaults
    "dp-svrg": {"epochs": 2, "inner": 30},
    "dp-svrg-pp": {"epochs": 2, "inner": 8},
    "dp-amd": {"iterations": 10},
    "dp-gd-erm": {"iterations": 10},
    "dp-double-spider": {"q": 3},  # refreshes AND step-proportional differences
    "dp-recursive-spider": {"q": 3},
    "noisy-sgd-ags": {"choice": "noisy-max"},
}
PRIVATE = sorted(  # the built-ins: other test modules register algorithms of their own
    name for name, cls in available_algorithms().items() if cls.__module__.startswith("privopt.") and cls().private
)
MAX_STEPS = 8


def _groups():
    return load_dataset(
        "synthetic-groups", seed=0, num_groups=3, dim=4, n_train=400, n_test_per_group=50,
        group_fractions=[0.5, 0.3, 0.2],
    )  # fmt: skip


def _config(name: str, **extra) -> RunConfig:
    linear = "svrg" in name or name in ("dp-amd", "dp-gd-erm")
    d = {
        **(LINEAR if linear else {"model": "logreg"}),
        "algorithm": name,
        "algorithm_params": PARAMS.get(name, {}),
        "privacy": {"epsilon": 2.0, "delta": 1e-4},
        "insecure_seed": 3,
        **extra,
    }
    return RunConfig.from_dict(d)


def _run(name: str, monkeypatch, tamper=None, **extra):
    """Build and step one run under the spies; returns (run, log, Poisson draws as (rate, n, size))."""
    import privopt.sampling as sampling

    draws = []
    real = sampling.PoissonSampler.sample

    def sample(self):
        idx = real(self)
        draws.append((self.rate, self.n, int(idx.numel())))
        return idx

    monkeypatch.setattr(sampling.PoissonSampler, "sample", sample)
    cfg = _config(name, **extra)
    with spy_run(monkeypatch) as log:
        run = build_run(cfg, dataset=None if cfg.dataset == "breast-cancer" else _groups())
        if tamper is not None:
            tamper(run)
        t = 0
        while t < min(run.total, MAX_STEPS) and not getattr(run.algo, "done", False):
            run.algo.step(t)
            t += 1
    return run, log, draws


def _multiplier(m) -> float:
    if isinstance(m, (Gaussian, TreeAggregation)):
        return m.noise_multiplier
    if isinstance(m, Laplace):
        return m.scale_multiplier
    assert isinstance(m, PureDP)
    return 1.0 / m.epsilon  # a calibrated report-noisy-max family: PureDP(1/b)


def _calibrated(run, name: str) -> float:
    """The multiplier the calibration gave family ``name`` (or the plan's fixed one)."""
    plan = run.algo.release_plan(run.ctx.n)
    q = next((q for p in plan.phases for q in p.queries if q.name == name), None)
    if q is not None and q.fixed is not None:
        return q.fixed
    noise = run.calibration.noise
    # The SOSP oracle's O1/O2 share the calibrated multiplier of one disjoint pass.
    return noise[name] if name in noise else noise["pass"]


def _check_release(run, e, draw, recorded) -> None:
    """One release against its own noise draw (the last one before it) and the ledger at that draw."""
    assert e.name in recorded, f"{e.name!r} released before it was recorded"
    step, m = recorded[e.name]
    z = _multiplier(m)
    assert z == pytest.approx(_calibrated(run, e.name), rel=1e-12), (e.name, z)
    assert e.sampling == step.sampling, (e.name, e.sampling, step.sampling)
    kind, spread, _ = draw
    assert kind == ("gaussian" if isinstance(m, Gaussian) else "laplace"), (e.name, kind, m)
    assert spread == pytest.approx(z * e.bound, rel=1e-9), (e.name, spread, z, e.bound)
    if not isinstance(m, PureDP):  # report-noisy-max releases an index, its noise stays inside
        assert e.noise_std == pytest.approx(spread, rel=1e-12)


def _walk(run, log):
    """Replay the log; returns (releases per family, recordings per family, draws no release
    reported, the last recording of each family)."""
    from privopt.algorithms.svrg import _SVRGBase

    svrg = isinstance(run.algo, _SVRGBase)
    recorded, released, records, pending, unreleased = {}, {}, {}, [], []
    for item in log.items:
        if item[0] == "record":
            for m in item[1].mechanisms:
                recorded[m.name] = (item[1], m)
                records[m.name] = records.get(m.name, 0) + 1
        elif item[0] == "draw":
            pending.append((item[1:], dict(recorded)))  # what the ledger held when the noise was drawn
        else:
            e = item[1]
            released[e.name] = released.get(e.name, 0) + 1
            if svrg:  # its snapshot events report the block draw checked below
                continue
            assert pending, f"{e.name!r} released without drawing noise"
            draw, at_draw = pending.pop()
            _check_release(run, e, draw, at_draw)
            unreleased += [d for d, _ in pending]
            pending = []
    return released, records, unreleased + [d for d, _ in pending], recorded


def _check_unreleased_draws(run, draws, recorded, records) -> None:
    """Draws no release reported: DP-FTRL's tree nodes and DP-SVRG's block noise only."""
    for kind, spread, shape in draws:
        assert kind == "gaussian", (kind, spread)
        trees = [m for _, m in recorded.values() if isinstance(m, TreeAggregation)]
        if trees:  # one node per leaf, std z·C with C the tree's leaf bound
            assert len(trees) == 1
            bound = run.algo.release_plan(run.ctx.n).query(trees[0].name).sensitivity.clip  # the leaf clip
            assert spread == pytest.approx(trees[0].noise_multiplier * bound, rel=1e-12)
            continue
        assert "diff" in recorded and spread == 1.0 and shape[0] == 2, (spread, shape)  # scaled by the stds after
    if "diff" in recorded:  # DP-SVRG: one (2, k, d) block of unit noise per k recorded inner steps
        assert sum(shape[1] for _, _, shape in draws) == records["diff"] == records["snapshot"]


@pytest.mark.parametrize("name", PRIVATE)
def test_every_release_is_recorded_first_with_the_calibrated_noise_it_draws(name, monkeypatch):
    run, log, poisson = _run(name, monkeypatch)
    released, records, unreleased, recorded = _walk(run, log)
    assert released or unreleased, "the run released nothing"
    _check_unreleased_draws(run, unreleased, recorded, records)
    plan = run.algo.release_plan(run.ctx.n)
    disjoint = {q.name for p in plan.phases for q in p.queries if q.disjoint}
    for fam, k in records.items():
        if fam in disjoint:  # parallel composition: recorded once, made on disjoint records
            assert k == 1 and released.get(fam, 0) >= 1, (fam, k)
        elif isinstance(recorded[fam][1], TreeAggregation):
            assert k == 1
        elif fam != "diff":
            assert released.get(fam, 0) == k, (fam, released.get(fam), k)
    assert set(released) <= set(records)
    _check_poisson_rate(poisson, recorded)
    assert run.ledger.epsilon() <= 2.0 + 1e-9


def _check_poisson_rate(draws, recorded) -> None:
    """Batches drawn by the plan's samplers: at a recorded Poisson rate, sizes ~ Binomial(n, q)."""
    rates = {step.sampling.rate for step, _ in recorded.values() if isinstance(step.sampling, Poisson)}
    by_rate: dict[tuple, list[int]] = {}
    for rate, n, size in draws:
        assert any(math.isclose(rate, r, rel_tol=1e-12) for r in rates), (rate, rates)
        by_rate.setdefault((rate, n), []).append(size)
    for (rate, n), sizes in by_rate.items():
        m = len(sizes)
        sd = math.sqrt(m * n * rate * (1 - rate))
        assert abs(sum(sizes) - m * n * rate) <= 5 * sd + 1, (rate, n, sizes)


def test_pretraining_releases_are_recorded_first_with_their_calibrated_noise(monkeypatch):
    """Private feature centring (L2 bound R) and the released class histogram (bound 1) precede the
    algorithm's releases: one record, then one draw of std ``z·bound`` each."""
    pre = {"feature_centering": {"norm_bound": 2.5, "noise_ratio": 1.0}, "logit_adjustment": {"noise_ratio": 2.0}}
    run, log, poisson = _run("dp-sgd", monkeypatch, **pre)
    noise = run.calibration.noise
    head = [i[:3] if i[0] == "draw" else (i[0], i[1].names, i[1].sampling) for i in log.items[:4]]
    assert head == [
        ("record", ("feature_mean",), FullBatch()),
        ("draw", "gaussian", pytest.approx(noise["feature_mean"] * 2.5, rel=1e-12)),
        ("record", ("class_counts",), FullBatch()),
        ("draw", "gaussian", pytest.approx(noise["class_counts"] * 1.0, rel=1e-12)),
    ]
    assert noise["class_counts"] == pytest.approx(2.0 * noise["feature_mean"], rel=1e-9)  # the declared ratios
    log.items = log.items[4:]
    released, records, unreleased, _ = _walk(run, log)
    assert not unreleased and released == records == {"grad": MAX_STEPS}
    _check_poisson_rate(poisson, {"grad": (log.items[0][1], None)})


def _sizes_vs_rate(sizes, recorded_rate) -> None:
    """``sizes`` = [(realised batch size, records it was drawn from)]: Binomial at the recorded rate."""
    total, mean = sum(k for k, _ in sizes), sum(m * recorded_rate for _, m in sizes)
    sd = math.sqrt(sum(m * recorded_rate * (1 - recorded_rate) for _, m in sizes))
    assert abs(total - mean) <= 5 * sd + 1, (total, mean, sd)


@pytest.mark.parametrize("name", ["ada-dp-spider", "fed-dp-sgd"])
def test_oracle_poisson_batches_are_drawn_at_the_recorded_rate(name, monkeypatch):
    """The SOSP oracle draws its Poisson batches itself: their sizes follow the rates its ledger records."""
    from privopt.algorithms.ada_dp_spider import AdaDPSpiderOracle

    sizes, real = {}, AdaDPSpiderOracle._batch

    def batch(self, client, kind, window):
        idx = real(self, client, kind, window)
        sizes.setdefault(kind, []).append((int(idx.numel()), client.n))
        return idx

    monkeypatch.setattr(AdaDPSpiderOracle, "_batch", batch)
    monkeypatch.setitem(PARAMS, "ada-dp-spider", {"sampling": "poisson", "b2": 40, "kappa": 1e-4})
    _, log, _ = _run(name, monkeypatch)
    rates = {m.name: step.sampling.rate for step in log_steps(log) for m in step.mechanisms}
    assert sum(map(len, sizes.values())) >= MAX_STEPS and set(sizes) <= set(rates)
    for kind, got in sizes.items():
        _sizes_vs_rate(got, rates[kind])


def test_group_sgd_batches_are_drawn_at_the_recorded_rate(monkeypatch):
    """Noisy-SGD-MGR's step draws a Poisson batch inside the chosen group at the recorded rate q."""
    from privopt.algorithms.worst_group_sgd import _GroupSGD

    sizes, real = [], _GroupSGD._grad_sum

    def grad_sum(self, idx, **kw):
        g = self.groups[idx]
        assert bool((g == g[0]).all())  # one group's records
        sizes.append((int(idx.numel()), int((self.groups == g[0]).sum())))
        return real(self, idx, **kw)

    monkeypatch.setattr(_GroupSGD, "_grad_sum", grad_sum)
    monkeypatch.setitem(PARAMS, "noisy-sgd-mgr", {"batch_size": 160})
    _, log, _ = _run("noisy-sgd-mgr", monkeypatch)
    (rate,) = {step.sampling.rate for step in log_steps(log) if step.names == ("grad",)}
    assert rate == pytest.approx(160 / 400) and len(sizes) >= 5
    _sizes_vs_rate(sizes, rate)


def log_steps(log):
    return [i[1] for i in log.items if i[0] == "record"]


def test_the_replay_catches_unrecorded_releases_and_short_noise(monkeypatch):
    """Teeth: the same run with its records dropped, or drawing half the noise it records, fails the
    replay (and a multiplier off the calibrated plan is refused by the ledger)."""
    import privopt.grads.release as release

    run, log, _ = _run("dp-sgd", monkeypatch)
    log.items = [i for i in log.items if i[0] != "record"]
    with pytest.raises(AssertionError, match="released before it was recorded"):
        _walk(run, log)

    def off_plan(run):  # a multiplier the plan was not calibrated with: the ledger refuses its step
        run.ctx.noise["grad"] = run.ctx.noise["grad"] * 2

    with pytest.raises(PrivacyBudgetExceeded):
        _run("dp-sgd", monkeypatch, tamper=off_plan)
    real = release.gaussian_noise_like
    monkeypatch.setattr(release, "gaussian_noise_like", lambda t, *, std, rng: real(t, std=std / 2, rng=rng))
    run, log, _ = _run("dp-sgd", monkeypatch)
    with pytest.raises(AssertionError, match="grad"):
        _walk(run, log)
