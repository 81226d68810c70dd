"""SCDRO's step-size schedule: declared, validated, and actually applied to the x step.

Noise-free SCDRO with a constant step keeps its last iterate moving; the schedule exists so that it
settles. These tests fail if the factor is computed but not used, used on the wrong iteration, or if
a decaying schedule leaves the late iterates moving as much as the early ones.
"""

import math

import pytest
import torch

from dro_helpers import D, make_ctx
from privopt.algorithms import get_algorithm
from privopt.algorithms.dro_recursive_spider import SCDROConfig
from privopt.algorithms.step_schedules import STEP_SCHEDULES, step_factor
from privopt.errors import ConfigError

N = 200


def separable(seed=0, scale=8.0):
    """Two linearly separable classes with large inputs (so every gradient has norm > 1)."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(N, generator=g) < 0.3).long()
    x = torch.randn(N, D, generator=g)
    x[:, 0] = torch.where(y == 1, 1.0, -1.0) * (1.0 + x[:, 0].abs())
    return x * scale, y


def x_moves(**params):
    """‖x_{t+1} − x_t‖ at every step of noise-free SCDRO on the separable problem, and its T."""
    torch.manual_seed(0)
    model = torch.nn.Linear(D, 2)
    ctx = make_ctx(model, data=separable())
    algo = get_algorithm("scdro", q=1, b1=N, b3=N, s_batch=N, epochs=20, **params)
    algo.setup(ctx)
    flat = lambda: torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    moves, prev = [], flat()
    for t in range(algo.num_steps()):
        algo.step(t)
        now = flat()
        moves.append(float((now - prev).norm()))
        prev = now
    return moves, algo.num_steps()


@pytest.mark.parametrize("schedule", ["cosine", "inverse-sqrt"])
def test_normalised_moves_follow_the_declared_schedule(schedule):
    # With lr_norm = lr and gradients of norm > 1 (a small lr keeps them large),
    # each step moves x by exactly lr·factor(t).
    lr, final = 0.005, 0.1
    moves, T = x_moves(lr=lr, lr_schedule=schedule, lr_final=final)
    expected = [lr * step_factor(schedule, t=t, total=T, final=final) for t in range(T)]
    assert moves == pytest.approx(expected, rel=1e-4)
    assert moves[-1] < 0.15 * moves[0]


def test_constant_step_never_settles_and_a_decaying_one_does():
    constant, T = x_moves(lr=0.005)
    assert constant == pytest.approx([0.005] * T, rel=1e-4)  # the last iterate keeps moving by lr
    # With a decaying step the late moves are far smaller than the early ones (a constant step of this
    # size still moves by about a third of its early moves at the end: the gradients shrink only so far).
    decayed, T = x_moves(lr=0.05, lr_schedule="cosine", lr_final=0.01)
    k = T // 10
    early, late = sum(decayed[:k]) / k, sum(decayed[-k:]) / k
    assert late < 0.05 * early, (early, late)


def test_step_factor_shapes():
    T = 100
    for schedule in STEP_SCHEDULES:
        f = [step_factor(schedule, t=t, total=T, final=0.2) for t in range(T + 5)]
        assert f[0] == 1.0
        assert all(a >= b for a, b in zip(f, f[1:])), schedule  # never increases
        assert f[-1] == pytest.approx(1.0 if schedule == "constant" else 0.2)  # steps past T keep the final factor
    assert step_factor("cosine", t=50, total=T, final=0.0 + 1e-9) == pytest.approx(0.5)
    # inverse-sqrt is 1/√(1 + t/t0): the factor squared is affine in 1/t
    inv = [step_factor("inverse-sqrt", t=t, total=T, final=0.5) ** -2 for t in (0, 25, 50)]
    assert inv[2] - inv[1] == pytest.approx(inv[1] - inv[0])
    assert math.isclose(step_factor("inverse-sqrt", t=T, total=T, final=1.0), 1.0)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(lr_schedule="linear"), "lr_schedule must be one of"),
        (dict(lr_schedule=None), "lr_schedule must be one of"),
        (dict(lr_final=0.0), r"lr_final must be in \(0, 1\]"),
        (dict(lr_final=1.5), r"lr_final must be in \(0, 1\]"),
        (dict(lr_final="0.1"), r"lr_final must be in \(0, 1\]"),
        (dict(lr_final=math.nan), r"lr_final must be in \(0, 1\]"),
    ],
)
def test_bad_schedule_settings_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        SCDROConfig(**bad)
    with pytest.raises(ConfigError, match=match):
        get_algorithm("scdro", **bad)


def test_step_factor_refuses_bad_arguments():
    with pytest.raises(ConfigError, match="schedule must be one of"):
        step_factor("step", t=0, total=10, final=0.5)
    with pytest.raises(ConfigError, match="total >= 1"):
        step_factor("cosine", t=0, total=0, final=0.5)
    with pytest.raises(ConfigError, match="final step factor"):
        step_factor("cosine", t=0, total=10, final=0.0)


def test_schedule_is_recorded_with_the_config():
    cfg = SCDROConfig(lr_schedule="cosine", lr_final=0.05).to_dict()
    assert (cfg["lr_schedule"], cfg["lr_final"]) == ("cosine", 0.05)
    assert SCDROConfig(**cfg) == SCDROConfig(lr_schedule="cosine", lr_final=0.05)


def test_reproductions_run_scdro_with_a_decaying_step():
    from privopt.experiments.dro_protocol import BUDGETS, method_params

    params = method_params("scdro", budget=BUDGETS["quick"], lr=10.0, clip=0.1, epochs=2)
    algo = get_algorithm("scdro", **params)
    assert algo.config.lr_schedule != "constant" and algo.config.lr_final < 1.0
    assert algo.config.lr == 10.0  # the tuning grid still sets the (initial) step
