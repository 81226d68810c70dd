"""Regression pins: short runs of every algorithm give the same parameters and epsilon as before.

Each case drives one algorithm through :class:`RunContext` directly, on data and a model made here
from fixed torch seeds, with seeded (insecure, reproducible) noise and sampling sources and fixed
noise multipliers. Nothing goes through ``train()`` or ``load_dataset()``, so the pins only move
when an algorithm's numbers move. The values were produced by the code before the algorithm-layer
refactor (commit b3968d8); a refactor must reproduce them to 1e-6.

To re-derive the values after an intended change of behaviour, run
``python tests/test_pinned_numbers.py`` and paste its output into ``PINNED`` (and say why in the
commit message).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privopt.algorithms import get_algorithm
from privopt.algorithms.base import RunContext
from privopt.grads import get_engine
from privopt.objectives.erm import logistic_loss
from privopt.privacy import FullBatch, Gaussian, Inventory, PlannedStep, Poisson, PrivacyLedger, Step, calibrate
from privopt.rng import TorchSource

N, D = 120, 4
Z = 1.3  # every family's noise multiplier (fixed: no calibration involved)


def _loss(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


def _classification_data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, D, generator=g)
    y = ((x[:, 0] - 0.5 * x[:, 1] + 0.6 * torch.randn(N, generator=g)) > 0.4).long()
    return x, y


def _logistic_data():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(N, 5, generator=g, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True)
    y = torch.where(torch.rand(N, generator=g, dtype=torch.float64) < 0.5, 1.0, -1.0).to(torch.float64)
    return x, y


def _mlp():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(D, 3), nn.Tanh(), nn.Linear(3, 2))


def _linear():
    model = nn.Linear(5, 1, bias=False, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(torch.linspace(-0.2, 0.3, 5, dtype=torch.float64).reshape(1, 5))
    return model


CASES = {
    "dp-double-spider": dict(steps=12, q=4, N1=60, N2=20, N3=60, N4=20, lam=1.0, lr=0.3, eta_lr=0.2),
    "dp-double-spider-unshared": dict(steps=10, q=4, N1=N, N2=20, N3=60, N4=25, lam=0.5, eta_init=0.4),
    "dp-recursive-spider": dict(steps=12, q=4, b1=60, b2=20, b3=60, b4=20, s_batch=5, lr=0.05),
    "dp-recursive-spider-unshared": dict(steps=10, q=3, b1=N, b2=20, b3=60, b4=30, s_batch=2, lr=0.05, beta=0.3),
    "private-diff": dict(steps=10, q=4, refresh_batch=60, batch_size=20, lam=1.0, lr=0.3),
    "dp-sgda": dict(steps=8, batch_size=20, lam=1.0, lr=0.3, dual_lr=0.05),
    "scdro": dict(steps=10, q=3, b1=60, b2=20, b3=60, b4=20, s_batch=20, lr=0.1),
    "dp-sgd": dict(epochs=1.5, batch_size=20, lr=0.5, clip=0.7),
    "dp-gd": dict(epochs=6, lr=0.5, clip=0.7),
    "dp-sgd-joint": dict(epochs=1.5, batch_size=20, lam=1.0, lr=0.3, clip=0.8),
    "dp-svrg": dict(epochs=2, inner=8, step_size=0.2, l2=1e-2, clip=0.8),
    "dp-svrg-pp": dict(epochs=2, inner=3, step_size=0.1, l2=0.0, clip=0.8),
    "dp-gd-erm": dict(iterations=9, step_size=0.4, l2=0.01, clip=0.8),
}
LINEAR = ("dp-svrg", "dp-svrg-pp", "dp-gd-erm")


def run_case(key: str) -> tuple[list[float], float | None]:
    """Run one pinned case; returns (final flat parameters, epsilon spent at delta = 1e-5)."""
    name = key.replace("-unshared", "")
    algo = get_algorithm(name, **CASES[key])
    linear = name in LINEAR
    x, y = _logistic_data() if linear else _classification_data()
    model = _linear() if linear else _mlp()
    ledger, noise = None, {}
    if algo.private:
        noise = dict.fromkeys(algo.inventory(n=N).names, Z)
        ledger = PrivacyLedger(delta=1e-5)
    ctx = RunContext(
        model=model,
        loss_fn=logistic_loss if linear else _loss,
        x_train=x,
        y_train=y,
        engine=None if linear else get_engine("vmap"),
        ledger=ledger,
        noise=noise,
        noise_rng=TorchSource(seed=21),
        sampler_rng=TorchSource(seed=22),
    )
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    algo.finalize()
    flat = torch.cat([p.detach().reshape(-1).to(torch.float64) for p in model.parameters()])
    return flat.tolist(), (ledger.epsilon() if ledger is not None else None)


PINNED: dict[str, tuple[list[float], float | None]] = {
    "dp-double-spider": (
        [
            -0.446259230375,
            -0.366249024868,
            -0.271875858307,
            -0.590652763844,
            0.112802669406,
            -0.40663164854,
            0.248920679092,
            0.307776391506,
            -0.0328695327044,
            0.371492475271,
            -0.0168548915535,
            0.330241262913,
            -0.431409806013,
            -0.254447489977,
            -0.302302241325,
            0.0294612720609,
            -0.546464204788,
            0.606472849846,
            0.308349430561,
            0.509056210518,
            0.0697598606348,
            -0.311858683825,
            0.293121159077,
        ],
        7.807870690591527,
    ),
    "dp-double-spider-unshared": (
        [
            -0.455434858799,
            -0.408169716597,
            -0.243242293596,
            -0.486768335104,
            0.050793223083,
            -0.454320043325,
            0.237348303199,
            0.246594980359,
            0.0809275358915,
            0.393925338984,
            -0.0233865045011,
            0.282918870449,
            -0.379402548075,
            -0.146164745092,
            -0.417725652456,
            -0.0348542332649,
            -0.414634644985,
            0.493623435497,
            0.379637598991,
            0.434391379356,
            0.186721786857,
            -0.264879226685,
            0.440026462078,
        ],
        8.24685089496753,
    ),
    "dp-gd": (
        [
            -0.392376244068,
            -0.422687649727,
            -0.2254986763,
            -0.479995578527,
            0.284327894449,
            -0.503847420216,
            0.205857083201,
            0.239368036389,
            -0.0206313803792,
            0.440543979406,
            -0.0348303094506,
            0.310953676701,
            -0.400508701801,
            -0.185705274343,
            -0.422882467508,
            0.0181987006217,
            -0.477250725031,
            0.499882757664,
            0.320787340403,
            0.538189530373,
            0.170146480203,
            -0.180205449462,
            0.384161829948,
        ],
        9.29147122232681,
    ),
    "dp-gd-erm": (
        [-0.190120831431, -0.0391486813867, -0.0594694839482, 0.23636867507, 0.171815160035],
        11.941432904506382,
    ),
    "dp-recursive-spider": (
        [
            -0.488999217749,
            -0.376114368439,
            -0.229800820351,
            -0.45297896862,
            0.0641357526183,
            -0.422463089228,
            0.243565291166,
            0.265160292387,
            0.0369698889554,
            0.353659361601,
            0.00150165008381,
            0.27415060997,
            -0.326001346111,
            -0.144018679857,
            -0.419866174459,
            -0.00135827902704,
            -0.391933053732,
            0.507230341434,
            0.339025139809,
            0.435774236917,
            0.180219084024,
            -0.248900070786,
            0.480900198221,
        ],
        8.545919262769097,
    ),
    "dp-recursive-spider-unshared": (
        [
            -0.468647867441,
            -0.396121144295,
            -0.2228179425,
            -0.456927955151,
            0.106255590916,
            -0.445808470249,
            0.24681122601,
            0.258552283049,
            0.0440257973969,
            0.360021144152,
            -0.0243137236685,
            0.283736109734,
            -0.380921721458,
            -0.184321060777,
            -0.408679544926,
            0.000530581281055,
            -0.385712772608,
            0.484110862017,
            0.354670792818,
            0.423697918653,
            0.222260683775,
            -0.212056577206,
            0.425668030977,
        ],
        10.443045695481036,
    ),
    "dp-sgd": (
        [
            -0.424279749393,
            -0.312731593847,
            -0.276431798935,
            -0.5135820508,
            0.503488183022,
            -0.428552895784,
            0.209471210837,
            0.198637068272,
            -0.132964998484,
            0.48666292429,
            -0.0688358992338,
            0.360467672348,
            -0.389887243509,
            -0.283982276917,
            -0.497715801001,
            0.0469896942377,
            -0.599352359772,
            0.514933764935,
            0.256822288036,
            0.71786916256,
            0.103526622057,
            0.0272750258446,
            0.161076381803,
        ],
        2.5857145601695426,
    ),
    "dp-sgd-joint": (
        [
            -0.438548564911,
            -0.442057669163,
            -0.12259208411,
            -0.450184851885,
            0.0491386204958,
            -0.389897733927,
            0.242670670152,
            0.284669429064,
            0.0489346124232,
            0.374312996864,
            0.0358753502369,
            0.326822400093,
            -0.311698675156,
            -0.118792071939,
            -0.433134168386,
            -0.0119339954108,
            -0.347339481115,
            0.552509665489,
            0.311387985945,
            0.410974770784,
            0.114936113358,
            -0.308674484491,
            0.512804329395,
        ],
        2.5857145601695426,
    ),
    "dp-sgda": (
        [
            -0.416346013546,
            -0.479619771242,
            -0.123427152634,
            -0.428264558315,
            0.134182080626,
            -0.528380692005,
            0.349861741066,
            0.335737586021,
            -0.0259638894349,
            0.425567984581,
            -0.0528343431652,
            0.354016900063,
            -0.366850972176,
            -0.269067704678,
            -0.380412101746,
            0.0348917543888,
            -0.39391258359,
            0.566791594028,
            0.312259614468,
            0.556908607483,
            0.236379176378,
            -0.243798315525,
            0.465475857258,
        ],
        4.647501323709287,
    ),
    "dp-svrg": (
        [-0.0529977912581, -0.679785991314, 0.853636506194, 0.769180561398, 0.0871718245621],
        17.23305699375773,
    ),
    "dp-svrg-pp": ([-1.26217617155, 0.26959300334, 0.459337238301, 1.4899911589, 1.15928251242], 18.608649380140065),
    "private-diff": (
        [
            -0.641140878201,
            -3.03308796883,
            2.60217452049,
            1.60086429119,
            0.427306294441,
            -2.34278178215,
            1.04899680614,
            1.43555223942,
            -1.54713225365,
            0.579295098782,
            0.0652077570558,
            0.693664073944,
            -1.32193279266,
            -2.77424550056,
            -0.97235250473,
            1.00456726551,
            2.02046608925,
            1.13448178768,
            -0.831099331379,
            2.34921312332,
            3.18839216232,
            -2.45917057991,
            0.568207979202,
        ],
        7.562366741532172,
    ),
    "scdro": (
        [
            -0.426651000977,
            -0.367570489645,
            -0.231770962477,
            -0.465962350368,
            0.164861708879,
            -0.357343405485,
            0.19764469564,
            0.276522129774,
            0.0627436861396,
            0.377709954977,
            -0.0380418412387,
            0.301271438599,
            -0.405906230211,
            -0.25135499239,
            -0.424003094435,
            0.0669344216585,
            -0.344859242439,
            0.348361551762,
            0.287239819765,
            0.403127133846,
            0.341564267874,
            -0.0578729212284,
            0.247316226363,
        ],
        None,
    ),
}


@pytest.mark.parametrize("key", sorted(CASES))
def test_short_run_matches_the_pinned_numbers(key):
    params, eps = run_case(key)
    want_params, want_eps = PINNED[key]
    torch.testing.assert_close(
        torch.tensor(params, dtype=torch.float64), torch.tensor(want_params, dtype=torch.float64), rtol=1e-6, atol=1e-6
    )
    if want_eps is None:
        assert eps is None
    else:
        assert eps == pytest.approx(want_eps, rel=1e-6)


def test_ledger_and_calibration_values_are_pinned():
    # A two-family step (shared batch) composed with a full-batch step: the ledger's epsilon.
    ledger = PrivacyLedger(delta=1e-5)
    shared = Step(Poisson(0.05), (Gaussian(1.1, name="a"), Gaussian(1.1, name="b")))
    full = Step(FullBatch(), (Gaussian(4.0, name="c"),))
    for _ in range(40):
        ledger.record(shared)
    for _ in range(3):
        ledger.record(full)
    assert ledger.epsilon() == pytest.approx(PINNED_LEDGER_EPSILON, rel=1e-6)
    # The calibrated multiplier of DP Double-SPIDER's inventory (uniform allocation).
    inv = get_algorithm("dp-double-spider", steps=64, q=16, N1=500, N2=50, N3=500, N4=50).inventory(n=1000)
    z = calibrate(inv, epsilon=2.0, delta=1e-5).noise
    assert set(z) == {"eta-refresh", "x-refresh", "eta-diff", "x-diff"}
    assert z["x-diff"] == pytest.approx(PINNED_DOUBLE_SPIDER_Z, rel=1e-4)  # the search's own precision
    # A planned DP-SGD step count and its epsilon.
    inv = Inventory((PlannedStep(Poisson(0.01), (("grad", 1.0),), 1000),))
    assert ledger_epsilon(inv, 0.9) == pytest.approx(PINNED_DPSGD_EPSILON, rel=1e-6)


def ledger_epsilon(inv: Inventory, z: float) -> float:
    ledger = PrivacyLedger(delta=1e-5)
    for step, count in inv.steps_for(dict.fromkeys(inv.names, z)).items():
        for _ in range(count):
            ledger.record(step)
    return ledger.epsilon()


PINNED_LEDGER_EPSILON = 4.751861797750619
PINNED_DOUBLE_SPIDER_Z = 3.524987006657533
PINNED_DPSGD_EPSILON = 2.316417133646664


if __name__ == "__main__":  # pragma: no cover  (prints the values to paste above)
    torch.set_num_threads(1)
    for key in sorted(CASES):
        params, eps = run_case(key)
        print(f"    {key!r}: ({[float(f'{v:.12g}') for v in params]}, {eps!r}),")
