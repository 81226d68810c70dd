"""Replace-one neighbours whose replaced record changes group, for Minimax Phased ERM and DP-OCO + EXP3.

Under ``neighbouring: replace_one`` a record of group A may be replaced by a record of group B: A loses
a record, B gains one, both group sizes change. Each test runs a private run on D (noise calibrated
for replace-one, its ledger of that relation), replays the neighbour D' on D's transcript
(``xgroup_helpers``, ``replay_helpers``: every release of D' receives D's value, so both worlds take
the same path) and checks, release family by release family, that the pre-noise statistics move by no more than the
ledger charged for (read from its recorded dp_accounting events), that the noise each release drew
is the same in both worlds (no data-dependent scale: the group sizes the algorithms normalise by
are the released ones) and that the accounting is the same. Replaced records are adversarial:
into the smallest group, out of a group of two (leaving one), features far beyond the algorithm's
per-record clip or exactly at it, the label flipped.
"""

from __future__ import annotations

import pytest
import torch

from replay_helpers import charged, moved, spent
from wg_helpers import tiny_groups
from xgroup_helpers import private_algo, run_world

PHASED = dict(phases=2, eta=0.05, radius=0.3, feature_norm=1.0, count_noise=2.0)


def _replaced(data, k: int, group: int, scale: float):
    """D' of the record ``k`` moved to ``group``: features ``scale`` along a fixed direction
    (``scale`` None: the record's own features), label flipped."""
    x, y, g = data.x_train.clone(), data.y_train.clone(), data.g_train.clone()
    direction = torch.tensor([1.0, -1.0, 1.0, 1.0]) / 2.0  # unit norm
    if scale is not None:
        x[k] = scale * direction
    y[k], g[k] = 1 - y[k], group
    return x, y, g


def _phased_worlds(monkeypatch, data, neighbour, sizes):
    d_algo, d_ctx = private_algo("minimax-phased-erm", data, data.x_train, data.y_train, data.g_train,
                                 epsilon=8.0, group_sizes=sizes, **PHASED)  # fmt: skip
    d = run_world(monkeypatch, d_algo)
    n_algo, n_ctx = private_algo("minimax-phased-erm", data, *neighbour, epsilon=8.0, group_sizes=sizes, **PHASED)
    n = run_world(monkeypatch, n_algo, forced=d)
    assert torch.equal(d_algo.group_sizes(), n_algo.group_sizes())  # the normalisers: released (or public) sizes
    assert d_ctx.ledger.counts == n_ctx.ledger.counts  # the same accounting
    return d, n, d_ctx.ledger


@pytest.mark.parametrize("sizes", ["private", "public"])
def test_phased_erm_releases_across_groups_stay_within_what_the_ledger_charges(monkeypatch, sizes):
    """Phase outputs move by at most Δ_t (the replace-one stability bound the docs state; the ledger
    charges 2Δ_t under replace-one), in one phase only (a record's phase is set by its key, the same
    in either group), and the group-count release moves by 2 (two counts change) = what it is charged."""
    data = tiny_groups(n=60, seed=3, fractions=(0.6, 0.365, 0.035))  # group sizes 37, 21, 2
    g = data.g_train
    first = [int(torch.nonzero(g == i)[0]) for i in range(3)]
    cases = [  # (record, its new group, feature scale)
        (first[0], 2, 1e6),  # into the smallest group, far beyond the feature clip
        (first[2], 0, 3e38),  # out of the group of two (one record left), float32's largest
        (first[1], 2, 1.0),  # into the smallest group, exactly at the clip (feature_norm 1)
        (first[2], 1, None),  # out of the group of two, its own features
    ]
    worst = 0.0
    for k, group, scale in cases:
        neighbour = _replaced(data, k, group, scale)
        counts = [torch.bincount(gg, minlength=3) for gg in (g, neighbour[2])]
        assert int((counts[0] - counts[1]).abs().sum()) == 2  # two group sizes change
        d, n, ledger = _phased_worlds(monkeypatch, data, neighbour, sizes)
        phases = moved(d, n, "phase-output")
        assert len(phases) == PHASED["phases"] and sum(m > 0 for m in phases) == 1, phases
        assert max(phases) <= 1.0, (k, group, scale, phases)  # ≤ Δ_t, the bound the noise was scaled to
        assert spent(d, n, "phase-output") <= charged(ledger, "phase-output")
        if sizes == "private":
            assert moved(d, n, "group-counts") == [2.0]  # one count down, one up
            assert spent(d, n, "group-counts") == pytest.approx(charged(ledger, "group-counts"), rel=1e-12)
        worst = max(worst, max(phases))
    assert worst >= 0.02, worst  # measured ≈ 0.03: Δ_t is a loose worst-case bound


# ----------------------------------------------------------------------------- DP-OCO + EXP3
OCO = dict(batch_size=2, clip=0.5, loss_bound=0.3)
FAR = 1e4 * torch.tensor([1.0, -1.0, 1.0, 1.0])  # a gradient clipped to C whatever w


