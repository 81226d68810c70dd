"""DP-OCO + EXP3, Noisy-SGD-MGR / AGS and group DRO: the λ-player's steps by hand, every noisy
release's sensitivity on neighbouring datasets, disjoint streams, and end-to-end accounting."""

import math

import numpy as np
import pytest
import torch

from privopt.algorithms import get_algorithm
from privopt.algorithms.worst_group_common import exp3_step, group_loss_sums, hedge_step
from privopt.grads.release import observe_releases
from privopt.privacy import PrivacyLedger, calibrate
from wg_helpers import ce, make_ctx, tiny_groups


def test_exp3_update_equals_a_hand_computed_step():
    lam = np.array([0.2, 0.5, 0.3])
    # pulled arm 1 with probability 0.5, bandit loss 0.8, step 0.1:
    # λ_1 ← 0.5·exp(−0.1·0.8/0.5) = 0.5·e^{−0.16}; then normalise.
    w1 = 0.5 * math.exp(-0.16)
    expected = np.array([0.2, w1, 0.3]) / (0.2 + w1 + 0.3)
    assert np.allclose(exp3_step(lam, arm=1, loss=0.8, prob=0.5, step=0.1), expected, rtol=1e-12)


def test_hedge_update_equals_a_hand_computed_step():
    lam = np.array([0.25, 0.25, 0.5])
    gains = np.array([1.0, 0.0, 2.0])
    w = lam * np.exp(0.3 * gains)
    assert np.allclose(hedge_step(lam, gains, step=0.3), w / w.sum(), rtol=1e-12)


def test_group_loss_sums_move_one_coordinate_by_at_most_the_bound():
    data = tiny_groups(n=200, seed=1)
    ctx, _ = make_ctx(data)
    with torch.no_grad():
        ctx.model[0].weight.normal_(0, 3.0)  # losses far above B for some records
    g = data.g_train
    kw = dict(num_groups=3, bound=1.0)
    full = group_loss_sums(ctx.model, ce, data.x_train, data.y_train, g, **kw)
    worst = 0.0
    for k in range(0, 200, 7):
        keep = torch.arange(200) != k
        nb = group_loss_sums(ctx.model, ce, data.x_train[keep], data.y_train[keep], g[keep], **kw)
        diff = full.value - nb.value
        assert int((diff != 0).sum()) <= 1
        worst = max(worst, float(diff.abs().sum()))
    assert worst <= full.bound and worst > 0.5  # the bound B = 1 is reached by clamped records


def _capture(algo_name, data, *, x=None, y=None, groups=None, steps=1, **params):
    """The first ``steps`` steps' releases (values divided by their normalisers) of a non-private run."""
    ctx, _ = make_ctx(data, x=x, y=y, groups=groups)
    algo = get_algorithm(algo_name, private=False, **params)
    algo.setup(ctx)
    seen = []
    with observe_releases(seen.append):
        for t in range(steps):
            algo.step(t)
    return seen


@pytest.mark.parametrize("name", ["noisy-sgd-mgr", "noisy-sgd-ags"])
def test_mgr_and_ags_releases_move_at_most_their_bound_between_neighbours(name):
    # Same randomness, one record removed: each release's pre-noise sum moves by ≤ its bound.
    data = tiny_groups(n=300, seed=2)
    params = dict(batch_size=150, epochs=1.0, loss_bound=1.0, clip=0.3, group_sizes="private")
    if name == "noisy-sgd-ags":
        params["choice"] = "noisy-losses"
    full = _capture(name, data, **params)
    for k in (3, 100, 299):
        keep = torch.arange(300) != k
        nb = _capture(name, data, x=data.x_train[keep], y=data.y_train[keep], groups=data.g_train[keep], **params)
        for a, b in zip(full, nb):
            if a.name == "group-counts":
                assert float((a.value - b.value).abs().sum()) <= a.bound + 1e-9
            elif a.name == "group-losses":  # the first loss release is at the same (initial) parameters
                diff = float((a.value - b.value).abs().sum())
                assert diff <= a.bound + 1e-9
                break


def test_gradient_release_moves_at_most_the_clip_between_neighbours():
    # The gradient sum of a Poisson batch: with the SAME sampled batch minus the removed record,
    # the sum moves by at most the clip (one per-sample term).
    data = tiny_groups(n=120, seed=3)
    ctx, _ = make_ctx(data)
    algo = get_algorithm("noisy-sgd-mgr", private=False, clip=0.2, batch_size=60)
    algo.setup(ctx)
    idx = torch.arange(40)
    full = algo._grad_sum(idx, clip=0.2)
    for k in range(0, 40, 9):
        nb = algo._grad_sum(idx[idx != k], clip=0.2)
        assert float((full.value - nb.value).norm()) <= full.bound + 1e-6


@pytest.mark.parametrize("model", ["logreg", "mlp"])
@pytest.mark.parametrize("chunk", [1024, 3])
def test_gradient_release_with_an_extreme_record_moves_by_the_clip_in_chunks(model, chunk):
    # The chosen group's batch with and without a far-out record (up to float32's overflow of its
    # squares): the clipped sum, in chunks or not, moves by at most C, and by about C (clipped, not dropped).
    data = tiny_groups(n=120, seed=3)
    worst = 0.0
    for scale in (1e3, 1e6, 3e37):
        xa = torch.cat([data.x_train, scale * torch.ones(1, data.x_train.shape[1])])
        ya, ga = torch.cat([data.y_train, torch.tensor([1])]), torch.cat([data.g_train, torch.tensor([2])])
        ctx, _ = make_ctx(data, x=xa, y=ya, groups=ga, model=model)
        algo = get_algorithm("noisy-sgd-mgr", private=False, clip=0.2, batch_size=60, chunk_size=chunk)
        algo.setup(ctx)
        idx = torch.nonzero(ga == 2).squeeze(1)  # the record is the group's last
        full, without = algo._grad_sum(idx, clip=0.2), algo._grad_sum(idx[:-1], clip=0.2)
        assert full.bound == 0.2
        moved = float((full.value.double() - without.value.double()).norm())
        assert moved <= 0.2 * (1 + 1e-5), (scale, moved)
        worst = max(worst, moved)
    assert worst >= 0.19


