"""Neighbouring-dataset checks for the noisy queries no other test measured that way.

The inventory of every noisy query, its bound, relation, event and the test that measures it is
the table of docs/privacy.md ("Inventory of noisy queries"); :func:`test_every_family_is_in_the_inventory_table`
keeps that table complete. Each check below builds D and D' differing in one (adversarial) record,
computes the pre-noise statistic on both and asserts it moves by at most the declared bound,
and that the bound is nearly attained (so the check has teeth).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from privopt.algorithms import available_algorithms, get_algorithm
from wg_helpers import ce, make_ctx, tiny_groups

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- PrivacyEngine (api)
class _Capture:
    """Stands in for the step's PrivateBatch: keeps the bounded sum, releases it without noise."""

    def __init__(self):
        self.stats = []

    def gaussian(self, name, stat, *, normalizer):
        from privopt.grads.sums import as_bounded

        self.stats.append(as_bounded(stat))
        return self.stats[-1].value / normalizer


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
@pytest.mark.parametrize("chunk", [None, 3])
def test_api_optimizer_gradient_moves_by_at_most_the_clip_between_neighbours(engine, chunk):
    import privopt

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 5, generator=g), torch.randint(0, 2, (200,), generator=g)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    eng = privopt.PrivacyEngine(accountant="rdp", engine=engine, insecure_seed=1)
    model, opt, _ = eng.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), dataset=(x, y), batch_size=20,
        epochs=1, epsilon=2.0, delta=1e-4, max_grad_norm=0.3, max_physical_batch_size=chunk,
    )  # fmt: skip
    xb, yb = x[:10], y[:10]
    worst = 0.0
    for scale in (1e3, 1e6, 3e37):  # large-norm gradients, up to float32's overflow
        bad = (scale * torch.sign(torch.randn(1, 5, generator=g)), torch.tensor([1]))
        cap = _Capture()
        opt._release(cap, torch.cat([xb, bad[0]]), torch.cat([yb, bad[1]]))
        opt._release(cap, xb, yb)
        with_rec, without = cap.stats
        assert with_rec.bound == without.bound == 0.3
        moved = float((with_rec.value.double() - without.value.double()).norm())
        assert math.isfinite(moved) and moved <= 0.3 * (1 + 1e-5), (scale, moved)
        worst = max(worst, moved)
    assert worst >= 0.2  # a large finite record is clipped to C, not dropped


# ----------------------------------------------------------------------------- Noisy-SGD-AGS's pick
def _ags_pick_values(x, y, groups, data, weights, sizes):
    ctx, _ = make_ctx(data, x=x, y=y, groups=groups)
    with torch.no_grad():
        ctx.model[0].weight.copy_(weights)
    algo = get_algorithm("noisy-sgd-ags", private=False, loss_bound=2.0, choice="noisy-max")
    algo.setup(ctx)
    algo._sizes = sizes  # the released sizes: public, the same for both neighbours
    seen = []
    algo.releases.noisy_max = lambda name, values, **kw: seen.append((name, values)) or 0
    algo._choose()
    ((name, values),) = seen
    assert name == "group-choice"
    return values


def test_ags_noisy_max_values_move_one_coordinate_by_at_most_the_declared_delta():
    """The report-noisy-max values are the group means ``s_g / n̂_g`` (losses clamped to [0, B]):
    one record moves one coordinate, one way, by at most ``B / min n̂`` (the monotone case charged
    ``PureDP(1/b)``)."""
    data = tiny_groups(n=120, seed=5)
    x, y, g = data.x_train, data.y_train, data.g_train
    weights = torch.tensor([[0.5, -1.0, 0.25, 2.0], [-0.3, 0.2, 1.0, -0.5]])
    sizes = torch.tensor([60.0, 35.0, 7.5], dtype=torch.float64)  # noisy sizes, the smallest below its count
    base = _ags_pick_values(x, y, g, data, weights, sizes)
    assert base.bound == pytest.approx(2.0 / 7.5)
    worst = 0.0
    for grp in range(3):
        for scale in (1.0, 1e3, 3e37):  # a mislabelled record whose loss reaches (or exceeds) B
            xr = scale * torch.sign(weights[0] - weights[1]).reshape(1, -1)
            xa, ya, ga = torch.cat([x, xr]), torch.cat([y, torch.tensor([1])]), torch.cat([g, torch.tensor([grp])])
            diff = (_ags_pick_values(xa, ya, ga, data, weights, sizes).value - base.value).double()
            assert int((diff != 0).sum()) <= 1 and bool((diff >= 0).all())  # one coordinate, one direction
            assert float(diff.abs().max()) <= base.bound * (1 + 1e-12)
            worst = max(worst, float(diff.abs().max()))
    assert worst == pytest.approx(base.bound, rel=1e-9)  # attained: loss at B in the smallest group


