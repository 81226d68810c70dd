"""The x-step schedule (``lr_schedule``, ``lr_final``) of DP-SGD and every DRO method.

The schedule is a public factor of the model step. These tests fail if a method declares the fields
but ignores them, if the constant schedule changes a run in any bit, if a decaying schedule leaves
the late noisy steps as large as the early ones, or if the step-proportional thresholds stop
following the (scheduled) public distance.
"""

import math

import pytest
import torch

from dro_helpers import N, fresh_model, make_ctx
from privopt.algorithms import get_algorithm
from privopt.algorithms.step_schedules import step_factor
from privopt.errors import ConfigError
from privopt.privacy import PrivacyLedger

# Small private runs (noise multiplier 1 on every query) of every method with a model step.
RUNS = {
    "dp-sgd": dict(epochs=4, batch_size=20, lr=0.5),
    "sgd": dict(epochs=4, batch_size=20, lr=0.5),
    "dp-gd": dict(epochs=20, lr=0.5),
    "dp-sgd-joint": dict(epochs=4, batch_size=20, lam=1.0, lr=0.5),
    "dp-double-spider": dict(steps=24, q=4, N1=60, N2=20, N3=60, N4=20, lam=1.0, lr=0.5, lr_norm=None),
    "dp-recursive-spider": dict(steps=24, q=4, b1=60, b2=20, b3=60, b4=20, lr=0.5, lr_norm=None),
    "scdro": dict(steps=24, q=1, b1=60, b3=60, lr=0.5, lr_norm=None),
    "dp-sgda": dict(steps=24, batch_size=20, lam=1.0, lr=0.5),
    "private-diff": dict(steps=24, q=4, refresh_batch=60, batch_size=20, lam=1.0, lr=0.5),
}


def run(name, **kw):
    """(flat parameters after the run, ‖x_{t+1} − x_t‖ per step, planned steps, per-step logs)."""
    model = fresh_model()
    algo = get_algorithm(name, **{**RUNS[name], **kw})
    noise = dict.fromkeys(algo.inventory(n=N).names, 1.0) if algo.private else {}
    ctx = make_ctx(model, ledger=PrivacyLedger(delta=1e-5) if algo.private else None, noise=noise)
    algo.setup(ctx)
    flat = lambda: torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    moves, logs, prev = [], [], flat()
    for t in range(algo.num_steps()):
        logs.append(algo.step(t))
        now = flat()
        moves.append(float((now - prev).norm()))
        prev = now
    return prev, moves, algo.num_steps(), logs


METHODS = sorted(RUNS)


@pytest.mark.parametrize("name", METHODS)
def test_constant_schedule_changes_no_bit(name):
    # The constant schedule (the default) and a cosine whose final factor is 1 multiply the step by
    # exactly 1.0: the same seeds give bit-identical parameters.
    base, _, _, _ = run(name)
    for kw in (dict(lr_schedule="constant", lr_final=0.2), dict(lr_schedule="cosine", lr_final=1.0)):
        other, _, _, _ = run(name, **kw)
        assert torch.equal(base, other), kw


@pytest.mark.parametrize("name", METHODS)
def test_decaying_schedule_shrinks_the_late_steps(name):
    # Under noise the step direction stays large to the end; only the schedule makes x settle.
    _, constant, T, _ = run(name)
    _, decayed, T2, _ = run(name, lr_schedule="cosine", lr_final=0.01)
    assert T == T2
    k = max(2, T // 6)
    mean = lambda xs: sum(xs) / len(xs)
    assert mean(decayed[-k:]) < 0.1 * mean(decayed[:k]), name
    assert mean(decayed[-k:]) < 0.2 * mean(constant[-k:]), name


def test_dp_sgd_step_follows_the_declared_factor_at_every_iteration():
    lr, final = 0.5, 0.1
    model = fresh_model()
    algo = get_algorithm("dp-sgd", **{**RUNS["dp-sgd"], "lr_schedule": "inverse-sqrt", "lr_final": final})
    algo.setup(make_ctx(model, ledger=PrivacyLedger(delta=1e-5), noise={"grad": 1.0}))
    T = algo.num_steps()
    for t in range(T):
        algo.step(t)
        expected = lr * step_factor("inverse-sqrt", t=t, total=T, final=final)
        assert algo._opt.param_groups[0]["lr"] == pytest.approx(expected)


def test_double_spider_step_size_and_thresholds_follow_the_scheduled_move():
    # The x-difference threshold is γ·max(|Δη|, ‖x_t − x_{t−1}‖), capped: computed from the public
    # (scheduled) move, so a smaller step gives a smaller threshold and the declared bound holds.
    _, moves, T, logs = run("dp-double-spider", lr_schedule="cosine", lr_final=0.05, gamma_x=3.0, clip_x_diff=1e9)
    q = RUNS["dp-double-spider"]["q"]
    etas = [None] + [h["eta"] for h in logs]  # etas[t + 1] = η_{t+1}
    for t in range(T):
        assert logs[t]["step_size"] == pytest.approx(0.5 * step_factor("cosine", t=t, total=T, final=0.05))
        if t % q == 0:
            continue
        eta_t = etas[t] if t > 0 else None
        d_x = max(abs(etas[t + 1] - eta_t), moves[t - 1])
        assert logs[t]["clip_x_diff"] == pytest.approx(3.0 * d_x, rel=1e-6)


@pytest.mark.parametrize("name", ["dp-sgd", "dp-double-spider", "dp-recursive-spider", "dp-sgda", "private-diff"])
@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(lr_schedule="linear"), "lr_schedule must be one of"),
        (dict(lr_final=0.0), r"lr_final must be in \(0, 1\]"),
        (dict(lr_final=math.inf), r"lr_final must be in \(0, 1\]"),
    ],
)
def test_bad_schedule_settings_are_refused(name, bad, match):
    with pytest.raises(ConfigError, match=match):
        get_algorithm(name, **bad)


def test_schedule_is_a_role_every_dp_method_declares():
    from privopt.algorithms import available_algorithms

    dp = ("dp-sgd", "dp-gd", "dp-sgd-joint", "dp-double-spider", "dp-recursive-spider", "dp-sgda", "private-diff")
    for name in dp:
        config = available_algorithms()[name].Config
        assert config.fields_with_role("lr_schedule") == ("lr_schedule",), name
        assert config.fields_with_role("lr_final") == ("lr_final",), name


def test_quick_budget_decays_every_method_step_and_scdro_keeps_its_own():
    from privopt.experiments.dro_protocol import BUDGETS, TABLE3_METHODS, method_params

    quick = BUDGETS["quick"]
    for method in TABLE3_METHODS:
        config = get_algorithm(method, **method_params(method, budget=quick, lr=40.0, clip=0.1, epochs=2)).config
        assert (config.lr_schedule, config.lr_final) == (quick.lr_schedule, quick.lr_final), method
        assert config.lr == 40.0  # the grid still sets the initial step
    assert quick.lr_schedule != "constant" and quick.lr_final < 1.0
    scdro = method_params("scdro", budget=quick, lr=10.0, clip=0.1, epochs=2)
    assert scdro["lr_schedule"] == "cosine" and scdro["lr_final"] < quick.lr_final
    paper = method_params("dp-sgd", budget=BUDGETS["paper"], lr=0.1, clip=1.0, epochs=2)
    assert paper["lr_schedule"] == "constant"