def test_oco_streams_are_disjoint_and_bandit_loss_is_bounded():
    data = tiny_groups(n=600, seed=4)
    ctx, _ = make_ctx(data)
    algo = get_algorithm("dp-oco-exp3", private=False, batch_size=20, loss_bound=1.0)
    algo.setup(ctx)
    seen = []
    with observe_releases(seen.append):
        for t in range(algo.num_steps()):
            algo.step(t)
    used = algo.releases.state_dict()["used"]
    tree, bandit = used["ftrl-tree"], used["bandit-loss"]
    assert not bool((tree & bandit).any())  # no record in both streams
    assert int(algo.oracles.drawn_mask().sum()) == int(tree.sum() + bandit.sum())  # and none twice
    assert any(e.name == "bandit-loss" for e in seen)
    # The bandit release is a sum of losses clamped to [0, B]: one record moves it by at most B.
    with torch.no_grad():
        ctx.model[0].weight.normal_(0, 5.0)
    idx = torch.arange(50)
    full = algo._loss_sum(idx)
    for k in range(0, 50, 7):
        assert abs(float(full.value) - float(algo._loss_sum(idx[idx != k]).value)) <= full.bound + 1e-12


def test_oco_stops_when_the_chosen_group_runs_dry():
    data = tiny_groups(n=300, seed=5, fractions=(0.9, 0.05, 0.05))
    ctx, _ = make_ctx(data)
    algo = get_algorithm("dp-oco-exp3", private=False, batch_size=30, lam_lr=5.0)
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    assert algo.stopped or algo.rounds_played == algo.num_steps()
    assert algo.rounds_played <= algo.num_steps()


@pytest.mark.parametrize(
    "name,params",
    [
        ("noisy-sgd-mgr", dict(batch_size=64, epochs=2.0)),
        ("noisy-sgd-ags", dict(batch_size=64, epochs=2.0)),
        ("noisy-sgd-ags", dict(batch_size=64, epochs=2.0, choice="noisy-losses")),
        ("dp-oco-exp3", dict(batch_size=16)),
    ],
)
def test_private_runs_spend_exactly_their_calibrated_budget(name, params):
    data = tiny_groups(n=500, seed=6)
    ctx, _ = make_ctx(data)
    algo = get_algorithm(name, **params)
    inv = algo.inventory(n=ctx.n)
    cal = calibrate(inv, epsilon=1.5, delta=1e-4, accountant="rdp")
    ctx.noise = dict(cal.noise)
    ctx.ledger = PrivacyLedger(delta=1e-4, target_epsilon=1.5, accountant="rdp", planned=inv.steps_for(cal.noise))
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    algo.finalize()
    assert ctx.ledger.epsilon() <= 1.5 + 1e-9
    assert all(torch.isfinite(p).all() for p in ctx.model.parameters())


def test_group_dro_moves_weight_to_the_high_loss_group():
    data = tiny_groups(n=400, seed=7, fractions=(0.85, 0.1, 0.05))
    ctx, _ = make_ctx(data)
    algo = get_algorithm("group-dro", lr=0.5, batch_size=100, epochs=5, group_lr=0.5)
    algo.setup(ctx)
    for t in range(algo.num_steps()):
        algo.step(t)
    with torch.no_grad():
        losses = ce(ctx.model(data.x_train), data.y_train)
    means = torch.stack([losses[data.g_train == i].mean() for i in range(3)])
    assert algo.q[int(means.argmax())] > 1 / 3  # the highest-loss group gained weight from the uniform start


@pytest.mark.parametrize("algo", ["noisy-sgd-ags", "noisy-sgd-mgr", "dp-oco-exp3", "minimax-phased-erm"])
def test_public_group_sizes_the_dataset_does_not_publish_are_refused_before_the_run_writes_anything(algo, tmp_path):
    """A config mistake (``group_sizes: public`` on data without ``public_meta['group_sizes_train']``,
    e.g. a CSV file) fails like any other: before a run folder, a checkpoint or a failed record exists."""
    import privopt
    from privopt.data import Dataset
    from privopt.errors import ConfigError

    g = torch.Generator().manual_seed(0)
    x, y, groups = torch.rand(240, 4, generator=g), torch.randint(0, 2, (240,), generator=g), torch.arange(240) % 3
    data = Dataset.from_tensors(
        x[:200], y[:200], x_test=x[200:], y_test=y[200:], groups=groups[:200], groups_test=groups[200:],
        num_classes=2, group_names=["a", "b", "c"],
    )  # fmt: skip
    with pytest.raises(ConfigError, match="group_sizes='public' needs public_meta"):
        privopt.fit(
            model="logreg", dataset=data, algorithm=algo, epsilon=1.0, delta=1e-4, group_sizes="public",
            out_dir=tmp_path / "run", progress=False,
        )  # fmt: skip
    assert not (tmp_path / "run").exists()