# ----------------------------------------------------------------------------- DP-OCO's tree leaf
def test_oco_tree_leaf_moves_by_at_most_the_clip():
    """Leaf t of DP-FTRL's tree is the clipped gradient sum of the batch x_t^- (each record in one
    leaf): adding a large-norm record moves it by at most the clip, the tree's declared leaf bound."""
    data = tiny_groups(n=120, seed=4)
    x_bad = torch.tensor([[1e4, -1e4, 1e4, 1e4]])
    xa, ya, ga = torch.cat([data.x_train, x_bad]), torch.cat([data.y_train, torch.tensor([0])]), None
    ga = torch.cat([data.g_train, torch.tensor([1])])
    ctx, _ = make_ctx(data, x=xa, y=ya, groups=ga)
    algo = get_algorithm("dp-oco-exp3", private=False, batch_size=20, clip=0.4)
    algo.setup(ctx)
    tree = algo.release_plan(ctx.n).query("ftrl-tree")
    idx = torch.arange(0, 121, 4)
    assert int(idx[-1]) == 120
    with_rec, without = algo._grad_sum(idx, clip=0.4), algo._grad_sum(idx[:-1], clip=0.4)
    assert with_rec.bound == tree.sensitivity.clip * tree.sensitivity.factor == 0.4
    moved = float((with_rec.value - without.value).norm())
    assert 0.39 <= moved <= 0.4 * (1 + 1e-6)


# ----------------------------------------------------------------------------- private model selection
def _selection_stats(x, y, model, method, monkeypatch):
    """The per-client bounded sums each release of one ``select`` call noises, by family."""
    from privopt.algorithms.private_selection import PrivateModelSelection

    seen = []
    real = PrivateModelSelection._release

    def spy(self, fed, name, stats, noise, private):
        seen.append((name, stats[0]))
        return real(self, fed, name, stats, noise, private)

    with monkeypatch.context() as mp:
        mp.setattr(PrivateModelSelection, "_release", spy)
        _select(x, y, model, method, PrivateModelSelection)
    return seen


def _select(x, y, model, method, cls):
    from privopt.algorithms.federation import Client, Federation
    from privopt.distributed import LocalComm
    from privopt.grads.flat import flat_params

    sel = cls(alpha=1e-9, method=method, lanczos_steps=1, grad_clip=0.5, hvp_clip=0.8)
    client = Client(0, x, y, None, None, None)
    fed = Federation([client], num_clients=1, shard_sizes=[x.shape[0]], trust="local", comm=LocalComm())
    w = flat_params(model).detach()
    sel.select([w, 0.5 * w], federation=fed, model=model, loss_fn=ce, noise={"sel-grad": 1.0, "sel-curv": 1.0},
               private=False)  # fmt: skip