def _oco_draws(monkeypatch, data):
    """The base run's draws ``(round, stream, group, [lo, hi) of keys, indices)`` and every record's key."""
    from privopt.group_sampling import GroupOracles

    algo, _ = private_algo("dp-oco-exp3", data, data.x_train, data.y_train, data.g_train, epsilon=4.0, **OCO)
    log, real = [], GroupOracles.draw

    def draw(self, group, *, width):
        lo = self._cursor[group]
        idx = real(self, group, width=width)
        log.append((len(log) // 2, ("minus", "plus")[len(log) % 2], group, lo, self._cursor[group], idx))
        return idx

    with monkeypatch.context() as mp:
        mp.setattr(GroupOracles, "draw", draw)
        run_world(monkeypatch, algo)
    state, keys = algo.oracles.state_dict(), torch.empty(data.n_train, dtype=torch.float64)
    for members, k in zip(state["members"], state["keys"]):
        keys[members] = k
    return log, keys, algo.rounds_played


def _landing(log, keys, k: int, group: int):
    """(round, stream) of the draw that holds record ``k`` as a member of ``group`` (None: never drawn)."""
    for rnd, stream, grp, lo, hi, idx in log:
        if grp == group and (bool((idx == k).any()) or lo <= float(keys[k]) < hi):
            return rnd, stream
    return None


def _tree_cost(a: int, b: int, rounds: int) -> int:
    """Σ over the tree's nodes of (leaves a, b in it)²: the node closing at t holds the leaves
    (t − lowbit(t), t], so leaf t is in the nodes t, t + lowbit(t), ... up to the rounds played."""

    def path(t):
        while t <= rounds:
            yield t
            t += t & -t

    pa, pb = set(path(a)), set(path(b))
    return len(pa ^ pb) + 4 * len(pa & pb)


def _adversarial_moves(monkeypatch, data):
    """Cross-group moves ``(record, new group, its features, label in D, label in D')`` chosen from the
    base run: into two tree leaves with the most nodes in common, into two bandit batches, then into
    the smallest group and out of it (one record left), far out. Zero features leave the bias's
    gradient ``p − e_y`` (at the clip while p is near uniform; the two labels give opposite ones:
    D − D' is then the same direction in both leaves, 2C on their common nodes) and a loss past B
    under either label. (Far-out features cannot give opposite clipped gradients: for a linear model,
    a mislabelled far-out record's gradient always increases the margin of its predicted class.)"""
    log, keys, rounds = _oco_draws(monkeypatch, data)
    g, best = data.g_train, {}
    for k in range(data.n_train):
        for group in range(3):
            a, b = _landing(log, keys, k, int(g[k])), _landing(log, keys, k, group)
            if group == int(g[k]) or a is None or b is None or a[1] != b[1]:
                continue
            score = _tree_cost(a[0] + 1, b[0] + 1, rounds) if a[1] == "minus" else 1
            if score > best.get(a[1], (-1,))[0]:
                best[a[1]] = (score, k, group)
    assert set(best) == {"minus", "plus"}, best
    (_, tree_k, tree_g), (_, loss_k, loss_g) = best["minus"], best["plus"]
    small, zero = int(torch.nonzero(g == 2)[0]), torch.zeros(4)
    return [
        (tree_k, tree_g, zero, 0, 1),
        (loss_k, loss_g, zero, int(data.y_train[loss_k]), int(data.y_train[loss_k])),
        (int(torch.nonzero(g == 0)[0]), 2, FAR, 0, 1),
        (small, 0, FAR, 1, 0),
    ]


def test_oco_releases_across_groups_stay_within_what_the_ledger_charges(monkeypatch):
    """A record moved across groups is drawn in another round (its key falls in the other group's
    interval): two tree leaves move by C each (2C on their common nodes) or two bandit sums by B
    each. Replace-one charges the tree z/2 per node (depth·(2C)²) and each Laplace family 2/b: the pair
    must stay within that. The adversarial pairs exhaust the Laplace charges and nearly the tree's:
    two leaves move at most (4·depth − 3)·C² of it (leaves 1 and 2 of a depth-5 tree: 17/20)."""
    data = tiny_groups(n=80, seed=4, fractions=(0.55, 0.42, 0.03))  # group sizes 45, 33, 2
    ratios = {"ftrl-tree": 0.0, "bandit-loss": 0.0, "group-counts": 0.0}
    for k, group, row, label, label2 in _adversarial_moves(monkeypatch, data):
        x, y, g = data.x_train.clone(), data.y_train.clone(), data.g_train.clone()
        x[k], y[k] = row, label
        d_algo, d_ctx = private_algo("dp-oco-exp3", data, x, y, g, epsilon=4.0, **OCO)
        d = run_world(monkeypatch, d_algo)
        y2, g2 = y.clone(), g.clone()
        y2[k], g2[k] = label2, group
        n_algo, n_ctx = private_algo("dp-oco-exp3", data, x, y2, g2, epsilon=4.0, **OCO)
        n = run_world(monkeypatch, n_algo, forced=d)
        assert group != int(g[k]) and d_ctx.ledger.counts == n_ctx.ledger.counts
        assert torch.equal(d_algo.group_sizes(), n_algo.group_sizes())  # normalisers: the released sizes
        assert (d_algo.rounds_played, d_algo.stopped) == (n_algo.rounds_played, n_algo.stopped)
        assert torch.equal(torch.as_tensor(d_algo.lam), torch.as_tensor(n_algo.lam))  # λ: post-processing
        for family in ratios:
            used, paid = spent(d, n, family), charged(d_ctx.ledger, family)
            assert used <= paid * (1 + 1e-9), (k, group, family, used, paid)
            ratios[family] = max(ratios[family], used / paid)
    assert ratios["group-counts"] == pytest.approx(1.0, rel=1e-12)  # two counts move by 1 each
    assert ratios["bandit-loss"] == pytest.approx(1.0, rel=1e-9)  # two sums by B each
    assert ratios["ftrl-tree"] >= 0.8, ratios  # two leaves that share most of their nodes