@pytest.mark.parametrize("method", ["hessian", "lanczos"])
def test_private_selection_gradient_and_curvature_move_by_at_most_their_clips(method, monkeypatch):
    """``sel-grad`` (per-record gradients clipped at ``grad_clip``) and ``sel-curv`` (per-record
    Hessians clipped in Frobenius norm, released as the √2-weighted upper triangle, or
    Hessian-vector products) on held-out data with and without one large-norm mislabelled record.
    One Lanczos step here, in a noiseless run of each world: later steps query vectors built from
    earlier noisy releases, so they are checked with the neighbour replayed on the first world's
    transcript, every step of every candidate (``tests/test_selection_neighbours.py``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(25, 3, generator=g), torch.randint(0, 2, (25,), generator=g)
    xa, ya = torch.cat([x, torch.tensor([[30.0, -30.0, 30.0]])]), torch.cat([y, torch.tensor([1])])
    with_rec = _selection_stats(xa, ya, model, method, monkeypatch)
    without = _selection_stats(x, y, model, method, monkeypatch)
    assert [n for n, _ in with_rec] == [n for n, _ in without] and len(with_rec) >= 2
    moved = {}
    for (name, a), (_, b) in zip(with_rec, without):
        assert a.bound == b.bound == {"sel-grad": 0.5, "sel-curv": 0.8}[name]
        m = float((a.value.double() - b.value.double()).norm())
        assert m <= a.bound * (1 + 1e-5), (name, m, a.bound)
        moved[name] = max(moved.get(name, 0.0), m / a.bound)
    assert moved["sel-grad"] >= 0.9  # the record's gradient is clipped to the bound, not tiny


# ----------------------------------------------------------------------------- feature centring
@pytest.mark.parametrize("row", [[1e200, -1e200, 1e200], [3e38, 3e38, -3e38], [0.0, 0.0, 0.0], [1e-300, 0.0, 0.0]])
def test_centring_sum_with_extreme_float64_rows(row):
    """A row whose squared norm overflows float64 (norm inf) contributes 0, a zero row 0; every
    row moves the clipped sum by at most R."""
    from privopt.data.centering import FeatureCentering

    fc = FeatureCentering(norm_bound=1.5, noise_ratio=1.0)
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 5
    moved = (fc.clipped_sum(torch.cat([x, torch.tensor([row], dtype=torch.float64)])) - fc.clipped_sum(x)).norm()
    assert math.isfinite(float(moved)) and float(moved) <= 1.5 * (1 + 1e-12)


# ----------------------------------------------------------------------------- accounting
def test_laplace_under_replace_one_is_charged_at_twice_the_sensitivity():
    """Reference values: a replaced record moves an L1-bounded release by up to 2C, so Laplace(b)
    under replace-one is dp_accounting's Laplace(b/2); PLD gives exactly 1/b resp. 2/b at δ→0."""
    import dp_accounting as dpa

    from privopt.privacy import FullBatch, Laplace, Step, epsilon_of

    step = Step(FullBatch(), (Laplace(4.0),))
    for acc in ("rdp", "pld"):
        rep = epsilon_of({step: 3}, delta=1e-6, accountant=acc, neighbouring="replace_one").epsilon
        half = epsilon_of({Step(FullBatch(), (Laplace(2.0),)): 3}, delta=1e-6, accountant=acc).epsilon
        assert rep == pytest.approx(half, rel=1e-9)
    ref = dpa.rdp.RdpAccountant()
    ref.compose(dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(2.0), 3))
    assert epsilon_of({step: 3}, delta=1e-6, accountant="rdp", neighbouring="replace_one").epsilon == pytest.approx(
        ref.get_epsilon(1e-6), rel=1e-9
    )
    one = epsilon_of({step: 1}, delta=1e-12, accountant="pld", neighbouring="replace_one").epsilon
    assert 0.5 - 1e-3 <= one <= 0.5 + 1e-4  # 2C / (4C): pure 0.5, not the add/remove 0.25


# ----------------------------------------------------------------------------- the inventory table
INVENTORY = "| family | algorithms |"
PRETRAINING = {"feature_mean": "feature_centering", "class_counts": "logit_adjustment"}
# Families of a non-default setting, and of the releases made outside the algorithms.
VARIANTS = {name: {"sampling": "poisson"} for name in ("ada-dp-spider", "gauss-psgd", "dp-spider-sosp")}
VARIANTS["noisy-sgd-ags"] = {"choice": "noisy-losses"}
OUTSIDE = {("grad", "PrivacyEngine"), *(("sel-" + k, "PrivateModelSelection") for k in ("grad", "curv"))}


def _inventory_rows():
    lines = (REPO / "docs/privacy.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(INVENTORY))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _families_in_code() -> set[tuple[str, str]]:
    out = set(OUTSIDE) | set(PRETRAINING.items())
    for name, cls in available_algorithms().items():
        if not cls.__module__.startswith("privopt."):
            continue  # registered by another test module
        for params in ({}, VARIANTS.get(name, {})):
            algo = get_algorithm(name, **params)
            if algo.private:
                plan = algo.release_plan(1000)
                out |= {(q.name, name) for p in plan.phases for q in p.queries}
    return out


def test_every_family_is_in_the_inventory_table():
    """Every release family of every private algorithm (and of the pre-training releases) has a row
    naming it, and every test a row cites exists."""
    listed = set()
    for row in _inventory_rows():
        fams = re.findall(r"`([a-z0-9_-]+)`", row[0])
        owners = re.findall(r"`([A-Za-z0-9_-]+)`", row[1])
        assert fams and owners, row
        listed |= {(f, o) for f in fams for o in owners}
        for path, test in re.findall(r"`(tests/[a-z0-9_]+\.py)::([a-z0-9_]+)`", row[-1]):
            assert re.search(rf"^def {test}\(", (REPO / path).read_text(), flags=re.M), (path, test)
        assert "tests/" in row[-1], row
    code = _families_in_code()
    assert code <= listed, sorted(code - listed)
    assert listed <= code, sorted(listed - code)
